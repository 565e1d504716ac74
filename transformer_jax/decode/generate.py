"""Sampling from a decoder-only language model with the KV cache.

`generate` writes BOS and the prompts into the KV cache in one prefill pass
(`prefix_lm.prefill`), then samples one token a step until EOS or
`max_new_tokens`: temperature 0 is greedy; top-k and top-p (nucleus) restrict
the sampled set; PAD and BOS are never chosen. The k-th sampled token's key is
`fold_in(key, k)`, so a seed fixes the text.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.decode import prefix_lm
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

  BOS and the prompts go through the model in one prefill call; then one
  token a step. The k-th sampled token of every row uses `fold_in(key, k)`.

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
  block = jnp.concatenate([jnp.full((batch, 1), BOS_ID, jnp.int32), prompt_tokens], axis=1)
  logits, cache = prefix_lm.prefill(model, params, block, block.shape[1] + max_new_tokens,
                                    prefix_lm=False)
  rows = jnp.arange(batch)
  logits = logits[rows, prompt_lengths]  # After each row's last prompt token.
  step = prefix_lm.step_logits(model, params, block)
  sequence = jnp.full((batch, 1 + prompt_len + max_new_tokens), PAD_ID, jnp.int32)
  sequence = sequence.at[:, :block.shape[1]].set(block)

  def choose(logits: Array, k: Array) -> Array:
    logits = logits.at[:, (PAD_ID, BOS_ID)].set(-jnp.inf)  # Never continued with.
    if temperature == 0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(jax.random.fold_in(key, k),
                                  filter_logits(logits, temperature, top_k, top_p),
                                  axis=-1).astype(jnp.int32)

  def body(k, carry):
    sequence, logits, cache, finished = carry
    token = jnp.where(finished, PAD_ID, choose(logits, k))
    sequence = sequence.at[rows, 1 + prompt_lengths + k].set(token)
    finished = finished | (token == EOS_ID)
    logits, cache = step(token[:, None], cache, k)
    return sequence, logits, cache, finished

  # The last token needs no step after it.
  sequence, logits, cache, finished = jax.lax.fori_loop(
      0, max_new_tokens - 1, body, (sequence, logits, cache, jnp.zeros((batch,), bool)))
  last = jnp.where(finished, PAD_ID, choose(logits, max_new_tokens - 1))
  return sequence.at[rows, 1 + prompt_lengths + max_new_tokens - 1].set(last)
