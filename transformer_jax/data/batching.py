"""Token-budget batching of tokenized pairs: plans, packing, assembly.

Everything here is a pure function of (seed, epoch, token lengths), so every
host computes the same global batch and keeps its own rows, and a restored
iterator continues exactly where it stopped.

- Buckets: each pair goes to the smallest boundary >= max(src_len,
  tgt_len); a batch pads source and target to that one length, so there is
  one shape per boundary. Rows per batch = tokens_per_batch // length,
  rounded down to a multiple of `batch_multiple` (the data-parallel shards).
  Leftover pairs of a bucket move up to the next bucket instead of being
  dropped; the last leftovers fill one batch padded with all-PAD rows.
- Order: a grain `MapDataset` per epoch: the epoch's batch plans as the
  source, grain's deterministic shuffle of the batch order, then a map that
  assembles this host's rows. Random access by batch index is what makes a
  restored iterator continue with exactly the next batch.
- Packing: several pairs share a row of `max_len` tokens (best fit,
  longest first), marked by segment ids (1, 2, ...; 0 = padding) and
  positions that restart at 0 in each segment.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
from typing import Callable, Iterator, Sequence

import grain
import numpy as np

from transformer_jax.special_tokens import PAD_ID
from transformer_jax.errors import UserError


def ragged(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """(flat int32[total], offsets int64[len(seqs) + 1]) of id sequences."""
  lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
  offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(offsets[-1]))
  return flat, offsets


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Ragged token ids of a split: pair i has src[src_offsets[i]:src_offsets[i+1]].

  Every sequence ends with EOS. Arrays: src, tgt int32[total];
  src_offsets, tgt_offsets int64[num_pairs + 1].
  """

  src: np.ndarray
  src_offsets: np.ndarray
  tgt: np.ndarray
  tgt_offsets: np.ndarray

  @classmethod
  def from_lists(cls, src: Sequence[Sequence[int]],
                 tgt: Sequence[Sequence[int]]) -> TokenizedSplit:
    return cls(*ragged(src), *ragged(tgt))

  def __len__(self) -> int:
    return len(self.src_offsets) - 1

  @functools.cached_property
  def src_lengths(self) -> np.ndarray:
    return np.diff(self.src_offsets).astype(np.int32)

  @functools.cached_property
  def tgt_lengths(self) -> np.ndarray:
    return np.diff(self.tgt_offsets).astype(np.int32)

  def subset(self, indices: np.ndarray) -> TokenizedSplit:
    """The pairs at `indices`, in that order."""
    def take(flat, offsets):
      starts, lengths = offsets[indices], np.diff(offsets)[indices]
      new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
      within = np.arange(new_offsets[-1]) - np.repeat(new_offsets[:-1], lengths)
      return flat[np.repeat(starts, lengths) + within], new_offsets
    return TokenizedSplit(*take(self.src, self.src_offsets),
                          *take(self.tgt, self.tgt_offsets))


def train_boundaries(boundaries: Sequence[int], max_len: int) -> tuple[int, ...]:
  """The configured boundaries below `max_len`, then `max_len` itself."""
  if max_len < 2:
    raise UserError(f"max_len={max_len} must be at least 2 (a token and EOS)")
  return tuple(sorted({int(b) for b in boundaries if 0 < b < max_len} | {max_len}))


def eval_boundaries(boundaries: Sequence[int], longest: int, max_len: int | None = None
                    ) -> tuple[int, ...]:
  """Boundaries for eval: `max_len` among them, so that a pair training could see is padded
  to at most its training length (a model with learned positions covers no more), the
  configured ones above it, and one that fits `longest` (eval never truncates)."""
  bounds = sorted({int(b) for b in boundaries if b > 0} | ({max_len} if max_len else set()))
  if not bounds or bounds[-1] < longest:
    bounds.append(-(-longest // 64) * 64)  # Round up to a multiple of 64.
  return tuple(bounds)


def rows_per_batch(tokens_per_batch: int, length: int, batch_multiple: int) -> int:
  """tokens_per_batch // length rounded down to a multiple of batch_multiple."""
  rows = (tokens_per_batch // length) // batch_multiple * batch_multiple
  if rows < batch_multiple:
    raise UserError(
        f"tokens_per_batch={tokens_per_batch} holds fewer than batch_multiple="
        f"{batch_multiple} rows of length {length}; raise tokens_per_batch to at "
        f"least {length * batch_multiple} or lower max_len")
  return rows


def bucket_plan(order: np.ndarray, lengths: np.ndarray, boundaries: Sequence[int],
                rows: Sequence[int]) -> list[tuple[int, np.ndarray]]:
  """Batches of pair indices, as [(padded_length, int64[rows] (-1 = pad row))].

  `order` is the order pairs are taken in (a shuffle, or sorted for eval);
  `lengths[i]` = max(src, tgt) length of pair i; `rows[b]` = rows per batch
  of bucket b. Pairs left over in a bucket join the next bucket.
  """
  bounds = np.asarray(boundaries)
  bucket_of = np.searchsorted(bounds, lengths[order], side="left")
  if len(order) and bucket_of.max() >= len(bounds):
    raise ValueError("a pair is longer than the largest boundary")
  batches = []
  leftover = np.zeros(0, np.int64)
  for b, length in enumerate(bounds):
    pool = np.concatenate([leftover, order[bucket_of == b]])
    full = len(pool) // rows[b] * rows[b]
    batches.extend((int(length), pool[s:s + rows[b]]) for s in range(0, full, rows[b]))
    leftover = pool[full:]
  if len(leftover):  # One batch at the smallest length that fits them all.
    b = int(np.searchsorted(bounds, lengths[leftover].max(), side="left"))
    padded = np.full(max(rows[b], len(leftover)), -1, np.int64)
    padded[:len(leftover)] = leftover
    batches.append((int(bounds[b]), padded))
  return batches


def pack_rows(order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray,
              length: int) -> list[list[int]]:
  """Packs pairs into rows of `length` tokens (source and target each).

  Best fit, longest first: a row starts with the longest pair left and is
  filled with the longest pairs that still fit. Among pairs of one size the
  one earliest in `order` goes first, so a shuffled order gives new rows.
  """
  size = np.maximum(src_lengths, tgt_lengths)
  by_size = order[np.argsort(size[order], kind="stable")]
  counts = np.bincount(size[order], minlength=length + 1)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  ptr, end = starts.tolist(), (starts + counts).tolist()
  by_size = by_size.tolist()
  src_len, tgt_len = src_lengths.tolist(), tgt_lengths.tolist()
  rows, remaining, top = [], len(order), length
  while remaining:
    while ptr[top] == end[top]:
      top -= 1
    first = by_size[ptr[top]]
    ptr[top] += 1
    row, room_src, room_tgt = [first], length - src_len[first], length - tgt_len[first]
    k = min(room_src, room_tgt, top)
    while k > 0:
      if ptr[k] < end[k]:
        i = by_size[ptr[k]]
        ptr[k] += 1
        row.append(i)
        room_src -= src_len[i]
        room_tgt -= tgt_len[i]
        k = min(k, room_src, room_tgt)
      else:
        k -= 1
    remaining -= len(row)
    rows.append(row)
  return rows


def gather_padded(flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray,
                  length: int) -> np.ndarray:
  """int32[len(idx), length]: sequences idx (-1 = all PAD), PAD-padded."""
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  starts = offsets[safe]
  lens = np.where(valid, offsets[safe + 1] - starts, 0)
  pos = np.arange(length)
  mask = pos[None, :] < lens[:, None]
  tokens = flat[np.where(mask, starts[:, None] + pos[None, :], 0)]
  return np.where(mask, tokens, PAD_ID).astype(np.int32)


def gather_packed(split: TokenizedSplit, rows: Sequence[Sequence[int]],
                  length: int) -> dict[str, np.ndarray]:
  """Packed batch of `rows` (lists of pair indices): arrays [len(rows), length]."""
  n = len(rows)
  ex = np.fromiter((i for r in rows for i in r), np.int64)
  row_of = np.repeat(np.arange(n), [len(r) for r in rows])
  seg = np.fromiter((s for r in rows for s in range(1, len(r) + 1)), np.int32, len(ex))
  out = {}
  for side, flat, offsets in (("src", split.src, split.src_offsets),
                              ("target", split.tgt, split.tgt_offsets)):
    tokens = np.full((n, length), PAD_ID, np.int32)
    segments = np.zeros((n, length), np.int32)
    positions = np.zeros((n, length), np.int32)
    if len(ex):
      lens = offsets[ex + 1] - offsets[ex]
      ends = np.cumsum(lens)
      row_start = np.zeros(n + 1, np.int64)  # Token count before each row.
      np.add.at(row_start, row_of + 1, lens)
      row_start = np.cumsum(row_start)
      col0 = ends - lens - row_start[row_of]
      within = np.arange(ends[-1]) - np.repeat(ends - lens, lens)
      r, c = np.repeat(row_of, lens), np.repeat(col0, lens) + within
      tokens[r, c] = flat[np.repeat(offsets[ex], lens) + within]
      segments[r, c] = np.repeat(seg, lens)
      positions[r, c] = within
    out[f"{side}_tokens"] = tokens
    out[f"{side}_segment_ids"] = segments
    out[f"{side}_positions"] = positions
  return out


class TrainIterator:
  """Infinite, deterministic, resumable iterator over training batches.

  Yields this host's rows [p*B/P, (p+1)*B/P) of each global batch of B rows:
  {'src_tokens': int32[B/P, len], 'target_tokens': int32[B/P, len]} (plus
  '*_segment_ids' and '*_positions' when packing).

  `resample(epoch)`, when given, returns that epoch's pairs (the same pairs,
  segmented anew, e.g. by BPE-dropout; every side at most max_len); it must
  be a pure function of the epoch, so that every host and a restored
  iterator see the same batches. `resample_key` names it in the fingerprint.
  """

  def __init__(self, split: TokenizedSplit, *, seed: int, tokens_per_batch: int,
               boundaries: Sequence[int], max_len: int, pack: bool,
               batch_multiple: int, process_index: int = 0, process_count: int = 1,
               resample: Callable[[int], TokenizedSplit] | None = None,
               resample_key: str = ""):
    check_sharding(batch_multiple, process_index, process_count)
    if len(split) == 0:
      raise UserError("the training split has no pairs left; check the data and max_len")
    self.split, self.seed, self.pack = split, int(seed), bool(pack)
    self.max_len, self.tokens_per_batch = int(max_len), int(tokens_per_batch)
    self.batch_multiple = batch_multiple
    self.process_index, self.process_count = process_index, process_count
    self.boundaries = train_boundaries(boundaries, max_len)
    self.rows = [rows_per_batch(tokens_per_batch, b, batch_multiple)
                 for b in self.boundaries]
    self._resample = resample
    lengths = np.maximum(split.src_lengths, split.tgt_lengths)
    self.epoch, self.batch_in_epoch = 0, 0
    self._dataset_cache: tuple[int, tuple] | None = None
    fields = ["grain", self.seed, self.tokens_per_batch, self.boundaries, self.pack,
              batch_multiple, len(split), int(lengths.sum())]
    self.fingerprint = hashlib.sha256(json.dumps(
        fields + ([resample_key] if resample_key else [])).encode()).hexdigest()[:16]

  def epoch_plan(self, epoch: int) -> list:
    """The global batches of `epoch` in training order: [(length, rows)].

    A pure function of (seed, epoch, lengths): pairs are permuted, bucketed
    (or packed) into batches, and grain shuffles the batch order.
    """
    return list(self._epoch_datasets(epoch)[0])

  def epoch_batches(self, epoch: int) -> grain.MapDataset:
    """This host's batches of `epoch` (grain: plans -> shuffle -> assemble)."""
    return self._epoch_datasets(epoch)[1]

  def epoch_split(self, epoch: int) -> TokenizedSplit:
    """The pairs as `epoch` segments them (`split` unless resampled)."""
    return self._epoch_datasets(epoch)[2]

  def _epoch_datasets(self, epoch: int) -> tuple[grain.MapDataset, grain.MapDataset,
                                                 TokenizedSplit]:
    """(global batch plans, this host's assembled batches, pairs) of `epoch`, built once."""
    if self._dataset_cache is None or self._dataset_cache[0] != epoch:
      split = self.split if self._resample is None else self._resample(epoch)
      if len(split) != len(self.split):
        raise ValueError(f"resample({epoch}) returned {len(split)} pairs, not {len(self.split)}")
      if max(split.src_lengths.max(), split.tgt_lengths.max()) > self.max_len:
        raise ValueError("pairs longer than max_len must be filtered first")
      plans = self._plan_epoch(epoch, split)
      batches = plans.map(functools.partial(self._host_batch, split))
      self._dataset_cache = (epoch, (plans, batches, split))
    return self._dataset_cache[1]

  def _plan_epoch(self, epoch: int, split: TokenizedSplit) -> grain.MapDataset:
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(len(split))
    if self.pack:
      rows = pack_rows(order, split.src_lengths, split.tgt_lengths, self.max_len)
      rows = [rows[i] for i in rng.permutation(len(rows))]
      r = rows_per_batch(self.tokens_per_batch, self.max_len, self.batch_multiple)
      plan = [(self.max_len, rows[s:s + r]) for s in range(0, len(rows), r)]
      plan[-1] = (self.max_len, plan[-1][1] + [[]] * (r - len(plan[-1][1])))
    else:
      lengths = np.maximum(split.src_lengths, split.tgt_lengths)
      plan = bucket_plan(order, lengths, self.boundaries, self.rows)
    return grain.MapDataset.source(plan).shuffle(seed=int(rng.integers(2**31)))

  def _host_batch(self, split: TokenizedSplit, plan: tuple) -> dict[str, np.ndarray]:
    length, rows = plan
    lo, hi = host_slice(len(rows), self.process_index, self.process_count)
    if self.pack:
      return gather_packed(split, rows[lo:hi], length)
    return {"src_tokens": gather_padded(split.src, split.src_offsets, rows[lo:hi], length),
            "target_tokens": gather_padded(split.tgt, split.tgt_offsets, rows[lo:hi], length)}

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batches = self.epoch_batches(self.epoch)
    batch = batches[self.batch_in_epoch]
    self.batch_in_epoch += 1
    if self.batch_in_epoch == len(batches):
      self.epoch, self.batch_in_epoch = self.epoch + 1, 0
    return batch

  def get_state(self) -> dict:
    """JSON-serialisable position: the next batch is batch_in_epoch of epoch."""
    return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "fingerprint": self.fingerprint}

  def set_state(self, state: dict) -> None:
    try:
      epoch, batch = int(state["epoch"]), int(state["batch_in_epoch"])
    except (KeyError, TypeError, ValueError):
      raise UserError(f"data iterator state {state!r} lacks epoch/batch_in_epoch; "
                      "restore a state saved by TrainIterator.get_state()") from None
    if state.get("fingerprint", self.fingerprint) != self.fingerprint:
      raise UserError("the saved data iterator state belongs to another data "
                      "setup (seed, tokens_per_batch, buckets, packing, data, or the batch "
                      "shards: config.mesh, config.cpu_devices, the device count); resume "
                      "with the run's own config.json settings")
    if epoch < 0 or not 0 <= batch < len(self.epoch_batches(epoch)):
      raise UserError(f"data iterator state {state!r} is out of range")
    self.epoch, self.batch_in_epoch = epoch, batch

  def batches_per_epoch(self, epoch: int = 0) -> int:
    return len(self.epoch_batches(epoch))

  def padding_fraction(self, epoch: int = 0) -> float:
    """Fraction of PAD slots (source and target) in the global batches."""
    return plan_padding_fraction(self.epoch_plan(epoch), self.epoch_split(epoch), self.pack)


def plan_padding_fraction(plan: list, split: TokenizedSplit, packed: bool) -> float:
  slots = real = 0
  for length, rows in plan:
    slots += 2 * length * len(rows)
    idx = (np.fromiter((i for r in rows for i in r), np.int64) if packed
           else rows[rows >= 0])
    real += int(split.src_lengths[idx].sum() + split.tgt_lengths[idx].sum())
  return 1.0 - real / slots if slots else 0.0


def check_sharding(batch_multiple: int, process_index: int, process_count: int) -> None:
  if batch_multiple < 1 or process_count < 1:
    raise UserError(f"batch_multiple={batch_multiple} and process_count="
                    f"{process_count} must be >= 1")
  if batch_multiple % process_count:
    raise UserError(f"batch_multiple={batch_multiple} is not a multiple of "
                    f"process_count={process_count}; pass the number of "
                    "data-parallel devices over all hosts")
  if not 0 <= process_index < process_count:
    raise UserError(f"process_index={process_index} is not in [0, {process_count})")


def host_slice(rows: int, process_index: int, process_count: int) -> tuple[int, int]:
  per_host = rows // process_count
  return process_index * per_host, (process_index + 1) * per_host


def eval_plan(split: TokenizedSplit, boundaries: Sequence[int], tokens_per_batch: int,
              batch_multiple: int, max_len: int | None = None) -> list[tuple[int, np.ndarray]]:
  """Batches covering every pair once, sorted by length (no truncation; see
  `eval_boundaries` for `max_len`), except pairs with an empty side: training never sees
  them (`tokenized.filter_train`), so the dev loss leaves them out too (a blank line of an
  LM corpus would otherwise add an EOS-only prediction to its perplexity)."""
  lengths = np.maximum(split.src_lengths, split.tgt_lengths)
  scored = np.flatnonzero((split.src_lengths > 1) & (split.tgt_lengths > 1))  # Not EOS only.
  if len(scored) == 0:
    return []
  bounds = eval_boundaries(boundaries, int(lengths[scored].max()), max_len)
  order = scored[np.argsort(lengths[scored], kind="stable")]
  split_at = max_len or bounds[-1]  # Pairs within max_len never join a longer bucket.
  plan = []
  for part, part_bounds in ((order[lengths[order] <= split_at], [b for b in bounds if b <= split_at]),
                            (order[lengths[order] > split_at], [b for b in bounds if b > split_at])):
    if len(part):
      rows = [max(batch_multiple, (tokens_per_batch // b) // batch_multiple * batch_multiple)
              for b in part_bounds]
      plan += bucket_plan(part, lengths, part_bounds, rows)
  return plan


def eval_batch(split: TokenizedSplit, length: int, idx: np.ndarray) -> dict[str, np.ndarray]:
  """{'src_tokens', 'target_tokens': int32[rows, length], 'example_ids': int32[rows]}."""
  return {"src_tokens": gather_padded(split.src, split.src_offsets, idx, length),
          "target_tokens": gather_padded(split.tgt, split.tgt_offsets, idx, length),
          "example_ids": idx.astype(np.int32)}
