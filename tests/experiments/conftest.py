"""Fixtures of the tests of experiments/: its scripts as modules, and the tiny config of a row."""

from __future__ import annotations

import pathlib
import types
from typing import Callable

import ml_collections
import pytest

from transformer_jax import configs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(relative: str) -> types.ModuleType:
  """A file of experiments/ as a module (registered, so its dataclasses resolve)."""
  return configs.load_module(REPO_ROOT / relative, relative.replace("/", "_")[:-3])


def _tiny_base() -> ml_collections.ConfigDict:
  """The tiny config at 6 steps, one batch shape (one compile per row)."""
  config = _load("experiments/configs/tiny.py").get_config()
  config.num_train_steps = 6
  config.log_every_steps = 2
  config.eval_every_steps = 3
  config.data.bucket_boundaries = (48,)
  config.beam_size = 2
  return config


@pytest.fixture(scope="session")
def experiment_module() -> Callable[[str], types.ModuleType]:
  """'experiments/ablations.py' -> that file as a module."""
  return _load


@pytest.fixture
def tiny_base() -> Callable[[], ml_collections.ConfigDict]:
  """() -> a fresh tiny config of 6 steps, evaluated at 3 and 6."""
  return _tiny_base
