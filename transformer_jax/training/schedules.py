"""The optimizer: Adam on a learning-rate schedule, the paper's (§5.3) or two common alternatives.

`OptimizerConfig` is the typed, validated form of an experiment config's optimizer keys;
`make_optimizer` and `make_schedule` take it, never the config itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import optax

from transformer_jax.errors import UserError

SCHEDULES = ("paper", "linear_rsqrt", "linear_cosine")
# Schedules whose values depend on config.num_train_steps (after the warm-up).
USES_STEP_COUNT = ("linear_cosine",)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Adam(β1, β2, ε) on a schedule, with optional global-norm clipping (§5.3 by default).

  Attributes:
    schedule: one of SCHEDULES.
    warmup_steps: steps of the warm-up.
    learning_rate_scale: "paper" only: multiplies d_model^-0.5 · min(step^-0.5, ...).
    learning_rate: the peak of the other schedules.
    d_model: the model width, which sets the paper schedule's peak.
    num_train_steps: where "linear_cosine" reaches zero.
    adam_b1, adam_b2, adam_eps: Adam's β1, β2 and ε.
    grad_clip_norm: > 0 clips the gradient's global norm to it.
  """

  schedule: str = "paper"
  warmup_steps: int = 4000
  learning_rate_scale: float = 1.0
  learning_rate: float = 7e-4
  d_model: int = 512
  num_train_steps: int = 100_000
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  grad_clip_norm: float = 0.0

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise UserError(f"config.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if self.warmup_steps < 1:
      raise UserError(f"config.warmup_steps={self.warmup_steps} must be at least 1")
    for name in ("adam_b1", "adam_b2"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise UserError(f"config.{name}={getattr(self, name)} must be in [0, 1)")
    if self.adam_eps <= 0 or self.grad_clip_norm < 0:
      raise UserError(f"config.adam_eps={self.adam_eps} must be > 0 and "
                      f"config.grad_clip_norm={self.grad_clip_norm} >= 0 (0: no clipping)")

  # Read from elsewhere in an experiment config (config.model.d_model, the loop's step count),
  # not from keys of their own.
  SHARED_FIELDS = ("d_model", "num_train_steps")

  @classmethod
  def config_defaults(cls) -> dict[str, Any]:
    """The experiment config's optimizer keys at their defaults (each written once, here)."""
    return {field.name: field.default for field in dataclasses.fields(cls)
            if field.name not in cls.SHARED_FIELDS}

  @classmethod
  def from_config(cls, config: Any) -> "OptimizerConfig":
    """The optimizer keys of an experiment config (and its model's width), validated."""
    return cls(schedule=config.schedule, warmup_steps=int(config.warmup_steps),
               learning_rate_scale=float(config.learning_rate_scale),
               learning_rate=float(config.learning_rate), d_model=int(config.model.d_model),
               num_train_steps=int(config.num_train_steps), adam_b1=float(config.adam_b1),
               adam_b2=float(config.adam_b2), adam_eps=float(config.adam_eps),
               grad_clip_norm=float(config.grad_clip_norm))

  @property
  def uses_step_count(self) -> bool:
    """Whether the schedule's values depend on num_train_steps (it is compiled into the step)."""
    return self.schedule in USES_STEP_COUNT


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


def make_schedule(optimizer: OptimizerConfig) -> optax.Schedule:
  """The schedule `optimizer.schedule` names."""
  if optimizer.schedule == "paper":
    return paper_schedule(optimizer.d_model, optimizer.warmup_steps, optimizer.learning_rate_scale)
  if optimizer.schedule == "linear_rsqrt":
    return linear_warmup_rsqrt(optimizer.learning_rate, optimizer.warmup_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=optimizer.learning_rate,
      warmup_steps=optimizer.warmup_steps,
      decay_steps=max(optimizer.num_train_steps, optimizer.warmup_steps + 1),
  )


def make_optimizer(optimizer: OptimizerConfig) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) (§5.3) on the schedule, with optional global-norm clipping."""
  adam = optax.adam(
      learning_rate=make_schedule(optimizer),
      b1=optimizer.adam_b1,
      b2=optimizer.adam_b2,
      eps=optimizer.adam_eps,
  )
  if optimizer.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optimizer.grad_clip_norm), adam)
  return adam
