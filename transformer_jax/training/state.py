"""The TrainState and its creation: concrete on a mesh, or abstract for restoring."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct
from jax.sharding import Mesh

from transformer_jax import sharding

# key -> the model's parameters, boxed with logical axis names (`model.init(...)["params"]`).
InitParams = Callable[[jax.Array], Any]


class TrainState(struct.PyTreeNode):
  """Everything that changes during training (a pytree; checkpointed whole)."""

  step: jax.Array
  params: Any
  opt_state: Any


def initial_state_fn(init_params: InitParams, optimizer: optax.GradientTransformation) -> Callable:
  """key -> the initial TrainState, its parameters boxed with logical axis names."""

  def init(key: jax.Array) -> TrainState:
    params = init_params(key)
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=optimizer.init(params))

  return init


def create_train_state(
    init_params: InitParams, optimizer: optax.GradientTransformation, mesh: Mesh, seed: int
) -> tuple[TrainState, Any]:
  """Initialises the state directly into its shardings on `mesh`.

  Returns:
    (state, state_shardings).
  """
  init = initial_state_fn(init_params, optimizer)
  init_key = jax.random.fold_in(jax.random.key(seed), 0)
  shardings = sharding.logical_shardings(jax.eval_shape(init, init_key), mesh)
  state = jax.jit(lambda key: nn.unbox(init(key)), out_shardings=shardings)(init_key)
  return state, shardings


def abstract_train_state(
    init_params: InitParams, optimizer: optax.GradientTransformation, mesh: Mesh
) -> TrainState:
  """ShapeDtypeStructs (with shardings on `mesh`) of the TrainState, for restoring."""
  boxed = jax.eval_shape(initial_state_fn(init_params, optimizer), jax.random.key(0))
  return sharding.sharded_shapes(boxed, mesh)
