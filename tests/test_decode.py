"""Incremental decoding with the KV cache, and the Translator on any batch size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import decode, parallel
from transformer_jax.model import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID

SRC = jnp.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, 12, EOS_ID, 0, 0]])


@pytest.fixture(scope="module")
def model_and_params():
  from transformer_jax.model_config import default_model_config

  config = default_model_config()
  config.update(dict(vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64))
  model = Transformer(config)
  params = jax.jit(model.init)(jax.random.key(0), SRC, SRC)["params"]
  return model, params


def test_cached_decoding_equals_full_recomputation(model_and_params):
  model, params = model_and_params
  targets = jnp.array([[20, 21, 22, 23, EOS_ID], [24, 25, 26, EOS_ID, 0]])
  inputs = shift_right(targets)
  full = jax.jit(model.apply)({"params": params}, SRC, inputs)

  @jax.jit
  def incremental(params):
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    cache = decode.init_cache(model, params, encoded, SRC, inputs.shape[1])
    step_fn = decode.step_logits(model, params, SRC)
    logits = []
    for step in range(inputs.shape[1]):
      step_logits, cache = step_fn(inputs[:, step : step + 1], cache, step)
      logits.append(step_logits)
    return jnp.stack(logits, axis=1)

  valid = np.asarray(targets != 0)  # PAD positions have no defined next token.
  np.testing.assert_allclose(
      np.asarray(incremental(params))[valid], np.asarray(full)[valid], atol=1e-5, rtol=1e-5
  )


def test_beams_sharing_one_cross_attention_cache_equal_beams_with_their_own_copy(model_and_params):
  """decode_batch keeps one cross-attention K/V row per sentence for all its beams."""
  from transformer_jax import search

  model, params = model_and_params
  options = decode.DecodeOptions(beam_size=3, alpha=0.6)
  max_len = 12
  shared = jax.jit(lambda p: decode.decode_batch(model, p, SRC, options, max_len))(params)

  @jax.jit
  def own_copies(params):
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    cache = decode.init_cache(model, params, encoded, SRC, max_len)  # Repeated per beam below.
    step = decode.step_logits(model, params, search.expand_to_beams(SRC, options.beam_size))
    max_lengths = jnp.minimum(jnp.sum(SRC != 0, -1) + options.max_extra_len, max_len)
    sequences, _ = search.beam_search(step, cache, SRC.shape[0], options.beam_size, options.alpha,
                                      max_decode_len=max_len, max_lengths=max_lengths)
    return sequences[:, 0]

  np.testing.assert_array_equal(np.asarray(shared), np.asarray(own_copies(params)))


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_translator_handles_batches_the_device_count_does_not_divide(model_and_params, method):
  model, params = model_and_params
  mesh = parallel.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  translator = decode.Translator(model, params, mesh, decode.DecodeOptions(method=method))
  src = np.asarray(jnp.concatenate([SRC, SRC[:1]], axis=0))  # 3 rows on 8 devices.
  out = translator(src)
  assert out.shape == (3, src.shape[1] + 50)
  np.testing.assert_array_equal(out[0], out[2])  # Same sentence, same translation.
  lengths = (out != 0).sum(-1)
  assert (lengths <= (src != 0).sum(-1) + 50).all()


def test_bad_decode_options_are_one_line_errors():
  from transformer_jax.errors import UserError

  with pytest.raises(UserError, match="beam_size=0"):
    decode.DecodeOptions(beam_size=0)
  with pytest.raises(UserError, match="alpha=-1"):
    decode.DecodeOptions(alpha=-1)


def test_attention_weights_cover_every_module(model_and_params):
  model, params = model_and_params
  weights = decode.attention_weights(model, params, SRC, shift_right(SRC))
  names = sorted(weights)
  assert any("encoder_0" in n and "self_attention" in n for n in names), names
  assert any("decoder_1" in n and "cross_attention" in n for n in names), names
  cross = next(v for n, v in weights.items() if "decoder_0" in n and "cross" in n)
  assert cross.shape == (2, 4, 6, 6)
  np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
