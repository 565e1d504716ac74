"""Sampling from a decoder-only language model with the KV cache.

`generate` writes BOS and the prompts into the KV cache in one prefill pass
(`prefix_lm.prefill`), then samples one token a step until EOS or
`max_new_tokens` through the search's sampling loop: temperature 0 is greedy;
top-k and top-p (nucleus) restrict the sampled set (`search.filter_logits`);
PAD and BOS are never chosen. The k-th sampled token's key is `fold_in(key, k)`,
so a seed fixes the text.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer_jax.decode import prefix_lm, search
from transformer_jax.special_tokens import BOS_ID, PAD_ID

Array = jax.Array


def generate(model: nn.Module, params: Any, prompt_tokens: Array, prompt_lengths: Array,
             max_new_tokens: int, key: Array, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0) -> Array:
  """Continuations of the prompts.

  BOS and the prompts go through the model in one prefill call; then one
  token a step, by the search's sampling loop (search.sample; greedy search
  at temperature 0). The k-th sampled token of every row uses `fold_in(key, k)`.

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
  first_logits = logits[rows, prompt_lengths].astype(jnp.float32)  # After each prompt.
  step = prefix_lm.step_logits(model, params, block)

  def after_previous(tokens: Array, cache: Any, t: Array) -> tuple[Array, Any]:
    logits, cache = step(tokens, cache, t - 1)  # Writes token t - 1 into the cache.
    return logits.astype(jnp.float32), cache

  def tokens_to_logits(tokens: Array, state: Any, t: Array) -> tuple[Array, Any]:
    """Token t's logits: the prefill's at t = 0, else those after token t - 1."""
    cache, first = state
    logits, cache = jax.lax.cond(t == 0, lambda: (first, cache),
                                 lambda: after_previous(tokens, cache, t))
    return logits, (cache, first)

  # PAD and BOS never continue a text.
  step_model = search.StepModel(search.allowed_tokens(tokens_to_logits, 0), (cache, first_logits))
  max_lengths = search.full_lengths(batch, max_new_tokens)
  if temperature == 0:
    new_tokens = search.greedy_search(step_model, search.SearchSpec(method="greedy"),
                                      max_lengths, max_new_tokens)
  else:
    spec = search.SearchSpec(method="sample", temperature=temperature, top_k=top_k, top_p=top_p)
    new_tokens = search.sample(step_model, spec, max_lengths, max_new_tokens, key)
  sequence = jnp.full((batch, 1 + prompt_len + max_new_tokens), PAD_ID, jnp.int32)
  sequence = sequence.at[:, :block.shape[1]].set(block)
  columns = 1 + prompt_lengths[:, None] + jnp.arange(max_new_tokens)[None, :]
  return sequence.at[rows[:, None], columns].set(new_tokens)
