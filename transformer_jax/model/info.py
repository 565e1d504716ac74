"""A model's parameter count, in total and by component, and its decoding cache per token
(`python -m transformer_jax.model_info`)."""

from __future__ import annotations

import collections
from typing import Any, Callable

import jax
import numpy as np

from transformer_jax.model.config import ModelConfig


def abstract_params(init_params: Callable[[jax.Array], Any]) -> Any:
  """The shapes of the parameters `init_params(key)` makes, without allocating them."""
  return jax.eval_shape(init_params, jax.random.key(0))


def parameter_counts(params: Any) -> dict[str, int]:
  """{'total': n, '<component>': n, ...}; components are the top-level modules,
  with the per-layer modules folded into 'encoder' and 'decoder'."""
  counts = collections.Counter()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    top = str(path[0].key)
    component = top.split("_")[0] if top.split("_")[-1].isdigit() else top
    counts[component] += int(np.prod(leaf.shape))
  return {"total": sum(counts.values()), **dict(sorted(counts.items()))}


def format_counts(counts: dict[str, int]) -> str:
  """A small table: one component a line, counts in millions."""
  lines = [f"{name:<20} {count:>13,} ({count / 1e6:.2f}M)" for name, count in counts.items()]
  return "\n".join(lines)


def kv_cache_bytes_per_token(config: ModelConfig) -> int:
  """Bytes the decoding cache holds for each token of a row, over the decoder layers: every
  layer's keys and values of its num_kv_heads heads, in the matmul operand dtype. An
  encoder-decoder's cross-attention holds as much again for each source token."""
  per_layer = config.num_kv_heads * (config.d_k + config.d_v)
  return config.num_decoder_layers * per_layer * np.dtype(config.matmul_operand_dtype).itemsize
