"""Positional encodings: sinusoids (§3.5) or learned embeddings (Table 3 E) added to the
token embeddings, or rotary positions (RoPE) applied to each self-attention's queries and keys."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

Array = jax.Array

POSITION_KINDS = ("sinusoidal", "learned", "none", "rope", "alibi", "t5_bias")
# Kinds that add nothing to the embeddings ("rope" turns queries and keys, "alibi" and
# "t5_bias" bias the attention scores instead).
ADDS_NOTHING = ("none", "rope", "alibi", "t5_bias")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")


def sinusoidal_encoding(positions: Array, d_model: int, layout: str = "interleaved") -> Array:
  """PE(pos, 2i) = sin(pos/10000^(2i/d)), PE(pos, 2i+1) = cos(pos/10000^(2i/d)).

  Args:
    positions: int[..., length], the absolute position of each token.
    d_model: encoding width (even).
    layout: "interleaved" (the paper's formula above) or "concatenated": the
      same sines in channels [0, d/2) and cosines in [d/2, d) (Marian, fairseq).

  Returns:
    float32[..., length, d_model].
  """
  two_i = np.arange(0, d_model, 2, dtype=np.float32)
  inverse_frequency = jnp.asarray(1.0 / (10000.0 ** (two_i / d_model)))
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequency
  if layout == "concatenated":
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  encoding = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return encoding.reshape(*angles.shape[:-1], d_model)


class PositionalEncoding(nn.Module):
  """Adds position information to token embeddings.

  Attributes:
    kind: "sinusoidal" (the paper), "learned", "none" or "rope" (nothing added here:
      `rotary` turns each self-attention's queries and keys).
    d_model: embedding width.
    max_len: number of learned positions (only for "learned").
    sinusoid_layout: see `sinusoidal_encoding`.
  """

  kind: str
  d_model: int
  max_len: int
  sinusoid_layout: str = "interleaved"

  @nn.compact
  def __call__(self, embeddings: Array, positions: Array) -> Array:
    """embeddings: [batch, length, d_model]; positions: int[batch, length]."""
    if self.kind in ADDS_NOTHING:
      return embeddings
    if self.kind == "sinusoidal":
      encoding = sinusoidal_encoding(positions, self.d_model, self.sinusoid_layout)
    else:
      if positions.shape[-1] > self.max_len:  # jnp.take would fill the rows past it with NaN.
        raise ValueError(f"{positions.shape[-1]} positions exceed the {self.max_len} learned "
                         "ones; raise max_len")
      table = self.param(
          "position_embedding",
          nn.with_logical_partitioning(
              nn.initializers.normal(stddev=self.d_model**-0.5),
              (None, "embed"),
          ),
          (self.max_len, self.d_model),
      )
      encoding = jnp.take(table, positions, axis=0)
    return embeddings + encoding.astype(embeddings.dtype)


def rotary_dims(depth: int, fraction: float) -> int:
  """The channels of a head of `depth` that rotary positions turn: `fraction` of them, even."""
  return int(depth * fraction) // 2 * 2


def rotary(x: Array, positions: Array, theta: float, fraction: float = 1.0) -> Array:
  """Rotary position embedding (RoPE; Su et al., 2021) of queries or keys.

  Channel pairs (i, i + r/2) of the first r = `rotary_dims(depth, fraction)` channels of
  each head turn by the angle position · θ^(-2i/r) (GPT-NeoX's layout); the other channels
  pass unchanged. A query at position m and a key at position n then score
  q·R(n - m)·k: the product depends on their offset only.

  Args:
    x: [batch, length, heads, depth].
    positions: int[batch, length].
  """
  rotated = rotary_dims(x.shape[-1], fraction)
  half = rotated // 2
  inverse_frequency = jnp.asarray(
      theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rotated), jnp.float32)
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequency  # [batch, length, half]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  first = x[..., :half].astype(jnp.float32)
  second = x[..., half:rotated].astype(jnp.float32)
  turned = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return jnp.concatenate([turned.astype(x.dtype), x[..., rotated:]], axis=-1)


def alibi_slopes(num_heads: int) -> tuple[float, ...]:
  """ALiBi's per-head slopes (Press et al., 2022): 2^(-8h/n) for h = 1..n where n = num_heads
  is a power of two; otherwise those of the nearest lower power of two n', then every other
  slope of 2n' heads (the paper's code)."""
  def powers_of_two(n: int) -> list[float]:
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

  lower = 2 ** int(np.floor(np.log2(num_heads)))
  slopes = powers_of_two(lower)
  if lower < num_heads:
    slopes += powers_of_two(2 * lower)[0::2][:num_heads - lower]
  return tuple(slopes)


def alibi_bias(slopes: tuple[float, ...], distance: Array) -> Array:
  """float32[batch or 1, heads, q, k]: -m_h·|distance| from int[batch or 1, 1, q, k] query-key
  position differences (causal attention sees distance >= 0 only)."""
  return -jnp.asarray(slopes, jnp.float32)[None, :, None, None] * jnp.abs(distance).astype(
      jnp.float32)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
  """T5's bucket of each key-minus-query position (Raffel et al., 2020; its
  `_relative_position_bucket`): exact buckets for the nearest distances, logarithmic ones up
  to `max_distance`, and the last bucket beyond. Bidirectional buckets split between keys
  before and after the query; unidirectional ones put every later key with distance 0."""
  buckets = jnp.zeros_like(relative_position)
  distance = -relative_position
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (distance < 0).astype(relative_position.dtype) * num_buckets
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  max_exact = num_buckets // 2
  logarithmic = max_exact + (
      jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
      / np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(distance.dtype)
  logarithmic = jnp.minimum(logarithmic, num_buckets - 1)
  return buckets + jnp.where(distance < max_exact, distance, logarithmic)


class RelativeBias(NamedTuple):
  """T5's learned bias of one stack: its table float32[buckets, heads] and how it buckets."""

  table: Array
  bidirectional: bool  # An encoder's: keys after the query have buckets of their own.
  max_distance: int

  def dense(self, distance: Array) -> Array:
    """float32[batch or 1, heads, q, k] for query-minus-key positions int[batch or 1, 1, q, k]."""
    return relative_bias(self.table, distance, self.bidirectional, self.max_distance)

  def buckets(self, distance: Array) -> Array:
    """int[batch or 1, q, k]: the bucket of each query-minus-key position difference."""
    return relative_position_bucket(-distance[:, 0], self.bidirectional, self.table.shape[0],
                                    self.max_distance)


def relative_bias(table: Array, distance: Array, bidirectional: bool, max_distance: int) -> Array:
  """float32[batch or 1, heads, q, k]: the learned bias table[bucket] ([buckets, heads]) of each
  query-minus-key position difference (int[batch or 1, 1, q, k])."""
  buckets = relative_position_bucket(-distance[:, 0], bidirectional, table.shape[0], max_distance)
  return jnp.moveaxis(jnp.take(table.astype(jnp.float32), buckets, axis=0), -1, 1)
