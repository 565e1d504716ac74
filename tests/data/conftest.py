"""Fixtures for the data tests: prepared corpora (the real data folder is tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
  """One prepared_dir for the session, so corpora are prepared once."""
  return tmp_path_factory.mktemp("prepared")


@pytest.fixture(scope="session")
def multi30k(data_dir, cache_dir):
  from transformer_jax.data import pipeline
  return pipeline.load_dataset({"dataset": "multi30k", "data_dir": str(data_dir),
                                "prepared_dir": str(cache_dir)})


@pytest.fixture(scope="session")
def small_generated(cache_dir):
  """A small toy corpus (3,000 train pairs) with a small vocabulary."""
  from transformer_jax.data import pipeline
  return pipeline.load_dataset({"dataset": "generated_translation",
                                "num_generated_train": 3_000,
                                "num_generated_eval": 200, "vocab_size": 600,
                                "tokens_per_batch": 1_024, "max_len": 48,
                                "prepared_dir": str(cache_dir)})
