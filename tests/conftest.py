"""Shared test fixtures: tiny configs and the location of the real data."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import tempfile


def _cheap_compile_flags() -> str:
  """XLA:CPU flags that make compiles cheaper; tiny models compile far longer than they run.

  With the fusion emitters off (the older elemental emitter) the suite's summed test time
  fell by a fifth. At the default optimisation level the same flag compiles and runs a
  training step slower, so it is a test setting only. XLA aborts on a flag it does not
  know, so that one is passed only to the jaxlib it was measured with.
  """
  flags = ["--xla_backend_optimization_level=0"]
  if importlib.metadata.version("jaxlib").startswith("0.10."):
    flags.append("--xla_cpu_use_fusion_emitters=false")
  return " ".join(flags)


# Before JAX is imported anywhere: 8 simulated CPU devices for the sharding
# tests, cheaper XLA compiles, and one persistent compilation cache shared by
# the test processes (subprocesses inherit all three).
os.environ.setdefault(
    "XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {_cheap_compile_flags()}"
)
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "transformer_jax_test_jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# The tests run on the CPU; with the [aot] extra installed and no GPU, JAX keeps the CUDA
# plugin's compiler (tests/hardware/ compiles for GPU targets) only when told the platform.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu locks /tmp/libtpu_lockfile for one process at a time; compiling needs no TPU.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def shared_data_dir() -> pathlib.Path | None:
  """The real corpora: $TRANSFORMER_JAX_DATA_DIR, else ../shared/data beside the repo."""
  candidates = [os.environ.get("TRANSFORMER_JAX_DATA_DIR"), REPO_ROOT.parent / "shared" / "data"]
  for candidate in candidates:
    if candidate and (pathlib.Path(candidate) / "multi30k").is_dir():
      return pathlib.Path(candidate)
  return None


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """The real corpora, or a skip that says how to provide them."""
  found = shared_data_dir()
  if found is None:
    pytest.skip(
        "real data not found: set TRANSFORMER_JAX_DATA_DIR to the folder holding "
        "multi30k/ (CI has it at ../shared/data)"
    )
  return found


@pytest.fixture
def tiny_model_config():
  from transformer_jax.model.config import default_model_config

  config = default_model_config()
  config.update(dict(vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64))
  return config


@pytest.fixture
def step_by_step_logits():
  """Teacher-forced logits [batch, target_len, vocab] from the KV-cached decoder, one token a step.

  Called as `step_by_step_logits(model, params, src_tokens, decoder_inputs)` inside or
  outside jit; the full forward pass should give the same logits. With
  `return_cache=True`, (logits, the cache after the last step).
  """
  import jax.numpy as jnp

  from transformer_jax.decode import cache as kv_cache
  from transformer_jax.model.transformer import Transformer

  def run(model, params, src_tokens, decoder_inputs, return_cache=False):
    encoded = model.apply({"params": params}, src_tokens, method=Transformer.encode)
    cache = kv_cache.init_cache(model, params, encoded, src_tokens, decoder_inputs.shape[1])
    step_fn = kv_cache.step_logits(model, params, src_tokens)
    logits = []
    for step in range(decoder_inputs.shape[1]):
      step_logits, cache = step_fn(decoder_inputs[:, step : step + 1], cache, step)
      logits.append(step_logits)
    logits = jnp.stack(logits, axis=1)
    return (logits, cache) if return_cache else logits

  return run
