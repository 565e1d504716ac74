"""Scaled dot-product and multi-head attention (§3.2), with a KV cache.

Layout convention: per-head tensors are ``[batch, length, heads, depth]``.
Masks are `masking.AttentionMask`s (which keys each query may see, kept as
vectors); the plain path expands one into bool[batch, 1, q_len, k_len].

Implementations (`config.model.attention_impl`):
  plain    einsum, softmax, einsum here; O(n²) memory. Attention dropout, ALiBi, T5 bias.
  xla      `jax.nn.dot_product_attention`'s XLA path; O(n²). ALiBi and T5's bias as
           its score bias.
  chunked  blocks with an online softmax (chunked_attention.py), any backend;
           O(n·block) memory; attention dropout, ALiBi and T5's bias a block at a time.
  pallas   JAX's Pallas flash kernels on GPU (self-attention only) and TPU
           (flash_attention.py); padding, packing and causal masks; no dropout.
  cudnn    cuDNN's flash attention through `jax.nn.dot_product_attention`;
           NVIDIA GPUs from Ampere on, bfloat16 or float16 operands.
A decoding step attends a few queries to the cache: it runs the chunked
kernel under "chunked" and the plain einsums under every other choice.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer_jax.errors import UserError
from transformer_jax.model import precision
from transformer_jax.model.chunked_attention import (
    DEFAULT_BLOCK,
    chunked_attention,
    chunked_attention_heads_first,
)
from transformer_jax.model.dropout import Dropout, keep_mask
from transformer_jax.model.flash_attention import pallas_attention
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.platform import compiling_for_local_devices, platform_in_force
from transformer_jax.model.positions import (RelativeBias, alibi_bias, alibi_slopes,
                                             relative_bias, rotary)

Array = jax.Array

ATTENTION_IMPLEMENTATIONS = ("plain", "xla", "chunked", "pallas", "cudnn")
WITH_ATTENTION_DROPOUT = ("plain", "chunked")
WINDOWED_ATTENTION = ("plain", "xla", "chunked")  # Take AttentionMask.window.
WITH_ALIBI = ("plain", "chunked", "xla")  # Add ALiBi's bias to the scores.
WITH_RELATIVE_BIAS = ("plain", "xla", "chunked")  # Add T5's learned relative bias to the scores.
CUDNN_MIN_COMPUTE_CAPABILITY = 8.0  # cuDNN's flash attention: Ampere (sm80) and later.

# Large negative logit for masked positions: finite, so a fully masked row
# (a padding query) gives a uniform distribution instead of NaN.
_MASKED_LOGIT = -1e9


# --- Scaled dot-product attention ------------------------------------------


def dot_product_attention_weights(
    query: Array, key: Array, mask: Array | None, matmul_dtype: Any = None,
    bias: Array | None = None,
) -> Array:
  """softmax(QKᵀ/√d_k + bias + mask), float32[batch, heads, q_len, k_len].

  Args:
    query: [batch, q_len, heads, d_k].
    key: [batch, k_len, heads, d_k].
    mask: bool, broadcastable to [batch, heads, q_len, k_len], or None.
    matmul_dtype: operand dtype of QKᵀ (see `precision.einsum`); None: the
      query's dtype.
    bias: float32, broadcastable to the scores (ALiBi's), or None.
  """
  depth = query.shape[-1]
  logits = precision.einsum(
      "bqhd,bkhd->bhqk", query, key, matmul_dtype or query.dtype, query.dtype
  ) / jnp.sqrt(depth).astype(query.dtype)
  if bias is not None:
    logits = logits.astype(jnp.float32) + bias
  return masked_softmax(logits, mask)


def weighted_values(weights: Array, value: Array, matmul_dtype: Any = None) -> Array:
  """[batch, q_len, heads, d_v] from weights [batch, heads, q_len, k_len], value [batch, k_len, heads, d_v]."""
  return precision.einsum(
      "bhqk,bkhd->bqhd", weights, value, matmul_dtype or value.dtype, value.dtype
  )


def masked_softmax(logits: Array, mask: Array | None) -> Array:
  """float32 softmax over the last axis, masked positions at `_MASKED_LOGIT`."""
  logits = logits.astype(jnp.float32)  # Softmax in float32 even under bf16.
  if mask is not None:
    logits = jnp.where(mask, logits, _MASKED_LOGIT)
  return jax.nn.softmax(logits, axis=-1)


def check_cudnn(operand_dtype: Any) -> None:
  """Raises a one-line UserError where cuDNN's flash attention cannot run (on the platform
  of the mesh in force: a CPU host compiles it for a GPU target)."""
  platform = platform_in_force()
  if platform != "gpu":
    raise UserError(f"attention_impl='cudnn' needs an NVIDIA GPU (this platform: {platform}); "
                     "use attention_impl='chunked' or 'plain'")
  # A cross-compiled target's compile-only devices state no capability; its compiler does.
  capability = (float(getattr(jax.devices()[0], "compute_capability", "0") or 0)
                if compiling_for_local_devices() else CUDNN_MIN_COMPUTE_CAPABILITY)
  if capability < CUDNN_MIN_COMPUTE_CAPABILITY:
    raise UserError(f"attention_impl='cudnn' needs a GPU of compute capability >= "
                     f"{CUDNN_MIN_COMPUTE_CAPABILITY} (this one: {capability}); use "
                     "attention_impl='pallas' or 'chunked'")
  if jnp.dtype(operand_dtype) not in (jnp.bfloat16, jnp.float16):
    raise UserError(f"attention_impl='cudnn' takes bfloat16 or float16 operands, not "
                     f"{jnp.dtype(operand_dtype).name}; set config.model.matmul_dtype='bfloat16' "
                     "or use attention_impl='chunked'")


def _dense(mask: AttentionMask | None, q_len: int, k_len: int) -> Array | None:
  return None if mask is None else mask.dense(q_len, k_len)


def dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: AttentionMask | None,
    implementation: str = "plain",
    matmul_dtype: Any = None,
    dropout_rate: float = 0.0,
    dropout_key: Array | None = None,
    block_size: int = DEFAULT_BLOCK,
    alibi_slopes: tuple[float, ...] = (),
    relative: RelativeBias | None = None,
) -> Array:
  """Scaled dot-product attention, [batch, q_len, heads, d_v].

  Args:
    query: [batch, q_len, heads, d_k].
    key: [batch, k_len, heads, d_k].
    value: [batch, k_len, heads, d_v]; d_v may differ from d_k (Table 3 B).
    mask: which keys each query sees, or None.
    implementation: one of ATTENTION_IMPLEMENTATIONS (see the module doc).
    matmul_dtype: operand dtype of the two matmuls (plain, chunked; cudnn
      rounds its inputs to it); None: the inputs' dtype. xla and pallas
      compute in the inputs' dtype.
    dropout_rate, dropout_key: dropout on the attention weights (plain and
      chunked only).
    block_size: the chunked path's block.
    alibi_slopes: ALiBi's per-head slopes over the mask's positions (plain, chunked, xla).
    relative: T5's learned bias over the mask's positions (plain, xla, chunked), or None.
  """
  q_len, k_len = query.shape[1], key.shape[1]
  if alibi_slopes and implementation not in WITH_ALIBI:
    raise UserError(f"attention_impl={implementation!r} has no ALiBi bias; use one of "
                    f"{', '.join(WITH_ALIBI)}")
  if relative is not None and implementation not in WITH_RELATIVE_BIAS:
    raise UserError(f"attention_impl={implementation!r} has no T5 relative bias; use one of "
                    f"{', '.join(WITH_RELATIVE_BIAS)}")
  if dropout_rate > 0.0 and implementation not in WITH_ATTENTION_DROPOUT:
    raise UserError(f"attention_impl={implementation!r} has no attention dropout; use one of "
                     f"{', '.join(WITH_ATTENTION_DROPOUT)} or attention_dropout_rate=0")
  bias = None  # plain and xla: the biases as one [batch or 1, heads, q, k] matrix.
  if implementation in ("plain", "xla") and (alibi_slopes or relative is not None):
    distance = (mask or AttentionMask()).distance(0, q_len, 0, k_len)
    if alibi_slopes:
      bias = alibi_bias(alibi_slopes, distance)
    if relative is not None:
      bias = relative.dense(distance) if bias is None else bias + relative.dense(distance)
  if implementation == "plain":
    weights = dot_product_attention_weights(query, key, _dense(mask, q_len, k_len), matmul_dtype,
                                            bias)
    if dropout_rate > 0.0:
      keep, keep_probability = keep_mask(dropout_key, weights.shape, dropout_rate)
      weights = jnp.where(keep, weights / keep_probability, 0.0)
    return weighted_values(weights, value, matmul_dtype)
  if implementation == "chunked":
    return chunked_attention(query, key, value, mask, block_size=block_size,
                             matmul_dtype=matmul_dtype, dropout_rate=dropout_rate,
                             dropout_key=dropout_key, alibi_slopes=alibi_slopes,
                             relative=relative)
  if implementation == "pallas":
    return pallas_attention(query, key, value, mask)
  if implementation == "cudnn":
    operand_dtype = matmul_dtype or query.dtype
    check_cudnn(operand_dtype)
    query, key, value = (x.astype(operand_dtype) for x in (query, key, value))
  # The fused kernel needs one head depth for Q, K and V. Zero-padding Q and K
  # leaves QKᵀ unchanged; the scale stays 1/√d_k; padded V columns are cut.
  d_k, d_v = query.shape[-1], value.shape[-1]
  depth = max(d_k, d_v)
  pad = lambda x: jnp.pad(x, [(0, 0)] * 3 + [(0, depth - x.shape[-1])])
  dense = _dense(mask, q_len, k_len)
  if dense is not None:
    dense = jnp.broadcast_to(dense, (query.shape[0], 1, q_len, k_len))
  if bias is not None:  # xla: the score bias, [batch, heads, q, k] as the function wants it.
    bias = jnp.broadcast_to(bias, (query.shape[0], query.shape[2], q_len, k_len))
  out = jax.nn.dot_product_attention(
      pad(query),
      pad(key),
      pad(value),
      bias=bias,
      mask=dense,
      scale=float(d_k) ** -0.5,
      implementation=implementation if implementation == "cudnn" else "xla",
  )
  return out[..., :d_v]


# --- Multi-head attention -----------------------------------------------------


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O  (§3.2.2).

  Attributes:
    num_heads: h.
    d_k: query/key depth per head.
    d_v: value depth per head.
    d_model: output width.
    dropout_rate: dropout on the attention weights (0 in the paper).
    implementation: see `dot_product_attention`.
    block_size: the chunked path's block.
    dtype: compute dtype; parameters are float32.
    matmul_dtype: operand dtype of every matmul (`precision.einsum`); None:
      `dtype`.
    use_bias: biases on the four projections (the paper has none; Marian has
      them): "query_bias" etc. [heads, depth], "out_bias" [d_model].
  """

  num_heads: int
  d_k: int
  d_v: int
  d_model: int
  dropout_rate: float = 0.0
  implementation: str = "plain"
  block_size: int = DEFAULT_BLOCK
  dtype: jnp.dtype = jnp.float32
  matmul_dtype: Any = None
  use_bias: bool = False
  quantize: str = ""  # "int8": the projections run through precision.int8_matmul (inference).
  scale: float = 0.0  # The factor of QKᵀ; 0: 1/√d_k (§3.2.1).
  rope_theta: float = 0.0  # > 0: rotary positions on self-attention (positions.rotary).
  rope_fraction: float = 1.0
  num_kv_heads: int = 0  # Key/value heads, each shared by num_heads / num_kv_heads query heads
                         # (grouped-query attention; 1: multi-query); 0: num_heads.
  window: int = 0  # > 0: a decoding step sees the cached tokens less than `window` positions
                   # before it (training takes the window through its AttentionMask).
  alibi: bool = False  # Self-attention scores get ALiBi's bias -m_h·|i - j| (positions.alibi_slopes).
  # T5's relative bias: self-attention scores get a learned table's entry for the bucket of each
  # key-minus-query position (positions.relative_bias); the stack owns the table and passes it.
  relative_bidirectional: bool = True
  relative_max_distance: int = 128

  def _rotated(self, query: Array, key: Array, positions: Array | None
               ) -> tuple[Array, Array]:
    """Self-attention's query and key turned by their positions where `rope_theta` asks."""
    if not self.rope_theta:
      return query, key
    if positions is None:
      raise ValueError("rotary positions need the tokens' positions: pass positions=")
    return (rotary(query, positions, self.rope_theta, self.rope_fraction),
            rotary(key, positions, self.rope_theta, self.rope_fraction))

  @property
  def _alibi_slopes(self) -> tuple[float, ...]:
    return alibi_slopes(self.num_heads) if self.alibi else ()

  def _scaled(self, query: Array) -> Array:
    """The query times scale·√d_k, so that every implementation's 1/√d_k makes QKᵀ·scale;
    unchanged for the paper's 1/√d_k (scale 0)."""
    if not self.scale:
      return query
    return query * jnp.asarray(self.scale * self.d_k ** 0.5, query.dtype)

  @property
  def _operand_dtype(self) -> Any:
    """The dtype every matmul rounds its operands to."""
    return self.matmul_dtype or self.dtype

  def _matmul(self, subscripts: str, lhs: Array, rhs: Array, bf16_gradients: bool = True) -> Array:
    return precision.einsum(subscripts, lhs, rhs, self._operand_dtype, self.dtype, bf16_gradients)

  def _weight_matmul(self, inputs: Array, kernel: Array) -> Array:
    """inputs[m, d] · kernel[d, n], a projection: int8 where `quantize` says so."""
    return precision.weight_matmul(inputs, kernel, self._operand_dtype, self.dtype, self.quantize)

  def _kernel(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...], fan_in: tuple) -> Array:
    """A float32 projection matrix, Glorot-uniform over its (in, out) axes."""
    fan_out = tuple(i for i in range(len(shape)) if i not in fan_in)
    init = nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=fan_in, out_axis=fan_out
    )
    kernel = self.param(name, nn.with_logical_partitioning(init, axes), shape)
    return jnp.asarray(kernel, self.dtype)

  def _bias(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...]) -> Array:
    bias = self.param(name, nn.with_logical_partitioning(nn.initializers.zeros, axes), shape)
    return jnp.asarray(bias, self.dtype)

  @property
  def _kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  def _heads_of(self, name: str) -> int:
    """The heads of projection `name`: the query's num_heads, the keys' and values' kv heads."""
    return self.num_heads if name == "query" else self._kv_heads

  def _shared_by_groups(self, x: Array, heads_axis: int) -> Array:
    """Keys or values of kv heads repeated for the query heads that share them."""
    group = self.num_heads // self._kv_heads
    return x if group == 1 else jnp.repeat(x, group, axis=heads_axis)

  def _input_kernel(self, name: str, depth: int) -> Array:
    """[d_model, heads, depth], stored per head (the logical axes shard heads)."""
    return self._kernel(name, (self.d_model, self._heads_of(name), depth), ("embed", "heads", "kv"),
                        (0,))

  def _project(self, inputs: Array, names_and_depths: tuple[tuple[str, int], ...]) -> list[Array]:
    """[batch, length, d_model] -> one [batch, length, heads, depth] per projection.

    The per-head kernels are flattened to [d_model, heads·depth] and applied as
    one 2-D matmul (Q, K and V together for self-attention): on the CPU a
    per-head einsum ran at ~60 % of the matmul rate of the feed-forward layers,
    mostly in its backward pass.
    """
    kernels = [self._input_kernel(name, depth) for name, depth in names_and_depths]
    widths = [self._heads_of(name) * depth for name, depth in names_and_depths]
    fused = jnp.concatenate([k.reshape(self.d_model, w) for k, w in zip(kernels, widths)], axis=1)
    batch, length = inputs.shape[:2]
    projected = self._weight_matmul(
        inputs.astype(self.dtype).reshape(batch * length, self.d_model), fused)
    if self.use_bias:
      projected = projected + jnp.concatenate([
          self._bias(f"{name}_bias", (self._heads_of(name), depth), ("heads", "kv")).reshape(-1)
          for name, depth in names_and_depths])
    splits = list(np.cumsum(widths)[:-1])
    return [
        part.reshape(batch, length, self._heads_of(name), depth)
        for part, (name, depth) in zip(jnp.split(projected, splits, axis=1), names_and_depths)
    ]

  @nn.compact
  def __call__(
      self,
      inputs_q: Array,
      inputs_kv: Array | None,
      mask: AttentionMask | None,
      train: bool = False,
      decode: bool = False,
      cross_attention: bool = False,
      positions: Array | None = None,
      relative_bias_table: Array | None = None,
  ) -> Array:
    """Attends from `inputs_q` to `inputs_kv`.

    Args:
      inputs_q: [batch, q_len, d_model].
      inputs_kv: [batch, kv_len, d_model]; pass the same array as `inputs_q`
        for self-attention. None only for cached cross-attention steps, whose
        keys and values were stored when the cache was made.
      mask: which keys each query sees, or None.
      train: enables attention dropout.
      decode: incremental decoding with the "cache" collection. Self-attention
        appends the keys/values of its q_len tokens at `cache_index`; cross-
        attention computes its keys and values once, when the cache is made.
        Either cache may hold fewer rows than the queries (one per sentence
        while the queries hold one per beam): query rows r·k .. r·k + k - 1
        then all read cache row r. A self-attention cache shared so holds
        k slots a position (`_update_self_attention_cache`), and `mask` must
        say which slots each beam sees.
      cross_attention: whether keys/values come from the encoder.
      positions: int[batch, q_len], the tokens' positions: self-attention turns its
        queries and keys by them under rotary positions (`rope_theta` > 0).
      relative_bias_table: float[buckets, heads], T5's relative bias of the stack, or None.

    Returns:
      [batch, q_len, d_model].
    """
    key_value = (("key", self.d_k), ("value", self.d_v))
    if decode:
      attended = self._decode_attention(inputs_q, inputs_kv, mask, cross_attention, positions,
                                        relative_bias_table)
    else:
      if inputs_kv is inputs_q:
        query, key, value = self._project(inputs_q, (("query", self.d_k),) + key_value)
        query, key = self._rotated(query, key, positions)
      else:
        (query,) = self._project(inputs_q, (("query", self.d_k),))
        key, value = self._project(inputs_kv, key_value)
      key, value = (self._shared_by_groups(x, heads_axis=2) for x in (key, value))
      query = nn.with_logical_constraint(self._scaled(query), ("batch", "length", "heads", "kv"))
      use_dropout = self.dropout_rate > 0.0 and train
      # ALiBi's bias is a self-attention's: cross-attention takes no positions.
      slopes = self._alibi_slopes if inputs_kv is inputs_q else ()
      if relative_bias_table is not None and self.implementation not in WITH_RELATIVE_BIAS:
        raise UserError(f"attention_impl={self.implementation!r} has no T5 relative bias; use "
                        f"{', '.join(WITH_RELATIVE_BIAS)}")
      distance = lambda: (mask or AttentionMask()).distance(0, query.shape[1], 0, key.shape[1])
      if self.implementation == "plain":
        bias = None
        if slopes:
          bias = alibi_bias(slopes, distance())
        if relative_bias_table is not None:
          bias = relative_bias(relative_bias_table, distance(), self.relative_bidirectional,
                               self.relative_max_distance)
        weights = dot_product_attention_weights(
            query, key, _dense(mask, query.shape[1], key.shape[1]),
            self.matmul_dtype, bias)
        # Kept for attention heat-maps: apply(..., mutable=["intermediates"]).
        self.sow("intermediates", "attention_weights", weights)
        if use_dropout:
          weights = Dropout(rate=self.dropout_rate, deterministic=False)(weights)
        attended = weighted_values(weights, value, self.matmul_dtype)
      else:
        relative = None
        if relative_bias_table is not None:
          relative = RelativeBias(relative_bias_table, self.relative_bidirectional,
                                  self.relative_max_distance)
        attended = dot_product_attention(
            query, key, value, mask, self.implementation, self.matmul_dtype,
            dropout_rate=self.dropout_rate if use_dropout else 0.0,
            dropout_key=self.make_rng("dropout") if use_dropout else None,
            block_size=self.block_size, alibi_slopes=slopes, relative=relative,
        )
    output_kernel = self._kernel(
        "out", (self.num_heads, self.d_v, self.d_model), ("heads", "kv", "embed"), (0, 1)
    )
    batch, length = attended.shape[:2]
    flat = attended.reshape(batch * length, self.num_heads * self.d_v)
    output = self._weight_matmul(
        flat, output_kernel.reshape(self.num_heads * self.d_v, self.d_model))
    if self.use_bias:
      output = output + self._bias("out_bias", (self.d_model,), ("embed",))
    return output.reshape(batch, length, self.d_model)

  def _decode_attention(
      self, inputs_q: Array, inputs_kv: Array | None, mask: AttentionMask | None,
      cross_attention: bool, positions: Array | None = None,
      relative_bias_table: Array | None = None,
  ) -> Array:
    """Attention against the cache, [batch, q_len, heads, d_v].

    The cache keeps keys and values as [rows, heads, length, depth]: heads
    next to rows, so both matmuls read them without re-laying-out a cache
    (a third of beam search's time with [rows, length, heads, depth]), and a
    step's key/value is one contiguous row per head. (Keys kept as [rows,
    heads, d_k, length] take a strided write along the minor axis each step:
    in bf16 that write took 12% of greedy decoding's op time on the CPU, more than
    the QKᵀ matmul saves by reading them untransposed; benchmarks/NOTES.md.)
    """
    key_value = (("key", self.d_k), ("value", self.d_v))
    # Cached keys and values only ever feed the two matmuls, so they are kept
    # rounded to the matmuls' operand dtype, stored in `cache_dtype`
    # (precision.decoding_cache_dtype): the same numbers as rounding them at each
    # use, without converting the whole cache every step.
    cache_dtype = precision.decoding_cache_dtype(self._operand_dtype, self.dtype)

    def as_operand(x: Array) -> Array:
      """`x` rounded to the operand dtype, held in `cache_dtype`."""
      return x.astype(self._operand_dtype).astype(cache_dtype)

    def to_cache_layout(projected: Array) -> Array:
      """[rows, length, heads, depth] -> [rows, heads, length, depth], as an operand."""
      return as_operand(projected.transpose(0, 2, 1, 3))

    cached_positions = None  # A sliding window's slot positions.
    if cross_attention:
      if not self.has_variable("cache", "cross_key"):  # Once per sentence, with the cache.
        key, value = map(to_cache_layout, self._project(inputs_kv, key_value))
        self.put_variable("cache", "cross_key", key)
        self.put_variable("cache", "cross_value", value)
      key = self.get_variable("cache", "cross_key")
      value = self.get_variable("cache", "cross_value")
      (query,) = self._project(inputs_q, (("query", self.d_k),))
      mask = _dense(mask, inputs_q.shape[1], key.shape[2])
    else:
      if mask is not None and not mask.is_explicit_only:
        raise ValueError("a decoding step's self-attention mask names cache slots: "
                         "AttentionMask.from_dense(bool[rows, 1, length, cache_len])")
      query, new_key, new_value = self._project(inputs_q, (("query", self.d_k),) + key_value)
      query, new_key = self._rotated(query, new_key, positions)  # Keys cached turned.
      by_position = self.window or self.alibi or relative_bias_table is not None
      if by_position and positions is None:
        raise ValueError("a sliding window or a position bias while decoding needs the tokens' "
                         "positions: pass positions=")
      key, value, mask, cached_positions = self._update_self_attention_cache(
          to_cache_layout(new_key), to_cache_layout(new_value),
          None if mask is None else mask.explicit, positions if by_position else None,
      )
    query = self._scaled(query)
    # The cache holds the kv heads only; each serves its group of query heads.
    key, value = (self._shared_by_groups(x, heads_axis=1) for x in (key, value))
    # A cache with one row per sentence serves all of that sentence's beams:
    # the beams become extra query positions of that row.
    rows, q_len = query.shape[:2]
    group = rows // key.shape[0]
    query = query.reshape(key.shape[0], group * q_len, self.num_heads, self.d_k)
    if mask is not None and mask.shape[0] not in (1, key.shape[0]):
      raise ValueError(f"mask rows {mask.shape[0]} match neither queries nor cache rows {key.shape[0]}")
    if mask is not None and group > 1 and mask.shape[2] not in (1, group * q_len):
      mask = jnp.tile(mask, (1, 1, group, 1))  # Query g·q_len + t is token t of beam g.
    bias = None
    if cached_positions is not None:  # The sliding window and ALiBi, by position.
      query_positions = positions.reshape(key.shape[0], group * q_len)
      distance = query_positions[:, None, :, None] - cached_positions[:, None, None, :]
      if self.window:
        seen = distance < self.window
        mask = seen if mask is None else mask & seen
      if self.alibi:
        bias = alibi_bias(self._alibi_slopes, distance)
      if relative_bias_table is not None:
        bias = relative_bias(relative_bias_table, distance, self.relative_bidirectional,
                             self.relative_max_distance)
    query = as_operand(query)
    if self.implementation == "chunked" and bias is None:  # Biases decode through the einsums.
      attended = chunked_attention_heads_first(
          query.transpose(0, 2, 1, 3), key, value, AttentionMask.from_dense(mask),
          block_size=self.block_size, matmul_dtype=self._operand_dtype).transpose(0, 2, 1, 3)
      return attended.astype(self.dtype).reshape(rows, q_len, self.num_heads, self.d_v)

    def matmul(subscripts: str, lhs: Array, rhs: Array) -> Array:
      """In the dtype the cache `rhs` is stored in (beam search: cache.stored_as)."""
      # Decoding is inference: these two products keep JAX's own gradients.
      return precision.einsum(subscripts, lhs, rhs, rhs.dtype, self.dtype, False)

    logits = matmul("bqhd,bhkd->bhqk", query, key) / jnp.sqrt(self.d_k).astype(self.dtype)
    if bias is not None:
      logits = logits.astype(jnp.float32) + bias
    if mask is not None:
      # Masked by adding _MASKED_LOGIT rather than selecting it (the same weights wherever a
      # query sees a slot; a query that sees none, which decoding never makes, gets nearly
      # uniform ones): XLA:CPU fuses the addition into the product's consumer, while the
      # select over a shared beam cache's mask took as long as the rest of the attention
      # (benchmarks/NOTES.md).
      logits = logits.astype(jnp.float32) + jnp.where(mask, 0.0, _MASKED_LOGIT)
    weights = masked_softmax(logits, None)
    # Product as [b, h, q, d], then transposed: asked for "->bqhd" directly, XLA:CPU computed
    # the beams' cross-attention as Vᵀ·Wᵀ in a generic dot, 5x slower (6 % of beam search).
    attended = matmul("bhqk,bhkd->bhqd", as_operand(weights), value).transpose(0, 2, 1, 3)
    return attended.reshape(rows, q_len, self.num_heads, self.d_v)

  def _update_self_attention_cache(
      self, key: Array, value: Array, mask: Array | None, positions: Array | None = None
  ) -> tuple[Array, Array, Array | None, Array | None]:
    """Writes this call's keys/values into the static-shape cache.

    key: [rows, heads, length, d_k], value: [rows, heads, length, d_v]. The
    first call (which creates the cache) takes the full length from `key` to
    size the cache and leaves it empty; each later call writes its `length`
    tokens (one decoding step, or a whole prompt in one pass) at slots
    cache_index .. cache_index + length - 1 and moves the index past them.

    With `mask` None, token i of the call sees slots <= cache_index + i (causal).
    A given `mask`, bool[rows or 1, 1, length, cache_len], replaces that
    default: the caller states every slot each token may see (a prompt's
    padding, a prefix attended both ways).

    A cache of fewer rows than `key` is shared by groups of k = rows / cache
    rows consecutive rows (the beams of a sentence): it holds k slots a
    position, slot p·k + g for position p of row g of the group, and each
    call writes the group's `length` positions at slots cache_index·k onwards.
    Nothing is then reordered when beams change parents: `mask`
    (bool[cache rows, 1, k·length, cache_len], query g·length + i for token i
    of row g) is required and names the slots of each row's own history.

    With `positions` (int[rows, length], a sliding window's), the cache also keeps each
    slot's position ("cached_position", [cache rows, 1, slots, 1]); the last value returned
    is then int32[cache rows, slots], else None (and None on the call that creates the cache).
    """
    is_initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable(
        "cache", "cached_value", jnp.zeros, value.shape, value.dtype
    )
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if positions is not None:
      cached_position = self.variable(
          "cache", "cached_position", jnp.zeros, (key.shape[0], 1, key.shape[2], 1), jnp.int32)
    if not is_initialized:
      return key, value, mask, None
    index = cache_index.value
    length = key.shape[2]
    max_length = cached_key.value.shape[2]
    group = key.shape[0] // cached_key.value.shape[0]
    if group > 1 and mask is None:
      raise ValueError(f"a self-attention cache shared by {group} rows (beams) needs the mask "
                       "of the slots each row sees")

    def write(cache: Array, new: Array) -> Array:
      if group > 1:  # [rows, h, length, d] -> [cache rows, h, length·group], position-major.
        cache_rows, heads, depth = cache.shape[0], new.shape[1], new.shape[3]
        new = new.reshape(cache_rows, group, heads, length, depth).transpose(0, 2, 3, 1, 4)
        new = new.reshape(cache_rows, heads, length * group, depth)
      return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index * group,
                                                 axis=2)

    cached_key.value = write(cached_key.value, key)
    cached_value.value = write(cached_value.value, value)
    slot_positions = None
    if positions is not None:
      cached_position.value = write(cached_position.value,
                                    positions.astype(jnp.int32)[:, None, :, None])
      slot_positions = cached_position.value[:, 0, :, 0]
    cache_index.value = index + length
    if mask is None:
      mask = (jnp.arange(max_length)[None, :] <= index + jnp.arange(length)[:, None])[None, None]
    return cached_key.value, cached_value.value, mask, slot_positions
