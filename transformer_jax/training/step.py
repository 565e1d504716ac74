"""One jitted, sharded optimizer update, and the summed evaluation of a batch.

A task supplies the loss as a `LossFn`: (params, batch, train, dropout_key) ->
(loss_sum, sums), where `sums["tokens"]` counts what the loss is averaged over
and every other `<name>_sum` is reported as `<name>` = sum / tokens. The step
knows nothing else about the task.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.training.config import LoopConfig
from transformer_jax.training.state import TrainState

Batch = dict[str, jax.Array]
LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def averages(sums: dict[str, Any], xp: Any = jnp) -> dict[str, Any]:
  """{'loss': loss_sum / tokens, 'nll': ..., 'perplexity': exp(nll) if there is an nll}.

  `xp` is jax.numpy inside a jitted step, numpy (float64) for host-side totals.
  """
  tokens = xp.maximum(sums["tokens"], 1.0)
  means = {name[: -len("_sum")]: value / tokens for name, value in sums.items()
           if name.endswith("_sum")}
  if "nll" in means:
    means["perplexity"] = xp.exp(means["nll"])
  return means


def micro_batches(batch: Batch, count: int) -> Batch:
  """[B, ...] -> [count, B/count, ...]; micro-batch j takes rows j, j+count, ...

  Interleaved rows keep every micro-batch spread evenly over the batch shards.
  """
  return jax.tree.map(
      lambda x: x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1), batch
  )


def train_step(
    state: TrainState, batch: Batch, *, loss_fn: LossFn, optimizer: optax.GradientTransformation,
    schedule: optax.Schedule, seed: int, accumulation_steps: int,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from `batch` (accumulated over micro-batches if asked).

  Gradients are of the loss summed over all target tokens of the global batch,
  divided by their count once, so k micro-batches equal one batch exactly.
  """
  dropout_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 1), state.step)
  grad_fn = jax.grad(loss_fn, has_aux=True)
  if accumulation_steps == 1:
    grads, sums = grad_fn(state.params, batch, train=True, dropout_key=dropout_key)
  else:
    def accumulate(carry, micro):
      index, micro_batch = micro
      grads, sums = grad_fn(state.params, micro_batch, train=True,
                            dropout_key=jax.random.fold_in(dropout_key, index))
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    abstract_sums = jax.eval_shape(lambda: grad_fn(state.params, batch, True, dropout_key)[1])
    zeros = jax.tree.map(jnp.zeros_like, (state.params, abstract_sums))
    (grads, sums), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(accumulation_steps), micro_batches(batch, accumulation_steps))
    )
  tokens = jnp.maximum(sums["tokens"], 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  new_state = state.replace(
      step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
  )
  metrics = dict(averages(sums), learning_rate=schedule(state.step),
                 grad_norm=optax.tree.norm(grads), tokens=sums["tokens"])
  return new_state, metrics


def eval_step(params: Any, batch: Batch, *, loss_fn: LossFn) -> dict[str, jax.Array]:
  """The task's summed quantities (loss_sum, tokens, ...) over one evaluation batch."""
  _, sums = loss_fn(params, batch, train=False, dropout_key=None)
  return sums


def sum_over_batches(eval_fn: Callable, params: Any, batches: Any, mesh: Mesh,
                     batch_keys: tuple[str, ...]) -> dict[str, float]:
  """The summed quantities of `eval_fn(params, batch)` over `batches` (this host's rows), added up."""
  totals: dict[str, float] = {}
  for batch in batches:
    batch = {k: v for k, v in batch.items() if k in batch_keys}
    sums = jax.device_get(eval_fn(params, sharding.global_batch(batch, mesh)))
    totals = {k: totals.get(k, 0.0) + float(v) for k, v in sums.items()}
  return totals


def compile_steps(
    loss_fn: LossFn, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
    loop_config: LoopConfig, mesh: Mesh, state_shardings: Any,
) -> tuple[Callable, Callable]:
  """Jitted (train_step, eval_step) with explicit shardings and a donated state.

  `loop_config` gives `seed` (dropout keys) and `gradient_accumulation_steps`.
  Each returned function runs inside the mesh and its logical-axis rules; its
  `.lower(*args)` gives the compiled computation for inspection.
  """
  batch_sharding = sharding.batch_sharding(mesh)
  replicated = sharding.replicated(mesh)
  jitted_train = jax.jit(
      functools.partial(train_step, loss_fn=loss_fn, optimizer=optimizer, schedule=schedule,
                        seed=loop_config.seed,
                        accumulation_steps=loop_config.gradient_accumulation_steps),
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, replicated),
      donate_argnums=0,
  )
  jitted_eval = jax.jit(
      functools.partial(eval_step, loss_fn=loss_fn),
      in_shardings=(state_shardings.params, batch_sharding),
      out_shardings=replicated,
  )
  return sharding.in_mesh(jitted_train, mesh), sharding.in_mesh(jitted_eval, mesh)
