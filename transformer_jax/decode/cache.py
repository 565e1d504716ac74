"""The KV cache of incremental decoding, and the model step that reads and extends it.

The encoder runs once per batch; the cross-attention keys and values are
computed once per sentence, when the cache is made; every decoder step then
feeds one token through the cached self-attention.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax.decode import search
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.transformer import Transformer

Array = jax.Array


def init_cache(model: Transformer, params, encoded: Array, src_tokens: Array, max_decode_len: int):
  """The decoder's cache for `max_decode_len` steps, cross-attention K/V filled in."""
  dummy_targets = jnp.zeros((src_tokens.shape[0], max_decode_len), jnp.int32)
  _, variables = model.apply(
      {"params": params}, encoded, src_tokens, dummy_targets,
      decode=True, mutable=["cache"], method=Transformer.decode,
  )
  return variables["cache"]


# Cache entries that depend only on the sentence, not on the beam or the step.
_PER_SENTENCE_ENTRIES = ("cross_key", "cross_value")
# Self-attention keys and values, [rows, heads, length, depth]: what `stored_as` converts.
_PER_STEP_ENTRIES = ("cached_key", "cached_value")
# A sliding window's slot positions, [rows, 1, length, 1]: padded with the keys as the cache grows.
_SLOT_POSITIONS = "cached_position"


def grow_cache(cache, length: int):
  """The cache with every self-attention key/value padded to `length` positions.

  The new positions hold zeros and lie after `cache_index`, so the step mask
  hides them until they are written.
  """

  def pad(value: Array) -> Array:
    if value.shape[2] >= length:
      return value
    return jnp.pad(value, ((0, 0), (0, 0), (0, length - value.shape[2]), (0, 0)))

  return _map_self_attention(cache, pad, _PER_STEP_ENTRIES + (_SLOT_POSITIONS,))


def stored_as(cache, dtype) -> dict:
  """`cache` with its self-attention keys/values stored in `dtype`.

  They hold values rounded to the matmul operand dtype already, so storing them
  in that dtype is exact. Beam search reorders them every step: in bfloat16 that
  moves half the bytes of float32 (10 % of beam 4's time for the base model on a
  CPU, where they are otherwise kept in float32: precision.decoding_cache_dtype).
  The attention reads them as stored.
  """
  return _map_self_attention(cache, lambda value: value.astype(dtype))


def _map_self_attention(cache, fn, entries: tuple[str, ...] = _PER_STEP_ENTRIES) -> dict:
  """`cache` with `fn` applied to each self-attention entry named in `entries`."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return traverse_util.unflatten_dict(
      {path: fn(value) if path[-1] in entries else value for path, value in flat.items()})


def self_attention_slots(cache) -> int:
  """The slots of the cache's self-attention keys (positions × beams for a shared cache)."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return next(value.shape[2] for path, value in flat.items() if path[-1] == "cached_key")


def shared_beam_mask(beam_slots: Array, step: Array, num_slots: int) -> AttentionMask:
  """The self-attention mask of a step whose beams share one cache row a sentence.

  Args:
    beam_slots: int32[batch, beam, >= num_slots / beam]: the beam slot that holds the
      key/value of position p of alive beam q's history (search.beam_search with
      `shared_cache`); this step's own position `step` holds q.
    step: the position this step writes, which must be the cache's `cache_index` (a cache
      made by `init_cache` starts at 0 with the search's step).
    num_slots: the cache's slots, positions × beam (slot p·beam + s: position p of slot s),
      at most beam_slots.shape[2] positions.

  Returns:
    An explicit mask bool[batch, 1, beam, num_slots]: beam q sees slot p·beam + s where
    p <= step and beam_slots[:, q, p] == s.
  """
  batch, beam = beam_slots.shape[:2]
  positions = num_slots // beam
  slots = beam_slots[:, :, :positions]
  visible = (slots[..., None] == jnp.arange(beam)) & (jnp.arange(positions) <= step)[:, None]
  return AttentionMask.from_dense(visible.reshape(batch, 1, beam, positions * beam))


def split_cache(cache) -> tuple[dict, dict]:
  """(per-row entries the search reorders, per-sentence entries it never touches)."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache))
  per_sentence = {k: v for k, v in flat.items() if k[-1] in _PER_SENTENCE_ENTRIES}
  per_row = {k: v for k, v in flat.items() if k[-1] not in _PER_SENTENCE_ENTRIES}
  return traverse_util.unflatten_dict(per_row), traverse_util.unflatten_dict(per_sentence)


def step_logits(
    model: Transformer, params, src_tokens: Array, sentence_cache=None
) -> search.TokensToLogits:
  """The search's step function: (tokens [n, 1], cache, step) -> (logits [n, vocab], cache).

  With `sentence_cache` (the cross-attention keys/values of `split_cache`, one
  row per sentence of `src_tokens`), the search's `cache` holds only the
  per-row entries and `n` may be any multiple of the sentences (beams). A
  fourth argument, `beam_slots`, is a shared beam cache's (`shared_beam_mask`).
  """
  step_fn = sentence_step_logits(model, params)
  return lambda tokens, cache, step, beam_slots=None: step_fn(
      tokens, cache, step, (src_tokens, sentence_cache), beam_slots)


def sentence_step_logits(model: Transformer, params) -> search.TokensToLogits:
  """`step_logits` with the sentences' inputs as the search's `sentences` argument:
  (tokens [n, 1], cache, step, (src_tokens, sentence_cache)) -> (logits, cache), so a
  shrinking search shrinks them with its batch. `sentence_cache` may be None (the
  cross-attention entries are then in `cache`). With a fifth argument, `beam_slots`,
  the self-attention cache holds one row a sentence, shared by its beams
  (`shared_beam_mask`)."""

  def tokens_to_logits(tokens, cache, step, sentences, beam_slots=None):
    src_tokens, sentence_cache = sentences
    positions = jnp.full(tokens.shape, step, jnp.int32)
    self_mask = None
    if beam_slots is not None:
      self_mask = shared_beam_mask(beam_slots, step, self_attention_slots(cache))
    full_cache = cache
    if sentence_cache is not None:
      full_cache = traverse_util.unflatten_dict(
          {**traverse_util.flatten_dict(cache), **traverse_util.flatten_dict(sentence_cache)}
      )
    logits, variables = model.apply(
        {"params": params, "cache": full_cache}, None, src_tokens, tokens,
        target_positions=positions, decode=True, decode_self_mask=self_mask, mutable=["cache"],
        method=Transformer.decode,
    )
    new_cache = variables["cache"]
    if sentence_cache is not None:
      new_cache, _ = split_cache(new_cache)
    return logits[:, 0], new_cache

  return tokens_to_logits
