"""What one device holds during training: parameters, optimizer state and the step's temporaries.

`state_bytes` needs no devices: on a `jax.sharding.AbstractMesh` of any size it
sizes a pod's layout from shapes and the sharding rules alone. `step_bytes`
compiles the real train step for one batch shape on this process's devices
(simulated ones on a CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)
and reads XLA's memory analysis of it; `lower_train_step` lowers it for any
devices, a TPU or GPU target's included (`transformer_jax.hardware`).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import AbstractMesh, Mesh

from transformer_jax import sharding
from transformer_jax.errors import UserError
from transformer_jax.training.config import LoopConfig
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer, make_schedule
from transformer_jax.training.state import InitParams, TrainState, abstract_train_state
from transformer_jax.training.step import LossFn, compile_steps


def abstract_mesh(sizes: dict[str, int]) -> AbstractMesh:
  """A (data, fsdp, tensor) mesh of the given sizes, with no devices behind it."""
  return AbstractMesh(tuple(int(sizes[axis]) for axis in sharding.MESH_AXES), sharding.MESH_AXES)


def state_bytes(config: ml_collections.ConfigDict, init_params: InitParams,
                mesh: Mesh | AbstractMesh) -> dict[str, int]:
  """{'params', 'opt_state'}: bytes on the most loaded device, and the unsharded totals."""
  state = abstract_train_state(init_params, make_optimizer(OptimizerConfig.from_config(config)),
                               mesh)
  result = {}
  for name in ("params", "opt_state"):
    tree = getattr(state, name)
    result[name] = sharding.bytes_per_device(tree)
    result[f"{name}_total"] = sum(math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
                                  for leaf in jax.tree.leaves(tree))
  return result


def batch_shape(config: ml_collections.ConfigDict, mesh: Mesh) -> tuple[int, int]:
  """(rows, length) of the largest training batch: rows of data.max_len within the token budget."""
  length = int(config.data.max_len)
  shards = sharding.batch_shards(mesh)
  rows = (int(config.data.tokens_per_batch) // length) // shards * shards
  if rows < 1:
    raise UserError(f"data.tokens_per_batch={config.data.tokens_per_batch} holds no row of "
                    f"{length} tokens per batch shard ({shards}); raise it")
  return rows, length


def lower_train_step(config: ml_collections.ConfigDict, init_params: InitParams,
                     loss_fn: LossFn, batch_keys: Sequence[str], mesh: Mesh,
                     rows: int | None = None) -> tuple[jax.stages.Lowered, TrainState]:
  """The real train step lowered on `mesh` for a batch of `rows` rows (None: `batch_shape`'s)
  of data.max_len tokens, from abstract arguments only: no array is allocated, so `mesh` may
  hold a TPU slice's or a GPU node's compile-only devices. Packed data adds its segment-id
  and position arrays. Returns (lowered, the abstract state it takes)."""
  optimizer_config = OptimizerConfig.from_config(config)
  optimizer = make_optimizer(optimizer_config)
  state = abstract_train_state(init_params, optimizer, mesh)
  shardings = jax.tree.map(lambda leaf: leaf.sharding, state)
  train_step, _ = compile_steps(loss_fn, optimizer, make_schedule(optimizer_config),
                                LoopConfig.from_config(config), mesh, shardings)
  if rows is None:
    rows, _ = batch_shape(config, mesh)
  length = int(config.data.max_len)
  keys = [k for k in batch_keys if config.data.pack or not k.endswith(("segment_ids", "positions"))]
  batch = {key: jax.ShapeDtypeStruct((rows, length), jnp.int32,
                                     sharding=sharding.batch_sharding(mesh)) for key in keys}
  return train_step.lower(state, batch), state


def step_bytes(config: ml_collections.ConfigDict, init_params: InitParams, loss_fn: LossFn,
               batch_keys: Sequence[str], mesh: Mesh) -> dict[str, int]:
  """XLA's memory analysis of the compiled train step on `mesh` (bytes per device).

  Returns {'temporaries', 'arguments', 'outputs', 'rows', 'length'} for one
  batch of `batch_shape` rows.
  """
  rows, length = batch_shape(config, mesh)
  lowered, _ = lower_train_step(config, init_params, loss_fn, batch_keys, mesh, rows)
  analysis = lowered.compile().memory_analysis()
  return dict(temporaries=int(analysis.temp_size_in_bytes),
              arguments=int(analysis.argument_size_in_bytes),
              outputs=int(analysis.output_size_in_bytes), rows=rows, length=length)
