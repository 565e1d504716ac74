"""Which keys each query may attend to (§3.2.3), kept as per-position vectors.

An `AttentionMask` holds what a mask is made of: key padding, packing
segments, causality and a prefix-LM's two-way prefix, each as a vector over
the query or key positions, never as the [q_len, k_len] matrix. The plain and
XLA paths expand it with `dense()`; the chunked path asks for one block at a
time with `block()`, so its memory stays O(n·block); the flash kernels take it
as segment ids. An explicit matrix (`from_dense`) serves the decoding cache,
whose slots and token positions differ.

Dense masks are bool[batch, 1, q_len, k_len] (or broadcastable), True where
the query may attend. Only keys are masked: a PAD query still gets a
well-defined output (which the loss ignores), so appending PAD never changes
any position's result.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from transformer_jax.special_tokens import PAD_ID

Array = jax.Array


def segment_mask(query_segment_ids: Array, key_segment_ids: Array) -> Array:
  """bool[batch, 1, q_len, k_len]: attend only within the same packed segment."""
  return query_segment_ids[:, None, :, None] == key_segment_ids[:, None, None, :]


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (broadcasting)."""
  result = None
  for mask in masks:
    if mask is not None:
      result = mask if result is None else jnp.logical_and(result, mask)
  return result


def _window(vector: Array, start: Array | int, size: int) -> Array:
  """vector[:, start:start + size] for a traced `start` (the vector is long enough)."""
  return jax.lax.dynamic_slice_in_dim(vector, start, size, axis=1)


@flax.struct.dataclass
class AttentionMask:
  """The parts of an attention mask; every field may be absent.

  Attributes:
    key_valid: bool[batch, k_len], False on PAD keys.
    query_segment_ids, key_segment_ids: int[batch, q_len] and [batch, k_len]:
      a query sees only keys of its own packed segment.
    prefix: bool[batch, len] (self-attention, with `causal`): tokens of a
      prefix LM's prefix, which also see the later tokens of the prefix.
    explicit: bool[batch or 1, 1, q_len or 1, k_len], ANDed with the rest.
    causal: query i sees keys j <= i.
    window: > 0: a query sees the keys less than `window` positions away only (a sliding
      window; with `causal`, the `window` keys up to itself).
    positions: int[batch, len] (self-attention): the tokens' positions, which the window
      and ALiBi measure; None: their indices. They differ where a row holds padding mid-row (a
      prefix LM's source padded before its target).
  """

  key_valid: Array | None = None
  query_segment_ids: Array | None = None
  key_segment_ids: Array | None = None
  prefix: Array | None = None
  explicit: Array | None = None
  positions: Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)
  window: int = flax.struct.field(pytree_node=False, default=0)

  @classmethod
  def from_dense(cls, mask: Array | None) -> "AttentionMask | None":
    return None if mask is None else cls(explicit=mask)

  @classmethod
  def self_attention(cls, tokens: Array, segment_ids: Array | None, causal: bool,
                     prefix: Array | None = None, window: int = 0,
                     positions: Array | None = None) -> "AttentionMask":
    """Padding, packing segments, causality (with an optional two-way prefix) and an
    optional sliding window over the tokens' `positions`."""
    if prefix is not None and not causal:
      raise ValueError("a prefix only widens a causal mask")
    return cls(key_valid=tokens != PAD_ID, query_segment_ids=segment_ids,
               key_segment_ids=segment_ids, prefix=prefix, causal=causal, window=window,
               positions=positions)

  @classmethod
  def cross_attention(cls, key_tokens: Array, query_segment_ids: Array | None,
                      key_segment_ids: Array | None) -> "AttentionMask":
    """Decoder queries over encoder keys: the source's padding and packing segments."""
    if query_segment_ids is None:
      key_segment_ids = None
    return cls(key_valid=key_tokens != PAD_ID, query_segment_ids=query_segment_ids,
               key_segment_ids=key_segment_ids)

  @property
  def is_explicit_only(self) -> bool:
    """Whether the explicit matrix is the whole mask."""
    vectors = (self.key_valid, self.query_segment_ids, self.key_segment_ids, self.prefix,
               self.positions)
    return not self.causal and not self.window and all(vector is None for vector in vectors)

  def block(self, q_start: Array | int, q_size: int, k_start: Array | int,
            k_size: int) -> Array:
    """bool[batch or 1, 1, q_size, k_size]: queries q_start.., keys k_start...

    The vectors must cover the window (`padded` extends them); the starts may
    be traced values.
    """
    parts = []
    if self.key_valid is not None:
      parts.append(_window(self.key_valid, k_start, k_size)[:, None, None, :])
    if self.query_segment_ids is not None:
      parts.append(segment_mask(_window(self.query_segment_ids, q_start, q_size),
                                _window(self.key_segment_ids, k_start, k_size)))
    if self.causal:
      query_index = q_start + jnp.arange(q_size)
      key_index = k_start + jnp.arange(k_size)
      visible = (key_index[None, :] <= query_index[:, None])[None, None]
      if self.prefix is not None:
        visible = visible | (_window(self.prefix, q_start, q_size)[:, None, :, None]
                             & _window(self.prefix, k_start, k_size)[:, None, None, :])
      parts.append(visible)
    if self.window:
      distance = self.distance(q_start, q_size, k_start, k_size)
      parts.append((distance < self.window) & (distance > -self.window))
    if self.explicit is not None:
      explicit = self.explicit
      if explicit.shape[2] > 1:
        explicit = jax.lax.dynamic_slice_in_dim(explicit, q_start, q_size, axis=2)
      parts.append(jax.lax.dynamic_slice_in_dim(explicit, k_start, k_size, axis=3))
    result = combine_masks(*parts)
    return jnp.ones((1, 1, q_size, k_size), bool) if result is None else result

  def distance(self, q_start: Array | int, q_size: int, k_start: Array | int,
               k_size: int) -> Array:
    """int[batch or 1, 1, q_size, k_size]: query position minus key position (`positions`,
    or the indices where they are absent), for a window or a distance bias."""
    if self.positions is None:
      return ((q_start + jnp.arange(q_size))[:, None]
              - (k_start + jnp.arange(k_size))[None, :])[None, None]
    return (_window(self.positions, q_start, q_size)[:, None, :, None]
            - _window(self.positions, k_start, k_size)[:, None, None, :])

  def dense(self, q_len: int, k_len: int) -> Array:
    """bool[batch or 1, 1, q_len, k_len]: the whole matrix."""
    return self.block(0, q_len, 0, k_len)

  def padded(self, q_len: int, k_len: int) -> "AttentionMask":
    """The same mask over at least q_len queries and k_len keys (longer vectors stay).

    Added keys are hidden where a field covers keys; the caller hides them
    otherwise (the chunked path compares key indices with the true length).
    """
    def pad(vector: Array | None, length: int, value) -> Array | None:
      if vector is None or vector.shape[1] >= length:
        return vector
      return jnp.pad(vector, ((0, 0), (0, length - vector.shape[1])), constant_values=value)

    explicit = self.explicit
    if explicit is not None:
      widths = [(0, 0), (0, 0),
                (0, max(0, q_len - explicit.shape[2]) if explicit.shape[2] > 1 else 0),
                (0, max(0, k_len - explicit.shape[3]))]
      explicit = jnp.pad(explicit, widths, constant_values=False)
    prefix_len = max(q_len, k_len)
    return self.replace(
        key_valid=pad(self.key_valid, k_len, False),
        query_segment_ids=pad(self.query_segment_ids, q_len, -1),
        key_segment_ids=pad(self.key_segment_ids, k_len, -2),
        prefix=pad(self.prefix, prefix_len, False),
        positions=pad(self.positions, prefix_len, 0),
        explicit=explicit,
    )
