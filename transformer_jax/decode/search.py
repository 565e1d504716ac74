"""Model-agnostic decoding: beam search, greedy search and sampling.

Pure JAX, built on `jax.lax.while_loop`, so each function can be traced
inside `jax.jit`. A search takes three values:

- a `StepModel`: the model's step, its initial cache, the per-sentence inputs
  and how to grow the cache;
- a `SearchSpec`: what to search for (method, beam, alpha, finish and stop rules,
  sampling parameters, special tokens);
- a `SearchPlan`: how the search runs on this backend (a growing cache, a
  shrinking batch, one cache row shared by a sentence's beams). Every plan gives
  the same results, so callers choose it from the backend and the shapes.

The model is seen only through its step:

  tokens_to_logits(tokens: int32[rows, 1], cache: PyTree, step: int32[], sentences)
      -> (logits: float[rows, vocab], new_cache: PyTree)

`tokens` are the previous output tokens (`bos_id` at `step == 0`) and `step`
is their position. Every cache leaf has leading dimension `rows`: batch for
greedy search and sampling, batch*beam for beam search, beam-major within a
batch item (row = b*beam + k). Leaves of rank 0 (e.g. a shared step counter)
are passed through unchanged. `sentences` is a PyTree whose leaves have leading
dimension batch (source tokens, cross-attention keys and values); a step
without per-sentence inputs (StepModel.sentences None) is called without it.

Outputs hold the generated tokens without BOS, up to and including EOS, and
PAD after it; a sentence ends at EOS or after `max_lengths[b]` tokens.

A shrinking batch (`SearchPlan.shrink_batch`, greedy and beam search): once the
sentences still decoding fit in half the batch (rounded up), the loop goes on
in a batch of that size, holding them and done ones to fill it (then a quarter,
an eighth), as CTranslate2 drops finished sentences. The results are the same;
the step must take every per-sentence input through `sentences` or the cache,
which shrink with the batch, so `sentences` is required.

A growing cache (`SearchPlan.cache_lengths`, increasing, the last one
`max_decode_len`, with `StepModel.grow_cache(cache, length) -> cache`): the
search runs one while loop per length; before the loop that ends at step L the
cache is grown to L positions, so early steps read (and beam search reorders) a
short cache. The results equal those of one loop over a full-length cache.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from transformer_jax.errors import UserError
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

PyTree = Any
# (tokens, cache, step[, sentences]) -> (logits, cache); beam search over a shared cache adds
# `beam_slots` after them (SearchPlan.shared_cache).
TokensToLogits = Callable[..., tuple[jax.Array, PyTree]]
GrowCache = Callable[[PyTree, int], PyTree]

METHODS = ("beam", "greedy", "sample")
# Which hypotheses beam search counts as finished (SearchSpec.finish_rule).
FINISH_RULES = ("t2t", "fairseq")
# When beam search stops a sentence (SearchSpec.stop_rule).
STOP_RULES = ("exact", "best_finished", "max_length")
# SearchSpec.eos_id: no token ends a sentence, every one decodes max_lengths[b] tokens.
NO_EOS = -1


class StepModel(NamedTuple):
  """The model as a search sees it: its step, initial cache, per-sentence inputs (None: the
  step takes none) and how to grow the cache (for SearchPlan.cache_lengths)."""
  step: TokensToLogits
  cache: PyTree
  sentences: PyTree = None
  grow_cache: GrowCache | None = None


@dataclasses.dataclass(frozen=True)
class SearchPlan:
  """How a search runs (module docstring); the results are the same under every plan.

  cache_lengths: a growing cache's lengths, () for one loop over the full length.
  shrink_batch: greedy and beam search go on in smaller batches as sentences end.
  shared_cache: beam search over one cache row a sentence (beam_search).
  """
  cache_lengths: tuple[int, ...] = ()
  shrink_batch: bool = False
  shared_cache: bool = False


@dataclasses.dataclass(frozen=True)
class SearchSpec:
  """What to search for; a setting that cannot work is a UserError on construction.

  method: "beam", "greedy" or "sample".
  beam_size, alpha: beams per sentence (the paper: 4) and the GNMT length penalty's
    exponent, >= 0 (the paper: 0.6). `alpha` may be a traced float32[] inside jit, so
    one compiled search serves every α.
  finish_rule, stop_rule: beam search's rules (beam_search).
  temperature, top_k, top_p: sampling from softmax(logits / temperature), restricted to
    the top_k most likely tokens (0: all) and to the smallest set whose probability
    reaches top_p (1: all).
  eos_id, bos_id: the special tokens; eos_id=NO_EOS decodes every sentence to its
    maximum length (fixed work, for benchmarks).
  """
  method: str = "beam"
  beam_size: int = 4
  alpha: float | jax.Array = 0.6
  finish_rule: str = "t2t"
  stop_rule: str = "exact"
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_id: int = EOS_ID
  bos_id: int = BOS_ID

  def __post_init__(self):
    if self.method not in METHODS:
      raise UserError(f"method={self.method!r} is not one of {', '.join(METHODS)}")
    if int(self.beam_size) < 1:
      raise UserError(f"beam_size={self.beam_size} must be at least 1 (the paper uses 4)")
    if isinstance(self.alpha, numbers.Real) and self.alpha < 0:  # Not checkable when traced.
      raise UserError(f"alpha={self.alpha} must be >= 0 (0 disables the length penalty; the "
                      "paper uses 0.6)")
    if self.finish_rule not in FINISH_RULES:
      raise UserError(f"finish_rule={self.finish_rule!r} is not one of "
                      f"{', '.join(FINISH_RULES)}")
    if self.stop_rule not in STOP_RULES:
      raise UserError(f"stop_rule={self.stop_rule!r} is not one of {', '.join(STOP_RULES)}")
    if not float(self.temperature) > 0:
      raise UserError(f"temperature={self.temperature} must be > 0 (1: the model's own "
                      "distribution; greedy search is the limit of 0)")
    if int(self.top_k) < 0:
      raise UserError(f"top_k={self.top_k} must be >= 0 (0 samples from every token)")
    if not 0 < float(self.top_p) <= 1:
      raise UserError(f"top_p={self.top_p} must be in (0, 1] (1 samples from every token)")


def doubling_lengths(max_decode_len: int, first: int = 16) -> tuple[int, ...]:
  """Cache lengths first, 2·first, 4·first, ... up to max_decode_len (the last one).

  A doubled length within 1.5× of max_decode_len is left out: (16, 32, 66), not
  (16, 32, 64, 66). Its loop would cost a compile (each length is one) for a few steps
  that few sentences reach: without it, the first beam decode of Multi30k's test2016
  (its compiles) takes 8 % less.
  """
  lengths = []
  length = first
  while length < max_decode_len:
    lengths.append(length)
    length *= 2
  if len(lengths) > 1 and 2 * max_decode_len <= 3 * lengths[-1]:
    lengths.pop()
  return tuple(lengths) + (max_decode_len,)


def _while_in_phases(cond_fn, body_fn, state, max_decode_len: int,
                     cache_lengths: Sequence[int], grow_cache: GrowCache | None):
  """`lax.while_loop(cond_fn, body_fn, state)`, one loop per cache length.

  `state` is a NamedTuple with `step` and `cache`; the loop for length L
  stops at step L, after the cache was grown to L positions.
  """
  if grow_cache is None or not cache_lengths:
    return jax.lax.while_loop(cond_fn, body_fn, state)
  lengths = [int(length) for length in cache_lengths]
  if lengths != sorted(set(lengths)) or lengths[0] < 1 or lengths[-1] != max_decode_len:
    raise ValueError(f"cache_lengths={lengths} must increase from >= 1 to "
                     f"max_decode_len={max_decode_len}")
  for length in cache_lengths:
    state = state._replace(cache=grow_cache(state.cache, length))
    state = jax.lax.while_loop(
        lambda s, length=length: cond_fn(s) & (s.step < length), body_fn, state)
  return state


def shrinking_sizes(batch_size: int, halvings: int = 3) -> tuple[int, ...]:
  """The batch sizes of a shrinking search: `batch_size`, then halved (rounded up)
  up to `halvings` times: 64 -> (64, 32, 16, 8). Each size is one more compiled loop."""
  sizes = [int(batch_size)]
  while len(sizes) <= halvings and sizes[-1] > 1:
    sizes.append((sizes[-1] + 1) // 2)
  return tuple(sizes)


def _take_rows(tree: PyTree, rows: jax.Array) -> PyTree:
  """Rows `rows` (int32[n]) of every leaf; rank-0 leaves as they are."""
  return jax.tree_util.tree_map(
      lambda x: x if jnp.ndim(x) == 0 else jnp.take(x, rows, axis=0), tree)


def _take_sentences(tree: PyTree, keep: jax.Array, rows_per_sentence: int) -> PyTree:
  """The rows of sentences `keep` (int32[n]) of leaves [batch * rows_per_sentence, ...]."""
  return _take_rows(tree, (keep[:, None] * rows_per_sentence
                           + jnp.arange(rows_per_sentence)).reshape(-1))


def _run_search(cond_fn, body_fn, state, finalize: Callable[[Any], PyTree],
                batch_sizes: Sequence[int], rows_per_sentence: int, max_decode_len: int,
                cache_lengths: Sequence[int], grow_cache: GrowCache | None) -> PyTree:
  """`finalize(state)` after the search loop, for every sentence in batch order.

  `state` is a NamedTuple with `step` (shared), `cache` (leaves of
  `rows_per_sentence` rows a sentence), `done` (bool[batch]) and per-sentence
  fields. With several `batch_sizes` (`shrinking_sizes`), the loop at each size
  stops once no more sentences than the next size are left undone; the undone
  ones (and done ones to fill the size) go on in the smaller batch, and the
  outputs of every sentence are written back in place. A done sentence's state
  no longer changes, so its outputs are final when it is dropped. The growing
  cache's loops run at the first size; the smaller batches use the cache at its
  full length.
  """
  sentence_ids = jnp.arange(batch_sizes[0])
  outputs = None
  for stage, size in enumerate(batch_sizes):
    smaller = batch_sizes[stage + 1] if stage + 1 < len(batch_sizes) else None
    stage_cond = cond_fn
    if smaller is not None:
      stage_cond = lambda s, smaller=smaller: cond_fn(s) & (jnp.sum(~s.done) > smaller)
    state = _while_in_phases(stage_cond, body_fn, state, max_decode_len,
                             cache_lengths if stage == 0 else (), grow_cache)
    result = finalize(state)
    if outputs is None:
      outputs = result
    else:
      outputs = jax.tree_util.tree_map(lambda out, new: out.at[sentence_ids].set(new),
                                       outputs, result)
    if smaller is not None:
      keep = jnp.argsort(state.done, stable=True)[:smaller]  # Undone sentences first.
      sentence_ids = sentence_ids[keep]
      state = state._replace(**{
          field: _take_sentences(getattr(state, field), keep,
                                 rows_per_sentence if field == "cache" else 1)
          for field in state._fields if field != "step"})
  return outputs


def _step_with_sentences(model: StepModel, shrink_batch: bool = False) -> Callable:
  """The step as `(tokens, cache, step, sentences, ...)`, whether or not it takes `sentences`."""
  if shrink_batch and model.sentences is None:
    raise ValueError("shrink_batch=True needs the step's per-sentence inputs as `sentences`: "
                     "a step closing over them would read other sentences' once the batch "
                     "shrinks")
  if model.sentences is None:
    step = model.step
    return lambda tokens, cache, t, _, *rest: step(tokens, cache, t, *rest)
  return model.step


def length_penalty(length: jax.Array | float, alpha: float | jax.Array) -> jax.Array:
  """GNMT length penalty lp = ((5 + length) / 6) ** alpha (paper §6.1).

  `length` counts the generated tokens including EOS. A finished hypothesis
  scores log P(y | x) / lp.
  """
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


def block_size(n: int, block: int = 128) -> int:
  """The block of `first_argmax`, `top_k_by_blocks` and `top_continuations` for rows of n
  entries: `block` if it divides n, else the divisor of n nearest to it within
  [block / 2, 2 * block] (0: none).

  Vocabularies are rarely multiples of 128: 8,000 (×5 beams: 40,000) splits into blocks of 125.
  """
  if n % block == 0:
    return block
  divisors = [d for d in range(block // 2, 2 * block + 1) if n % d == 0]
  return min(divisors, key=lambda d: (abs(d - block), d)) if divisors else 0


def first_argmax(values: jax.Array, block: int = 128) -> jax.Array:
  """jnp.argmax over the last axis (the lowest index among equal maxima), vectorised.

  XLA:CPU lowers argmax to one (value, index) reduction that it does not
  vectorise: 4.6 ms for [64, 32000] against 1.2 ms for a max. Here one max
  over blocks of about `block` entries (`block_size`) reads the row once; the
  first block holding the row's maximum holds its first index, and only that
  block is searched again. float[..., n] -> int32[...].
  """
  n = values.shape[-1]
  block = block_size(n, block)
  if not block or n // block < 2:
    return _first_max_index(values)
  blocks = values.reshape(values.shape[:-1] + (n // block, block))
  best_block = _first_max_index(jnp.max(blocks, axis=-1))
  chosen = jnp.take_along_axis(blocks, best_block[..., None, None], axis=-2)[..., 0, :]
  return best_block * block + _first_max_index(chosen)


def _first_max_index(values: jax.Array) -> jax.Array:
  """The first index of the maximum over the last axis, as two plain reductions."""
  maximum = jnp.max(values, axis=-1, keepdims=True)
  index = jax.lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
  first = jnp.min(jnp.where(values == maximum, index, values.shape[-1]), axis=-1)
  return jnp.minimum(first, values.shape[-1] - 1)  # A NaN row: argmax would not be defined either.


def top_k_by_blocks(values: jax.Array, k: int, block: int = 128) -> tuple[jax.Array, jax.Array]:
  """jax.lax.top_k(values, k) over the last axis of float[rows, n]; same values and indices.

  The k largest entries of a row lie in the k blocks (of `block` entries)
  with the largest maxima: a block outside them has k blocks above it, each
  holding a larger entry. So one vectorised max over the row, a top-k over
  the block maxima and a top-k over k * block entries replace a top-k over n
  (11.8 → 1.75 ms for beam 4 over 64 sentences × 4 × 32000 on the CPU). The
  chosen blocks are taken in index order, so ties still go to the lowest
  index. The block is `block_size(n, block)`; rows with no such block, or
  with few blocks, use jax.lax.top_k directly.
  """
  rows, n = values.shape
  block = block_size(n, block)
  if not block or n // block <= 2 * k:
    return jax.lax.top_k(values, k)
  blocks = values.reshape(rows, n // block, block)
  _, best_blocks = jax.lax.top_k(jnp.max(blocks, axis=-1), k)
  return _top_k_in_blocks(blocks, best_blocks, k)


def _top_k_in_blocks(blocks: jax.Array, best_blocks: jax.Array, k: int,
                     block_offsets: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The top k of float[rows, num_blocks, block] (plus `block_offsets[rows, num_blocks]`,
  each added to its block), read only in the k blocks `best_blocks` (int32[rows, k]) that
  hold it; indices into num_blocks * block. The blocks are read in index order, so ties
  go to the lowest index."""
  rows, _, block = blocks.shape
  best_blocks = jnp.sort(best_blocks, axis=-1)
  candidates = jnp.take_along_axis(blocks, best_blocks[:, :, None], axis=1)
  if block_offsets is not None:
    candidates = candidates + jnp.take_along_axis(block_offsets, best_blocks, axis=1)[:, :, None]
  top_values, position = jax.lax.top_k(candidates.reshape(rows, k * block), k)
  top_index = jnp.take_along_axis(best_blocks, position // block, axis=1) * block + position % block
  return top_values, top_index


def top_continuations(logits: jax.Array, logprobs: jax.Array, k: int,
                      block: int = 128) -> tuple[jax.Array, jax.Array]:
  """The k best continuations of a sentence's beams: `jax.lax.top_k` over the
  beam * vocab entries of `logprobs[..., None] + log_softmax(logits)`.

  logits: float[rows, beam, vocab], logprobs: float[rows, beam] -> (float[rows, k],
  int32[rows, k] indices into beam * vocab), ties to the lowest index. One read of the
  logits gives the maxima of their blocks (`block_size(vocab, block)`): the log-softmax's
  max is theirs, and a block's best sum is its maximum plus its beam's offset
  (`logprobs - logsumexp`; rounding is monotone), so only the k best blocks get the
  offset added, the top-k of `top_k_by_blocks` without the sums written out. Without a
  block (none divides vocab, or too few blocks), the sums and `top_k_by_blocks`.
  """
  rows, beam, vocab = logits.shape
  size = block_size(vocab, block)
  if not size or beam * (vocab // size) <= 2 * k:
    offsets = logprobs - jax.nn.logsumexp(logits, axis=-1)
    return top_k_by_blocks((logits + offsets[:, :, None]).reshape(rows, beam * vocab), k, block)
  block, blocks_per_beam = size, vocab // size
  blocks = logits.reshape(rows, beam, blocks_per_beam, block)
  block_maxima = jnp.max(blocks, axis=-1)  # [rows, beam, blocks_per_beam]
  # jax.nn.logsumexp, its max taken from the blocks'.
  shift = jnp.max(block_maxima, axis=-1)
  shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
  logsumexp = jnp.log(jnp.sum(jnp.exp(logits - shift[:, :, None]), axis=-1)) + shift
  offsets = jnp.repeat(logprobs - logsumexp, blocks_per_beam, axis=1)  # Per block.
  blocks = blocks.reshape(rows, beam * blocks_per_beam, block)
  _, best_blocks = jax.lax.top_k(block_maxima.reshape(rows, -1) + offsets, k)
  return _top_k_in_blocks(blocks, best_blocks, k, offsets)


def expand_to_beams(tree: PyTree, beam_size: int) -> PyTree:
  """Repeats each leaf row `beam_size` times: [b, ...] -> [b*beam, ...].

  Row b*beam + k is beam k of batch item b. Rank-0 leaves are left as is.
  """
  return jax.tree_util.tree_map(
      lambda x: x if jnp.ndim(x) == 0 else jnp.repeat(x, beam_size, axis=0),
      tree)


def _check_length(max_decode_len: int) -> None:
  if int(max_decode_len) < 1:
    raise UserError(f"max_decode_len={max_decode_len} must be at least 1")


def _max_lengths(max_lengths: jax.Array, max_decode_len: int) -> jax.Array:
  """int32[batch] per-sentence limits, clipped to `max_decode_len`."""
  max_lengths = jnp.asarray(max_lengths, jnp.int32)
  if max_lengths.ndim != 1:
    raise UserError(f"max_lengths has shape {max_lengths.shape}, expected (batch,): one limit "
                    "per sentence")
  return jnp.minimum(max_lengths, max_decode_len)


def full_lengths(batch_size: int, max_decode_len: int) -> jax.Array:
  """int32[batch_size] limits of `max_decode_len` tokens: `max_lengths` with no shorter one."""
  return jnp.full((batch_size,), max_decode_len, jnp.int32)


# --------------------------------------------------------------------------
# Beam search.


class _BeamState(NamedTuple):
  step: jax.Array  # int32[]: tokens generated so far.
  alive_seqs: jax.Array  # int32[batch, beam, max_decode_len], no EOS.
  alive_logprobs: jax.Array  # float32[batch, beam], best first; -inf: empty.
  finished_seqs: jax.Array  # int32[batch, beam, max_decode_len], end in EOS.
  finished_scores: jax.Array  # float32[batch, beam], best first; -inf: empty.
  done: jax.Array  # bool[batch]: the sentence's beams are final.
  max_lengths: jax.Array  # int32[batch]: most tokens, EOS included.
  sentences: PyTree  # leaves [batch, ...]: the step's per-sentence inputs.
  cache: PyTree  # leaves [batch*beam, ...], row b*beam + k for alive beam k (shared: [batch, ...]).
  # A shared cache: int32[batch, beam, max_decode_len], the beam slot holding position p of
  # alive beam k's history; None otherwise.
  beam_slots: jax.Array | None


def beam_search(model: StepModel, spec: SearchSpec, max_lengths: jax.Array,
                max_decode_len: int, plan: SearchPlan = SearchPlan()
                ) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty (paper §6.1), best first.

  Each step extends the alive beams, keeps the 2*beam best candidates, moves
  those ending in EOS to the finished set (scored log P / lp(length)) and
  keeps the `beam_size` best others alive, gathering the cache rows of
  their parent beams (or, with `plan.shared_cache`, only their slot tables).

  Args:
    model: the step and its cache, whose leaves have leading dimension batch*beam (or
      batch, in which case each row is repeated for the beams).
    spec: beam_size, alpha, eos_id, bos_id and the rules:
      finish_rule "t2t" (tensor2tensor, the paper's code): every one of the
        2*beam candidates that ends in EOS is finished, and hypotheses cut at
        the maximum length are returned only if nothing finished. "fairseq"
        (fairseq, Hugging Face generate): only EOS candidates among the `beam`
        best are finished, and hypotheses cut at the maximum length compete
        with the finished ones. They differ only where a hypothesis ranked
        below the beam ends, or the length limit cuts one that would win.
      stop_rule "exact": stop a sentence once no alive beam can beat its
        `beam_size`-th finished one. The bound divides the best alive
        log-probability by the largest possible penalty lp(max_lengths[b]),
        which is exact because log-probabilities only fall and lp grows with
        length (alpha >= 0): results equal those of "max_length". With a large
        alpha that bound is loose, so sentences often run to their maximum length.
        "best_finished": stop a sentence at the first step whose best
        candidate ends in EOS, and return the best finished hypotheses so far
        (the rule of OpenNMT-py's and CTranslate2's beam search for one
        hypothesis). An alive beam that would have finished better later is
        lost, so results can differ from "exact"; most sentences stop soon
        after their best translation ends. "max_length": every sentence runs
        to its maximum length.
    max_lengths: int32[batch] most tokens (EOS included) per sentence, e.g. source
      length + 50 (§6.1); clipped to `max_decode_len`.
    max_decode_len: static length of the output arrays.
    plan: a growing cache, a shrinking batch (module docstring), or `shared_cache`:
      the beams of a sentence share one cache row, and nothing is reordered when
      they change parents. The cache holds beam_size slots a position, each beam
      writes its own, and the step is called as `step(tokens, cache, t, sentences,
      beam_slots)` with beam_slots int32[batch, beam, max_decode_len], the slot
      holding position p of each alive beam's history (cache.shared_beam_mask turns
      it into the attention mask). The cache then has `batch` rows, starts empty (its
      writes follow the search's step), and `model.grow_cache(cache, n)` (required) is
      called with n = length × beam_size slots. The results equal the reordering
      search's up to float rounding.

  Returns:
    sequences: int32[batch, beam, max_decode_len], tokens after EOS are PAD.
    scores: float32[batch, beam], log P / lp(length), descending. A sentence
      that finished nothing by its maximum length returns its alive beams
      (scored with lp(max_lengths[b])); finished slots that stay empty have
      score -inf and an all-PAD sequence.
  """
  _check_length(max_decode_len)
  beam_size, alpha, eos_id = spec.beam_size, spec.alpha, spec.eos_id
  finish_rule, stop_rule = spec.finish_rule, spec.stop_rule
  max_lengths = _max_lengths(max_lengths, max_decode_len)
  batch_size = max_lengths.shape[0]
  rows = batch_size * beam_size
  step_fn = _step_with_sentences(model, plan.shrink_batch)
  shared_cache, cache_lengths, grow_cache = plan.shared_cache, plan.cache_lengths, model.grow_cache
  if shared_cache:
    if grow_cache is None:
      raise ValueError("shared_cache=True needs grow_cache to give the cache beam_size slots "
                       "a position")
    cache_lengths = tuple(cache_lengths) or (max_decode_len,)
    grow_positions = grow_cache
    grow_cache = lambda cache, length: grow_positions(cache, length * beam_size)

  def expand(x):
    if shared_cache:
      if jnp.ndim(x) != 0 and x.shape[0] != batch_size:
        raise ValueError(f"a shared cache leaf has shape {x.shape}, not batch={batch_size} rows")
      return x
    if jnp.ndim(x) == 0 or x.shape[0] == rows:
      return x
    if x.shape[0] == batch_size:
      return jnp.repeat(x, beam_size, axis=0)
    raise ValueError(f"cache leaf with shape {x.shape} has neither "
                     f"batch*beam={rows} nor batch={batch_size} rows")

  neg_inf = jnp.float32(-jnp.inf)
  seqs0 = jnp.full((batch_size, beam_size, max_decode_len), PAD_ID, jnp.int32)
  # Only beam 0 is live at first, so the first step does not pick duplicates.
  logprobs0 = jnp.where(jnp.arange(beam_size) == 0, 0.0, neg_inf)
  state = _BeamState(
      step=jnp.int32(0),
      alive_seqs=seqs0,
      alive_logprobs=jnp.broadcast_to(logprobs0, (batch_size, beam_size)),
      finished_seqs=seqs0,
      finished_scores=jnp.full((batch_size, beam_size), neg_inf),
      done=max_lengths <= 0,
      max_lengths=max_lengths,
      sentences=model.sentences,
      cache=jax.tree_util.tree_map(expand, model.cache),
      beam_slots=(jnp.zeros((batch_size, beam_size, max_decode_len), jnp.int32)
                  if shared_cache else None))

  def cond_fn(s: _BeamState) -> jax.Array:
    return (s.step < max_decode_len) & ~jnp.all(s.done)

  def body_fn(s: _BeamState) -> _BeamState:
    t = s.step
    batch = s.done.shape[0]  # Smaller than batch_size in a shrunk batch.
    prev = jax.lax.dynamic_index_in_dim(
        s.alive_seqs, jnp.maximum(t - 1, 0), axis=2, keepdims=False)
    tokens = jnp.where(t == 0, jnp.int32(spec.bos_id), prev)  # [batch, beam]
    beam_slots = s.beam_slots
    if shared_cache:  # Each beam writes position t in its own slot.
      beam_slots = beam_slots.at[:, :, t].set(jnp.arange(beam_size, dtype=jnp.int32))
    logits, cache = step_fn(tokens.reshape(batch * beam_size, 1), s.cache, t, s.sentences,
                            *(() if beam_slots is None else (beam_slots,)))
    vocab = logits.shape[-1]
    logits = logits.astype(jnp.float32).reshape(batch, beam_size, vocab)
    # 2*beam candidates leave at least `beam` that do not end in EOS.
    num_candidates = min(2 * beam_size, beam_size * vocab)
    top_logprobs, top_index = top_continuations(logits, s.alive_logprobs, num_candidates)
    top_parent = top_index // vocab  # [batch, 2*beam]
    top_token = top_index % vocab
    top_seqs = jnp.take_along_axis(s.alive_seqs, top_parent[:, :, None], 1)
    top_seqs = top_seqs.at[:, :, t].set(top_token)
    valid = top_logprobs > neg_inf
    ends = top_token == eos_id  # Never with NO_EOS.
    finishes = ends & valid
    if finish_rule == "fairseq":  # An EOS ranked below the beam is dropped, not finished.
      finishes &= jnp.arange(num_candidates) < beam_size

    # Alive: the best `beam` candidates that did not end.
    alive_logprobs, alive_index = jax.lax.top_k(
        jnp.where(ends, neg_inf, top_logprobs), beam_size)
    alive_seqs = jnp.take_along_axis(top_seqs, alive_index[:, :, None], 1)
    parent = jnp.take_along_axis(top_parent, alive_index, 1)  # [batch, beam]
    if shared_cache:  # A new beam's history is its parent's.
      beam_slots = jnp.take_along_axis(beam_slots, parent[:, :, None], 1)
    else:
      cache = _take_rows(cache, (jnp.arange(batch)[:, None] * beam_size
                                 + parent).reshape(batch * beam_size))

    # Finished: merge the old set with this step's EOS candidates. Old ones
    # come first, so ties keep the earlier hypothesis.
    new_scores = jnp.where(finishes,
                           top_logprobs / length_penalty(t + 1, alpha),
                           neg_inf)
    finished_scores, finished_index = jax.lax.top_k(
        jnp.concatenate([s.finished_scores, new_scores], axis=1), beam_size)
    finished_seqs = jnp.take_along_axis(
        jnp.concatenate([s.finished_seqs, top_seqs], axis=1),
        finished_index[:, :, None], 1)

    # Sentences already done keep their beams (their cache rows keep
    # running, but nothing reads their logits).
    def keep(old, new):
      mask = s.done.reshape((batch,) + (1,) * (old.ndim - 1))
      return jnp.where(mask, old, new)

    alive_seqs = keep(s.alive_seqs, alive_seqs)
    alive_logprobs = keep(s.alive_logprobs, alive_logprobs)
    finished_seqs = keep(s.finished_seqs, finished_seqs)
    finished_scores = keep(s.finished_scores, finished_scores)
    if shared_cache:
      beam_slots = keep(s.beam_slots, beam_slots)

    done = s.done | (t + 1 >= s.max_lengths)
    if stop_rule == "exact":
      best_possible = alive_logprobs[:, 0] / length_penalty(s.max_lengths, alpha)
      done |= finished_scores[:, -1] > best_possible
    if stop_rule == "best_finished":
      stops = finishes[:, 0] & ~done  # This step's best candidate ended in EOS.
      # Its alive beams were not cut by the length limit: they must not compete with the
      # finished ones at the end (fairseq's rule scores cut beams with lp(max_lengths)).
      alive_logprobs = jnp.where(stops[:, None], neg_inf, alive_logprobs)
      done |= stops
    return s._replace(step=t + 1, alive_seqs=alive_seqs, alive_logprobs=alive_logprobs,
                      finished_seqs=finished_seqs, finished_scores=finished_scores, done=done,
                      cache=cache, beam_slots=beam_slots)

  def finalize(state: _BeamState) -> tuple[jax.Array, jax.Array]:
    any_finished = state.finished_scores[:, 0] > neg_inf  # [batch]
    alive_scores = state.alive_logprobs / length_penalty(
        state.max_lengths, alpha)[:, None]
    if finish_rule == "fairseq":  # The beams cut at the length limit compete too.
      # (A sentence stopped early by the exact rule: its alive beams score below all its
      # finished ones; by best_finished: they were set to -inf.)
      scores, index = jax.lax.top_k(
          jnp.concatenate([state.finished_scores, alive_scores], axis=1), beam_size)
      sequences = jnp.take_along_axis(
          jnp.concatenate([state.finished_seqs, state.alive_seqs], axis=1), index[:, :, None], 1)
      return jnp.where((scores > neg_inf)[:, :, None], sequences, PAD_ID), scores
    sequences = jnp.where(any_finished[:, None, None], state.finished_seqs,
                          state.alive_seqs)
    scores = jnp.where(any_finished[:, None], state.finished_scores,
                       alive_scores)
    sequences = jnp.where((scores > neg_inf)[:, :, None], sequences, PAD_ID)
    return sequences, scores

  batch_sizes = shrinking_sizes(batch_size) if plan.shrink_batch else (batch_size,)
  return _run_search(cond_fn, body_fn, state, finalize, batch_sizes,
                     1 if shared_cache else beam_size, max_decode_len, cache_lengths, grow_cache)


# --------------------------------------------------------------------------
# Greedy search and sampling: one token per step.


class _StepState(NamedTuple):
  step: jax.Array  # int32[]: tokens generated so far.
  seqs: jax.Array  # int32[batch, max_decode_len].
  last: jax.Array  # int32[batch]: the latest token (BOS at first).
  done: jax.Array  # bool[batch].
  max_lengths: jax.Array  # int32[batch]: most tokens, EOS included.
  sentences: PyTree  # leaves [batch, ...]: the step's per-sentence inputs.
  cache: PyTree  # leaves [batch, ...].


def allowed_tokens(tokens_to_logits: TokensToLogits, min_length: int
                   ) -> TokensToLogits:
  """The step function with PAD and BOS impossible, and EOS too at steps < `min_length`.

  No output continues with PAD or BOS: a model trained here learns this; an
  imported one (Marian bans its decoder start token, which becomes BOS here)
  is told. One scatter a step sets all three columns.
  """

  def step(tokens, cache, t, *sentences):
    logits, cache = tokens_to_logits(tokens, cache, t, *sentences)
    eos = jnp.where(t < min_length, -jnp.inf, logits[:, EOS_ID])
    never = jnp.full((logits.shape[0], 2), -jnp.inf, logits.dtype)
    values = jnp.concatenate([never, eos[:, None].astype(logits.dtype)], axis=1)
    return logits.at[:, (PAD_ID, BOS_ID, EOS_ID)].set(values), cache

  return step


def _decode_one_per_step(model: StepModel, spec: SearchSpec, max_lengths: jax.Array,
                         max_decode_len: int, plan: SearchPlan,
                         choose: Callable[[jax.Array, jax.Array], jax.Array]) -> jax.Array:
  """Decodes with `choose(logits float32[batch, vocab], step) -> int32[batch]`."""
  _check_length(max_decode_len)
  max_lengths = _max_lengths(max_lengths, max_decode_len)
  batch_size = max_lengths.shape[0]
  step_fn = _step_with_sentences(model, plan.shrink_batch)

  def cond_fn(s: _StepState) -> jax.Array:
    return (s.step < max_decode_len) & ~jnp.all(s.done)

  def body_fn(s: _StepState) -> _StepState:
    logits, cache = step_fn(s.last[:, None], s.cache, s.step, s.sentences)
    token = choose(logits.astype(jnp.float32), s.step)
    token = jnp.where(s.done, PAD_ID, token.astype(jnp.int32))
    seqs = s.seqs.at[:, s.step].set(token)
    done = s.done | (s.step + 1 >= s.max_lengths) | (token == spec.eos_id)
    return s._replace(step=s.step + 1, seqs=seqs, last=token, done=done, cache=cache)

  state = _StepState(jnp.int32(0),
                     jnp.full((batch_size, max_decode_len), PAD_ID, jnp.int32),
                     jnp.full((batch_size,), spec.bos_id, jnp.int32),
                     max_lengths <= 0,
                     max_lengths,
                     model.sentences,
                     model.cache)
  batch_sizes = shrinking_sizes(batch_size) if plan.shrink_batch else (batch_size,)
  return _run_search(cond_fn, body_fn, state, lambda s: s.seqs, batch_sizes, 1, max_decode_len,
                     plan.cache_lengths, model.grow_cache)


def greedy_search(model: StepModel, spec: SearchSpec, max_lengths: jax.Array,
                  max_decode_len: int, plan: SearchPlan = SearchPlan()) -> jax.Array:
  """Greedy decoding: int32[batch, max_decode_len], PAD after EOS.

  The cache leaves have leading dimension batch. The loop stops as soon as
  every sentence has emitted `spec.eos_id` or reached `max_lengths[b]` tokens.
  """
  return _decode_one_per_step(model, spec, max_lengths, max_decode_len, plan,
                              lambda logits, step: first_argmax(logits))


def filter_logits(logits: jax.Array, temperature: float, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
  """float[n, vocab] -> logits / temperature with -inf outside the top-k and the top-p set.

  The top-p set is the smallest set of most likely tokens whose probability
  reaches `top_p` (the most likely token is always in it).
  """
  logits = logits.astype(jnp.float32) / temperature
  if top_k:
    kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # The number of tokens kept: those before the cumulative mass reaches top_p, plus that one.
    kept = jnp.sum(cumulative < top_p, axis=-1, keepdims=True) + 1
    threshold = jnp.take_along_axis(sorted_logits, kept - 1, axis=-1)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def sample(model: StepModel, spec: SearchSpec, max_lengths: jax.Array, max_decode_len: int,
           rng: jax.Array, plan: SearchPlan = SearchPlan()) -> jax.Array:
  """Ancestral sampling: int32[batch, max_decode_len], PAD after EOS.

  Step t draws from `filter_logits(logits, spec.temperature, spec.top_k, spec.top_p)` with
  the key `fold_in(rng, t)`, so a seed fixes the output. The cache leaves have leading
  dimension batch. The batch never shrinks (`plan.shrink_batch` is refused): a
  sentence's draws depend on its row.
  """
  if plan.shrink_batch:
    raise ValueError("sampling keeps its batch: a sentence's draws depend on its row")

  def choose(logits, step):
    return jax.random.categorical(
        jax.random.fold_in(rng, step),
        filter_logits(logits, spec.temperature, spec.top_k, spec.top_p), axis=-1)

  return _decode_one_per_step(model, spec, max_lengths, max_decode_len, plan, choose)


def best_outputs(model: StepModel, spec: SearchSpec, max_lengths: jax.Array,
                 max_decode_len: int, plan: SearchPlan = SearchPlan(),
                 rng: jax.Array | None = None) -> jax.Array:
  """The search `spec.method` names: int32[batch, max_decode_len], its best output per
  sentence (`rng`: sampling's key, key 0 where None)."""
  if spec.method == "beam":
    return beam_search(model, spec, max_lengths, max_decode_len, plan)[0][:, 0]
  if spec.method == "greedy":
    return greedy_search(model, spec, max_lengths, max_decode_len, plan)
  return sample(model, spec, max_lengths, max_decode_len,
                jax.random.key(0) if rng is None else rng, plan)
