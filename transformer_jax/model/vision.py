"""Images as patch tokens (Dosovitskiy et al., 2021): a ViT through the encoder's own blocks.

An image [height, width, channels] is cut into non-overlapping p×p patches, each
flattened and projected to d_model (a convolution of stride p, written as the matmul
it is). A learned [CLS] token goes first where `pooling` is "cls". Positions are
`config.positions`: "learned" (ViT's), "sinusoidal" (2-D: half of the channels encode
the patch's row, half its column, the paper's sinusoids on each) or "none". Then the
`encoder_layer`s of model/layers.py, unchanged, the final norm under pre-LN, and a
linear head on the [CLS] output or on the mean of the patches' outputs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.model.config import ModelConfig
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.layers import dense, encoder_layer, layer_norm
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.positions import sinusoidal_encoding

Array = jax.Array
POOLINGS = ("cls", "mean")
IMAGE_POSITIONS = ("learned", "sinusoidal", "none")


def patches(images: Array, patch_size: int) -> Array:
  """float[batch, h, w, c] -> [batch, (h/p)·(w/p), p·p·c], patches in row-major order."""
  batch, height, width, channels = images.shape
  rows, cols = height // patch_size, width // patch_size
  grid = images.reshape(batch, rows, patch_size, cols, patch_size, channels)
  return grid.transpose(0, 1, 3, 2, 4, 5).reshape(batch, rows * cols, -1)


def sinusoidal_2d(rows: int, cols: int, d_model: int) -> Array:
  """float32[rows·cols, d_model]: the row's sinusoids in the first half of the channels, the
  column's in the second."""
  row_index, col_index = jnp.divmod(jnp.arange(rows * cols), cols)
  return jnp.concatenate([sinusoidal_encoding(row_index, d_model // 2),
                          sinusoidal_encoding(col_index, d_model // 2)], axis=-1)


class VisionTransformer(nn.Module):
  """Images float[batch, h, w, c] -> class logits float32[batch, num_classes]."""

  config: Any
  patch_size: int
  num_classes: int
  pooling: str = "cls"

  def __post_init__(self):
    object.__setattr__(self, "config", ModelConfig.from_config(self.config))
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling={self.pooling!r} is not one of {', '.join(POOLINGS)}")
    if self.config.positions not in IMAGE_POSITIONS:
      raise ValueError(f"positions={self.config.positions!r} is not one of "
                       f"{', '.join(IMAGE_POSITIONS)} for images")
    super().__post_init__()

  @nn.compact
  def __call__(self, images: Array, train: bool = False) -> Array:
    config = self.config
    _, height, width, _ = images.shape
    if height % self.patch_size or width % self.patch_size:
      raise ValueError(f"images of {height}×{width} do not divide into {self.patch_size}-pixel "
                       "patches")
    grid = (height // self.patch_size, width // self.patch_size)
    x = dense(config, config.d_model, (None, "embed"), "patch_embedding")(
        patches(images, self.patch_size).astype(config.compute_dtype))
    if config.positions == "learned":
      table = self.param("position_embedding", nn.with_logical_partitioning(
          nn.initializers.normal(stddev=0.02), (None, "embed")), (grid[0] * grid[1],
                                                                  config.d_model))
      x = x + table.astype(x.dtype)
    elif config.positions == "sinusoidal":
      x = x + sinusoidal_2d(*grid, config.d_model).astype(x.dtype)
    if self.pooling == "cls":
      cls = self.param("cls_token", nn.with_logical_partitioning(
          nn.initializers.zeros, (None, None, "embed")), (1, 1, config.d_model))
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, x.shape[2])),
                           x], axis=1)
    x = Dropout(config.dropout_rate)(x, deterministic=not train)
    tokens = jnp.ones(x.shape[:2], jnp.int32)  # Every patch is real: no PAD.
    positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
    mask = AttentionMask.self_attention(tokens, None, causal=False,
                                        window=config.attention_window, positions=positions)
    for i in range(config.num_encoder_layers):
      x = encoder_layer(config, f"encoder_{i}")(x, mask, train, positions, None)
    if config.norm == "pre":
      x = layer_norm(config, "encoder_norm")(x)
    pooled = x[:, 0] if self.pooling == "cls" else jnp.mean(x, axis=1)
    return dense(config, self.num_classes, ("embed", None), "head")(pooled).astype(jnp.float32)
