"""A GPT-style decoder-only language model from the same blocks, optionally a prefix LM."""

from __future__ import annotations

from typing import Any

import jax
from flax import linen as nn

from transformer_jax.model.config import ModelConfig
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.layers import (
    decoder_layer,
    default_positions,
    embed_tokens,
    layer_norm,
    relative_bias_table,
    vocabulary_logits,
)

Array = jax.Array


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
      decode: bool = False,
      prefix: Array | None = None,
      cache_mask: Array | None = None,
  ) -> Array:
    """int[batch, length] -> next-token logits float32[batch, length, vocab].

    `prefix` (bool[batch, length]) marks tokens that attend to each other both
    ways (a prefix LM's source); the others attend causally.

    With `decode=True` the "cache" collection holds every layer's keys and
    values: a first call with the full cache length creates it, each later
    call writes its tokens (a prompt in one pass, or one token a step) at the
    next slots, with their `positions`. `cache_mask`, bool[batch, 1, length,
    cache_len], names the slots each token may see (None: the slots up to its
    own); slots and positions differ when a batch's prompts differ in length.
    """
    config = self.config
    if positions is None:
      positions = default_positions(tokens)
    token_embedding, x = embed_tokens(config, tokens, positions, train)
    if decode:
      mask = AttentionMask.from_dense(cache_mask)
    else:
      mask = AttentionMask.self_attention(tokens, segment_ids, causal=True, prefix=prefix,
                                          window=config.attention_window, positions=positions)
    table = relative_bias_table(self, config, "relative_bias")
    for i in range(config.num_decoder_layers):
      x = decoder_layer(config, f"decoder_{i}", cross_attention=False)(
          x, None, mask, None, train, decode, positions, table)
    if config.norm == "pre":
      x = layer_norm(config, "decoder_norm")(x)
    return vocabulary_logits(config, token_embedding, x)
