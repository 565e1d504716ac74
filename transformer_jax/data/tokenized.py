"""Token ids of each split, computed once and cached as .npz, and the filtering of training pairs."""

from __future__ import annotations

import os
from pathlib import Path
import tempfile

import numpy as np

from transformer_jax.data import batching
from transformer_jax.data.builders import PreparedDataset
from transformer_jax.data.tokenizer import Tokenizer


def tokenize_split(cache_dir: Path, prepared: PreparedDataset, tok: Tokenizer, split: str,
                   read) -> batching.TokenizedSplit:
  """Token ids of a split, from `<cache_dir>/<data>-<tokenizer>-<split>.npz`."""
  path = cache_dir / f"{prepared.key}-{tok.sha256[:16]}-{split}.npz"
  fields = {}
  if path.is_file():
    with np.load(path) as z:
      fields = {k: z[k] for k in z.files}
  else:
    src, tgt = read(split)
    for feat, lines in ((prepared.source_feature, src), (prepared.target_feature, tgt)):
      fields[feat], fields[f"{feat}_offsets"] = encode_ragged(tok, lines)
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **fields)
    os.replace(tmp, path)  # Atomic: readers never see a partial file.
  s, t = prepared.source_feature, prepared.target_feature
  return batching.TokenizedSplit(fields[s], fields[f"{s}_offsets"],
                                 fields[t], fields[f"{t}_offsets"])


def encode_ragged(tok: Tokenizer, lines: list[str], chunk: int = 65_536
                  ) -> tuple[np.ndarray, np.ndarray]:
  """`batching.ragged(tok.encode_batch(lines))`, encoded `chunk` lines at a time: the
  Python lists of ids (~30x the int32 array's bytes) never exist for the whole split."""
  flats, offsets, total = [], [np.zeros(1, np.int64)], 0
  for start in range(0, len(lines), chunk):
    flat, chunk_offsets = batching.ragged(tok.encode_batch(lines[start:start + chunk]))
    flats.append(flat)
    offsets.append(chunk_offsets[1:] + total)
    total += len(flat)
  return (np.concatenate(flats) if flats else np.zeros(0, np.int32),
          np.concatenate(offsets))


def filter_train(split: batching.TokenizedSplit, max_len: int):
  """(kept pairs, their indices, counts) after dropping pairs with an empty
  side or a side longer than max_len."""
  empty = (split.src_lengths <= 1) | (split.tgt_lengths <= 1)  # Only EOS.
  too_long = ~empty & (np.maximum(split.src_lengths, split.tgt_lengths) > max_len)
  keep = np.flatnonzero(~empty & ~too_long)
  if len(keep) < len(split):
    split = split.subset(keep)
  return split, keep, {"empty": int(empty.sum()), "too_long": int(too_long.sum())}
