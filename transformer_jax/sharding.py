"""The device mesh, the logical-axis rule table, and multi-host set-up.

The mesh has three axes:
  data:   pure data parallelism (parameters replicated);
  fsdp:   data parallelism with parameters and optimizer state sharded;
  tensor: tensor (model) parallelism over heads, d_ff and the vocabulary.
The batch is split over data × fsdp. One rule table maps the model's logical
axis names onto these mesh axes; a config chooses the parallelism only through
`config.mesh` (its data/fsdp/tensor sizes).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Any, Callable, Iterator

import jax
import numpy as np
from absl import logging
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis name -> mesh axis (or axes). The single place that says how
# every parameter and activation is laid out.
LOGICAL_AXIS_RULES = (
    ("batch", BATCH_AXES),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
)


def use_cpu_devices(count: int) -> None:
  """Runs `count` JAX devices on this process's CPU cores (0: leaves JAX's default); must run
  before JAX's first operation.

  The default mesh (data=-1) then splits each batch over them. Small models gain (their
  many small ops leave cores idle), large matmuls lose (they already use every core):
  benchmarks/README.md, "One CPU device unless asked". Only the CPU backend's devices
  change; a GPU or TPU run is unaffected. A run resumes with the count it started with.
  """
  if count <= 0:
    return
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    raise UserError(f"config.cpu_devices={count} comes too late: JAX has already started in "
                    "this process; set it before JAX's first operation (the train command "
                    "and experiments/ablations.py do)") from None


def check_cpu_devices(count: int) -> None:
  """A UserError where config.cpu_devices asked for `count` CPU devices and this process
  started with another number (set by a caller that ran JAX before the config was read)."""
  if count > 0 and jax.default_backend() == "cpu" and jax.local_device_count() != count:
    raise UserError(f"config.cpu_devices={count}, but this process has "
                    f"{jax.local_device_count()} CPU devices: JAX started before this config "
                    "was read; give the value to the whole process (the train command's "
                    "--config.cpu_devices, a sweep's base config or --launcher=subprocess), "
                    "or set config.cpu_devices=0 to keep the process's devices")


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
  """Joins a multi-process run when one is configured.

  Explicit flags win; otherwise JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
  JAX_PROCESS_ID from the environment; otherwise JAX's own auto-detection on
  TPU pods and SLURM. A plain single-process run does nothing.
  """
  env = os.environ
  coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and env.get("JAX_NUM_PROCESSES"):
    num_processes = int(env["JAX_NUM_PROCESSES"])
  if process_id is None and env.get("JAX_PROCESS_ID"):
    process_id = int(env["JAX_PROCESS_ID"])
  if coordinator_address and num_processes and num_processes > 1:
    timeout = int(env.get("TRANSFORMER_JAX_DISTRIBUTED_TIMEOUT_S", "120"))
    # How long the others wait for a silent process before stopping (JAX's default: 100 s).
    heartbeat = int(env.get("TRANSFORMER_JAX_HEARTBEAT_TIMEOUT_S", "30"))
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=heartbeat,
    )
  elif "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
    jax.distributed.initialize()  # Auto-detected.
  elif env.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:
    jax.distributed.initialize()  # A multi-host TPU slice.


def any_process(*flags: bool) -> tuple[bool, ...]:
  """Each flag OR-ed over all processes, so that every process takes the same branch.

  Host-side decisions that lead to collective work (save a checkpoint because
  SIGTERM arrived, or because N minutes passed on this host's clock) must agree,
  or the processes that save wait forever for those that do not. One tiny
  all-gather; nothing at all in a single-process run.
  """
  if jax.process_count() == 1:
    return tuple(bool(f) for f in flags)
  gathered = np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.int32)))
  return tuple(bool(f) for f in gathered.reshape(jax.process_count(), len(flags)).any(axis=0))


def check_same_everywhere(digest: str, what: str, fix: str) -> None:
  """Raises a one-line UserError unless every process holds the same hex `digest` of `what`
  (a tokenizer each host trained or found in its own cache: different token ids on two hosts
  would train on nonsense without any error). Nothing to do in a single-process run."""
  if jax.process_count() == 1:
    return
  mine = np.frombuffer(bytes.fromhex(digest[:32]), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
  differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
  if differ:
    raise UserError(f"{what} differs between processes (process 0 has {digest[:12]}…; "
                    f"processes {', '.join(map(str, differ))} another); {fix}")


def from_process_0(value: int) -> int:
  """Process 0's `value` on every process (a decision one host takes for all)."""
  if jax.process_count() == 1:
    return int(value)
  return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


def make_mesh(mesh_config: Any, devices: list | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh; a size of -1 takes the remaining devices."""
  devices = devices if devices is not None else jax.devices()
  sizes = [int(mesh_config[axis]) for axis in MESH_AXES]
  if sizes.count(-1) > 1:
    raise UserError("config.mesh: at most one of data, fsdp, tensor may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if known < 1 or len(devices) % known:
      raise UserError(
          f"config.mesh {dict(zip(MESH_AXES, sizes))} does not fit {len(devices)} devices"
      )
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise UserError(
        f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices "
        f"but {len(devices)} are available; set config.mesh.data=-1 to use them all"
    )
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def check_tensor_divides(mesh: Mesh, **model_sizes: int) -> None:
  """A one-line UserError where the tensor axis does not divide a model size it splits
  (`check_tensor_divides(mesh, num_heads=8, num_kv_heads=2)`)."""
  tensor = mesh.shape["tensor"]
  for name, size in model_sizes.items():
    if size % tensor:
      raise UserError(f"config.mesh.tensor={tensor} does not divide config.model.{name}={size}; "
                      f"choose a tensor axis that divides it (config.mesh.tensor=1 splits no "
                      "heads)")


def batch_shards(mesh: Mesh) -> int:
  """How many ways the batch is split: every global batch must divide by it."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows of [batch, length] arrays split over data × fsdp."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def shard_rows_held_everywhere(array: np.ndarray, mesh: Mesh) -> jax.Array:
  """A [batch, ...] array that every process holds whole (the same dev sentences on every
  host), as one global array split over the batch axes: each device takes its rows."""
  return jax.make_array_from_callback(array.shape, batch_sharding(mesh), lambda index: array[index])


def fetch_everywhere(array: jax.Array) -> np.ndarray:
  """The whole of a global array on every process, as numpy; across hosts an all-gather
  (a collective: every process must call it), on one host a plain copy."""
  if array.is_fully_addressable:
    return np.asarray(jax.device_get(array))
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def logical_shardings(abstract_boxed_tree: Any, mesh: Mesh) -> Any:
  """NamedShardings for a tree whose leaves carry flax logical-axis boxes."""
  logical_specs = nn.get_partition_spec(abstract_boxed_tree)
  return nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_AXIS_RULES)


def sharded_shapes(abstract_boxed_tree: Any, mesh: Mesh) -> Any:
  """The tree's leaves as ShapeDtypeStructs placed on `mesh` by the logical-axis rules: what
  restoring, lowering or compiling from shapes alone takes."""
  return jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                      nn.unbox(abstract_boxed_tree), logical_shardings(abstract_boxed_tree, mesh))


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each process's rows into global arrays sharded over the batch axes.

  Args:
    local_batch: this process's rows, e.g. src_tokens int32[global_batch / processes, len].
  """
  sharding = batch_sharding(mesh)
  return {
      name: jax.make_array_from_process_local_data(sharding, value)
      for name, value in local_batch.items()
  }


def log_topology(mesh: Mesh) -> None:
  logging.info(
      "process %d of %d; %d local / %d global devices (%s); mesh %s",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
      jax.devices()[0].platform,
      dict(mesh.shape),
  )


@contextlib.contextmanager
def mesh_context(mesh: Mesh) -> Iterator[None]:
  """`mesh` as the current mesh, with the logical-axis rules in force."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
    yield


def in_mesh(jitted: Callable, mesh: Mesh) -> Callable:
  """`jitted` called (and, through `.lower(*args)`, lowered) inside `mesh_context(mesh)`."""

  @functools.wraps(jitted)
  def call(*args):
    with mesh_context(mesh):
      return jitted(*args)

  def lower(*args) -> jax.stages.Lowered:
    with mesh_context(mesh):
      return jitted.lower(*args)

  call.lower = lower
  return call


def bytes_per_device(tree: Any) -> int:
  """Bytes the most loaded device holds of `tree`: arrays or ShapeDtypeStructs with shardings.

  A leaf split n ways costs each device its shard (`shard_shape`); a replicated
  leaf costs every device all of it. Works on an abstract mesh
  (`jax.sharding.AbstractMesh`), so a pod's layout can be sized on a laptop.
  """
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total
