"""The prefix_lm task: a decoder-only model translates `source <sep> target`, decoded with the KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decode import prefix_lm
from transformer_jax.decode.translator import DecodeOptions, decode_batch
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.transformer import shift_right
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.prefix_lm import prefix_lm_loss_sums
from transformer_jax.tasks.rows import pair_rows

SOURCES = np.array([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]], np.int32)
TARGETS = np.array([[11, 12, 13, EOS_ID], [14, 15, 16, 17]], np.int32)


@pytest.fixture
def model_and_params(tiny_model_config):
  model = DecoderOnly(tiny_model_config)
  params = model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  return model, params


def full_target_logits(model, params, sources, targets):
  """The uncached model's next-token logits over the target half of [source | BOS target]."""
  batch = dict(src_tokens=jnp.asarray(sources), target_tokens=jnp.asarray(targets))
  rows = pair_rows(batch, shift_right(batch["target_tokens"]))
  logits = model.apply({"params": params}, rows.tokens, positions=rows.positions,
                       prefix=rows.prefix)
  return logits[:, sources.shape[1]:]


def test_cached_steps_equal_the_full_recompute(model_and_params):
  """Prefill the source in one pass, then feed BOS and the target a token a step."""
  model, params = model_and_params
  expected = full_target_logits(model, params, SOURCES, TARGETS)
  cache_len = SOURCES.shape[1] + TARGETS.shape[1]
  _, cache = prefix_lm.prefill(model, params, jnp.asarray(SOURCES), cache_len, prefix_lm=True)
  step = prefix_lm.step_logits(model, params, jnp.asarray(SOURCES))
  inputs = np.asarray(shift_right(jnp.asarray(TARGETS)))
  for t in range(TARGETS.shape[1]):
    logits, cache = step(jnp.asarray(inputs[:, t:t + 1]), cache, jnp.int32(t))
    np.testing.assert_allclose(logits, expected[:, t], atol=2e-5, rtol=2e-5)


def test_the_prefix_sees_itself_both_ways_and_the_target_only_its_past(model_and_params):
  model, params = model_and_params
  base = full_target_logits(model, params, SOURCES, TARGETS)
  # A later target token never changes an earlier position's logits (no future leakage).
  later = TARGETS.copy()
  later[:, -1] = 20
  changed = full_target_logits(model, params, SOURCES, later)
  np.testing.assert_allclose(changed[:, :-1], base[:, :-1], atol=1e-6)
  # The last source token changes the first target logits, and through a bidirectional
  # prefix, the source's own earlier outputs too.
  src = SOURCES.copy()
  src[0, 3] = 30
  batch = dict(src_tokens=jnp.asarray(src), target_tokens=jnp.asarray(TARGETS))
  rows = pair_rows(batch, shift_right(batch["target_tokens"]))
  before = dict(src_tokens=jnp.asarray(SOURCES), target_tokens=jnp.asarray(TARGETS))
  rows_before = pair_rows(before, shift_right(before["target_tokens"]))
  out = model.apply({"params": params}, rows.tokens, positions=rows.positions, prefix=rows.prefix)
  out_before = model.apply({"params": params}, rows_before.tokens,
                           positions=rows_before.positions, prefix=rows_before.prefix)
  assert not np.allclose(out[0, 0], out_before[0, 0])  # Source position 0 saw position 3.
  np.testing.assert_allclose(out[1], out_before[1], atol=1e-6)  # Rows stay apart.


def test_padding_between_the_halves_changes_nothing(model_and_params):
  """A source padded wider scores its target exactly as before."""
  model, params = model_and_params
  wide = np.pad(SOURCES, ((0, 0), (0, 3)), constant_values=PAD_ID)
  batch = dict(src_tokens=jnp.asarray(SOURCES), target_tokens=jnp.asarray(TARGETS))
  _, narrow_sums = prefix_lm_loss_sums(model, params, batch, False, None, 0.1)
  _, wide_sums = prefix_lm_loss_sums(model, params, dict(batch, src_tokens=jnp.asarray(wide)),
                                     False, None, 0.1)
  np.testing.assert_allclose(narrow_sums["loss_sum"], wide_sums["loss_sum"], rtol=1e-5)
  assert float(narrow_sums["tokens"]) == np.sum(TARGETS != PAD_ID)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_greedy_and_beam_search_decode_a_prefix_lm(model_and_params, method):
  """Greedy search follows the full model's argmax; beam 1 equals greedy."""
  model, params = model_and_params
  options = DecodeOptions(method=method, beam_size=1, max_extra_len=3, growing_cache=True,
                          min_length=0)
  out = np.asarray(decode_batch(model, params, jnp.asarray(SOURCES), options, max_decode_len=6))
  for row in range(len(SOURCES)):
    produced = []
    for token in out[row]:
      # One shape for every step (a PAD tail changes nothing before it); the EOS is not read.
      target = (produced + [EOS_ID] + [PAD_ID] * 8)[:8]
      logits = full_target_logits(model, params, SOURCES[row:row + 1], np.array([target], np.int32))
      expected = int(jnp.argmax(logits[0, len(produced)]))
      assert token == expected, (row, produced, token, expected)
      produced.append(int(token))
      if token == EOS_ID or len(produced) == int(np.sum(SOURCES[row] != PAD_ID)) + 3:
        break


def test_a_packed_row_scores_each_pair_as_if_alone(model_and_params):
  """Two pairs packed into one row (segment ids, restarting positions) score as they do alone."""
  model, params = model_and_params
  pairs = [([5, 6, 7, EOS_ID], [11, 12, EOS_ID]), ([8, 9, EOS_ID], [13, 14, 15, 16, EOS_ID])]
  src = [t for s, _ in pairs for t in s] + [PAD_ID]
  tgt = [t for _, t in pairs for t in t]
  packed = dict(
      src_tokens=jnp.array([src]), target_tokens=jnp.array([tgt]),
      src_segment_ids=jnp.array([[1] * 4 + [2] * 3 + [0]]),
      target_segment_ids=jnp.array([[1] * 3 + [2] * 5]),
      src_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
      target_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 4]]))
  _, packed_sums = prefix_lm_loss_sums(model, params, packed, False, None, 0.0)
  alone = 0.0
  for source, target in pairs:
    _, sums = prefix_lm_loss_sums(model, params, dict(src_tokens=jnp.array([source]),
                                                      target_tokens=jnp.array([target])),
                                  False, None, 0.0)
    alone += float(sums["nll_sum"])
  assert float(packed_sums["tokens"]) == 8
  np.testing.assert_allclose(float(packed_sums["nll_sum"]), alone, rtol=1e-5)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_min_length_keeps_eos_from_ending_an_empty_output(method):
  """A model whose likeliest token is always EOS: min_length=1 still gives a token first."""
  from transformer_jax.decode import search

  def eos_first(tokens, cache, step):
    logits = jnp.zeros((tokens.shape[0], 8)).at[:, EOS_ID].set(5.0).at[:, 6].set(1.0)
    return logits, cache

  for min_length, first in ((0, EOS_ID), (1, 6)):
    step = search.allowed_tokens(eos_first, min_length)
    spec = search.SearchSpec(method=method, beam_size=2)
    out = search.best_outputs(search.StepModel(step, {}), spec, search.full_lengths(2, 4), 4)
    assert np.asarray(out)[:, 0].tolist() == [first, first], (min_length, out)
