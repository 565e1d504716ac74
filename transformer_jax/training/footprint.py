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
from typing import Any

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


BatchShapes = dict[str, tuple[tuple[int, ...], Any]]  # {key: (shape, dtype)}, a task's.


def lower_train_step(config: ml_collections.ConfigDict, init_params: InitParams,
                     loss_fn: LossFn, batch_shapes: BatchShapes, mesh: Mesh
                     ) -> tuple[jax.stages.Lowered, TrainState]:
  """The real train step lowered on `mesh` for a batch of `batch_shapes` (a task's
  `batch_shapes(rows)`), from abstract arguments only: no array is allocated, so `mesh` may
  hold a TPU slice's or a GPU node's compile-only devices. Returns (lowered, the abstract
  state it takes)."""
  optimizer_config = OptimizerConfig.from_config(config)
  optimizer = make_optimizer(optimizer_config)
  state = abstract_train_state(init_params, optimizer, mesh)
  shardings = jax.tree.map(lambda leaf: leaf.sharding, state)
  train_step, _ = compile_steps(loss_fn, optimizer, make_schedule(optimizer_config),
                                LoopConfig.from_config(config), mesh, shardings)
  batch = {key: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(mesh))
           for key, (shape, dtype) in batch_shapes.items()}
  return train_step.lower(state, batch), state


def step_bytes(config: ml_collections.ConfigDict, init_params: InitParams, loss_fn: LossFn,
               batch_shapes: BatchShapes, mesh: Mesh) -> dict[str, int]:
  """XLA's memory analysis of the compiled train step on `mesh` (bytes per device) for one
  batch of `batch_shapes`.

  Returns {'temporaries', 'arguments', 'outputs', 'rows'}.
  """
  lowered, _ = lower_train_step(config, init_params, loss_fn, batch_shapes, mesh)
  analysis = lowered.compile().memory_analysis()
  rows = next(iter(batch_shapes.values()))[0][0]
  return dict(temporaries=int(analysis.temp_size_in_bytes),
              arguments=int(analysis.argument_size_in_bytes),
              outputs=int(analysis.output_size_in_bytes), rows=rows)


def shard_rows(recipe_rows: int, mesh: Mesh) -> int:
  """The recipe's rows rounded down to a multiple of the mesh's batch shards; a one-line
  error where no row is left a shard."""
  shards = sharding.batch_shards(mesh)
  rows = recipe_rows // shards * shards
  if rows < 1:
    raise UserError(f"the recipe's batch of {recipe_rows} rows holds no row per batch shard "
                    f"({shards}); raise data.tokens_per_batch (or the task's batch size)")
  return rows
