"""Tests for transformer_jax.search on small synthetic "models" (CPU, fast).

Each model is a `tokens_to_logits` function over fixed tables, mirrored by a
NumPy function so the expected output can be computed independently.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decode import search
from transformer_jax.errors import UserError
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -np.inf


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=-1, keepdims=True)
  return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def _lp(length: int, alpha: float) -> float:
  return ((5.0 + length) / 6.0) ** alpha


def _log(probs: np.ndarray) -> np.ndarray:
  """float32 log-probabilities, -inf where the probability is 0."""
  with np.errstate(divide="ignore"):
    return np.log(probs).astype(np.float32)


def _random_logits(rng, shape, eos=True, scale=2.0) -> np.ndarray:
  """float32 logits; PAD, UNK and BOS are impossible, EOS optionally too."""
  logits = rng.normal(size=shape).astype(np.float32) * scale
  logits[..., [PAD_ID, 1, BOS_ID]] = NEG_INF
  if not eos:
    logits[..., EOS_ID] = NEG_INF
  return logits


def _lengths(batch: int, max_decode_len: int, max_lengths=None) -> jax.Array:
  return search.full_lengths(batch, max_decode_len) if max_lengths is None else max_lengths


def _beam(step, cache, batch, max_decode_len, max_lengths=None, sentences=None,
          plan=search.SearchPlan(), **spec):
  """search.beam_search of `step` over `batch` sentences, SearchSpec(**spec)."""
  return search.beam_search(search.StepModel(step, cache, sentences), search.SearchSpec(**spec),
                            _lengths(batch, max_decode_len, max_lengths), max_decode_len, plan)


def _greedy(step, cache, batch, max_decode_len, max_lengths=None, sentences=None,
            plan=search.SearchPlan(), **spec):
  return search.greedy_search(search.StepModel(step, cache, sentences),
                              search.SearchSpec(method="greedy", **spec),
                              _lengths(batch, max_decode_len, max_lengths), max_decode_len, plan)


def _sample(step, cache, rng, batch, max_decode_len, max_lengths=None, **spec):
  return search.sample(search.StepModel(step, cache), search.SearchSpec(method="sample", **spec),
                       _lengths(batch, max_decode_len, max_lengths), max_decode_len, rng)


# A bigram model: logits = table[last token]; the cache is a dummy.


def _bigram_model(table: np.ndarray):
  table = jnp.asarray(table)

  def tokens_to_logits(tokens, cache, step):
    del step
    return table[tokens[:, 0]], cache

  return tokens_to_logits


def _bigram_next(table: np.ndarray):
  return lambda prefix: _log_softmax(table[([BOS_ID] + prefix)[-1]])


# A history model: the distribution depends on the sum of all tokens fed so
# far, which only the cache holds, and on a per-sentence table id, also only
# in the cache. Wrongly gathered cache rows give wrong distributions.

_MOD = 3


def _history_model(tables: np.ndarray):  # [n_tables, _MOD, vocab, vocab]
  tables = jnp.asarray(tables)

  def tokens_to_logits(tokens, cache, step):
    del step
    token = tokens[:, 0]
    total = cache["sum"] + token
    logits = tables[cache["table"], total % _MOD, token]
    return logits, {"sum": total, "table": cache["table"]}

  return tokens_to_logits


def _history_next(tables: np.ndarray, table_id: int):
  def next_logprobs(prefix):
    fed = [BOS_ID] + prefix
    return _log_softmax(tables[table_id, sum(fed) % _MOD, fed[-1]])

  return next_logprobs


def _history_cache(batch: int, rows: int | None = None):
  rows = rows or batch
  per_row = rows // batch
  return {"sum": jnp.zeros((rows,), jnp.int32),
          "table": jnp.repeat(jnp.arange(batch, dtype=jnp.int32), per_row)}


def _exhaustive(next_logprobs, max_len: int, alpha: float):
  """All sequences ending in EOS within max_len tokens, best first."""
  found = []

  def extend(prefix, logprob):
    if len(prefix) >= max_len:
      return
    dist = next_logprobs(prefix)
    for token in np.flatnonzero(np.isfinite(dist)):
      total = logprob + dist[token]
      if token == EOS_ID:
        found.append((total / _lp(len(prefix) + 1, alpha),
                      prefix + [int(token)]))
      else:
        extend(prefix + [int(token)], total)

  extend([], 0.0)
  return sorted(found, key=lambda item: -item[0])


def _padded(seq, length):
  return list(seq) + [PAD_ID] * (length - len(seq))


def _greedy_np(next_logprobs, max_len):
  seq = []
  while len(seq) < max_len:
    seq.append(int(np.argmax(next_logprobs(seq))))
    if seq[-1] == EOS_ID:
      break
  return seq


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_search_equals_exhaustive_search_when_beam_covers_everything(
    alpha):
  # Tokens 3 (EOS), 4, 5 only; 4 tokens at most: at most 8 unfinished
  # prefixes, 24 candidates and 15 finished sequences, so beam 16 (32
  # candidates) is exhaustive and must return the 15 best in order. The
  # history model also checks that cache rows follow their beams.
  rng = np.random.default_rng(0)
  tables = _random_logits(rng, (2, _MOD, 6, 6))
  max_lengths = [4, 3]
  seqs, scores = _beam(_history_model(tables), _history_cache(2), 2, 5,
                       max_lengths=jnp.array(max_lengths), beam_size=16, alpha=alpha)
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  for b in range(2):
    expected = _exhaustive(_history_next(tables, b), max_lengths[b], alpha)
    n = len(expected)
    assert n == (15 if b == 0 else 7)
    got = [list(s) for s in seqs[b, :n]]
    want = [_padded(s, 5) for _, s in expected]
    assert got == want, f"sentence {b}: beam order differs from exhaustive"
    np.testing.assert_allclose(scores[b, :n], [s for s, _ in expected],
                               rtol=1e-5)
    assert np.all(scores[b, n:] == NEG_INF), "empty slots must score -inf"
    assert np.all(seqs[b, n:] == PAD_ID), "empty slots must be all PAD"


def test_beam_search_finds_better_sequence_than_greedy():
  # P(4 EOS) = .5 * .4 = .2 but P(5 EOS) = .4 * .9 = .36: greedy takes 4.
  probs = np.zeros((6, 6))
  probs[BOS_ID, [4, 5, EOS_ID]] = [.5, .4, .1]
  probs[4, [EOS_ID, 4, 5]] = [.4, .3, .3]
  probs[5, [EOS_ID, 4, 5]] = [.9, .05, .05]
  table = _log(probs)
  model = _bigram_model(table)
  best = _exhaustive(_bigram_next(table), 6, alpha=0.0)[0]
  assert best[1] == [5, EOS_ID]

  greedy = _greedy(model, {}, 1, 6)
  assert list(np.asarray(greedy[0])) == _padded([4, EOS_ID], 6)
  seqs, scores = _beam(model, {}, 1, 6, beam_size=2, alpha=0.0)
  assert list(np.asarray(seqs[0, 0])) == _padded(best[1], 6)
  np.testing.assert_allclose(scores[0, 0], np.log(.36), rtol=1e-5)


def test_length_penalty_reorders_short_and_long_hypotheses():
  # A = [4, EOS]: log P = -1.0, length 2. B = [6, 7, 8, EOS]: log P = -1.2,
  # length 4. alpha=0 ranks A first; alpha=1 divides by 7/6 and 9/6, giving
  # -0.857 < -0.8, so B first. Token 5 soaks up the rest of the mass.
  c = np.exp(-1.2) / .45  # P(6 7 8 EOS | BOS 6) = c, split over 3 steps.
  step = c ** (1 / 3)
  probs = np.zeros((9, 9))
  probs[BOS_ID, [4, 6, 5]] = [.5, .45, .05]
  probs[4, [EOS_ID, 5]] = [np.exp(-1.0) / .5, 1 - np.exp(-1.0) / .5]
  probs[5, [5, EOS_ID]] = [.5, .5]
  probs[6, [7, 5]] = [step, 1 - step]
  probs[7, [8, 5]] = [step, 1 - step]
  probs[8, [EOS_ID, 5]] = [step, 1 - step]
  table = _log(probs)
  a, b = [4, EOS_ID], [6, 7, 8, EOS_ID]
  # α as a number, and as a traced argument of one compiled search (translator.Translator).
  traced = jax.jit(lambda alpha: _beam(_bigram_model(table), {}, 1, 8, beam_size=4, alpha=alpha))
  for alpha, order in [(0.0, [a, b]), (1.0, [b, a])]:
    for seqs, scores in [_beam(_bigram_model(table), {}, 1, 8, beam_size=4, alpha=alpha),
                         traced(np.float32(alpha))]:
      got = [list(np.asarray(s)) for s in seqs[0, :2]]
      assert got == [_padded(s, 8) for s in order], f"alpha={alpha}"
      logprob = {2: -1.0, 4: -1.2}
      want = [logprob[len(s)] / ((5 + len(s)) / 6) ** alpha for s in order]
      np.testing.assert_allclose(scores[0, :2], want, rtol=1e-5)
    assert _exhaustive(_bigram_next(table), 8, alpha)[0][1] == order[0]


def test_beam_size_one_equals_greedy_when_nothing_ends():
  rng = np.random.default_rng(1)
  table = _random_logits(rng, (12, 12))
  model = _bigram_model(table)
  max_lengths = jnp.array([9, 4, 1])
  greedy = _greedy(model, {}, 3, 9, max_lengths=max_lengths, eos_id=search.NO_EOS)
  seqs, scores = _beam(model, {}, 3, 9, max_lengths=max_lengths, beam_size=1, alpha=0.6,
                       eos_id=search.NO_EOS)
  np.testing.assert_array_equal(seqs[:, 0], greedy)
  next_logprobs = _bigram_next(table)
  for b, n in enumerate([9, 4, 1]):
    path = list(np.asarray(greedy[b, :n]))
    logprob = sum(next_logprobs(path[:i])[path[i]] for i in range(n))
    np.testing.assert_allclose(scores[b, 0], logprob / _lp(n, 0.6), rtol=1e-5)


def test_beam_size_one_equals_greedy_with_eos():
  # Beam search keeps every finished hypothesis it meets, so beam 1 returns
  # the best of "greedy prefix + EOS" over the steps where EOS was one of
  # the 2 candidates (with alpha=0 it then stops, as nothing alive can do
  # better). That is greedy's own output unless an earlier EOS was likelier.
  rng = np.random.default_rng(2)
  batch, max_len = 16, 10
  tables = _random_logits(rng, (batch, _MOD, 8, 8))
  greedy = _greedy(_history_model(tables), _history_cache(batch), batch, max_len)
  seqs, _ = _beam(_history_model(tables), _history_cache(batch), batch, max_len, beam_size=1,
                  alpha=0.0)
  same_as_greedy = 0
  for b in range(batch):
    next_logprobs = _history_next(tables, b)
    path = _greedy_np(next_logprobs, max_len)
    assert list(np.asarray(greedy[b])) == _padded(path, max_len)
    candidates, logprob = [], 0.0
    for i in range(len(path)):
      dist = next_logprobs(path[:i])
      if EOS_ID in np.argsort(-dist)[:2]:
        candidates.append((logprob + dist[EOS_ID], path[:i] + [EOS_ID]))
      logprob += dist[path[i]]
    want = max(candidates)[1] if candidates else path
    assert list(np.asarray(seqs[b, 0])) == _padded(want, max_len), b
    same_as_greedy += want == path
  assert same_as_greedy >= batch // 2, "the test model should mostly agree"


def test_per_sentence_max_lengths_are_respected():
  rng = np.random.default_rng(3)
  never_ends = _random_logits(rng, (10, 10), eos=False)
  max_lengths = [1, 4, 7]
  kwargs = dict(max_decode_len=8, max_lengths=jnp.array(max_lengths))
  greedy = _greedy(_bigram_model(never_ends), {}, 3, **kwargs)
  sampled = _sample(_bigram_model(never_ends), {}, jax.random.key(0), 3, **kwargs)
  seqs, scores = _beam(_bigram_model(never_ends), {}, 3, beam_size=3, alpha=0.6, **kwargs)
  for b, n in enumerate(max_lengths):
    for name, out in [("greedy", greedy[b]), ("sample", sampled[b]),
                      ("beam", seqs[b, 0])]:
      out = np.asarray(out)
      assert np.all(out[:n] != PAD_ID) and np.all(out[n:] == PAD_ID), (
          f"{name}: sentence {b} should have exactly {n} tokens, got {out}")
  # Nothing finished, so the alive beams come back, scored with lp(max).
  next_logprobs = _bigram_next(never_ends)
  for b, n in enumerate(max_lengths):
    path = list(np.asarray(seqs[b, 0, :n]))
    logprob = sum(next_logprobs(path[:i])[path[i]] for i in range(n))
    np.testing.assert_allclose(scores[b, 0], logprob / _lp(n, 0.6), rtol=1e-5)
    assert np.all(np.diff(np.asarray(scores[b])) <= 0), "best first"

  ends = _random_logits(rng, (10, 10))
  seqs, _ = _beam(_bigram_model(ends), {}, 3, beam_size=4, alpha=0.6, **kwargs)
  for b, n in enumerate(max_lengths):
    assert np.all(np.asarray(seqs[b, :, n:]) == PAD_ID)


def test_the_exact_stop_rule_does_not_change_results_and_saves_steps():
  rng = np.random.default_rng(4)
  batch, beam, max_len = 6, 4, 40
  tables = _random_logits(rng, (batch, _MOD, 16, 16))
  tables[..., EOS_ID] += 1.5  # Make sentences end well before max_len.
  steps = []

  def counting_model(tokens, cache, step):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return _history_model(tables)(tokens, cache, step)

  results = {}
  for rule in ("exact", "max_length"):
    steps.clear()
    results[rule] = _beam(counting_model, _history_cache(batch), batch, max_len,
                          max_lengths=jnp.array([40, 35, 30, 25, 20, 15]), beam_size=beam,
                          alpha=0.6, stop_rule=rule)
    jax.block_until_ready(results[rule])
    results[rule] += (len(steps),)
  (seqs_a, scores_a, steps_a), (seqs_b, scores_b, steps_b) = (
      results["exact"], results["max_length"])
  np.testing.assert_array_equal(seqs_a, seqs_b)
  np.testing.assert_array_equal(scores_a, scores_b)
  assert steps_b == 40, "without early stopping: the longest max_length"
  assert steps_a < steps_b, "early stopping should end the loop sooner"
  assert np.all(np.isfinite(scores_a)), "every beam should have finished"


def _sentence_model(tables: np.ndarray, rows_seen: list):
  """The history model with its table ids as the search's `sentences` (one per sentence),
  recording how many rows each step ran."""
  tables = jnp.asarray(tables)

  def tokens_to_logits(tokens, cache, step, sentences):
    jax.debug.callback(lambda n: rows_seen.append(int(n)), jnp.int32(tokens.shape[0]) + 0 * step)
    token = tokens[:, 0]
    total = cache["sum"] + token
    table = jnp.repeat(sentences["table"], tokens.shape[0] // sentences["table"].shape[0])
    return tables[table, total % _MOD, token], {"sum": total}

  return tokens_to_logits


@pytest.mark.parametrize("method,finish_rule,stop_rule", [
    ("greedy", None, None), ("beam", "t2t", "exact"), ("beam", "t2t", "best_finished"),
    ("beam", "fairseq", "exact"), ("beam", "fairseq", "best_finished")])
def test_a_shrinking_batch_returns_what_the_full_batch_returns(method, finish_rule, stop_rule):
  """Sentences of one batch stop at different steps; once half of them have, the rest go on
  in a batch of half the size: the same outputs and scores, in the same order, and fewer
  rows computed. The per-sentence tables reach the step only through `sentences`, the
  running sums only through the cache, so a sentence moved to the wrong slot, or a cache
  row to the wrong beam, changes its outputs."""
  rng = np.random.default_rng(7)
  batch, beam, max_len = 13, 3, 30
  tables = _random_logits(rng, (batch, _MOD, 12, 12))
  tables[..., EOS_ID] += rng.uniform(-1.0, 3.0, size=(batch, 1, 1))  # Some end soon, some late.
  max_lengths = jnp.asarray(rng.integers(4, max_len + 1, size=batch), jnp.int32)
  sentences = {"table": jnp.arange(batch, dtype=jnp.int32)}
  rows_per_sentence = beam if method == "beam" else 1
  outputs, rows = {}, {}
  for shrink in (False, True):
    seen = []
    model = _sentence_model(tables, seen)
    cache = {"sum": jnp.zeros((batch * rows_per_sentence,), jnp.int32)}
    plan = search.SearchPlan(shrink_batch=shrink)
    if method == "beam":
      result = _beam(model, cache, batch, max_len, max_lengths=max_lengths, sentences=sentences,
                     plan=plan, beam_size=beam, alpha=0.6, finish_rule=finish_rule,
                     stop_rule=stop_rule)
    else:
      result = (_greedy(model, cache, batch, max_len, max_lengths=max_lengths,
                        sentences=sentences, plan=plan),)
    outputs[shrink] = [np.asarray(x) for x in jax.block_until_ready(result)]
    rows[shrink] = seen
  for shrunk, full in zip(outputs[True], outputs[False]):
    np.testing.assert_array_equal(shrunk, full)
  assert set(rows[False]) == {batch * rows_per_sentence}
  assert set(rows[True]) > {batch * rows_per_sentence, 7 * rows_per_sentence}, rows[True]
  assert sum(rows[True]) < sum(rows[False])
  assert len(rows[True]) == len(rows[False]), "the same steps, on fewer rows"


def test_a_shrinking_batch_needs_the_per_sentence_inputs():
  step = lambda tokens, cache, t: (jnp.zeros((tokens.shape[0], 8)), cache)
  plan = search.SearchPlan(shrink_batch=True)
  for search_fn in (lambda: _greedy(step, {}, 4, 6, plan=plan),
                    lambda: _beam(step, {}, 4, 6, plan=plan, beam_size=2)):
    with pytest.raises(ValueError, match="needs the step's per-sentence inputs as `sentences`"):
      search_fn()


def test_shrinking_sizes_halve_the_batch_three_times_at_most():
  assert search.shrinking_sizes(64) == (64, 32, 16, 8)
  assert search.shrinking_sizes(13) == (13, 7, 4, 2)
  assert search.shrinking_sizes(2) == (2, 1)
  assert search.shrinking_sizes(1) == (1,)


def _beam_best_finished_np(next_logprobs, beam: int, alpha: float, max_len: int,
                           finish_rule: str = "t2t"):
  """NumPy beam search that stops once a step's best candidate ends in EOS.

  t2t: every EOS among the 2·beam candidates finishes, and the best alive beam is
  returned only if nothing finished; fairseq: only EOS candidates ranked within the
  beam finish, and beams cut at `max_len` compete with the finished ones.
  Returns (score, tokens) of the best hypothesis.
  """
  alive, finished = [([], 0.0)], []
  for t in range(max_len):
    candidates = []
    for prefix, logprob in alive:  # Beam order, then token order: lax.top_k's tie order.
      dist = next_logprobs(prefix)
      candidates += [(logprob + dist[token], prefix + [int(token)])
                     for token in np.flatnonzero(np.isfinite(dist))]
    top = sorted(candidates, key=lambda c: -c[0])[:2 * beam]
    finished += [(logprob / _lp(t + 1, alpha), seq) for rank, (logprob, seq) in enumerate(top)
                 if seq[-1] == EOS_ID and (finish_rule == "t2t" or rank < beam)]
    alive = [(seq, logprob) for logprob, seq in top if seq[-1] != EOS_ID][:beam]
    if top[0][1][-1] == EOS_ID:
      return max(finished, key=lambda f: f[0])
  cut = [(logprob / _lp(max_len, alpha), seq) for seq, logprob in alive]
  if finish_rule == "fairseq":
    return max(finished + cut, key=lambda f: f[0])
  return max(finished or cut, key=lambda f: f[0])


@pytest.mark.parametrize("finish_rule", search.FINISH_RULES)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_best_finished_stop_rule_equals_its_reference_and_saves_steps(alpha, finish_rule):
  # "best_finished" stops a sentence at the first step whose best candidate is EOS
  # (OpenNMT-py, CTranslate2). Checked against a NumPy beam search with that rule;
  # it never runs more steps than "exact" and, with a large alpha, runs fewer.
  rng = np.random.default_rng(11)
  batch, beam, max_len = 6, 3, 30
  tables = _random_logits(rng, (batch, _MOD, 12, 12))
  tables[..., EOS_ID] += 1.0
  steps = []

  def counting_model(tokens, cache, step):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return _history_model(tables)(tokens, cache, step)

  results = {}
  for rule in ("exact", "best_finished"):
    steps.clear()
    seqs, scores = _beam(counting_model, _history_cache(batch), batch, max_len, beam_size=beam,
                         alpha=alpha, stop_rule=rule, finish_rule=finish_rule)
    jax.block_until_ready(seqs)
    results[rule] = (np.asarray(seqs), np.asarray(scores), len(steps))
  seqs, scores, steps_best = results["best_finished"]
  for b in range(batch):
    want_score, want_seq = _beam_best_finished_np(_history_next(tables, b), beam, alpha, max_len,
                                                  finish_rule)
    assert list(seqs[b, 0]) == _padded(want_seq, max_len), f"sentence {b}"
    np.testing.assert_allclose(scores[b, 0], want_score, rtol=1e-5)
  steps_exact = results["exact"][2]
  assert steps_best <= steps_exact
  if alpha == 1.5:
    assert steps_best < steps_exact, (steps_best, steps_exact)


def test_cache_rows_follow_their_beams_with_flat_cache():
  # The history model's distribution depends on a running sum held only in
  # the cache: if rows were not gathered by parent beam, the beams would be
  # scored with another beam's history and differ from exhaustive search.
  # Here the cache is passed already flattened to batch*beam rows.
  rng = np.random.default_rng(5)
  tables = _random_logits(rng, (3, _MOD, 6, 6))
  seqs, scores = _beam(_history_model(tables), _history_cache(3, rows=3 * 16), 3, 4,
                       beam_size=16, alpha=0.6)
  for b in range(3):
    expected = _exhaustive(_history_next(tables, b), 4, 0.6)
    got = [list(np.asarray(s)) for s in seqs[b, :15]]
    assert got == [_padded(s, 4) for _, s in expected], f"sentence {b}"


def test_beam_search_runs_under_jit_with_early_termination():
  rng = np.random.default_rng(6)
  table = _random_logits(rng, (20, 20))
  table[:, EOS_ID] += 2.0
  model = _bigram_model(table)

  @jax.jit
  def decode(max_lengths):
    return _beam(model, {"unused": jnp.zeros((8,))}, 2, 12, max_lengths=max_lengths,
                 beam_size=4, alpha=0.6)

  seqs, scores = decode(jnp.array([12, 6]))
  assert seqs.shape == (2, 4, 12) and seqs.dtype == jnp.int32
  assert scores.shape == (2, 4) and scores.dtype == jnp.float32
  for b in range(2):
    for k in range(4):
      row = list(np.asarray(seqs[b, k]))
      if EOS_ID in row:  # Everything after EOS is PAD; no BOS anywhere.
        end = row.index(EOS_ID)
        assert all(t == PAD_ID for t in row[end + 1:]), row
      assert BOS_ID not in row


def test_sampling_with_top_k_one_or_tiny_temperature_is_greedy():
  rng = np.random.default_rng(7)
  table = _random_logits(rng, (12, 12))
  model = _bigram_model(table)
  greedy = _greedy(model, {}, 4, 10)
  for kwargs in (dict(top_k=1), dict(temperature=1e-4)):
    sampled = _sample(model, {}, jax.random.key(3), 4, 10, **kwargs)
    np.testing.assert_array_equal(sampled, greedy, err_msg=str(kwargs))


def test_sampling_top_k_restricts_support_and_is_reproducible():
  rng = np.random.default_rng(8)
  table = _random_logits(rng, (12, 12), eos=False)
  model = _bigram_model(table)
  a = _sample(model, {}, jax.random.key(5), 64, 6, top_k=2, temperature=2.0)
  b = _sample(model, {}, jax.random.key(5), 64, 6, top_k=2, temperature=2.0)
  np.testing.assert_array_equal(a, b)
  a = np.asarray(a)
  prev = np.concatenate([np.full((64, 1), BOS_ID), a[:, :-1]], axis=1)
  top2 = np.argsort(-table, axis=-1)[:, :2]
  for p, t in zip(prev.ravel(), a.ravel()):
    assert t in top2[p], f"token {t} after {p} is not among the top 2"
  assert len(set(map(tuple, a))) > 1, "sampling should not be deterministic"


@pytest.mark.parametrize("call, message", [
    (lambda m: _beam(m, {}, 1, 5, beam_size=0), "beam_size=0"),
    (lambda m: _beam(m, {}, 1, 5, alpha=-0.1), "alpha=-0.1"),
    (lambda m: _sample(m, {}, jax.random.key(0), 1, 5, temperature=0.0), "temperature=0.0"),
    (lambda m: _sample(m, {}, jax.random.key(0), 1, 5, top_k=-1), "top_k=-1"),
    (lambda m: _sample(m, {}, jax.random.key(0), 1, 5, top_p=0.0), "top_p=0.0"),
    (lambda m: _beam(m, {}, 1, 5, stop_rule="never"), "stop_rule='never'"),
    (lambda m: _greedy(m, {}, 1, 0), "max_decode_len=0"),
])
def test_invalid_settings_raise_one_line_user_errors(call, message):
  model = _bigram_model(np.zeros((6, 6), np.float32))
  with pytest.raises(UserError, match=message) as info:
    call(model)
  assert "\n" not in str(info.value)


def test_length_penalty_formula():
  for length, alpha in itertools.product([1, 7, 50], [0.0, 0.6, 1.0]):
    np.testing.assert_allclose(search.length_penalty(length, alpha),
                               ((5 + length) / 6) ** alpha, rtol=1e-6)


def test_block_size_divides_the_row():
  assert search.block_size(32000) == 128
  assert search.block_size(40000) == 125  # Beam 5 over an 8,000-token vocabulary.
  assert search.block_size(50000) == 125
  assert search.block_size(6 * 1009) == 0  # No divisor near 128: the plain top-k.


@pytest.mark.parametrize("levels", [3, 1000])
@pytest.mark.parametrize("n", [4 * 640, 4 * 625])  # Blocks of 128; of 125.
def test_top_k_by_blocks_equals_lax_top_k_including_ties(levels, n):
  # levels=3: almost every entry ties with many others; the lowest index must win.
  rng = np.random.default_rng(levels)
  values = rng.integers(0, levels, size=(6, n)).astype(np.float32)
  values[0, :] = -np.inf  # A row with no finite entry.
  values[1, 1000:] = -np.inf
  for k in (1, 8):
    want_values, want_index = jax.lax.top_k(jnp.asarray(values), k)
    got_values, got_index = jax.jit(search.top_k_by_blocks, static_argnums=1)(values, k)
    np.testing.assert_array_equal(got_values, want_values)
    np.testing.assert_array_equal(got_index, want_index)


@pytest.mark.parametrize("levels", [3, 1000])
@pytest.mark.parametrize("vocab", [640, 625, 6 * 1009])  # Blocks of 128; of 125; none.
def test_top_continuations_equal_lax_top_k_of_the_log_probabilities(levels, vocab):
  """Beam search's candidates: ties within and across beams, empty beams (-inf)."""
  rng = np.random.default_rng(levels)
  beam = 4
  logits = rng.integers(0, levels, size=(5, beam, vocab)).astype(np.float32)
  logprobs = -rng.integers(0, 3, size=(5, beam)).astype(np.float32)
  logprobs[0, 1:] = -np.inf  # Only beam 0 alive (the first step).
  logprobs[1, :] = -np.inf  # No finite candidate.
  logits[2, :, 100:] = -np.inf
  logprobs[3] = rng.standard_normal(beam).astype(np.float32)  # Sums that round.
  logits[4] = rng.standard_normal((beam, vocab)).astype(np.float32) * levels
  if vocab == 640:  # The best blocks, chosen out of index order, must be read in it.
    logits[4] = 0.0
    logits[4, :, 600] = 1.0
    logprobs[4] = 0.0
  sums = (logits + (logprobs - jax.nn.logsumexp(logits, axis=-1))[:, :, None]).reshape(5, -1)
  for k in (1, 2 * beam):
    want_values, want_index = jax.lax.top_k(sums, k)
    got_values, got_index = jax.jit(search.top_continuations, static_argnums=2)(
        logits, logprobs, k)
    np.testing.assert_array_equal(got_values, want_values)
    np.testing.assert_array_equal(got_index, want_index)


def test_first_argmax_equals_argmax_including_ties():
  rng = np.random.default_rng(0)
  values = rng.integers(0, 4, size=(16, 3000)).astype(np.float32)
  np.testing.assert_array_equal(search.first_argmax(jnp.asarray(values)),
                                np.argmax(values, axis=-1))


@pytest.mark.parametrize("vocab", [3072, 8000, 32000])
def test_blocked_first_argmax_equals_argmax_including_ties_across_blocks(vocab):
  """Rows the blocks divide: the maximum repeated within and across blocks, or unique."""
  rng = np.random.default_rng(1)
  ties = rng.integers(0, 3, size=(8, vocab)).astype(np.float32)  # Each block holds the max.
  ties[0, :] = 1.0  # All equal: index 0.
  ties[1, :] = 0.0
  ties[1, -1] = 2.0  # The maximum only in the last block's last entry.
  unique = rng.standard_normal((4, 2, vocab)).astype(np.float32)
  for values in (ties, unique):
    np.testing.assert_array_equal(search.first_argmax(jnp.asarray(values)),
                                  np.argmax(values, axis=-1))


def test_beam_search_with_blocked_top_k_equals_plain_top_k(monkeypatch):
  """A vocabulary big enough for the blocked top-k gives the plain top-k's beams."""
  vocab, max_len = 640, 5
  tables = jnp.asarray(np.random.default_rng(1).standard_normal((max_len, vocab, vocab)),
                       jnp.float32)

  def tokens_to_logits(tokens, cache, step):
    return tables[step][tokens[:, 0]], cache

  def run():
    return _beam(tokens_to_logits, {"rows": jnp.zeros((12, 1))}, 3, max_len, beam_size=4,
                 alpha=0.6)

  blocked = run()
  monkeypatch.setattr(search, "top_continuations", lambda logits, logprobs, k: jax.lax.top_k(
      (logits + (logprobs - jax.nn.logsumexp(logits, axis=-1))[:, :, None]).reshape(
          logits.shape[0], -1), k))
  plain = run()
  np.testing.assert_array_equal(blocked[0], plain[0])
  np.testing.assert_allclose(blocked[1], plain[1], rtol=1e-6)
