"""Inverted dropout (§5.4) from 16 random bits per element.

flax's `nn.Dropout` draws a 32-bit uniform number for every element; the
threefry hash that makes those bits is most of dropout's cost (about 7 % of
the small model's train step on a 2-core CPU). A 16-bit number is enough to
decide keep or drop, so each 32-bit draw here serves two elements and
dropout costs about half as much. The rate is rounded to a multiple of
2^-16 (0.1 becomes 0.10000610) and kept values are scaled by the inverse of
that exact keep probability, so the expected output equals the input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

Array = jax.Array

_LEVELS = 1 << 16


def keep_mask(key: Array, shape: tuple[int, ...], rate: float) -> tuple[Array, float]:
  """(bool[shape] true where an element is kept, the exact keep probability)."""
  drop_levels = round(rate * _LEVELS)
  last = shape[-1] if shape else 1
  words = jax.random.bits(key, (*shape[:-1], (last + 1) // 2), jnp.uint32)
  # Both 16-bit halves of each word, interleaved along the last axis.
  halves = jnp.stack([words >> 16, words & 0xFFFF], axis=-1).reshape(*shape[:-1], -1)
  halves = halves[..., :last].reshape(shape)
  return halves >= drop_levels, (_LEVELS - drop_levels) / _LEVELS


class Dropout(nn.Module):
  """Drop elements with probability `rate` in training; the identity otherwise.

  Same interface as flax.linen.Dropout (rng stream "dropout").
  """

  rate: float
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if deterministic or self.rate == 0.0:
      return inputs
    if self.rate >= 1.0:
      return jnp.zeros_like(inputs)
    keep, keep_probability = keep_mask(self.make_rng("dropout"), inputs.shape, self.rate)
    scale = jnp.asarray(1.0 / keep_probability, inputs.dtype)
    return jnp.where(keep, inputs * scale, jnp.zeros_like(inputs))
