"""Fixtures for the data tests: the real data folder and prepared corpora."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def real_data_root() -> Path | None:
  """$TRANSFORMER_JAX_DATA_DIR, else ../shared/data beside the repository."""
  for candidate in (os.environ.get("TRANSFORMER_JAX_DATA_DIR"),
                    Path(__file__).resolve().parents[2] / ".." / "shared" / "data"):
    if candidate and (Path(candidate) / "multi30k" / "train.en").is_file():
      return Path(candidate).resolve()
  return None


@pytest.fixture(scope="session")
def real_data() -> Path:
  root = real_data_root()
  if root is None:
    pytest.skip("real data not found: set TRANSFORMER_JAX_DATA_DIR to the folder "
                "holding multi30k/ (CI has it at ../shared/data)")
  return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
  """One prepared_dir for the session, so corpora are prepared once."""
  return tmp_path_factory.mktemp("prepared")


@pytest.fixture(scope="session")
def multi30k(real_data, cache_dir):
  from transformer_jax.data import pipeline
  return pipeline.load_dataset({"dataset": "multi30k", "data_dir": str(real_data),
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
