"""The blocks every model family is built from (§3.1-§3.4).

Embeddings ×√d_model with positions, the position-wise feed-forward network,
the residual-dropout-LayerNorm connection around each sub-layer, and the
encoder and decoder layers. Every parameter and the main activations carry
logical axis names ('vocab', 'embed', 'mlp', 'heads', 'kv', 'batch', 'length');
`sharding.py` maps them onto mesh axes with one rule table.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.model import precision
from transformer_jax.model.attention import MultiHeadAttention
from transformer_jax.model.config import GATED_ACTIVATIONS, ModelConfig
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.positions import PositionalEncoding

Array = jax.Array
ACTIVATION = ("batch", "length", "embed")


def default_positions(tokens: Array) -> Array:
  """int[batch, length]: 0, 1, 2, ... for unpacked rows."""
  return jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)


def dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
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
          quantize=config.quantize,
      ),
      kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
      name=name,
  )


def attend(embedding: nn.Embed, x: Array, config: ModelConfig) -> Array:
  """Logits [batch, length, vocab] = x · Eᵀ, the shared pre-softmax weights (§3.4)."""
  table = jnp.asarray(embedding.embedding, config.compute_dtype)
  if config.quantize == "int8":  # One scale per vocabulary entry (a row of the table).
    logits = precision.int8_matmul(x.reshape(-1, x.shape[-1]), table.T, config.compute_dtype)
    return logits.reshape(*x.shape[:-1], table.shape[0])
  logits = precision.einsum(  # As a 2-D product: see precision._low_precision_product.
      "md,vd->mv",
      x.reshape(-1, x.shape[-1]),
      table,
      config.matmul_operand_dtype,
      config.compute_dtype,
  )
  return logits.reshape(*x.shape[:-1], table.shape[0])


def embedding(num_embeddings: int, config: ModelConfig, name: str) -> nn.Embed:
  return nn.Embed(
      num_embeddings=num_embeddings,
      features=config.d_model,
      dtype=config.compute_dtype,
      embedding_init=nn.with_logical_partitioning(
          nn.initializers.normal(stddev=config.d_model**-0.5), ("vocab", "embed")
      ),
      name=name,
  )


def lookup(embedding: nn.Embed, tokens: Array, config: ModelConfig) -> Array:
  """[batch, length, d_model]: the rows of `embedding` that `tokens` (int[batch, length]) name.

  The table is gathered whole along 'embed' first (under fsdp, the all-gather every
  weight gets) and stays split along 'vocab': left to itself, the SPMD partitioner
  meets a table split over fsdp and a batch split over fsdp in one gather, and
  replicates the whole output to reshard it.
  """
  table = jnp.asarray(embedding.embedding, config.compute_dtype)
  table = nn.with_logical_constraint(table, ("vocab", None))
  return jnp.take(table, tokens, axis=0)


class EmbedTokens(nn.Module):
  """Token embedding × √d_model (§3.4; `embedding_scale`) + positions (§3.5), a LayerNorm
  where `embedding_norm` (BERT), then dropout (§5.4)."""

  config: ModelConfig
  embedding: nn.Embed

  @nn.compact
  def __call__(self, tokens: Array, positions: Array, train: bool) -> Array:
    """tokens, positions: int[batch, length] -> [batch, length, d_model]."""
    config = self.config
    embedded = lookup(self.embedding, tokens, config)
    if config.embedding_scale:
      embedded = embedded * jnp.sqrt(config.d_model).astype(config.compute_dtype)
    embedded = PositionalEncoding(
        config.positions, config.d_model, config.max_len, config.sinusoid_layout,
        name="positions")(embedded, positions)
    if config.embedding_norm:
      embedded = layer_norm(config, "norm")(embedded)
    embedded = Dropout(config.dropout_rate)(embedded, deterministic=not train)
    return nn.with_logical_constraint(embedded, ACTIVATION)


ACTIVATION_FUNCTIONS = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "swish": nn.swish,
    # The gates of the gated activations (config.GATED_ACTIVATIONS).
    "swiglu": nn.swish,
    "geglu": functools.partial(nn.gelu, approximate=True),
}


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2  (§3.3); max(0, ·) is `config.activation`.

  A gated activation (swiglu, geglu) computes act(x W_gate + b_gate) ⊙ (x W1 + b1) in
  place of act(x W1 + b1), with W_gate ("wi_gate") of W1's shape.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, train: bool) -> Array:
    """[batch, length, d_model] -> [batch, length, d_model]."""
    config = self.config
    hidden = dense(config, config.d_ff, ("embed", "mlp"), "wi")(inputs)
    if config.activation in GATED_ACTIVATIONS:
      gate = dense(config, config.d_ff, ("embed", "mlp"), "wi_gate")(inputs)
      hidden = ACTIVATION_FUNCTIONS[config.activation](gate) * hidden
    else:
      hidden = ACTIVATION_FUNCTIONS[config.activation](hidden)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    hidden = Dropout(config.relu_dropout_rate)(hidden, deterministic=not train)
    return dense(config, config.d_model, ("mlp", "embed"), "wo")(hidden)


class SublayerConnection(nn.Module):
  """Residual connection, dropout and LayerNorm around one sub-layer.

  post (§3.1, §5.4): LayerNorm(x + Dropout(Sublayer(x))).
  pre:  x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, sublayer: Callable[[Array], Array], train: bool) -> Array:
    config = self.config
    norm = layer_norm(config, "norm")
    outputs = sublayer(norm(inputs) if config.norm == "pre" else inputs)
    outputs = Dropout(config.dropout_rate)(outputs, deterministic=not train)
    outputs = inputs + outputs
    if config.norm == "post":
      outputs = norm(outputs)
    return nn.with_logical_constraint(outputs, ACTIVATION)


def layer_norm(config: ModelConfig, name: str) -> nn.Module:
  """The normalisation `config.norm_type` names: LayerNorm (scale and bias) or RMSNorm
  (x / √(mean(x²) + ε) · scale)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
  if config.norm_type == "rmsnorm":
    return nn.RMSNorm(epsilon=config.layer_norm_epsilon, dtype=config.compute_dtype,
                      scale_init=scale_init, name=name)
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon,
      dtype=config.compute_dtype,
      scale_init=scale_init,
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
      name=name,
  )


def relative_bias_table(module: nn.Module, config: ModelConfig, name: str) -> Array | None:
  """T5's relative bias table of a stack, float32[relative_buckets, num_heads], made in
  `module` (shared by the stack's layers), or None unless config.positions is "t5_bias"."""
  if config.positions != "t5_bias":
    return None
  init = nn.initializers.normal(stddev=config.d_model ** -0.5)
  return module.param(name, nn.with_logical_partitioning(init, (None, "heads")),
                      (config.relative_buckets, config.num_heads))


def multi_head_attention(config: ModelConfig, name: str,
                         relative_bidirectional: bool = True) -> MultiHeadAttention:
  """The attention of `config`; `relative_bidirectional`: T5's buckets tell keys after the
  query from keys before (an encoder's), or not (a causal decoder's)."""
  return MultiHeadAttention(
      num_heads=config.num_heads,
      d_k=config.d_k,
      d_v=config.d_v,
      d_model=config.d_model,
      dropout_rate=config.attention_dropout_rate,
      implementation=config.attention_impl,
      block_size=config.attention_block_size,
      dtype=config.compute_dtype,
      matmul_dtype=config.matmul_operand_dtype,
      use_bias=config.attention_bias,
      quantize=config.quantize,
      scale=config.attention_scale,
      rope_theta=config.rope_theta if config.positions == "rope" else 0.0,
      rope_fraction=config.rope_fraction,
      num_kv_heads=config.num_kv_heads,
      window=config.attention_window,
      alibi=config.positions == "alibi",
      relative_bidirectional=relative_bidirectional,
      relative_max_distance=config.relative_max_distance,
      name=name,
  )


class EncoderLayer(nn.Module):
  """Self-attention, then the feed-forward network (§3.1)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, inputs: Array, mask: AttentionMask | None, train: bool,
               positions: Array | None = None, relative_bias_table: Array | None = None
               ) -> Array:
    """[batch, src_len, d_model] -> same; `positions` int[batch, src_len] (rotary positions,
    biases); `relative_bias_table`: the stack's T5 bias (`relative_bias_table`)."""
    self_attention = multi_head_attention(self.config, "self_attention")
    feed_forward = FeedForward(self.config, name="feed_forward")
    x = SublayerConnection(self.config, name="self_attention_block")(
        inputs, lambda h: self_attention(h, h, mask, train=train, positions=positions,
                                         relative_bias_table=relative_bias_table), train
    )
    return SublayerConnection(self.config, name="feed_forward_block")(
        x, lambda h: feed_forward(h, train), train
    )


def encoder_layer(config: ModelConfig, name: str) -> nn.Module:
  """An EncoderLayer, rematerialised in the backward pass where `config.remat` says so.
  Call it with positional arguments (inputs, mask, train, positions, relative_bias_table)."""
  layer = nn.remat(EncoderLayer, static_argnums=(3,)) if config.remat else EncoderLayer
  return layer(config, name=name)


def decoder_layer(config: ModelConfig, name: str, cross_attention: bool = True) -> nn.Module:
  """A DecoderLayer, rematerialised in the backward pass where `config.remat` says so.
  Call it with positional arguments (inputs, encoded, self_mask, cross_mask, train, decode,
  positions, relative_bias_table)."""
  layer = nn.remat(DecoderLayer, static_argnums=(5, 6)) if config.remat else DecoderLayer
  return layer(config, cross_attention=cross_attention, name=name)


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
      self_mask: AttentionMask | None,
      cross_mask: AttentionMask | None,
      train: bool,
      decode: bool = False,
      positions: Array | None = None,
      relative_bias_table: Array | None = None,
  ) -> Array:
    """inputs: [batch, tgt_len, d_model]; encoded: [batch, src_len, d_model]; positions:
    int[batch, tgt_len] (rotary positions, biases); relative_bias_table: the stack's T5 bias."""
    config = self.config
    self_attention = multi_head_attention(config, "self_attention", relative_bidirectional=False)
    x = SublayerConnection(config, name="self_attention_block")(
        inputs, lambda h: self_attention(h, h, self_mask, train=train, decode=decode,
                                         positions=positions,
                                         relative_bias_table=relative_bias_table), train
    )
    if self.cross_attention:
      cross_attention = multi_head_attention(config, "cross_attention")
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


def embed_tokens(config: ModelConfig, tokens: Array, positions: Array | None,
                 train: bool) -> tuple[nn.Embed, Array]:
  """(the token embedding, embedded tokens [batch, len, d_model]) of a one-stack model.

  Call from a compact method: the parameters land in its scope as
  "token_embedding" and "embed".
  """
  token_embedding = embedding(config.vocab_size, config, "token_embedding")
  if positions is None:
    positions = default_positions(tokens)
  return token_embedding, EmbedTokens(config, token_embedding, name="embed")(tokens, positions, train)


def vocabulary_logits(config: ModelConfig, token_embedding: nn.Embed, x: Array) -> Array:
  """float32[batch, len, vocab]: the tied embedding's transpose, or a separate projection.

  Call from a compact method: the projection and the bias land in its scope.
  """
  logits = attend(token_embedding, x, config) if config.tie_output else output_dense(config)(x)
  return LogitsBias(config, name="logits_bias")(logits)


NEVER_LOGIT = -1e9  # The logit of `config.unused_tokens`.


class LogitsBias(nn.Module):
  """float32 logits [..., vocab] + a learned bias where `config.logits_bias` (Marian's);
  NEVER_LOGIT at `config.unused_tokens`."""

  config: ModelConfig

  @nn.compact
  def __call__(self, logits: Array) -> Array:
    logits = logits.astype(jnp.float32)
    if self.config.logits_bias:
      logits = logits + self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
          (self.config.vocab_size,))
    if self.config.unused_tokens:
      logits = logits.at[..., jnp.asarray(self.config.unused_tokens)].set(NEVER_LOGIT)
    return logits


def output_dense(config: ModelConfig) -> nn.Dense:
  return dense(config, config.vocab_size, ("embed", "vocab"), "output_projection", use_bias=False)
