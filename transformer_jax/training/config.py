"""The training loop's section of an experiment config: one frozen dataclass, validated once.

`LoopConfig.from_config(config)` reads the loop's keys of an experiment
config (they stand at its top level: `--config.num_train_steps=N`); the loop,
the step and the time budget take the result, never the config itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer_jax.errors import UserError

_POSITIVE = ("num_train_steps", "gradient_accumulation_steps", "log_every_steps",
             "eval_every_steps", "checkpoint_every_steps", "keep_checkpoints")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How long to train, and when to log, evaluate and save.

  Attributes:
    seed: parameter initialisation and dropout.
    num_train_steps: the steps of the run (a time budget may choose fewer, once).
    train_minutes: > 0: stop within this many minutes of training; the step count is fixed
      once, halfway through the warm-up, from the measured speed (training/budget.py).
    gradient_accumulation_steps: batches summed into one update.
    log_every_steps, eval_every_steps, checkpoint_every_steps: the periods, in steps.
    checkpoint_every_minutes: also save when this long has passed since the last save (§6.1:
      the paper saved every 10 minutes).
    keep_checkpoints: the newest checkpoints kept on disk.
    async_checkpoints: write checkpoints while training goes on.
  """

  seed: int = 0
  num_train_steps: int = 100_000
  train_minutes: float = 0.0
  gradient_accumulation_steps: int = 1
  log_every_steps: int = 100
  eval_every_steps: int = 1000
  checkpoint_every_steps: int = 1000
  checkpoint_every_minutes: float = 10.0
  keep_checkpoints: int = 5
  async_checkpoints: bool = True

  def __post_init__(self):
    for key in _POSITIVE:
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"config.{key}={value!r} must be a positive integer")
    if self.train_minutes < 0:
      raise UserError(f"config.train_minutes={self.train_minutes!r} must be >= 0 (0: train "
                      "num_train_steps)")
    if self.checkpoint_every_minutes <= 0:
      raise UserError(f"config.checkpoint_every_minutes={self.checkpoint_every_minutes!r} must "
                      "be > 0")

  @classmethod
  def config_defaults(cls) -> dict[str, Any]:
    """The experiment config's loop keys at their defaults (each written once, here)."""
    return {field.name: field.default for field in dataclasses.fields(cls)}

  @classmethod
  def from_config(cls, config: Any) -> "LoopConfig":
    """The loop's keys of an experiment config (a ConfigDict or a mapping), validated."""
    values = {}
    for field in dataclasses.fields(cls):
      value = config[field.name]
      if field.type == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
      elif field.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
      values[field.name] = value
    return cls(**values)

  def with_step_count(self, num_train_steps: int) -> "LoopConfig":
    """This loop with another step count (a time budget's choice)."""
    return dataclasses.replace(self, num_train_steps=num_train_steps)
