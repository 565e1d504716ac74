"""The model section of an experiment config, and its validation.

Experiment configs hold `ml_collections.ConfigDict`s; the model turns its
section into a frozen `ModelConfig` and validates it once, at construction,
so a mistake fails with one line that names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import ml_collections

from transformer_jax.attention import ATTENTION_IMPLEMENTATIONS
from transformer_jax.errors import UserError
from transformer_jax.positions import POSITION_KINDS

NORM_PLACEMENTS = ("post", "pre")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def default_model_config() -> ml_collections.ConfigDict:
  """The paper's base model (Table 3, first row) with a 37k shared vocabulary."""
  return ml_collections.ConfigDict(dict(
      vocab_size=37_000,       # Shared source/target vocabulary (§5.1).
      source_vocab_size=0,     # 0: same as vocab_size. Needs share_embeddings=False.
      share_embeddings=True,   # Source and target embeddings are one matrix (§3.4).
      tie_output=True,         # Pre-softmax projection = target embedding (§3.4).
      num_layers=6,            # N, for encoder and decoder alike.
      num_encoder_layers=0,    # 0: num_layers.
      num_decoder_layers=0,    # 0: num_layers.
      d_model=512,
      d_ff=2048,
      num_heads=8,
      d_k=0,                   # 0: d_model // num_heads.
      d_v=0,                   # 0: d_model // num_heads.
      dropout_rate=0.1,        # P_drop on sub-layer outputs and embeddings (§5.4).
      attention_dropout_rate=0.0,
      relu_dropout_rate=0.0,
      positions="sinusoidal",  # "sinusoidal" | "learned" | "none".
      max_len=512,             # Learned positions only; sinusoids have no limit.
      norm="post",             # "post" (the paper) | "pre".
      layer_norm_epsilon=1e-6,
      attention_impl="plain",  # "plain" | "xla" | "cudnn" (jax.nn.dot_product_attention).
      dtype="float32",         # Compute dtype; parameters stay float32.
      matmul_dtype="",         # "": dtype. Matmul operand dtype, float32 accumulation
                               # (precision.py); "bfloat16" with dtype "float32" is
                               # mixed precision, fast on CPUs with AMX.
  ))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A validated, resolved model config (no 0-means-default fields left)."""

  vocab_size: int
  source_vocab_size: int
  share_embeddings: bool
  tie_output: bool
  num_encoder_layers: int
  num_decoder_layers: int
  d_model: int
  d_ff: int
  num_heads: int
  d_k: int
  d_v: int
  dropout_rate: float
  attention_dropout_rate: float
  relu_dropout_rate: float
  positions: str
  max_len: int
  norm: str
  layer_norm_epsilon: float
  attention_impl: str
  dtype: str
  matmul_dtype: str

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]

  @property
  def matmul_operand_dtype(self) -> Any:
    return DTYPES[self.matmul_dtype]

  @classmethod
  def from_config(cls, config: Any) -> "ModelConfig":
    """Validates a ConfigDict (or dict, or ModelConfig) and fills defaults."""
    if isinstance(config, ModelConfig):
      return config
    values = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    known = set(default_model_config().keys())
    unknown = sorted(set(values) - known)
    if unknown:
      raise UserError(
          f"unknown key config.model.{unknown[0]}; valid keys are: "
          + ", ".join(sorted(known))
      )
    merged = default_model_config().to_dict()
    merged.update(values)
    return cls._resolve(merged)

  @classmethod
  def _resolve(cls, c: dict) -> "ModelConfig":
    def fail(message: str):
      raise UserError(message)

    for key in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len"):
      if not isinstance(c[key], int) or c[key] < 1:
        fail(f"config.model.{key}={c[key]!r} must be a positive integer")
    for key in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
      if not 0.0 <= c[key] < 1.0:
        fail(f"config.model.{key}={c[key]!r} must be in [0, 1)")
    choices = {
        "positions": POSITION_KINDS,
        "norm": NORM_PLACEMENTS,
        "attention_impl": ATTENTION_IMPLEMENTATIONS,
        "dtype": tuple(DTYPES),
        "matmul_dtype": ("",) + tuple(DTYPES),
    }
    for key, allowed in choices.items():
      if c[key] not in allowed:
        fail(f"config.model.{key}={c[key]!r} is not one of {', '.join(allowed)}")
    if c["d_k"] == 0 or c["d_v"] == 0:
      if c["d_model"] % c["num_heads"]:
        fail(
            f"config.model.num_heads={c['num_heads']} does not divide "
            f"d_model={c['d_model']}; change num_heads or set d_k and d_v"
        )
    head_depth = c["d_model"] // c["num_heads"]
    d_k = c["d_k"] or head_depth
    d_v = c["d_v"] or head_depth
    if d_k < 0 or d_v < 0:
      fail(f"config.model.d_k={d_k} and d_v={d_v} must be positive")
    source_vocab_size = c["source_vocab_size"] or c["vocab_size"]
    if c["share_embeddings"] and source_vocab_size != c["vocab_size"]:
      fail(
          f"config.model.source_vocab_size={source_vocab_size} differs from "
          f"vocab_size={c['vocab_size']}; set share_embeddings=False for "
          "separate vocabularies"
      )
    if c["attention_impl"] != "plain" and c["attention_dropout_rate"] > 0:
      fail(
          f"config.model.attention_impl={c['attention_impl']!r} has no attention "
          "dropout; use attention_impl='plain' or attention_dropout_rate=0"
      )
    return cls(
        vocab_size=c["vocab_size"],
        source_vocab_size=source_vocab_size,
        share_embeddings=bool(c["share_embeddings"]),
        tie_output=bool(c["tie_output"]),
        num_encoder_layers=c["num_encoder_layers"] or c["num_layers"],
        num_decoder_layers=c["num_decoder_layers"] or c["num_layers"],
        d_model=c["d_model"],
        d_ff=c["d_ff"],
        num_heads=c["num_heads"],
        d_k=d_k,
        d_v=d_v,
        dropout_rate=float(c["dropout_rate"]),
        attention_dropout_rate=float(c["attention_dropout_rate"]),
        relu_dropout_rate=float(c["relu_dropout_rate"]),
        positions=c["positions"],
        max_len=c["max_len"],
        norm=c["norm"],
        layer_norm_epsilon=float(c["layer_norm_epsilon"]),
        attention_impl=c["attention_impl"],
        dtype=c["dtype"],
        matmul_dtype=c["matmul_dtype"] or c["dtype"],
    )
