"""Decoding several runs as one model: each step averages their next-token probabilities.

An ensemble of runs trained on the same vocabulary (encoder-decoders, prefix LMs, or
both) is searched like one model: every member keeps its own cache, and the step's
log-probabilities are log(mean_m p_m(token | prefix)), as fairseq ensembles (Marian
instead sums the members' weighted log-probabilities: a product, not a mean). Tokens the
search bans (search.allowed_tokens) are banned after the mean, and sampling at
temperature T draws from (mean_m p_m)^(1/T), renormalised.

  run = tasks.translation.combine_runs([load_run(a), load_run(b)], [a, b])
  translate_lines(run, lines, options)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp

from transformer_jax.decode import search
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.transformer import Transformer

Model = Transformer | DecoderOnly


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """Models decoded together; their params are a tuple in the same order."""

  members: tuple[Model, ...]


def members_of(model: Model | Ensemble, params) -> tuple[tuple[Model, ...], tuple]:
  """(models, params): the members of an ensemble, or the one model."""
  if isinstance(model, Ensemble):
    if len(params) != len(model.members):
      raise ValueError(f"an ensemble of {len(model.members)} models got {len(params)} params")
    return model.members, tuple(params)
  return (model,), (params,)


def average_step(steps: Sequence[search.TokensToLogits]) -> search.TokensToLogits:
  """One search step over the members' steps: (tokens [n, 1], caches, t, sentences) ->
  (log of the members' mean next-token probability, float32[n, vocab], new caches).

  `caches` and `sentences` are tuples with one entry per member, in its own layout; a
  shared beam cache's `beam_slots` (search.beam_search) go to every member.
  """
  log_members = math.log(len(steps))

  def step(tokens, caches, t, sentences, *beam_slots):
    logprobs, new_caches = [], []
    for member_step, cache, member_sentences in zip(steps, caches, sentences):
      logits, cache = member_step(tokens, cache, t, member_sentences, *beam_slots)
      logprobs.append(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
      new_caches.append(cache)
    return jax.nn.logsumexp(jnp.stack(logprobs), axis=0) - log_members, tuple(new_caches)

  return step
