"""Decoding several models as one: each step is the log of their mean next-token probability."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.decode import translator
from transformer_jax.decode.ensemble import Ensemble
from transformer_jax.tasks.translation import combine_runs
from transformer_jax.errors import UserError
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID

SRC = jnp.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, 12, EOS_ID, 0, 0], [13, 14, EOS_ID, 0, 0, 0]])


@pytest.fixture(scope="module")
def models():
  from transformer_jax.model.config import default_model_config

  config = default_model_config()
  config.update(dict(vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64))
  model = Transformer(config)
  init = jax.jit(model.init)
  # Doubled weights: outputs that vary with the prefix, where the two models disagree.
  return model, [jax.tree.map(lambda w: 2 * w, init(jax.random.key(seed), SRC, SRC)["params"])
                 for seed in (0, 1)]


def _decode(model, params, options, max_extra_len=12):
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  options = dataclasses.replace(options, max_extra_len=max_extra_len)
  return translator.Translator(model, params, mesh, options)(np.asarray(SRC))


def test_greedy_ensemble_takes_the_most_likely_token_of_the_mean_distribution(models):
  """Each greedy token of two models' ensemble is the argmax of the mean of their full
  (uncached) forward passes' probabilities over the output so far."""
  model, (params_a, params_b) = models
  greedy = translator.DecodeOptions(method="greedy")
  out = _decode(Ensemble((model, model)), (params_a, params_b), greedy)
  # Neither member alone: the test would pass for an ensemble that used one of them.
  assert not np.array_equal(out, _decode(model, params_a, greedy))
  assert not np.array_equal(out, _decode(model, params_b, greedy))

  inputs = shift_right(jnp.asarray(out))
  probs = [jax.nn.softmax(model.apply({"params": p}, SRC, inputs), axis=-1)
           for p in (params_a, params_b)]
  mean = np.array((probs[0] + probs[1]) / 2)
  mean[:, :, (PAD_ID, BOS_ID)] = -1  # Never chosen (search.allowed_tokens).
  mean[:, 0, EOS_ID] = -1  # min_length 1.
  checked = 0
  max_lengths = np.asarray((SRC != PAD_ID).sum(-1)) + 12  # Input length + max_extra_len.
  for row in range(out.shape[0]):
    for t in range(max_lengths[row]):
      assert out[row, t] == mean[row, t].argmax(), (row, t)
      checked += 1
      if out[row, t] == EOS_ID:
        break
  assert checked > out.shape[0]


@pytest.mark.parametrize("shrink_batch", [False, True])
def test_an_ensemble_of_a_model_with_itself_beam_searches_as_the_model(models, shrink_batch):
  """Two caches grown, reordered and shrunk in step: the same beams as one model's."""
  model, (params, _) = models
  options = translator.DecodeOptions(beam_size=3, shrink_batch=shrink_batch)
  alone = _decode(model, params, options, max_extra_len=30)
  together = _decode(Ensemble((model, model)), (params, params), options, max_extra_len=30)
  np.testing.assert_array_equal(together, alone)


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_an_encoder_decoder_and_a_prefix_lm_decode_alike_over_any_cache_and_batch(
    tiny_model_config, method):
  """Two different members, each with its own cache: the same tokens over a growing cache
  (16, 32, 50 positions) and a shrinking batch as over one full-length cache and batch."""
  from transformer_jax.model.decoder_only import DecoderOnly

  rng = np.random.default_rng(0)
  src = np.zeros((9, 10), np.int32)
  for row, length in enumerate(rng.permutation(np.arange(2, 11))):
    src[row, :length - 1] = rng.integers(4, 64, size=length - 1)
    src[row, length - 1] = EOS_ID
  members = (Transformer(tiny_model_config), DecoderOnly(tiny_model_config))
  params = tuple(
      jax.tree.map(lambda w: 2 * w, jax.jit(member.init)(jax.random.key(seed), *inputs)["params"])
      for member, seed, inputs in zip(members, (0, 1), ((src, src), (src,))))
  outputs = {}
  for growing, shrink in ((False, False), (True, False), (True, True)):
    options = translator.DecodeOptions(method=method, beam_size=3, max_extra_len=40,
                                       growing_cache=growing, shrink_batch=shrink)
    outputs[growing, shrink] = np.asarray(jax.jit(lambda p: translator.decode_batch(
        Ensemble(members), p, jnp.asarray(src), options, 50))(params))
  for variant, out in outputs.items():
    np.testing.assert_array_equal(out, outputs[False, False], err_msg=str(variant))
  lengths = (outputs[False, False] != PAD_ID).sum(-1)
  assert len(set(lengths.tolist())) >= 4 and lengths.max() > 32, lengths


def test_an_ensemble_needs_one_tokenizer():
  def run(sha256):
    return types.SimpleNamespace(tokenizer=types.SimpleNamespace(sha256=sha256))

  with pytest.raises(UserError, match="runs/b has another tokenizer than runs/a .*one vocabulary"):
    combine_runs([run("1" * 64), run("2" * 64)], ["runs/a", "runs/b"])
