"""Sampling from a decoder-only LM: the cached step equals the full recompute, the sampling
filters keep to their sets, a seed fixes the text, greedy follows the argmax."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decode import prefix_lm
from transformer_jax.decode.generate import generate
from transformer_jax.decode.search import filter_logits
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def lm():
  from transformer_jax.model.config import default_model_config

  config = default_model_config()
  config.update(dict(vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4,
                     max_len=64, dropout_rate=0.0))
  model = DecoderOnly(config)
  params = model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  return model, params


def test_cached_steps_equal_the_full_recompute(lm):
  model, params = lm
  tokens = jnp.array([[BOS_ID, 5, 6, 7, 8, 9, 10, 11], [BOS_ID, 12, 13, 14, 15, 16, 17, 18]])
  full = model.apply({"params": params}, tokens)
  _, variables = model.apply({"params": params}, jnp.zeros_like(tokens), decode=True,
                             mutable=["cache"])
  cache, stepped = variables["cache"], []
  for t in range(tokens.shape[1]):
    logits, variables = model.apply({"params": params, "cache": cache}, tokens[:, t:t + 1],
                                    positions=jnp.full((2, 1), t), decode=True, mutable=["cache"])
    cache = variables["cache"]
    stepped.append(logits[:, 0])
  np.testing.assert_allclose(np.stack(stepped, axis=1), full, atol=2e-5, rtol=2e-5)


def test_one_prefill_pass_equals_the_full_model_for_prompts_of_two_lengths(lm):
  """The prompt block goes through the cache in one call; its PAD is never seen."""
  model, params = lm
  block = jnp.array([[BOS_ID, 5, 6, 7, PAD_ID, PAD_ID], [BOS_ID, 8, 9, 10, 11, 12]])
  logits, cache = prefix_lm.prefill(model, params, block, 9, prefix_lm=False)
  full = model.apply({"params": params}, block)
  np.testing.assert_allclose(logits[0, :4], full[0, :4], atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(logits[1], full[1], atol=2e-5, rtol=2e-5)
  # The next token of row 0 sits at slot 6 but position 4, right after its prompt.
  step = prefix_lm.step_logits(model, params, block)
  next_logits, _ = step(jnp.array([[20], [21]]), cache, jnp.int32(0))
  np.testing.assert_allclose(
      next_logits[0], model.apply({"params": params}, jnp.array([[BOS_ID, 5, 6, 7, 20]]))[0, -1],
      atol=2e-5, rtol=2e-5)


def test_top_k_and_top_p_never_sample_outside_their_sets():
  logits = jnp.log(jnp.array([[0.05, 0.4, 0.3, 0.15, 0.1]]))
  keys = jax.random.split(jax.random.key(0), 2000)
  draw = jax.jit(jax.vmap(lambda key, l: jax.random.categorical(key, l, axis=-1),
                          in_axes=(0, None)))
  top2 = set(np.asarray(draw(keys, filter_logits(logits, 1.0, top_k=2))).ravel())
  assert top2 == {1, 2}, top2
  # Probabilities 0.4, 0.3, 0.15 reach 0.85 >= 0.8: the nucleus is {1, 2, 3}.
  nucleus = set(np.asarray(draw(keys, filter_logits(logits, 1.0, top_p=0.8))).ravel())
  assert nucleus == {1, 2, 3}, nucleus
  # The most likely token always stays, however small top_p.
  assert set(np.asarray(draw(keys, filter_logits(logits, 1.0, top_p=0.01))).ravel()) == {1}


def _generate(model, params, seed, **kwargs):
  prompts = jnp.array([[5, 6, 7, PAD_ID], [8, 9, 10, 11]])
  lengths = jnp.array([3, 4])
  run = jax.jit(functools.partial(generate, model, max_new_tokens=6, **kwargs))
  return np.asarray(run(params, prompts, lengths, key=jax.random.key(seed)))


def test_a_seed_fixes_the_text_and_the_prompt_is_kept(lm):
  model, params = lm
  first = _generate(model, params, 1, temperature=1.0, top_k=20)
  np.testing.assert_array_equal(first, _generate(model, params, 1, temperature=1.0, top_k=20))
  assert not np.array_equal(first, _generate(model, params, 2, temperature=1.0, top_k=20))
  assert first[0, :4].tolist() == [BOS_ID, 5, 6, 7] and first[1, :5].tolist() == [BOS_ID, 8, 9, 10, 11]


def test_greedy_follows_the_argmax_of_the_full_model(lm):
  model, params = lm
  out = _generate(model, params, 0, temperature=0.0)
  compared = 0
  for row, length in ((0, 3), (1, 4)):
    sequence = out[row, :1 + length].tolist()
    for token in out[row, 1 + length:1 + length + 6]:  # max_new_tokens=6.
      logits = model.apply({"params": params}, jnp.array([sequence]))[0, -1]
      expected = int(jnp.argmax(logits.at[jnp.array([PAD_ID, BOS_ID])].set(-jnp.inf)))
      assert int(token) == expected, (row, sequence)
      compared += 1
      if token == EOS_ID:
        break
      sequence.append(int(token))
  assert compared >= 2
