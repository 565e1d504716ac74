"""Learning-rate schedules: the paper's (§5.3), and two common alternatives."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from transformer_jax.errors import UserError

SCHEDULES = ("paper", "linear_rsqrt", "linear_cosine")
# Schedules whose values depend on config.num_train_steps (after the warm-up).
USES_STEP_COUNT = ("linear_cosine",)


def paper_schedule(d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)  (§5.3).

  `step` counts from 1 (optax passes the number of updates already applied,
  so update n uses step n + 1); the peak is at step == warmup_steps.
  """

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def linear_warmup_rsqrt(peak: float, warmup_steps: int) -> optax.Schedule:
  """Linear warm-up to `peak`, then peak · sqrt(warmup / step)."""

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return peak * jnp.minimum(step / warmup_steps, jnp.sqrt(warmup_steps / step))

  return schedule


def make_schedule(config) -> optax.Schedule:
  """The schedule named by `config.schedule` (one of SCHEDULES)."""
  name = config.schedule
  if name == "paper":
    return paper_schedule(config.model.d_model, config.warmup_steps, config.learning_rate_scale)
  if name == "linear_rsqrt":
    return linear_warmup_rsqrt(config.learning_rate, config.warmup_steps)
  if name == "linear_cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=max(config.num_train_steps, config.warmup_steps + 1),
    )
  raise UserError(f"config.schedule={name!r} is not one of {', '.join(SCHEDULES)}")


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) (§5.3) on the schedule, with optional global-norm clipping."""
  adam = optax.adam(
      learning_rate=make_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
  )
  if config.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adam)
  return adam
