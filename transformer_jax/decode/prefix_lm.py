"""Cached decoding of a decoder-only model from a prompt: one prefill pass, then a token a step.

A batch's prompts differ in length, so cache slots and positions part ways:
the prompt block (PAD-padded to `prompt_len`) fills slots 0 .. prompt_len - 1
in one call, and step t writes slot prompt_len + t at position
`prompt_lengths[r] + t` of row r. Each call's `cache_mask` names the slots a
token may see: the prompt's non-PAD slots, and the generated ones up to its
own. Those are exactly the tokens the full (uncached) model shows it.

`prefix_lm=True`: the prompt is a prefix LM's source, attended both ways
(as in training); otherwise the prompt is causal (a language model's prompt).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax.decode import search
from transformer_jax.decode.cache import grow_cache
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.layers import default_positions
from transformer_jax.special_tokens import PAD_ID

Array = jax.Array


def cache_length(cache: Any) -> int:
  """The number of slots of a decoder-only cache (its self-attention keys' length axis)."""
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return next(value.shape[2] for path, value in flat.items() if path[-1] == "cached_key")


def prefill(model: DecoderOnly, params: Any, prompt_tokens: Array, cache_len: int,
            prefix_lm: bool) -> tuple[Array, Any]:
  """(logits float32[batch, prompt_len, vocab], the cache with the prompt written in).

  prompt_tokens: int32[batch, prompt_len], PAD after each prompt.
  """
  batch, prompt_len = prompt_tokens.shape
  _, variables = model.apply({"params": params}, jnp.zeros((batch, cache_len), jnp.int32),
                             decode=True, mutable=["cache"])
  valid = prompt_tokens != PAD_ID
  slots = jnp.arange(cache_len)
  seen = jnp.pad(valid, ((0, 0), (0, cache_len - prompt_len)))[:, None, :]  # [batch, 1, slots]
  if not prefix_lm:  # Token i sees slots <= i.
    seen = seen & (slots[None, None, :] <= jnp.arange(prompt_len)[None, :, None])
  logits, variables = model.apply(
      {"params": params, "cache": variables["cache"]}, prompt_tokens,
      positions=default_positions(prompt_tokens), decode=True, cache_mask=seen[:, None],
      mutable=["cache"])
  return logits, variables["cache"]


def step_mask(prompt_tokens: Array, rows: int, step: Array, cache_len: int) -> Array:
  """bool[rows, 1, 1, cache_len]: the slots step `step`'s token sees.

  `rows` is a multiple of the prompts (beams of a prompt are adjacent rows).
  """
  batch, prompt_len = prompt_tokens.shape
  valid = jnp.repeat(prompt_tokens != PAD_ID, rows // batch, axis=0)
  slots = jnp.arange(cache_len)[None, :]
  in_prompt = jnp.pad(valid, ((0, 0), (0, cache_len - prompt_len)))
  generated = (slots >= prompt_len) & (slots <= prompt_len + step)
  return (in_prompt | generated)[:, None, None, :]


def step_logits(model: DecoderOnly, params: Any, prompt_tokens: Array) -> search.TokensToLogits:
  """The search's step function over a prefilled cache: (tokens [n, 1], cache, step)."""
  step_fn = sentence_step_logits(model, params)
  return lambda tokens, cache, step: step_fn(tokens, cache, step, prompt_tokens)


def sentence_step_logits(model: DecoderOnly, params: Any) -> search.TokensToLogits:
  """`step_logits` with the prompts as the search's `sentences` argument:
  (tokens [n, 1], cache, step, prompt_tokens) -> (logits, cache), so a shrinking
  search shrinks them with its batch."""

  def tokens_to_logits(tokens, cache, step, prompt_tokens):
    rows = tokens.shape[0]
    prompt_lengths = jnp.sum(prompt_tokens != PAD_ID, axis=-1)
    lengths = jnp.repeat(prompt_lengths, rows // prompt_tokens.shape[0], axis=0)
    logits, variables = model.apply(
        {"params": params, "cache": cache}, tokens, positions=(lengths + step)[:, None],
        decode=True, cache_mask=step_mask(prompt_tokens, rows, step, cache_length(cache)),
        mutable=["cache"])
    return logits[:, 0], variables["cache"]

  return tokens_to_logits


def growing(prompt_len: int) -> search.GrowCache:
  """The search's grow_cache for a cache whose first `prompt_len` slots hold the prompt."""
  return lambda cache, length: grow_cache(cache, prompt_len + length)
