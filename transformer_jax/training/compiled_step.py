"""A train step compiled ahead of time, kept in the run directory and loaded instead of compiling.

`python -m transformer_jax.precompile --workdir=RUN` compiles the step for a
target (a TPU slice from a CPU host, say) and `save`s the executable
(`jax.experimental.serialize_executable`) beside a record of what it was
compiled for. `train` on that run calls `with_saved_step` on its own jitted
step: where the devices, mesh and config match the record, batches of the
recorded shape run the saved executable, so the first step compiles nothing;
batches of any other shape, and any mismatch, take the jitted step as before.
Save from a process that compiled nothing else: XLA:CPU reuses kernels between the
programs one process compiles, and a CPU executable that reused one serializes without
it (the precompile command compiles one step a process).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from typing import Any, Callable

import jax
from absl import logging
from jax.experimental import serialize_executable
from jax.sharding import Mesh

FOLDER = "compiled"
EXECUTABLE = "train_step.bin"
RECORD = "train_step.json"
# Keys that change what the host does around the step, not the step itself.
HOST_SIDE_KEYS = ("cpu_devices", "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
                  "checkpoint_every_minutes", "keep_checkpoints", "async_checkpoints",
                  "average_last_checkpoints", "final_eval_split", "init_from")


def config_digest(run_config: dict) -> str:
  """A hash of everything in a run's config that the compiled step depends on.

  `run_config`: the config as the run records it (`Task.run_config()`: the vocabulary the
  tokenizer decided included), so that a step compiled for another vocabulary never loads.
  """
  values = dict(run_config)
  for key in HOST_SIDE_KEYS:
    values.pop(key, None)
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def devices_record(mesh: Mesh) -> dict[str, Any]:
  """What an executable needs of its devices: platform, kind, count and mesh shape."""
  device = mesh.devices.flat[0]
  return dict(platform=device.platform, device_kind=device.device_kind,
              devices=int(mesh.devices.size), mesh=dict(mesh.shape), jax=jax.__version__)


def _batch_shapes(batch: dict[str, Any]) -> dict[str, list[int]]:
  return {key: list(value.shape) for key, value in sorted(batch.items())}


def save(compiled: jax.stages.Compiled, workdir: str, run_config: dict) -> str:
  """Writes a compiled train step and its record into `workdir`/compiled/; returns the path."""
  folder = os.path.join(workdir, FOLDER)
  os.makedirs(folder, exist_ok=True)
  (_, batch_info), _ = compiled.args_info
  mesh = jax.tree.leaves(compiled.input_shardings)[0].mesh
  record = dict(config_digest=config_digest(run_config), batch=_batch_shapes(batch_info),
                **devices_record(mesh))
  path = os.path.join(folder, EXECUTABLE)
  with open(path + ".tmp", "wb") as f:
    pickle.dump(serialize_executable.serialize(compiled), f)
  os.replace(path + ".tmp", path)
  with open(os.path.join(folder, RECORD), "w") as f:
    json.dump(record, f, indent=1)
  return path


def load(workdir: str, run_config: dict, mesh: Mesh
         ) -> tuple[Any, dict[str, list[int]]] | None:
  """(the saved executable, the batch shapes it takes), or None where `workdir` holds none or
  one compiled for other devices, another mesh or another config (the reason is logged)."""
  folder = os.path.join(workdir, FOLDER)
  if not os.path.exists(os.path.join(folder, RECORD)):
    return None
  with open(os.path.join(folder, RECORD)) as f:
    record = json.load(f)
  wanted = dict(config_digest=config_digest(run_config), **devices_record(mesh))
  differ = [key for key, value in wanted.items() if record.get(key) != value]
  if differ:
    logging.warning("%s: not used, compiled for another %s; compiling the step here",
                    os.path.join(folder, EXECUTABLE), " and ".join(differ))
    return None
  with open(os.path.join(folder, EXECUTABLE), "rb") as f:
    payload, in_tree, out_tree = pickle.load(f)
  executable = serialize_executable.deserialize_and_load(
      payload, in_tree, out_tree, execution_devices=list(mesh.devices.flat))
  return executable, record["batch"]


def with_saved_step(train_fn: Callable, workdir: str, run_config: dict, mesh: Mesh) -> Callable:
  """`train_fn`, with batches of the saved executable's shape run by that executable."""
  loaded = load(workdir, run_config, mesh)
  if loaded is None:
    return train_fn
  executable, shapes = loaded
  logging.info("train step: the executable saved in %s for batches of %s", workdir, shapes)

  def step(state, batch):
    if _batch_shapes(batch) == shapes:
      return executable(state, batch)
    return train_fn(state, batch)

  return step
