"""The Transformer (§3) and its two descendants, from the same blocks.

- `Transformer`: the paper's encoder-decoder.
- `DecoderOnly`: a GPT-style language model (decoder layers, no cross-attention).
- `EncoderOnly`: a BERT-style encoder with a token-prediction head.

Every parameter and the main activations carry logical axis names
('vocab', 'embed', 'mlp', 'heads', 'kv', 'batch', 'length'); `parallel.py`
maps them onto mesh axes with one rule table.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.attention import (
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from transformer_jax import precision
from transformer_jax.dropout import Dropout
from transformer_jax.model_config import ModelConfig
from transformer_jax.positions import PositionalEncoding
from transformer_jax.special_tokens import BOS_ID, PAD_ID

Array = jax.Array
_ACTIVATION = ("batch", "length", "embed")


def shift_right(target_tokens: Array, target_positions: Array | None = None) -> Array:
  """Decoder inputs: BOS followed by the targets, one step late.

  Args:
    target_tokens: int[batch, length], ending in EOS, padded with PAD.
    target_positions: int[batch, length] for packed rows (each segment restarts
      at 0 and gets its own BOS), or None.

  Returns:
    int[batch, length]; PAD where the target is PAD.
  """
  shifted = jnp.pad(target_tokens[:, :-1], ((0, 0), (1, 0)), constant_values=BOS_ID)
  if target_positions is not None:
    shifted = jnp.where(target_positions == 0, BOS_ID, shifted)
  return jnp.where(target_tokens == PAD_ID, PAD_ID, shifted)


def default_positions(tokens: Array) -> Array:
  """int[batch, length]: 0, 1, 2, ... for unpacked rows."""
  return jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)


def _dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
           use_bias: bool = True) -> nn.Dense:
  """A Glorot-initialised Dense whose matmul follows `config.matmul_dtype`."""
  return nn.Dense(
      features,
      dtype=config.compute_dtype,
      use_bias=use_bias,
      dot_general=functools.partial(
          precision.dot_general,
          operand_dtype=config.matmul_operand_dtype,
          result_dtype=config.compute_dtype,
      ),
      kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
      name=name,
  )


def attend(embedding: nn.Embed, x: Array, config: ModelConfig) -> Array:
  """Logits [batch, length, vocab] = x · Eᵀ, the shared pre-softmax weights (§3.4)."""
  table = jnp.asarray(embedding.embedding, config.compute_dtype)
  logits = precision.einsum(  # As a 2-D product: see precision._low_precision_product.
      "md,vd->mv",
      x.reshape(-1, x.shape[-1]),
      table,
      config.matmul_operand_dtype,
      config.compute_dtype,
  )
  return logits.reshape(*x.shape[:-1], table.shape[0])


def _embedding(num_embeddings: int, config: ModelConfig, name: str) -> nn.Embed:
  return nn.Embed(
      num_embeddings=num_embeddings,
      features=config.d_model,
      dtype=config.compute_dtype,
      embedding_init=nn.with_logical_partitioning(
          nn.initializers.normal(stddev=config.d_model**-0.5), ("vocab", "embed")
      ),
      name=name,
  )


class EmbedTokens(nn.Module):
  """Token embedding × √d_model (§3.4) + positions (§3.5), then dropout (§5.4)."""

  config: ModelConfig
  embedding: nn.Embed

  @nn.compact
  def __call__(self, tokens: Array, positions: Array, train: bool) -> Array:
    """tokens, positions: int[batch, length] -> [batch, length, d_model]."""
    config = self.config
    embedded = self.embedding(tokens) * jnp.sqrt(config.d_model).astype(config.compute_dtype)
    embedded = PositionalEncoding(
        config.positions, config.d_model, config.max_len, name="positions"
    )(embedded, positions)
    embedded = Dropout(config.dropout_rate)(embedded, deterministic=not train)
    return nn.with_logical_constraint(embedded, _ACTIVATION)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2  (§3.3)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, train: bool) -> Array:
    """[batch, length, d_model] -> [batch, length, d_model]."""
    config = self.config
    hidden = _dense(config, config.d_ff, ("embed", "mlp"), "wi")(inputs)
    hidden = nn.relu(hidden)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    hidden = Dropout(config.relu_dropout_rate)(hidden, deterministic=not train)
    return _dense(config, config.d_model, ("mlp", "embed"), "wo")(hidden)


class SublayerConnection(nn.Module):
  """Residual connection, dropout and LayerNorm around one sub-layer.

  post (§3.1, §5.4): LayerNorm(x + Dropout(Sublayer(x))).
  pre:  x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, sublayer: Callable[[Array], Array], train: bool) -> Array:
    config = self.config
    norm = _layer_norm(config, "norm")
    outputs = sublayer(norm(inputs) if config.norm == "pre" else inputs)
    outputs = Dropout(config.dropout_rate)(outputs, deterministic=not train)
    outputs = inputs + outputs
    if config.norm == "post":
      outputs = norm(outputs)
    return nn.with_logical_constraint(outputs, _ACTIVATION)


def _layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon,
      dtype=config.compute_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
      name=name,
  )


def _attention(config: ModelConfig, name: str) -> MultiHeadAttention:
  return MultiHeadAttention(
      num_heads=config.num_heads,
      d_k=config.d_k,
      d_v=config.d_v,
      d_model=config.d_model,
      dropout_rate=config.attention_dropout_rate,
      implementation=config.attention_impl,
      dtype=config.compute_dtype,
      matmul_dtype=config.matmul_operand_dtype,
      name=name,
  )


class EncoderLayer(nn.Module):
  """Self-attention, then the feed-forward network (§3.1)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, mask: Array | None, train: bool) -> Array:
    """[batch, src_len, d_model] -> same; mask: bool[batch, 1, src_len, src_len]."""
    self_attention = _attention(self.config, "self_attention")
    feed_forward = FeedForward(self.config, name="feed_forward")
    x = SublayerConnection(self.config, name="self_attention_block")(
        inputs, lambda h: self_attention(h, h, mask, train=train), train
    )
    return SublayerConnection(self.config, name="feed_forward_block")(
        x, lambda h: feed_forward(h, train), train
    )


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, feed-forward (§3.1).

  With `cross_attention=False` it is a GPT-style decoder-only layer.
  """

  config: ModelConfig
  cross_attention: bool = True

  @nn.compact
  def __call__(
      self,
      inputs: Array,
      encoded: Array | None,
      self_mask: Array | None,
      cross_mask: Array | None,
      train: bool,
      decode: bool = False,
  ) -> Array:
    """inputs: [batch, tgt_len, d_model]; encoded: [batch, src_len, d_model]."""
    config = self.config
    self_attention = _attention(config, "self_attention")
    x = SublayerConnection(config, name="self_attention_block")(
        inputs, lambda h: self_attention(h, h, self_mask, train=train, decode=decode), train
    )
    if self.cross_attention:
      cross_attention = _attention(config, "cross_attention")
      x = SublayerConnection(config, name="cross_attention_block")(
          x,
          lambda h: cross_attention(
              h, encoded, cross_mask, train=train, decode=decode, cross_attention=True
          ),
          train,
      )
    feed_forward = FeedForward(config, name="feed_forward")
    return SublayerConnection(config, name="feed_forward_block")(
        x, lambda h: feed_forward(h, train), train
    )


def _self_attention_mask(
    tokens: Array, segment_ids: Array | None, causal: bool
) -> Array:
  """bool[batch, 1, len, len]: padding, packing segments and (optionally) causality."""
  return combine_masks(
      padding_mask(tokens),
      segment_mask(segment_ids, segment_ids) if segment_ids is not None else None,
      causal_mask(tokens.shape[-1]) if causal else None,
  )


class Transformer(nn.Module):
  """The encoder-decoder Transformer.

  `Transformer(config.model)` takes the `model` section of an experiment
  config (a ConfigDict), validated here, at construction.
  """

  config: Any

  def __post_init__(self):
    object.__setattr__(self, "config", ModelConfig.from_config(self.config))
    super().__post_init__()

  def setup(self):
    config = self.config
    self.target_embedding = _embedding(config.vocab_size, config, "target_embedding")
    if config.share_embeddings:
      self.source_embedding = self.target_embedding
    else:
      self.source_embedding = _embedding(
          config.source_vocab_size, config, "source_embedding"
      )
    self.embed_source = EmbedTokens(config, self.source_embedding, name="embed_source")
    self.embed_target = EmbedTokens(config, self.target_embedding, name="embed_target")
    self.encoder_layers = [
        EncoderLayer(config, name=f"encoder_{i}") for i in range(config.num_encoder_layers)
    ]
    self.decoder_layers = [
        DecoderLayer(config, name=f"decoder_{i}") for i in range(config.num_decoder_layers)
    ]
    if config.norm == "pre":
      self.encoder_norm = _layer_norm(config, "encoder_norm")
      self.decoder_norm = _layer_norm(config, "decoder_norm")
    if not config.tie_output:
      self.output_projection = _output_dense(config)

  def encode(
      self,
      src_tokens: Array,
      train: bool = False,
      src_segment_ids: Array | None = None,
      src_positions: Array | None = None,
  ) -> Array:
    """int[batch, src_len] -> encoded [batch, src_len, d_model]."""
    if src_positions is None:
      src_positions = default_positions(src_tokens)
    x = self.embed_source(src_tokens, src_positions, train)
    mask = _self_attention_mask(src_tokens, src_segment_ids, causal=False)
    for layer in self.encoder_layers:
      x = layer(x, mask, train)
    if self.config.norm == "pre":
      x = self.encoder_norm(x)
    return x

  def decode(
      self,
      encoded: Array | None,
      src_tokens: Array,
      target_input_tokens: Array,
      train: bool = False,
      src_segment_ids: Array | None = None,
      target_segment_ids: Array | None = None,
      target_positions: Array | None = None,
      decode: bool = False,
  ) -> Array:
    """Logits float32[batch, tgt_len, vocab] for the next target token.

    With `decode=True` the "cache" collection holds per-layer keys/values; a
    first call with the full-length target creates it (and stores the cross-
    attention keys/values of `encoded`), each later call takes one token and
    its `target_positions` ([batch, 1], the step index).
    """
    if target_positions is None:
      target_positions = default_positions(target_input_tokens)
    x = self.embed_target(target_input_tokens, target_positions, train)
    cross_mask = combine_masks(
        padding_mask(src_tokens),
        segment_mask(target_segment_ids, src_segment_ids)
        if target_segment_ids is not None
        else None,
    )
    self_mask = None if decode else _self_attention_mask(
        target_input_tokens, target_segment_ids, causal=True
    )
    for layer in self.decoder_layers:
      x = layer(x, encoded, self_mask, cross_mask, train, decode=decode)
    if self.config.norm == "pre":
      x = self.decoder_norm(x)
    return self._logits(x)

  def _logits(self, x: Array) -> Array:
    if self.config.tie_output:
      logits = attend(self.target_embedding, x, self.config)
    else:
      logits = self.output_projection(x)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32)

  def __call__(
      self,
      src_tokens: Array,
      target_input_tokens: Array,
      train: bool = False,
      src_segment_ids: Array | None = None,
      target_segment_ids: Array | None = None,
      src_positions: Array | None = None,
      target_positions: Array | None = None,
  ) -> Array:
    """src_tokens: int[batch, src_len]; target_input_tokens: int[batch, tgt_len].

    Returns:
      float32 logits [batch, tgt_len, vocab].
    """
    encoded = self.encode(src_tokens, train, src_segment_ids, src_positions)
    return self.decode(
        encoded,
        src_tokens,
        target_input_tokens,
        train,
        src_segment_ids,
        target_segment_ids,
        target_positions,
    )


def _output_dense(config: ModelConfig) -> nn.Dense:
  return _dense(config, config.vocab_size, ("embed", "vocab"), "output_projection", use_bias=False)


class DecoderOnly(nn.Module):
  """A GPT-style language model: causal decoder layers without cross-attention."""

  config: Any

  def __post_init__(self):
    object.__setattr__(self, "config", ModelConfig.from_config(self.config))
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      tokens: Array,
      train: bool = False,
      segment_ids: Array | None = None,
      positions: Array | None = None,
  ) -> Array:
    """int[batch, length] -> next-token logits float32[batch, length, vocab]."""
    config = self.config
    embedding = _embedding(config.vocab_size, config, "token_embedding")
    if positions is None:
      positions = default_positions(tokens)
    x = EmbedTokens(config, embedding, name="embed")(tokens, positions, train)
    mask = _self_attention_mask(tokens, segment_ids, causal=True)
    for i in range(config.num_decoder_layers):
      x = DecoderLayer(config, cross_attention=False, name=f"decoder_{i}")(
          x, None, mask, None, train
      )
    if config.norm == "pre":
      x = _layer_norm(config, "decoder_norm")(x)
    logits = attend(embedding, x, config) if config.tie_output else _output_dense(config)(x)
    return logits.astype(jnp.float32)


class EncoderOnly(nn.Module):
  """A BERT-style encoder with a token-prediction (masked-LM) head."""

  config: Any

  def __post_init__(self):
    object.__setattr__(self, "config", ModelConfig.from_config(self.config))
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      tokens: Array,
      train: bool = False,
      segment_ids: Array | None = None,
      positions: Array | None = None,
  ) -> Array:
    """int[batch, length] -> per-token logits float32[batch, length, vocab]."""
    config = self.config
    embedding = _embedding(config.vocab_size, config, "token_embedding")
    if positions is None:
      positions = default_positions(tokens)
    x = EmbedTokens(config, embedding, name="embed")(tokens, positions, train)
    mask = _self_attention_mask(tokens, segment_ids, causal=False)
    for i in range(config.num_encoder_layers):
      x = EncoderLayer(config, name=f"encoder_{i}")(x, mask, train)
    if config.norm == "pre":
      x = _layer_norm(config, "encoder_norm")(x)
    # The head: a transform, then the tied (or separate) vocabulary projection.
    x = _dense(config, config.d_model, ("embed", "mlp"), "head_transform")(x)
    x = _layer_norm(config, "head_norm")(nn.gelu(x))
    logits = attend(embedding, x, config) if config.tie_output else _output_dense(config)(x)
    return logits.astype(jnp.float32)
