"""The model section of an experiment config: one frozen dataclass, its defaults and validation.

Each field is written once, here, with its default and what it means; the
`config.model` ConfigDict of an experiment is built from these defaults, and
`ModelConfig.from_config(config.model)` validates it and resolves the fields
whose 0 (or "") means "derive from the others", so a mistake fails with one
line that names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import ml_collections

from transformer_jax.errors import UserError
from transformer_jax.model import precision
from transformer_jax.model.attention import (ATTENTION_IMPLEMENTATIONS, WINDOWED_ATTENTION,
                                             WITH_ALIBI, WITH_ATTENTION_DROPOUT,
                                             WITH_RELATIVE_BIAS)
from transformer_jax.model.positions import POSITION_KINDS, SINUSOID_LAYOUTS, rotary_dims

NORM_PLACEMENTS = ("post", "pre")
NORM_TYPES = ("layernorm", "rmsnorm")
# swish = SiLU, x·sigmoid(x); gelu: the exact (erf) one. Gated (Shazeer, 2020): swiglu =
# swish(x W_gate) ⊙ x W1, geglu = gelu(x W_gate) ⊙ x W1 with GELU's tanh form (T5 v1.1, Gemma).
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
MATMUL_DTYPES = ("", "auto") + tuple(DTYPES)  # "": the compute dtype.
DROPOUT_RATES = ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate")

_CHOICES = {
    "positions": POSITION_KINDS,
    "sinusoid_layout": SINUSOID_LAYOUTS,
    "activation": ACTIVATIONS,
    "norm": NORM_PLACEMENTS,
    "norm_type": NORM_TYPES,
    "attention_impl": ATTENTION_IMPLEMENTATIONS,
    "dtype": tuple(DTYPES),
    "matmul_dtype": MATMUL_DTYPES,
    "quantize": precision.QUANTIZATIONS,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The paper's base model (Table 3, first row) with a 37k shared vocabulary, by default.

  After construction no 0-means-derived field is left: num_encoder_layers,
  num_decoder_layers, num_kv_heads, d_k, d_v, source_vocab_size and matmul_dtype hold values.
  """

  vocab_size: int = 37_000        # Shared source/target vocabulary (§5.1).
  source_vocab_size: int = 0      # 0: vocab_size. Needs share_embeddings=False.
  share_embeddings: bool = True   # Source and target embeddings are one matrix (§3.4).
  tie_output: bool = True         # Pre-softmax projection = target embedding (§3.4).
  num_layers: int = 6             # N, for encoder and decoder alike.
  num_encoder_layers: int = 0     # 0: num_layers.
  num_decoder_layers: int = 0     # 0: num_layers.
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  num_kv_heads: int = 0           # 0: num_heads. Key/value heads, each shared by a group of query
                                  # heads (grouped-query attention; 1: multi-query); the KV cache
                                  # holds num_kv_heads heads.
  d_k: int = 0                    # 0: d_model // num_heads.
  d_v: int = 0                    # 0: d_model // num_heads.
  dropout_rate: float = 0.1       # P_drop on sub-layer outputs and embeddings (§5.4).
  attention_dropout_rate: float = 0.0
  relu_dropout_rate: float = 0.0
  positions: str = "sinusoidal"   # "sinusoidal" | "learned" | "none" | "rope" (rotary, on the
                                  # self-attention queries and keys; positions.rotary) | "alibi"
                                  # (a -m_h·|i - j| bias on self-attention scores) | "t5_bias"
                                  # (T5's learned bias by bucketed distance, one table a stack).
  relative_buckets: int = 32      # positions="t5_bias": buckets of the learned relative bias
  relative_max_distance: int = 128  # and the distance past which they share the last one (T5).
  rope_theta: float = 10_000.0    # RoPE's base θ.
  rope_fraction: float = 1.0      # RoPE: the fraction of each head's channels turned (GPT-NeoX:
                                  # 0.25); the rest carry no position.
  sinusoid_layout: str = "interleaved"  # sin/cos in even/odd channels (§3.5); "concatenated":
                                        # all sines, then all cosines (Marian, fairseq).
  activation: str = "relu"        # Of the feed-forward network (§3.3); Marian: "swish"; GPT-2:
                                  # "gelu_tanh" (GELU's tanh approximation); "swiglu" | "geglu":
                                  # gated, d_ff stays the hidden width.
  embedding_scale: bool = True    # Token embeddings × √d_model (§3.4); GPT-2 and BERT: False.
  embedding_norm: bool = False    # A LayerNorm on the embeddings plus positions (BERT).
  attention_bias: bool = False    # Biases on the attention projections (Marian has them).
  logits_bias: bool = False       # A bias on the output logits (Marian's final_logits_bias).
  unused_tokens: tuple[int, ...] = ()  # Ids never predicted (logit -1e9): rows a published
                                  # vocabulary lacks (GPT-2's PAD and UNK).
  max_len: int = 512              # Learned positions only; sinusoids have no limit.
  norm: str = "post"              # "post" (the paper) | "pre".
  norm_type: str = "layernorm"    # "layernorm" (the paper) | "rmsnorm" (x / RMS(x) · g, no mean
                                  # and no bias; T5, LLaMA, Gemma).
  layer_norm_epsilon: float = 1e-6
  attention_window: int = 0       # > 0: sliding-window self-attention, each token seeing the
                                  # tokens less than this far from it (causal: before it).
  attention_scale: float = 0.0    # The factor of QKᵀ; 0: 1/√d_k (§3.2.1), which keeps the
                                  # softmax out of saturation as d_k grows.
  attention_impl: str = "plain"   # "plain" | "xla" | "chunked" | "pallas" | "cudnn" (attention.py).
  attention_block_size: int = 512  # Queries and keys per block of attention_impl="chunked".
  dtype: str = "float32"          # Compute dtype; parameters stay float32.
  matmul_dtype: str = ""          # "": dtype. Matmul operand dtype with float32 accumulation
                                  # (precision.py); "bfloat16" with dtype "float32" is mixed
                                  # precision, fast on CPUs with AVX512-BF16 or AMX; "auto":
                                  # bfloat16 where that is native (precision.native_bfloat16).
  remat: bool = False             # Training: recompute each layer's activations in the backward
                                  # pass instead of keeping them (jax.checkpoint): less memory
                                  # for about a third more compute.
  quantize: str = ""              # Decoding only: "int8" runs every weight matmul (projections,
                                  # feed-forward, logits) in int8 (precision.int8_matmul);
                                  # set by translate/evaluate --quantize, refused by training.

  def __post_init__(self):
    for key in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len",
                "attention_block_size"):
      value = getattr(self, key)
      if not isinstance(value, int) or value < 1:
        raise UserError(f"config.model.{key}={value!r} must be a positive integer")
    if not self.rope_theta > 0:
      raise UserError(f"config.model.rope_theta={self.rope_theta!r} must be > 0 (LLaMA: 10000)")
    if not 0 < self.rope_fraction <= 1:
      raise UserError(f"config.model.rope_fraction={self.rope_fraction!r} must be in (0, 1]")
    if not isinstance(self.attention_window, int) or self.attention_window < 0:
      raise UserError(f"config.model.attention_window={self.attention_window!r} must be an "
                      "integer >= 0 (0: every token sees the whole row)")
    if self.attention_window and self.attention_impl not in WINDOWED_ATTENTION:
      raise UserError(f"config.model.attention_impl={self.attention_impl!r} takes no sliding "
                      f"window; use attention_impl={' or '.join(map(repr, WINDOWED_ATTENTION))}, "
                      "or attention_window=0")
    if self.positions == "t5_bias" and self.attention_impl not in WITH_RELATIVE_BIAS:
      raise UserError(f"config.model.attention_impl={self.attention_impl!r} takes no T5 relative "
                      f"bias; use attention_impl={' or '.join(map(repr, WITH_RELATIVE_BIAS))}, or "
                      "other positions")
    if self.relative_buckets < 4 or self.relative_buckets % 2:
      raise UserError(f"config.model.relative_buckets={self.relative_buckets} must be even and "
                      ">= 4 (T5: 32)")
    if self.relative_max_distance <= self.relative_buckets // 2:
      raise UserError(f"config.model.relative_max_distance={self.relative_max_distance} must "
                      f"exceed relative_buckets / 2 = {self.relative_buckets // 2} (T5: 128)")
    if self.positions == "alibi" and self.attention_impl not in WITH_ALIBI:
      raise UserError(f"config.model.attention_impl={self.attention_impl!r} takes no ALiBi bias; "
                      f"use attention_impl={' or '.join(map(repr, WITH_ALIBI))}, or other "
                      "positions")
    if self.attention_window > self.max_len and self.positions == "learned":
      raise UserError(f"config.model.attention_window={self.attention_window} is longer than "
                      f"the max_len={self.max_len} learned positions; a window of max_len or "
                      "more hides nothing: use attention_window=0")
    if not self.attention_scale >= 0:
      raise UserError(f"config.model.attention_scale={self.attention_scale!r} must be >= 0 "
                      "(0: 1/sqrt(d_k), the paper's)")
    for key in DROPOUT_RATES:
      if not 0.0 <= getattr(self, key) < 1.0:
        raise UserError(f"config.model.{key}={getattr(self, key)!r} must be in [0, 1)")
    for key, allowed in _CHOICES.items():
      if getattr(self, key) not in allowed:
        raise UserError(f"config.model.{key}={getattr(self, key)!r} is not one of "
                        f"{', '.join(allowed)}")
    if (self.d_k == 0 or self.d_v == 0) and self.d_model % self.num_heads:
      raise UserError(
          f"config.model.num_heads={self.num_heads} does not divide d_model={self.d_model}; "
          "change num_heads or set d_k and d_v")
    num_kv_heads = self.num_kv_heads or self.num_heads
    if self.num_kv_heads < 0 or self.num_heads % num_kv_heads:
      raise UserError(f"config.model.num_kv_heads={self.num_kv_heads} does not divide "
                      f"num_heads={self.num_heads}; use a divisor (1: multi-query attention)")
    unused = tuple(int(i) for i in self.unused_tokens)  # A list, read back from JSON.
    if any(not 0 <= i < self.vocab_size for i in unused):
      raise UserError(f"config.model.unused_tokens={list(unused)} must be ids below "
                      f"vocab_size={self.vocab_size}")
    head_depth = self.d_model // self.num_heads
    resolved = dict(
        unused_tokens=unused,
        num_encoder_layers=self.num_encoder_layers or self.num_layers,
        num_decoder_layers=self.num_decoder_layers or self.num_layers,
        num_kv_heads=num_kv_heads,
        d_k=self.d_k or head_depth,
        d_v=self.d_v or head_depth,
        source_vocab_size=self.source_vocab_size or self.vocab_size,
        matmul_dtype=resolve_matmul_dtype(self.matmul_dtype, self.dtype),
    )
    if resolved["d_k"] < 0 or resolved["d_v"] < 0:
      raise UserError(f"config.model.d_k={resolved['d_k']} and d_v={resolved['d_v']} must be "
                      "positive")
    if self.positions == "rope" and rotary_dims(resolved["d_k"], self.rope_fraction) < 2:
      raise UserError(f"config.model.rope_fraction={self.rope_fraction} of d_k={resolved['d_k']} "
                      "turns no channel pair; raise rope_fraction")
    if self.share_embeddings and resolved["source_vocab_size"] != self.vocab_size:
      raise UserError(
          f"config.model.source_vocab_size={resolved['source_vocab_size']} differs from "
          f"vocab_size={self.vocab_size}; set share_embeddings=False for separate vocabularies")
    if self.attention_impl not in WITH_ATTENTION_DROPOUT and self.attention_dropout_rate > 0:
      raise UserError(
          f"config.model.attention_impl={self.attention_impl!r} has no attention dropout; use "
          f"attention_impl={' or '.join(map(repr, WITH_ATTENTION_DROPOUT))} or "
          "attention_dropout_rate=0")
    if self.attention_impl == "cudnn" and resolved["matmul_dtype"] != "bfloat16":
      raise UserError(
          f"config.model.attention_impl='cudnn' takes bfloat16 operands, not "
          f"{resolved['matmul_dtype']}; set config.model.matmul_dtype='bfloat16' or use "
          "attention_impl='chunked'")
    for key, value in resolved.items():
      object.__setattr__(self, key, value)

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]

  @property
  def matmul_operand_dtype(self) -> Any:
    return DTYPES[self.matmul_dtype]

  @classmethod
  def from_config(cls, config: Any) -> "ModelConfig":
    """Validates a ConfigDict (or dict, or ModelConfig); unset fields take their defaults."""
    if isinstance(config, ModelConfig):
      return config
    values = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    known = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise UserError(f"unknown key config.model.{unknown[0]}; valid keys are: "
                      + ", ".join(sorted(known)))
    for key in (*DROPOUT_RATES, "layer_norm_epsilon", "attention_scale", "rope_theta",
                "rope_fraction"):
      if key in values and isinstance(values[key], int) and not isinstance(values[key], bool):
        values[key] = float(values[key])
    for key in ("share_embeddings", "tie_output", "attention_bias", "logits_bias"):
      if key in values:
        values[key] = bool(values[key])
    return cls(**values)


def resolve_matmul_dtype(matmul_dtype: str, dtype: str) -> str:
  """config.model.matmul_dtype as a dtype name: "" -> dtype; "auto" -> bfloat16 where native."""
  if matmul_dtype == "auto":
    return "bfloat16" if precision.native_bfloat16_here()[0] else dtype
  return matmul_dtype or dtype


def default_model_config() -> ml_collections.ConfigDict:
  """`config.model` as an experiment config starts it: every field at its default."""
  return ml_collections.ConfigDict(
      {field.name: field.default for field in dataclasses.fields(ModelConfig)})
