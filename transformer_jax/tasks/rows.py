"""The model rows a monolingual task reads from a corpus batch: one side, or the pair as one row.

A corpus batch holds `src_tokens` and `target_tokens` ([rows, length], each
sentence EOS-terminated and PAD-padded; with packing, `*_segment_ids` and
`*_positions` too). `config.text_side` chooses what a task models:

  "source" / "target": that side's rows as they are;
  "pair": source then target in one row, [src | tgt], positions running on
  from each source sentence into its target, so the target's first token sits
  right after the source's EOS whatever PAD lies between the two halves.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.errors import UserError
from transformer_jax.model.layers import default_positions
from transformer_jax.special_tokens import PAD_ID

Array = jax.Array
TEXT_SIDES = ("source", "target", "pair")
# Every array a corpus batch may hold (the segment ids and positions only when packed).
CORPUS_BATCH_KEYS = ("src_tokens", "target_tokens", "src_segment_ids", "target_segment_ids",
                     "src_positions", "target_positions")


class Rows(NamedTuple):
  """tokens, positions: int32[batch, len]; segment_ids (packed rows) or None;
  prefix: bool[batch, len], True on a pair's source half (None for one side)."""

  tokens: Array
  positions: Array
  segment_ids: Array | None
  prefix: Array | None


def check_text_side(side: str) -> None:
  if side not in TEXT_SIDES:
    raise UserError(f"config.text_side={side!r} is not one of {', '.join(TEXT_SIDES)}")


def side_rows(batch: dict[str, Array], side: str) -> Rows:
  """One side of the batch ("source" or "target") as model rows."""
  prefix = "src" if side == "source" else "target"
  tokens = batch[f"{prefix}_tokens"]
  positions = batch.get(f"{prefix}_positions")
  return Rows(tokens, default_positions(tokens) if positions is None else positions,
              batch.get(f"{prefix}_segment_ids"), None)


def source_lengths_at(batch: dict[str, Array], target_like: Array) -> Array:
  """int32[batch, tgt_len]: the length of the source sentence each target token belongs to."""
  not_pad = batch["src_tokens"] != PAD_ID
  src_segments, tgt_segments = batch.get("src_segment_ids"), batch.get("target_segment_ids")
  if src_segments is None:
    return jnp.broadcast_to(jnp.sum(not_pad, axis=-1, keepdims=True), target_like.shape)
  same = (tgt_segments[:, :, None] == src_segments[:, None, :]) & not_pad[:, None, :]
  return jnp.sum(same, axis=-1).astype(jnp.int32)


def pair_rows(batch: dict[str, Array], target_tokens: Array | None = None) -> Rows:
  """[src | tgt] rows; `target_tokens` replaces the batch's target half (e.g. shifted right)."""
  src, tgt = side_rows(batch, "source"), side_rows(batch, "target")
  target_tokens = tgt.tokens if target_tokens is None else target_tokens
  tokens = jnp.concatenate([src.tokens, target_tokens], axis=1)
  positions = jnp.concatenate(
      [src.positions, tgt.positions + source_lengths_at(batch, tgt.tokens)], axis=1)
  segment_ids = None
  if src.segment_ids is not None:
    segment_ids = jnp.concatenate([src.segment_ids, tgt.segment_ids], axis=1)
  prefix = jnp.concatenate(
      [src.tokens != PAD_ID, jnp.zeros(target_tokens.shape, bool)], axis=1)
  return Rows(tokens, positions, segment_ids, prefix)


def text_rows(batch: dict[str, Array], side: str) -> Rows:
  """The rows `config.text_side` names."""
  return pair_rows(batch) if side == "pair" else side_rows(batch, side)
