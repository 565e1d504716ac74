"""Fixtures of the train-step tests: a one-layer translation config, synthetic batches, steps."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.configs import default_config
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training import loop
from transformer_jax.training.config import LoopConfig
from transformer_jax.training.schedules import OptimizerConfig


def _tiny_config():
  config = default_config()
  config.model.update(dict(vocab_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                           dropout_rate=0.0))
  config.warmup_steps = 10
  return config


def _synthetic_batch(rows=16, seed=0):
  rng = np.random.default_rng(seed)
  src = rng.integers(4, 64, size=(rows, 12)).astype(np.int32)
  tgt = rng.integers(4, 64, size=(rows, 10)).astype(np.int32)
  for row in range(rows):  # Varied lengths: EOS then PAD.
    src[row, 6 + row % 6 :] = 0
    src[row, 5 + row % 6] = 3
    tgt[row, 4 + row % 6 :] = 0
    tgt[row, 3 + row % 6] = 3
  return {"src_tokens": src, "target_tokens": tgt}


def _run_steps(config, mesh, batches, task_class=TranslationTask):
  task = task_class(config)
  _, state, train_fn, _ = loop.build_steps(LoopConfig.from_config(config),
                                           OptimizerConfig.from_config(config), task, mesh)
  for batch in batches:
    batch = {k: v for k, v in batch.items() if k in task.batch_keys}
    state, metrics = train_fn(state, sharding.global_batch(batch, mesh))
  return jax.device_get(state), jax.device_get(metrics)


@pytest.fixture
def tiny_config() -> Callable:
  """A fresh one-layer translation ConfigDict at d_model 32, without dropout."""
  return _tiny_config


@pytest.fixture
def synthetic_batch() -> Callable:
  """(rows, seed) -> {src_tokens, target_tokens}: int32 numpy rows of varied lengths."""
  return _synthetic_batch


@pytest.fixture
def run_steps() -> Callable:
  """(config, mesh, batches, task_class) -> the state and metrics after a train step per batch."""
  return _run_steps
