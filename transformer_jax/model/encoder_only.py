"""A BERT-style encoder-only model with a token-prediction head, from the same blocks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.model.config import ModelConfig
from transformer_jax.model.layers import (
    EmbedTokens,
    EncoderLayer,
    attend,
    default_positions,
    dense,
    embedding,
    layer_norm,
    output_dense,
    self_attention_mask,
)

Array = jax.Array


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
    token_embedding = embedding(config.vocab_size, config, "token_embedding")
    if positions is None:
      positions = default_positions(tokens)
    x = EmbedTokens(config, token_embedding, name="embed")(tokens, positions, train)
    mask = self_attention_mask(tokens, segment_ids, causal=False)
    for i in range(config.num_encoder_layers):
      x = EncoderLayer(config, name=f"encoder_{i}")(x, mask, train)
    if config.norm == "pre":
      x = layer_norm(config, "encoder_norm")(x)
    # The head: a transform, then the tied (or separate) vocabulary projection.
    x = dense(config, config.d_model, ("embed", "mlp"), "head_transform")(x)
    x = layer_norm(config, "head_norm")(nn.gelu(x))
    logits = attend(token_embedding, x, config) if config.tie_output else output_dense(config)(x)
    return logits.astype(jnp.float32)
