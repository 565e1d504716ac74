"""Sampling from a decoder-only language model with the KV cache.

`generate` feeds BOS and each prompt token through the cached self-attention
one step at a time, then samples one token a step until EOS or
`max_new_tokens`: temperature 0 is greedy; top-k and top-p (nucleus) restrict
the sampled set; PAD and BOS are never chosen. A step's key is `fold_in(key, step)`, so a seed fixes the text.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array


def filter_logits(logits: Array, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Array:
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


def generate(model: nn.Module, params: Any, prompt_tokens: Array, prompt_lengths: Array,
             max_new_tokens: int, key: Array, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0) -> Array:
  """Continuations of the prompts.

  Args:
    prompt_tokens: int32[batch, prompt_len], each row's prompt (no BOS, no EOS),
      PAD after it.
    prompt_lengths: int32[batch].

  Returns:
    int32[batch, 1 + prompt_len + max_new_tokens]: BOS, the prompt, then the
    sampled tokens up to EOS, PAD after it (row r's continuation starts at
    1 + prompt_lengths[r]).
  """
  batch, prompt_len = prompt_tokens.shape
  total = 1 + prompt_len + max_new_tokens
  sequence = jnp.full((batch, total), PAD_ID, jnp.int32)
  sequence = sequence.at[:, 0].set(BOS_ID).at[:, 1:1 + prompt_len].set(prompt_tokens)
  _, variables = model.apply({"params": params}, jnp.zeros((batch, total), jnp.int32),
                             decode=True, mutable=["cache"])
  last = 1 + prompt_lengths + max_new_tokens  # Row r's sequence ends before here.

  def step(t, carry):
    sequence, cache, finished = carry
    tokens = jax.lax.dynamic_slice_in_dim(sequence, t, 1, axis=1)
    logits, variables = model.apply(
        {"params": params, "cache": cache}, tokens, positions=jnp.full((batch, 1), t),
        decode=True, mutable=["cache"])
    logits = logits[:, 0].at[:, (PAD_ID, BOS_ID)].set(-jnp.inf)  # Never continued with.
    if temperature == 0:
      chosen = jnp.argmax(logits, axis=-1)
    else:
      chosen = jax.random.categorical(jax.random.fold_in(key, t),
                                      filter_logits(logits, temperature, top_k, top_p), axis=-1)
    in_prompt = t + 1 < 1 + prompt_lengths
    given = jax.lax.dynamic_index_in_dim(sequence, t + 1, axis=1, keepdims=False)
    following = jnp.where(in_prompt, given, chosen.astype(jnp.int32))
    following = jnp.where(finished | (t + 1 >= last), PAD_ID, following)
    sequence = jax.lax.dynamic_update_index_in_dim(sequence, following, t + 1, axis=1)
    finished = finished | (~in_prompt & (following == EOS_ID))
    return sequence, variables["cache"], finished

  sequence, _, _ = jax.lax.fori_loop(
      0, total - 1, step, (sequence, variables["cache"], jnp.zeros((batch,), bool)))
  return sequence
