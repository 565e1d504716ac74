"""The paper's encoder-decoder Transformer (§3)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.model.config import ModelConfig
from transformer_jax.model.layers import (
    EmbedTokens,
    LogitsBias,
    attend,
    decoder_layer,
    default_positions,
    embedding,
    encoder_layer,
    layer_norm,
    relative_bias_table,
    output_dense,
)
from transformer_jax.model.masking import AttentionMask
from transformer_jax.special_tokens import BOS_ID, PAD_ID

Array = jax.Array


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
    self.target_embedding = embedding(config.vocab_size, config, "target_embedding")
    if config.share_embeddings:
      self.source_embedding = self.target_embedding
    else:
      self.source_embedding = embedding(
          config.source_vocab_size, config, "source_embedding"
      )
    self.embed_source = EmbedTokens(config, self.source_embedding, name="embed_source")
    self.embed_target = EmbedTokens(config, self.target_embedding, name="embed_target")
    self.encoder_layers = [
        encoder_layer(config, f"encoder_{i}") for i in range(config.num_encoder_layers)
    ]
    self.decoder_layers = [
        decoder_layer(config, f"decoder_{i}") for i in range(config.num_decoder_layers)
    ]
    self.encoder_relative_bias = relative_bias_table(self, config, "encoder_relative_bias")
    self.decoder_relative_bias = relative_bias_table(self, config, "decoder_relative_bias")
    if config.norm == "pre":
      self.encoder_norm = layer_norm(config, "encoder_norm")
      self.decoder_norm = layer_norm(config, "decoder_norm")
    if not config.tie_output:
      self.output_projection = output_dense(config)
    self.logits_bias = LogitsBias(config)

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
    mask = AttentionMask.self_attention(src_tokens, src_segment_ids, causal=False,
                                        window=self.config.attention_window,
                                        positions=src_positions)
    for layer in self.encoder_layers:
      x = layer(x, mask, train, src_positions, self.encoder_relative_bias)
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
      decode_self_mask: AttentionMask | None = None,
  ) -> Array:
    """Logits float32[batch, tgt_len, vocab] for the next target token.

    With `decode=True` the "cache" collection holds per-layer keys/values; a
    first call with the full-length target creates it (and stores the cross-
    attention keys/values of `encoded`), each later call takes one token and
    its `target_positions` ([batch, 1], the step index). `decode_self_mask`
    (explicit, over cache slots) replaces a step's causal self-attention mask:
    the beams sharing one cache (decode/cache.shared_beam_mask).
    """
    if decode_self_mask is not None and not decode:
      raise ValueError("decode_self_mask is a decoding step's mask over cache slots: "
                       "pass decode=True")
    if target_positions is None:
      target_positions = default_positions(target_input_tokens)
    x = self.embed_target(target_input_tokens, target_positions, train)
    cross_mask = AttentionMask.cross_attention(src_tokens, target_segment_ids, src_segment_ids)
    self_mask = decode_self_mask if decode else AttentionMask.self_attention(
        target_input_tokens, target_segment_ids, causal=True,
        window=self.config.attention_window, positions=target_positions)
    for layer in self.decoder_layers:
      x = layer(x, encoded, self_mask, cross_mask, train, decode, target_positions,
                self.decoder_relative_bias)
    if self.config.norm == "pre":
      x = self.decoder_norm(x)
    return self._logits(x)

  def _logits(self, x: Array) -> Array:
    if self.config.tie_output:
      logits = attend(self.target_embedding, x, self.config)
    else:
      logits = self.output_projection(x)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return self.logits_bias(logits)

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
