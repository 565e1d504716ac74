"""Batch plans: determinism, per-host sharding, resume, budgets, packing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_jax.data import batching
from transformer_jax.errors import UserError
from transformer_jax.special_tokens import EOS_ID, PAD_ID


def _split(n: int = 3_000, seed: int = 0) -> batching.TokenizedSplit:
  """Random pairs like real ones: target length close to source length."""
  rng = np.random.default_rng(seed)
  src_len = np.minimum(rng.geometric(1 / 14, n) + 1, 60)
  tgt_len = np.clip(src_len + rng.integers(-3, 4, n), 2, 60)

  def seqs(lengths):
    return [list(rng.integers(4, 500, l - 1)) + [EOS_ID] for l in lengths]

  return batching.TokenizedSplit.from_lists(seqs(src_len), seqs(tgt_len))


SPLIT = _split()


def _iterator(pack=False, seed=0, multiple=4, index=0, count=1, tpb=1_024):
  return batching.TrainIterator(
      SPLIT, seed=seed, tokens_per_batch=tpb, boundaries=(8, 16, 24, 32, 48, 64),
      max_len=64, pack=pack, batch_multiple=multiple, process_index=index,
      process_count=count)


def _take(it, k):
  return [next(it) for _ in range(k)]


def _same(a, b) -> bool:
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("pack", [False, True])
def test_same_seed_same_batches_and_other_seed_differs(pack):
  n = _iterator(pack).batches_per_epoch() + 3  # Crosses into epoch 1.
  a, b = _take(_iterator(pack), n), _take(_iterator(pack), n)
  assert all(_same(x, y) for x, y in zip(a, b))
  c = _take(_iterator(pack, seed=1), n)
  assert not all(_same(x, y) for x, y in zip(a, c))
  epoch1 = _take(_iterator(pack), 2 * n)[n - 3:n]
  assert not all(_same(x, y) for x, y in zip(a[:3], epoch1)), "epochs must reshuffle"


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("count", [2, 4])
def test_union_of_hosts_equals_global_batch(pack, count):
  k = 12
  whole = _take(_iterator(pack, multiple=4), k)
  hosts = [_take(_iterator(pack, multiple=4, index=p, count=count), k) for p in range(count)]
  for step in range(k):
    for key, value in whole[step].items():
      parts = [h[step][key] for h in hosts]
      assert all(len(p) == len(value) // count for p in parts)
      np.testing.assert_array_equal(np.concatenate(parts), value,
                                    err_msg=f"step {step} {key}: hosts differ from global")


@pytest.mark.parametrize("pack", [False, True])
def test_resume_continues_exactly(pack):
  it = _iterator(pack)
  n = it.batches_per_epoch()
  for k in (0, 5, n - 1, n + 2):  # Includes the epoch boundary.
    it = _iterator(pack)
    _take(it, k + 1)  # Batches 0..k.
    state = json.loads(json.dumps(it.get_state()))
    expected = next(it)  # Batch k + 1.
    restored = _iterator(pack)
    restored.set_state(state)
    assert _same(next(restored), expected), f"resume after batch {k} differs"


def test_state_of_other_setup_is_rejected():
  state = _iterator(seed=0).get_state()
  with pytest.raises(UserError, match="another data setup"):
    _iterator(seed=1).set_state(state)
  with pytest.raises(UserError, match="epoch"):
    _iterator().set_state({"step": 3})


@pytest.mark.parametrize("pack", [False, True])
def test_budget_multiple_and_every_pair_once_per_epoch(pack):
  it = _iterator(pack, multiple=4, tpb=1_024)
  seen = []
  for length, rows in it.epoch_plan(0):
    assert len(rows) % 4 == 0 and len(rows) * length <= 1_024, (len(rows), length)
    seen.extend(i for r in rows for i in r) if pack else seen.extend(rows[rows >= 0])
  assert sorted(seen) == list(range(len(SPLIT))), "an epoch must use every pair once"
  for _ in range(it.batches_per_epoch()):
    b = next(it)
    for key in ("src_tokens", "target_tokens"):
      assert b[key].dtype == np.int32 and b[key].size <= 1_024


def test_shapes_come_from_the_boundaries():
  it = _iterator()
  shapes = {next(it)["src_tokens"].shape[1] for _ in range(it.batches_per_epoch())}
  assert shapes <= {8, 16, 24, 32, 48, 64}


def test_unpacked_rows_hold_the_exact_sequences():
  it = _iterator()
  for length, rows in it.epoch_plan(0)[:5]:
    b = batching.eval_batch(SPLIT, length, rows)
    for row, i in zip(b["src_tokens"], rows):
      want = SPLIT.src[SPLIT.src_offsets[i]:SPLIT.src_offsets[i + 1]] if i >= 0 else []
      assert list(row[:len(want)]) == list(want) and (row[len(want):] == PAD_ID).all()


def test_packed_segments_and_positions():
  it = _iterator(pack=True)
  _, rows = it.epoch_plan(0)[0]
  b = next(it)
  for side, flat, offsets in (("src", SPLIT.src, SPLIT.src_offsets),
                              ("target", SPLIT.tgt, SPLIT.tgt_offsets)):
    tokens, seg, pos = (b[f"{side}_{k}"] for k in ("tokens", "segment_ids", "positions"))
    np.testing.assert_array_equal(tokens != PAD_ID, seg > 0)
    for r, pairs in enumerate(rows):
      for s, i in enumerate(pairs, start=1):
        cols = np.flatnonzero(seg[r] == s)
        np.testing.assert_array_equal(tokens[r, cols], flat[offsets[i]:offsets[i + 1]])
        np.testing.assert_array_equal(pos[r, cols], np.arange(len(cols)))
        assert tokens[r, cols[-1]] == EOS_ID
  assert it.padding_fraction() < 0.1


def test_eval_plan_covers_every_pair_without_truncation():
  plan = batching.eval_plan(SPLIT, (8, 16, 24), 512, 2)  # Pairs up to 60 > 24.
  ids = np.concatenate([rows for _, rows in plan])
  assert sorted(ids[ids >= 0]) == list(range(len(SPLIT)))
  for length, rows in plan:
    assert len(rows) % 2 == 0
    real = rows[rows >= 0]
    assert (np.maximum(SPLIT.src_lengths, SPLIT.tgt_lengths)[real] <= length).all()


def test_eval_leaves_out_the_pairs_training_drops_as_empty():
  """A blank line (EOS only) on either side: training drops the pair, so its loss would be a
  prediction the model never trained on; every other pair is still scored once."""
  sources = [[5, EOS_ID], [EOS_ID], [6, 7, EOS_ID], [8, EOS_ID], [EOS_ID]]
  targets = [[9, EOS_ID], [10, EOS_ID], [EOS_ID], [11, 12, EOS_ID], [EOS_ID]]
  split = batching.TokenizedSplit.from_lists(sources, targets)
  ids = np.concatenate([rows for _, rows in batching.eval_plan(split, (8,), 64, 2)])
  assert sorted(ids[ids >= 0]) == [0, 3]
  blank = batching.TokenizedSplit.from_lists([[EOS_ID]], [[EOS_ID]])
  assert batching.eval_plan(blank, (8,), 64, 2) == []


def test_eval_pads_a_pair_training_could_see_to_at_most_max_len():
  """Boundaries (8, 16, 32, 64) and max_len 40: training pads a 36-token pair to 40; so must
  eval (a model with 40 learned positions has none past them); longer pairs still fit."""
  plan = batching.eval_plan(SPLIT, (8, 16, 32, 64), 512, 2, max_len=40)
  longest = np.maximum(SPLIT.src_lengths, SPLIT.tgt_lengths)
  for length, rows in plan:
    real = longest[rows[rows >= 0]]
    assert (real <= length).all()
    if (real <= 40).all():
      assert length <= 40, f"pairs of at most 40 tokens padded to {length}"
  assert {length for length, _ in plan} >= {40, 64}
  # Pairs left over in the 40 bucket must not be carried into the 64 one.
  near = batching.TokenizedSplit.from_lists(
      [[5] * (33 + i % 8 - 1) + [EOS_ID] for i in range(57)],
      [[6] * (33 + i % 8 - 1) + [EOS_ID] for i in range(57)])
  lengths = [length for length, rows in batching.eval_plan(near, (8, 16, 32, 64), 512, 2, 40)]
  assert lengths and max(lengths) == 40, lengths


def test_bad_sharding_and_budget_are_user_errors():
  with pytest.raises(UserError, match="not a multiple of process_count"):
    _iterator(multiple=3, count=2)
  with pytest.raises(UserError, match="raise tokens_per_batch"):
    _iterator(multiple=32, tpb=1_024)
