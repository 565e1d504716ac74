"""transformer_jax.dropout: the drop rate, unbiasedness and determinism of 16-bit dropout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.dropout import Dropout, keep_mask


@pytest.mark.parametrize("rate", [0.1, 0.3])
@pytest.mark.parametrize("shape", [(64, 32, 256), (8, 4, 31, 33)])  # Odd last axis too.
def test_drop_rate_and_mean_match_the_rate(rate, shape):
  inputs = jnp.ones(shape)
  outputs = Dropout(rate).apply({}, inputs, deterministic=False,
                                rngs={"dropout": jax.random.key(0)})
  kept = np.asarray(outputs != 0)
  n = kept.size
  # Binomial: 5 standard deviations.
  assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n), kept.mean()
  assert abs(float(outputs.mean()) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / n)
  np.testing.assert_allclose(np.unique(np.asarray(outputs)), [0.0, 1 / (1 - round(rate * 65536) / 65536)],
                             rtol=1e-6)


def test_the_two_halves_of_a_word_are_independent():
  keep, _ = keep_mask(jax.random.key(1), (4096, 64), 0.5)
  keep = np.asarray(keep)
  even, odd = keep[:, 0::2].ravel(), keep[:, 1::2].ravel()
  both = np.mean(even & odd)
  assert abs(both - 0.25) < 5 * np.sqrt(0.25 * 0.75 / even.size), both


def test_deterministic_is_identity_and_keys_decide_the_mask():
  inputs = jax.random.normal(jax.random.key(2), (16, 40))
  np.testing.assert_array_equal(Dropout(0.1).apply({}, inputs, deterministic=True), inputs)
  apply = lambda seed: np.asarray(Dropout(0.1).apply(
      {}, inputs, deterministic=False, rngs={"dropout": jax.random.key(seed)}))
  np.testing.assert_array_equal(apply(3), apply(3))
  assert not np.array_equal(apply(3), apply(4))
  assert np.all(Dropout(1.0).apply({}, inputs, deterministic=False,
                                   rngs={"dropout": jax.random.key(0)}) == 0)
