"""A BERT-style encoder-only model from the same blocks, with a masked-LM or a classifier head."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.model.config import ModelConfig
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.layers import (
    ACTIVATION_FUNCTIONS,
    default_positions,
    dense,
    embed_tokens,
    encoder_layer,
    layer_norm,
    relative_bias_table,
    vocabulary_logits,
)
from transformer_jax.special_tokens import PAD_ID

Array = jax.Array
HEADS = ("mlm", "classify")


class EncoderOnly(nn.Module):
  """A BERT-style encoder with a head.

  head="mlm": a transform, then the tied (or separate) vocabulary projection:
  per-token logits [batch, length, vocab].
  head="classify": the mean of each row's non-PAD outputs, a tanh pooler, then
  `num_classes` logits [batch, num_classes] (one example per row: no packing).

  Both heads sit on the same parameters (token_embedding, embed, encoder_i,
  encoder_norm), so a classifier can start from a masked-LM run's encoder.
  """

  config: Any
  head: str = "mlm"
  num_classes: int = 2

  def __post_init__(self):
    object.__setattr__(self, "config", ModelConfig.from_config(self.config))
    if self.head not in HEADS:
      raise ValueError(f"head={self.head!r} is not one of {', '.join(HEADS)}")
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      tokens: Array,
      train: bool = False,
      segment_ids: Array | None = None,
      positions: Array | None = None,
  ) -> Array:
    """int[batch, length] -> float32 logits ([batch, length, vocab] or [batch, classes])."""
    config = self.config
    if positions is None:
      positions = default_positions(tokens)
    token_embedding, x = embed_tokens(config, tokens, positions, train)
    mask = AttentionMask.self_attention(tokens, segment_ids, causal=False,
                                        window=config.attention_window, positions=positions)
    table = relative_bias_table(self, config, "relative_bias")
    for i in range(config.num_encoder_layers):
      x = encoder_layer(config, f"encoder_{i}")(x, mask, train, positions, table)
    if config.norm == "pre":
      x = layer_norm(config, "encoder_norm")(x)
    if self.head == "classify":
      return self.classify(x, tokens != PAD_ID, train)
    x = dense(config, config.d_model, ("embed", "mlp"), "head_transform")(x)
    # BERT's transform uses its hidden activation; GELU's tanh form unless that is a GELU.
    activation = config.activation if config.activation in ("gelu", "gelu_tanh") else "gelu_tanh"
    x = layer_norm(config, "head_norm")(ACTIVATION_FUNCTIONS[activation](x))
    return vocabulary_logits(config, token_embedding, x)

  def classify(self, encoded: Array, valid: Array, train: bool) -> Array:
    """Mean of the non-PAD outputs [batch, d_model] -> tanh pooler -> [batch, num_classes]."""
    config = self.config
    weights = valid.astype(jnp.float32)[..., None]
    pooled = jnp.sum(encoded.astype(jnp.float32) * weights, axis=1) / jnp.maximum(
        jnp.sum(weights, axis=1), 1.0)
    pooled = jnp.tanh(dense(config, config.d_model, ("embed", "mlp"), "pooler")(
        pooled.astype(config.compute_dtype)))
    pooled = Dropout(config.dropout_rate)(pooled, deterministic=not train)
    logits = dense(config, self.num_classes, ("mlp", None), "classifier")(pooled)
    return logits.astype(jnp.float32)
