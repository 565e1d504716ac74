"""Memory-efficient attention in pure JAX: blocks and an online softmax, on any backend.

softmax(QKᵀ/√d_k)V computed one (query block, key block) pair at a time with
a running maximum and sum per query (Milakov & Gimelshein 2018; Rabe & Staats
2021; FlashAttention, Dao et al. 2022), so the [q_len, k_len] scores never
exist: memory grows as O(n·block), not O(n²).

The backward pass is FlashAttention-2's: a custom VJP that keeps only the
output and each query's log-sum-exp, and recomputes every block's
probabilities from them. A block that the mask hides entirely is skipped
(`lax.cond`) in both passes: a causal mask does about half the work.

Dropout on the attention weights draws its bits per block from the dropout
key folded with the block's indices, so the backward pass regenerates them
exactly; the pattern depends on the block sizes. Inputs that fit in one block
take JAX's own gradient instead (`_one_block`): their scores are no larger
than a block's.

A query that may see no key at all (trailing padding in a packed row) gets a
zero output and zero gradients; the plain path gives it the mean of the
values. Losses ignore those positions.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.model.dropout import keep_mask
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.positions import RelativeBias, alibi_bias

Array = jax.Array

DEFAULT_BLOCK = 512


class _Static(NamedTuple):
  """The kernel's compile-time settings."""

  block_q: int
  block_k: int
  key_length: int          # k_len before padding to a multiple of block_k.
  scale: float
  operand_dtype: Any
  dropout_rate: float
  alibi_slopes: tuple[float, ...] = ()  # ALiBi's per-head slopes; (): no bias.
  relative_bidirectional: bool = True  # T5's bias (when a table is given): an encoder's buckets,
  relative_max_distance: int = 0       # and the distance past which they share the last.


def chunked_attention(query: Array, key: Array, value: Array, mask: AttentionMask | None,
                      **options: Any) -> Array:
  """Attention by blocks, [batch, q_len, heads, d_v], from the model's layout.

  query: [batch, q_len, heads, d_k]; key: [batch, k_len, heads, d_k]; value:
  [batch, k_len, heads, d_v]; `options` as in `chunked_attention_heads_first`.
  """
  attended = chunked_attention_heads_first(
      *(x.transpose(0, 2, 1, 3) for x in (query, key, value)), mask, **options)
  return attended.transpose(0, 2, 1, 3)


def chunked_attention_heads_first(
    query: Array,
    key: Array,
    value: Array,
    mask: AttentionMask | None,
    *,
    block_size: int = DEFAULT_BLOCK,
    matmul_dtype: Any = None,
    dropout_rate: float = 0.0,
    dropout_key: Array | None = None,
    alibi_slopes: tuple[float, ...] = (),
    relative: RelativeBias | None = None,
) -> Array:
  """Attention by blocks, [batch, heads, q_len, d_v] (the decoding cache's layout).

  Args:
    query: [batch, heads, q_len, d_k].
    key: [batch, heads, k_len, d_k].
    value: [batch, heads, k_len, d_v].
    mask: which keys each query sees; None: all.
    block_size: queries and keys per block (shorter inputs take one block).
    matmul_dtype: operand dtype of the two products (float32 accumulation);
      None: the inputs' dtype.
    dropout_rate: dropout on the attention weights; needs `dropout_key`.
    alibi_slopes: per-head slopes of ALiBi's bias -m_h·|i - j| over the mask's positions,
      computed a block at a time.
    relative: T5's learned bias, looked up a block at a time from the mask's positions; its
      table's gradient is summed by bucket in the backward pass.
  """
  if dropout_rate > 0.0 and dropout_key is None:
    raise ValueError("attention dropout needs a dropout key")
  q_len, k_len = query.shape[2], key.shape[2]
  block_q, block_k = min(block_size, q_len), min(block_size, k_len)
  padded_q, padded_k = round_up(q_len, block_q), round_up(k_len, block_k)
  static = _Static(block_q, block_k, k_len, query.shape[-1] ** -0.5,
                   jnp.dtype(matmul_dtype or query.dtype), float(dropout_rate),
                   tuple(alibi_slopes),
                   relative.bidirectional if relative is not None else True,
                   relative.max_distance if relative is not None else 0)
  table = relative.table.astype(jnp.float32) if relative is not None else None
  mask = (mask or AttentionMask()).padded(padded_q, padded_k)
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, 0)))
  if dropout_key is None:
    dropout_key = jax.random.key(0)  # Unused without dropout; keeps one signature.
  if q_len <= block_size and k_len <= block_size:
    return _one_block(static, query, key, value, mask, dropout_key, table).astype(value.dtype)
  attended = _attention(static, pad(query, padded_q), pad(key, padded_k), pad(value, padded_k),
                        mask, dropout_key, table)
  return attended[:, :, :q_len].astype(value.dtype)


def _one_block(static: _Static, query: Array, key: Array, value: Array, mask: AttentionMask,
               dropout_key: Array, table: Array | None) -> Array:
  """Inputs within one block: the scores are block-sized, so JAX's own gradient keeps them.

  Recomputing them in the backward pass costs a third matmul, about 1.4x the plain
  path's time at 512 tokens; the numbers (dropout bits included) are those of the
  blocked path.
  """
  visible = _visible(static, mask, jnp.int32(0), jnp.int32(0))
  scores = _product(static, "bhqd,bhkd->bhqk", query, key) * static.scale
  scores = jnp.where(visible, scores + _bias(static, mask, table, 0, 0), -jnp.inf)
  seen = jnp.any(visible, axis=-1, keepdims=True)
  weights = jax.nn.softmax(jnp.where(seen, scores, 0.0), axis=-1)
  weights = jnp.where(visible & seen, weights, 0.0)
  if static.dropout_rate > 0.0:
    keep, keep_probability = _dropout_keep(static, dropout_key, jnp.int32(0), jnp.int32(0),
                                           weights.shape)
    weights = jnp.where(keep, weights / keep_probability, 0.0)
  return _product(static, "bhqk,bhkd->bhqd", weights, value)


def round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= n."""
  return -(-n // multiple) * multiple


def _visible(static: _Static, mask: AttentionMask, i: Array, j: Array) -> Array:
  """bool[batch or 1, 1, block_q, block_k] for query block i and key block j."""
  visible = mask.block(i * static.block_q, static.block_q, j * static.block_k, static.block_k)
  key_index = j * static.block_k + jnp.arange(static.block_k)
  return visible & (key_index < static.key_length)


def _relative(static: _Static, table: Array) -> RelativeBias:
  return RelativeBias(table, static.relative_bidirectional, static.relative_max_distance)


def _block_distance(static: _Static, mask: AttentionMask, i: Array | int, j: Array | int
                    ) -> Array:
  return mask.distance(i * static.block_q, static.block_q, j * static.block_k, static.block_k)


def _bias(static: _Static, mask: AttentionMask, table: Array | None, i: Array | int,
          j: Array | int) -> Array | float:
  """ALiBi's and T5's biases for query block i and key block j ([batch or 1, heads, block_q,
  block_k]), or 0 without either."""
  bias = 0.0
  if static.alibi_slopes:
    bias = alibi_bias(static.alibi_slopes, _block_distance(static, mask, i, j))
  if table is not None:
    bias = bias + _relative(static, table).dense(_block_distance(static, mask, i, j))
  return bias


def _table_grad(static: _Static, mask: AttentionMask, table: Array, i: Array, j: Array,
                scores_grad: Array) -> Array:
  """float32[buckets, heads]: a block's score gradients (before the scale) summed by the
  bucket each query-key pair reads."""
  buckets = _relative(static, table).buckets(_block_distance(static, mask, i, j))
  if buckets.shape[0] == 1:  # One position row for the whole batch.
    scores_grad = jnp.sum(scores_grad, axis=0, keepdims=True)
  return jnp.einsum("bhqk,bqkn->nh", scores_grad, jax.nn.one_hot(buckets, table.shape[0]))


def _product(static: _Static, subscripts: str, lhs: Array, rhs: Array) -> Array:
  return jnp.einsum(subscripts, lhs.astype(static.operand_dtype),
                    rhs.astype(static.operand_dtype), preferred_element_type=jnp.float32)


def _dropout_keep(static: _Static, dropout_key: Array, i: Array, j: Array,
                  shape: tuple[int, ...]) -> tuple[Array, float]:
  block_key = jax.random.fold_in(jax.random.fold_in(dropout_key, i), j)
  return keep_mask(block_key, shape, static.dropout_rate)


def _slice(x: Array, index: Array, size: int) -> Array:
  return lax.dynamic_slice_in_dim(x, index * size, size, axis=2)


def _forward(static: _Static, query: Array, key: Array, value: Array, mask: AttentionMask,
             dropout_key: Array, table: Array | None) -> tuple[Array, Array]:
  """(attended float32[b, h, q, d_v], log-sum-exp float32[b, h, q])."""
  batch, heads, q_len, _ = query.shape
  d_v = value.shape[-1]
  num_k_blocks = key.shape[2] // static.block_k

  def query_block(i: Array) -> tuple[Array, Array]:
    q_block = _slice(query, i, static.block_q)

    def key_block(j: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
      visible = _visible(static, mask, i, j)

      def attend(carry):
        running_max, running_sum, accumulated = carry
        scores = _product(static, "bhqd,bhkd->bhqk", q_block, _slice(key, j, static.block_k))
        scores = jnp.where(visible, scores * static.scale + _bias(static, mask, table, i, j),
                           -jnp.inf)
        new_max = jnp.maximum(running_max, scores.max(axis=-1))
        finite_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
        weights = jnp.exp(scores - finite_max[..., None])
        correction = jnp.exp(running_max - finite_max)
        running_sum = running_sum * correction + weights.sum(axis=-1)
        if static.dropout_rate > 0.0:
          keep, keep_probability = _dropout_keep(static, dropout_key, i, j, weights.shape)
          weights = jnp.where(keep, weights / keep_probability, 0.0)
        accumulated = accumulated * correction[..., None] + _product(
            static, "bhqk,bhkd->bhqd", weights, _slice(value, j, static.block_k))
        return new_max, running_sum, accumulated

      return lax.cond(jnp.any(visible), attend, lambda carry: carry, carry)

    shape = (batch, heads, static.block_q)
    running_max, running_sum, accumulated = lax.fori_loop(
        0, num_k_blocks, key_block,
        (jnp.full(shape, -jnp.inf), jnp.zeros(shape), jnp.zeros(shape + (d_v,))))
    seen = running_sum > 0.0
    attended = jnp.where(seen[..., None], accumulated / jnp.where(seen, running_sum, 1.0)[..., None],
                         0.0)
    log_sum_exp = jnp.where(seen, running_max + jnp.log(jnp.where(seen, running_sum, 1.0)), 0.0)
    return attended, log_sum_exp

  attended, log_sum_exp = lax.map(query_block, jnp.arange(q_len // static.block_q))
  # [q_blocks, b, h, block_q, ...] -> [b, h, q_len, ...]
  attended = jnp.moveaxis(attended, 0, 2).reshape(batch, heads, q_len, d_v)
  log_sum_exp = jnp.moveaxis(log_sum_exp, 0, 2).reshape(batch, heads, q_len)
  return attended, log_sum_exp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static: _Static, query: Array, key: Array, value: Array, mask: AttentionMask,
               dropout_key: Array, table: Array | None) -> Array:
  return _forward(static, query, key, value, mask, dropout_key, table)[0]


def _attention_forward(static, query, key, value, mask, dropout_key, table):
  attended, log_sum_exp = _forward(static, query, key, value, mask, dropout_key, table)
  return attended, (query, key, value, mask, dropout_key, table, attended, log_sum_exp)


def _attention_backward(static: _Static, residuals, attended_grad: Array):
  """FlashAttention-2's backward: per key block, its dK and dV over all query blocks."""
  query, key, value, mask, dropout_key, table, attended, log_sum_exp = residuals
  attended_grad = attended_grad.astype(jnp.float32)
  # D_i = Σ_j P_ij dP_ij = rowsum(dO ∘ O), dropout included.
  delta = jnp.sum(attended_grad * attended, axis=-1)
  num_q_blocks = query.shape[2] // static.block_q
  num_k_blocks = key.shape[2] // static.block_k

  def key_block(j: Array, grads: tuple) -> tuple:
    query_grad, key_grad, value_grad, table_grad = grads
    k_block = _slice(key, j, static.block_k)
    v_block = _slice(value, j, static.block_k)

    def query_block(i: Array, carry: tuple) -> tuple:
      visible = _visible(static, mask, i, j)

      def gradients(carry):
        query_grad, k_grad, v_grad, table_grad = carry
        q_block = _slice(query, i, static.block_q)
        out_grad = _slice(attended_grad, i, static.block_q)
        scores = (_product(static, "bhqd,bhkd->bhqk", q_block, k_block) * static.scale
                  + _bias(static, mask, table, i, j))
        lse = lax.dynamic_slice_in_dim(log_sum_exp, i * static.block_q, static.block_q, axis=2)
        weights = jnp.where(visible, jnp.exp(scores - lse[..., None]), 0.0)
        dropped = weights
        weights_grad = _product(static, "bhqd,bhkd->bhqk", out_grad, v_block)
        if static.dropout_rate > 0.0:
          keep, keep_probability = _dropout_keep(static, dropout_key, i, j, weights.shape)
          dropped = jnp.where(keep, weights / keep_probability, 0.0)
          weights_grad = jnp.where(keep, weights_grad / keep_probability, 0.0)
        v_grad = v_grad + _product(static, "bhqk,bhqd->bhkd", dropped, out_grad)
        d_rows = lax.dynamic_slice_in_dim(delta, i * static.block_q, static.block_q, axis=2)
        biased_grad = weights * (weights_grad - d_rows[..., None])  # dL/d(scores + bias).
        if table is not None:
          table_grad = table_grad + _table_grad(static, mask, table, i, j, biased_grad)
        scores_grad = biased_grad * static.scale
        k_grad = k_grad + _product(static, "bhqk,bhqd->bhkd", scores_grad, q_block)
        q_block_grad = _slice(query_grad, i, static.block_q) + _product(
            static, "bhqk,bhkd->bhqd", scores_grad, k_block)
        query_grad = lax.dynamic_update_slice_in_dim(
            query_grad, q_block_grad, i * static.block_q, axis=2)
        return query_grad, k_grad, v_grad, table_grad

      return lax.cond(jnp.any(visible), gradients, lambda carry: carry, carry)

    query_grad, k_grad, v_grad, table_grad = lax.fori_loop(
        0, num_q_blocks, query_block,
        (query_grad, jnp.zeros(k_block.shape, jnp.float32),
         jnp.zeros(v_block.shape, jnp.float32), table_grad))
    key_grad = lax.dynamic_update_slice_in_dim(key_grad, k_grad, j * static.block_k, axis=2)
    value_grad = lax.dynamic_update_slice_in_dim(value_grad, v_grad, j * static.block_k, axis=2)
    return query_grad, key_grad, value_grad, table_grad

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  table_grad = zeros(table) if table is not None else jnp.zeros(())
  query_grad, key_grad, value_grad, table_grad = lax.fori_loop(
      0, num_k_blocks, key_block, (zeros(query), zeros(key), zeros(value), table_grad))
  mask_grad = jax.tree.map(lambda _: None, mask)
  return (query_grad.astype(query.dtype), key_grad.astype(key.dtype),
          value_grad.astype(value.dtype), mask_grad, None,
          table_grad.astype(table.dtype) if table is not None else None)


_attention.defvjp(_attention_forward, _attention_backward)
