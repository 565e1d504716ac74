"""Every attention implementation equals "plain": outputs and gradients, under every mask.

Tolerances: float32 operands 2e-5 (absolute and relative); bfloat16 operands
3e-2, since each path rounds its probabilities to bfloat16 at a different
point (plain after normalising, chunked before). Queries that may see no key
(trailing padding of a packed row) are left out: their outputs are defined
differently by each path and every loss ignores them. The Pallas kernels run
in Pallas's interpreters on the CPU: the code a GPU or TPU runs, slowly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from transformer_jax.decode import prefix_lm
from transformer_jax.decode.translator import DecodeOptions, decode_batch
from transformer_jax.errors import UserError
from transformer_jax.model import attention
from transformer_jax.model.chunked_attention import chunked_attention
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.dropout import keep_mask
from transformer_jax.model.flash_attention import pallas_attention
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID

BATCH, HEADS, DEPTH = 2, 3, 8
BLOCK = 8  # Small, so that 21 and 37 tokens span several blocks, the last one partial.


def _tokens(length: int, pad: int) -> jax.Array:
  """int[2, length]: row 0 ends in `pad` PADs, row 1 has none."""
  row0 = [5] * (length - pad) + [0] * pad
  return jnp.array([row0, [6] * length])


def _segments(length: int, pad: int) -> jax.Array:
  """Two packed segments per row, then trailing PAD in segment 0."""
  cut = length // 3
  row0 = [1] * cut + [2] * (length - cut - pad) + [0] * pad
  row1 = [1] * (2 * cut) + [2] * (length - 2 * cut)
  return jnp.array([row0, row1])


def _masks(q_len: int, k_len: int) -> dict[str, AttentionMask | None]:
  """The masks a model builds: self-attention when the lengths agree, else cross-attention."""
  if q_len != k_len:
    return {
        "cross_padding": AttentionMask.cross_attention(_tokens(k_len, 5), None, None),
        "cross_segments": AttentionMask.cross_attention(
            _tokens(k_len, 5), _segments(q_len, 0), _segments(k_len, 5)),
    }
  tokens, segments = _tokens(q_len, 5), _segments(q_len, 5)
  return {
      "none": None,
      "padding": AttentionMask.self_attention(tokens, None, causal=False),
      "causal": AttentionMask.self_attention(tokens, None, causal=True),
      "segments": AttentionMask.self_attention(tokens, segments, causal=True),
      "prefix": AttentionMask.self_attention(
          tokens, segments, causal=True, prefix=jnp.arange(q_len)[None] < q_len // 2),
  }


CASES = [(q_len, k_len, name) for q_len, k_len in [(21, 21), (37, 37), (21, 37)]
         for name in _masks(q_len, k_len)]


def _inputs(q_len, k_len, d_k=DEPTH, d_v=DEPTH, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(q_len * 100 + k_len), 4)
  query = jax.random.normal(keys[0], (BATCH, q_len, HEADS, d_k), dtype)
  key = jax.random.normal(keys[1], (BATCH, k_len, HEADS, d_k), dtype)
  value = jax.random.normal(keys[2], (BATCH, k_len, HEADS, d_v), dtype)
  cotangent = jax.random.normal(keys[3], (BATCH, q_len, HEADS, d_v))
  return query, key, value, cotangent


def _seen(mask: AttentionMask | None, q_len: int, k_len: int) -> np.ndarray:
  """bool[batch, q_len]: queries that see at least one key."""
  if mask is None:
    return np.ones((BATCH, q_len), bool)
  dense = jnp.broadcast_to(mask.dense(q_len, k_len), (BATCH, 1, q_len, k_len))
  return np.asarray(dense.any(-1))[:, 0]


def _output_and_grads(attend, query, key, value, cotangent, seen):
  """attend(q, k, v) and the gradients of <attend(q, k, v), cotangent> on the seen queries."""
  weight = cotangent * seen[:, :, None, None]
  loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) * weight)
  return attend(query, key, value), jax.grad(loss, argnums=(0, 1, 2))(query, key, value)


def _assert_equal_on_seen(got, want, seen, tolerance):
  got_out, got_grads = got
  want_out, want_grads = want
  np.testing.assert_allclose(np.asarray(got_out, np.float32)[seen],
                             np.asarray(want_out, np.float32)[seen],
                             atol=tolerance, rtol=tolerance, err_msg="outputs")
  for name, got_grad, want_grad in zip("qkv", got_grads, want_grads):
    np.testing.assert_allclose(np.asarray(got_grad, np.float32), np.asarray(want_grad, np.float32),
                               atol=tolerance, rtol=tolerance, err_msg=f"gradient of {name}")


def _plain(mask, matmul_dtype=None):
  return lambda q, k, v: attention.dot_product_attention(q, k, v, mask, "plain", matmul_dtype)


@pytest.mark.parametrize("block_size", [BLOCK, 64])  # Several blocks; one block.
@pytest.mark.parametrize("q_len,k_len,mask_name", CASES)
def test_chunked_equals_plain(q_len, k_len, mask_name, block_size):
  mask = _masks(q_len, k_len)[mask_name]
  query, key, value, cotangent = _inputs(q_len, k_len)
  seen = _seen(mask, q_len, k_len)
  chunked = lambda q, k, v: chunked_attention(q, k, v, mask, block_size=block_size)
  _assert_equal_on_seen(_output_and_grads(chunked, query, key, value, cotangent, seen),
                        _output_and_grads(_plain(mask), query, key, value, cotangent, seen),
                        seen, 2e-5)


@pytest.mark.parametrize("q_len,k_len,mask_name",
                         [case for case in CASES if case[2] != "prefix"])
def test_xla_equals_plain(q_len, k_len, mask_name):
  mask = _masks(q_len, k_len)[mask_name]
  query, key, value, cotangent = _inputs(q_len, k_len)
  seen = _seen(mask, q_len, k_len)
  xla = lambda q, k, v: attention.dot_product_attention(q, k, v, mask, "xla")
  _assert_equal_on_seen(_output_and_grads(xla, query, key, value, cotangent, seen),
                        _output_and_grads(_plain(mask), query, key, value, cotangent, seen),
                        seen, 2e-5)


def test_chunked_with_bfloat16_operands_equals_plain():
  q_len = k_len = 37
  mask = _masks(q_len, k_len)["segments"]
  query, key, value, cotangent = _inputs(q_len, k_len, dtype=jnp.bfloat16)
  seen = _seen(mask, q_len, k_len)
  chunked = lambda q, k, v: chunked_attention(q, k, v, mask, block_size=BLOCK)
  _assert_equal_on_seen(_output_and_grads(chunked, query, key, value, cotangent, seen),
                        _output_and_grads(_plain(mask), query, key, value, cotangent, seen),
                        seen, 3e-2)


def test_chunked_takes_bfloat16_matmuls_with_float32_inputs_and_separate_value_depth():
  mask = _masks(21, 37)["cross_segments"]
  query, key, value, cotangent = _inputs(21, 37, d_k=4, d_v=12)
  seen = _seen(mask, 21, 37)
  chunked = lambda q, k, v: chunked_attention(q, k, v, mask, block_size=BLOCK,
                                              matmul_dtype=jnp.bfloat16)
  _assert_equal_on_seen(_output_and_grads(chunked, query, key, value, cotangent, seen),
                        _output_and_grads(_plain(mask, jnp.bfloat16), query, key, value,
                                          cotangent, seen), seen, 3e-2)


def _block_dropout_matrix(dropout_key, rate, shape, q_blocks, k_blocks):
  """The chunked path's dropout, laid out as one [b, h, q, k] matrix of kept/keep_probability."""
  rows = []
  for i in range(q_blocks):
    row = []
    for j in range(k_blocks):
      block_key = jax.random.fold_in(jax.random.fold_in(dropout_key, i), j)
      keep, probability = keep_mask(block_key, shape, rate)
      row.append(keep / probability)
    rows.append(jnp.concatenate(row, axis=-1))
  return jnp.concatenate(rows, axis=-2)


def test_chunked_attention_dropout_equals_plain_with_the_same_dropped_weights():
  q_len = k_len = 24  # A multiple of the block: the dropout matrix needs no cropping.
  mask = _masks(21, 21)["causal"].padded(q_len, k_len)
  query, key, value, cotangent = _inputs(q_len, k_len)
  dropout_key, rate = jax.random.key(7), 0.3
  scale = _block_dropout_matrix(dropout_key, rate, (BATCH, HEADS, BLOCK, BLOCK), 3, 3)
  chunked = lambda q, k, v: chunked_attention(q, k, v, mask, block_size=BLOCK,
                                              dropout_rate=rate, dropout_key=dropout_key)

  def plain_with_dropout(q, k, v):
    weights = attention.dot_product_attention_weights(q, k, mask.dense(q_len, k_len))
    return attention.weighted_values(weights * scale, v)

  seen = _seen(mask, q_len, k_len)
  got = _output_and_grads(chunked, query, key, value, cotangent, seen)
  _assert_equal_on_seen(got, _output_and_grads(plain_with_dropout, query, key, value, cotangent,
                                               seen), seen, 2e-5)
  no_dropout = chunked_attention(query, key, value, mask, block_size=BLOCK)
  assert not np.allclose(got[0], no_dropout), "dropout changed nothing"
  # Within one block the path differs (JAX's own gradient), the dropped weights do not.
  one_block = chunked_attention(query[:, :BLOCK], key[:, :BLOCK], value[:, :BLOCK],
                                mask.padded(BLOCK, BLOCK), block_size=BLOCK, dropout_rate=rate,
                                dropout_key=dropout_key)
  np.testing.assert_allclose(one_block, got[0][:, :BLOCK], atol=2e-5, rtol=2e-5)


def test_chunked_skips_blocks_the_mask_hides():
  """A causal mask hides the blocks above the diagonal: the compiled loop skips them."""
  q_len = k_len = 64
  query, key, value, _ = _inputs(q_len, k_len)
  mask = AttentionMask(causal=True)
  # Keys that only hidden blocks would read: NaN there must not reach any output.
  poisoned = value.at[:, 8:].set(jnp.nan)
  out = chunked_attention(query[:, :8], key, poisoned, mask.padded(8, k_len), block_size=BLOCK)
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("mask_name", ["padding", "causal", "segments"])
def test_pallas_gpu_kernel_equals_plain_in_the_interpreter(mask_name):
  length = 37
  mask = _masks(length, length)[mask_name]
  query, key, value, cotangent = _inputs(length, length)
  seen = _seen(mask, length, length)
  if mask is not None and mask.key_valid is not None:
    seen = seen & np.asarray(mask.key_valid)  # The GPU kernel's PAD queries see only PAD keys.
  pallas = lambda q, k, v: pallas_attention(q, k, v, mask, platform="gpu", interpret=True)
  _assert_equal_on_seen(_output_and_grads(pallas, query, key, value, cotangent, seen),
                        _output_and_grads(_plain(mask), query, key, value, cotangent, seen),
                        seen, 2e-5)


@pytest.mark.parametrize("q_len,k_len,mask_name", [(37, 37, "segments"), (21, 37, "cross_segments")])
def test_pallas_tpu_kernel_equals_plain_in_the_interpreter(q_len, k_len, mask_name):
  mask = _masks(q_len, k_len)[mask_name]
  query, key, value, cotangent = _inputs(q_len, k_len)
  seen = _seen(mask, q_len, k_len)
  pallas = lambda q, k, v: pallas_attention(q, k, v, mask, platform="tpu")
  with pltpu.force_tpu_interpret_mode():
    got = _output_and_grads(pallas, query, key, value, cotangent, seen)
  _assert_equal_on_seen(got, _output_and_grads(_plain(mask), query, key, value, cotangent, seen),
                        seen, 2e-5)


@pytest.mark.parametrize("call,message", [
    (lambda: pallas_attention(*_inputs(8, 8)[:3], None), "runs on gpu and tpu, not on cpu"),
    (lambda: pallas_attention(*_inputs(8, 8)[:3], _masks(8, 8)["prefix"], platform="tpu"),
     "not a prefix LM's"),
    (lambda: pallas_attention(*_inputs(8, 16)[:3], None, platform="gpu"),
     "self-attention only"),
    (lambda: pallas_attention(*_inputs(8, 8, d_k=512, d_v=512)[:3], None, platform="gpu"),
     "depth <= 256"),
    (lambda: attention.dot_product_attention(*_inputs(8, 8)[:3], None, "cudnn"),
     "needs an NVIDIA GPU"),
    (lambda: attention.dot_product_attention(*_inputs(8, 8)[:3], None, "xla", dropout_rate=0.1),
     "has no attention dropout"),
])
def test_unsupported_uses_are_one_line_errors(call, message):
  with pytest.raises(ValueError, match=message) as error:
    call()
  assert "\n" not in str(error.value)


def test_cudnn_refuses_float32_operands_naming_the_fix(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  device = type("Device", (), {"compute_capability": "9.0"})()
  monkeypatch.setattr(jax, "devices", lambda *args: [device])
  with pytest.raises(ValueError, match="matmul_dtype='bfloat16'"):
    attention.check_cudnn(jnp.float32)
  attention.check_cudnn(jnp.bfloat16)
  old = type("Device", (), {"compute_capability": "7.5"})()
  monkeypatch.setattr(jax, "devices", lambda *args: [old])
  with pytest.raises(ValueError, match="compute capability >= 8.0"):
    attention.check_cudnn(jnp.bfloat16)


@pytest.mark.parametrize("overrides,message", [
    (dict(attention_impl="xla", attention_dropout_rate=0.1), "has no attention dropout"),
    (dict(attention_impl="cudnn"), "set config.model.matmul_dtype='bfloat16'"),
])
def test_config_refuses_what_a_path_cannot_do(tiny_model_config, overrides, message):
  tiny_model_config.update(overrides)
  with pytest.raises(UserError, match=message):
    Transformer(tiny_model_config)


# --- Whole models: training and cached decoding ---------------------------------------------

SRC = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, EOS_ID], [14, 15, 16, EOS_ID] + [0] * 6])
TARGETS = jnp.array([[20, 21, 22, 23, 24, 25, EOS_ID], [26, 27, 28, EOS_ID, 0, 0, 0]])


def _model_pair(model_class, config):
  """(plain model, chunked model with 4-token blocks): the same parameters serve both."""
  chunked = config.copy_and_resolve_references()
  chunked.update(attention_impl="chunked", attention_block_size=4)
  return model_class(config), model_class(chunked)


def test_encoder_decoder_with_chunked_attention_trains_and_decodes_as_plain(tiny_model_config,
                                                                          step_by_step_logits):
  plain, chunked = _model_pair(Transformer, tiny_model_config)
  inputs = shift_right(TARGETS)
  params = jax.jit(plain.init)(jax.random.key(0), SRC, inputs)["params"]

  @functools.partial(jax.jit, static_argnums=0)
  def logits_and_grads(model):
    loss = lambda p: jnp.sum(model.apply({"params": p}, SRC, inputs) ** 2) * 1e-3
    return model.apply({"params": params}, SRC, inputs), jax.grad(loss)(params)

  (got_logits, got_grads), (want_logits, want_grads) = map(logits_and_grads, (chunked, plain))
  np.testing.assert_allclose(got_logits, want_logits, atol=2e-5, rtol=2e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=2e-5, rtol=2e-4),
               got_grads, want_grads)

  @functools.partial(jax.jit, static_argnums=0)
  def incremental_and_beams(model):
    beams = decode_batch(model, params, SRC, DecodeOptions(beam_size=3, alpha=0.6), 12)
    return step_by_step_logits(model, params, SRC, inputs), beams

  (got_steps, got_beams), (want_steps, want_beams) = map(incremental_and_beams, (chunked, plain))
  valid = np.asarray(TARGETS != 0)
  np.testing.assert_allclose(np.asarray(got_steps)[valid], np.asarray(want_steps)[valid],
                             atol=2e-5, rtol=2e-5)
  np.testing.assert_array_equal(got_beams, want_beams)


def test_prefix_lm_with_chunked_attention_prefills_and_steps_as_plain(tiny_model_config):
  plain, chunked = _model_pair(DecoderOnly, tiny_model_config)
  params = plain.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  cache_len = SRC.shape[1] + 6

  @functools.partial(jax.jit, static_argnums=0)
  def prefill_and_steps(model):
    logits, cache = prefix_lm.prefill(model, params, SRC, cache_len, prefix_lm=True)
    step = prefix_lm.step_logits(model, params, SRC)
    outputs = [logits]
    for t, token in enumerate([2, 30, 31]):
      logits, cache = step(jnp.full((2, 1), token, jnp.int32), cache, jnp.int32(t))
      outputs.append(logits)
    return outputs

  for got, want in zip(prefill_and_steps(chunked), prefill_and_steps(plain)):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_running_out_of_memory_is_one_line_that_names_chunked_attention(capsys):
  from transformer_jax.errors import exit_on_user_error

  @exit_on_user_error
  def step():
    raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory allocating 43445526528 bytes.")

  with pytest.raises(SystemExit) as exit_info:
    step()
  assert exit_info.value.code == 2
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and "40.5 GiB" in error and "attention_impl='chunked'" in error
