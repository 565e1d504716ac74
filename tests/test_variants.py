"""The descendants' block variants: RMSNorm, gated feed-forward layers (SwiGLU, GeGLU), the
attention scale as a key, rotary positions (RoPE), grouped-query attention (GQA, MQA) and
sliding-window attention, ALiBi and T5's relative bias. Each equals its formula, computed here independently, and keeps
what the paper's blocks guarantee: cached decoding equals the full recompute, chunked
attention equals plain in outputs and gradients."""

from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer_jax.decode import prefix_lm
from transformer_jax.errors import UserError
from transformer_jax.model.attention import MultiHeadAttention
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.layers import FeedForward, layer_norm
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.positions import rotary
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.rows import pair_rows

SRC = jnp.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, 12, EOS_ID, 0, 0]])
TARGETS = jnp.array([[20, 21, 22, 23, EOS_ID], [24, 25, 26, EOS_ID, 0]])
VARIANTS = {
    "rmsnorm": dict(norm_type="rmsnorm"),
    "rmsnorm_pre": dict(norm_type="rmsnorm", norm="pre"),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "attention_scale": dict(attention_scale=0.5),
    "rope": dict(positions="rope"),
    "rope_half_the_channels": dict(positions="rope", rope_fraction=0.5, rope_theta=100.0),
    "grouped_query": dict(num_kv_heads=2),
    "multi_query": dict(num_kv_heads=1),
    "sliding_window": dict(attention_window=2),
    "sliding_window_chunked": dict(attention_window=3, attention_impl="chunked",
                                   attention_block_size=2),
    "alibi": dict(positions="alibi"),
    "alibi_chunked": dict(positions="alibi", attention_impl="chunked", attention_block_size=2),
    "t5_bias": dict(positions="t5_bias", relative_buckets=8, relative_max_distance=16),
}


def _config(tiny_model_config, **overrides) -> ModelConfig:
  tiny_model_config.update(overrides)
  return ModelConfig.from_config(tiny_model_config)


def test_rmsnorm_divides_by_the_root_mean_square_and_has_no_bias(tiny_model_config):
  config = _config(tiny_model_config, norm_type="rmsnorm", layer_norm_epsilon=1e-6)
  x = np.random.default_rng(0).standard_normal((2, 3, config.d_model)).astype(np.float32) * 3
  norm = layer_norm(config, "norm")
  params = norm.init(jax.random.key(0), x)["params"]
  assert set(params) == {"scale"}
  scale = np.random.default_rng(1).standard_normal(config.d_model).astype(np.float32)
  got = norm.apply({"params": {"scale": scale}}, x)
  want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6) * scale
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_a_gated_feed_forward_layer_equals_its_formula(tiny_model_config, activation):
  config = _config(tiny_model_config, activation=activation)
  x = np.random.default_rng(0).standard_normal((2, 3, config.d_model)).astype(np.float32)
  ffn = FeedForward(config)
  params = jax.tree.map(np.asarray, nn.unbox(ffn.init(jax.random.key(0), x, train=False)["params"]))
  assert set(params) == {"wi", "wi_gate", "wo"}
  assert params["wi_gate"]["kernel"].shape == (config.d_model, config.d_ff)
  linear = lambda name, h: h @ params[name]["kernel"] + params[name]["bias"]
  gate = linear("wi_gate", x)
  if activation == "swiglu":
    gated = gate / (1 + np.exp(-gate))
  else:  # GELU, tanh form.
    gated = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
  want = linear("wo", gated * linear("wi", x))
  np.testing.assert_allclose(ffn.apply({"params": params}, x, train=False), want,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
def test_the_attention_scale_multiplies_the_scores(implementation):
  """softmax(s·QKᵀ)V for s = 0.5, against NumPy; s = 0 is the paper's 1/√d_k."""
  heads, depth, d_model = 2, 4, 8
  x = np.random.default_rng(0).standard_normal((2, 5, d_model)).astype(np.float32)
  mask = AttentionMask.self_attention(jnp.ones((2, 5), jnp.int32), None, causal=True)

  def attention(scale):
    return MultiHeadAttention(num_heads=heads, d_k=depth, d_v=depth, d_model=d_model,
                              implementation=implementation, block_size=2, scale=scale)

  params = jax.tree.map(np.asarray,
                        nn.unbox(attention(0.0).init(jax.random.key(0), x, x, mask)["params"]))

  def reference(scale):
    q, k, v = (np.einsum("bld,dhk->blhk", x, params[name]) for name in ("query", "key", "value"))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    scores = np.where(np.tril(np.ones((5, 5), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd,hdm->bqm", weights, v, params["out"])

  for scale, expected_scale in ((0.5, 0.5), (0.0, depth ** -0.5)):
    got = attention(scale).apply({"params": params}, x, x, mask)
    np.testing.assert_allclose(got, reference(expected_scale), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_equals_full_recomputation(tiny_model_config, step_by_step_logits,
                                                   variant):
  model = Transformer(_config(tiny_model_config, **VARIANTS[variant]))
  inputs = shift_right(TARGETS)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), SRC, inputs)["params"])
  full = jax.jit(model.apply)({"params": params}, SRC, inputs)
  incremental, cache = jax.jit(
      lambda p: step_by_step_logits(model, p, SRC, inputs, return_cache=True))(params)
  valid = np.asarray(TARGETS != 0)
  np.testing.assert_allclose(np.asarray(incremental)[valid], np.asarray(full)[valid],
                             atol=1e-5, rtol=1e-5)
  # The cache holds the key/value heads only: num_heads / num_kv_heads times fewer bytes.
  cached = [leaf for path, leaf in flax.traverse_util.flatten_dict(cache).items()
            if path[-1] in ("cached_key", "cached_value", "cross_key", "cross_value")]
  assert cached and {leaf.shape[1] for leaf in cached} == {model.config.num_kv_heads}


def test_chunked_attention_equals_plain_in_outputs_and_gradients_for_every_variant(
    tiny_model_config):
  """All variants at once in a decoder-only model (causal), chunked in blocks of 2."""
  combined = dict(norm_type="rmsnorm", norm="pre", activation="swiglu", attention_scale=0.3,
                  positions="rope", rope_fraction=0.5, num_kv_heads=2, attention_window=3)
  tokens = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 0, 0, 0]])
  plain = DecoderOnly(_config(tiny_model_config.copy_and_resolve_references(), **combined))
  chunked = DecoderOnly(_config(tiny_model_config, **combined, attention_impl="chunked",
                                attention_block_size=2))
  params = nn.unbox(jax.jit(plain.init)(jax.random.key(0), tokens)["params"])

  # PAD queries are left out: under a window one can see no key at all, and the paths give
  # such a query different (unused) outputs, as they may.
  valid = tokens != 0

  def loss(model, p):
    scores = jax.nn.log_softmax(model.apply({"params": p}, tokens))[..., 3] ** 2
    return jnp.sum(jnp.where(valid, scores, 0.0)) / jnp.sum(valid)

  np.testing.assert_allclose(np.asarray(chunked.apply({"params": params}, tokens))[valid],
                             np.asarray(plain.apply({"params": params}, tokens))[valid],
                             rtol=1e-4, atol=1e-5)
  for a, b in zip(jax.tree.leaves(jax.grad(lambda p: loss(plain, p))(params)),
                  jax.tree.leaves(jax.grad(lambda p: loss(chunked, p))(params))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides,message", [
    (dict(norm_type="batchnorm"), "config.model.norm_type='batchnorm' is not one of layernorm, "
                                  "rmsnorm"),
    (dict(activation="reglu"), "config.model.activation='reglu' is not one of"),
    (dict(attention_scale=-1.0), "config.model.attention_scale=-1.0 must be >= 0"),
    (dict(positions="rope", rope_fraction=0.0), "config.model.rope_fraction=0.0 must be in (0, 1]"),
    (dict(positions="rope", rope_fraction=0.2), "rope_fraction=0.2 of d_k=8 turns no channel pair"),
    (dict(positions="rope", rope_theta=0.0), "config.model.rope_theta=0.0 must be > 0"),
    (dict(num_kv_heads=3), "config.model.num_kv_heads=3 does not divide num_heads=4"),
    (dict(attention_window=-1), "config.model.attention_window=-1 must be an integer >= 0"),
    (dict(attention_window=4, attention_impl="pallas"),
     "config.model.attention_impl='pallas' takes no sliding window"),
    (dict(positions="alibi", attention_impl="pallas"),
     "config.model.attention_impl='pallas' takes no ALiBi bias"),
    (dict(positions="t5_bias", attention_impl="pallas"),
     "config.model.attention_impl='pallas' takes no T5 relative bias"),
    (dict(relative_buckets=7), "config.model.relative_buckets=7 must be even and >= 4"),
    (dict(relative_max_distance=16), "config.model.relative_max_distance=16 must exceed "
                                     "relative_buckets / 2 = 16"),
    (dict(attention_window=100, positions="learned", max_len=64),
     "config.model.attention_window=100 is longer than the max_len=64 learned positions"),
])
def test_a_bad_variant_is_one_line(tiny_model_config, overrides, message):
  with pytest.raises(UserError) as error:
    _config(tiny_model_config, **overrides)
  assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("overrides", [dict(norm_type="rmsnorm"), dict(activation="geglu"),
                                       dict(attention_scale=0.5), dict(positions="rope"),
                                       dict(num_kv_heads=1), dict(positions="t5_bias")])
def test_the_ctranslate2_export_refuses_a_variant_it_cannot_express(tiny_model_config, overrides):
  from transformer_jax.interop.ctranslate2_export import model_spec

  with pytest.raises(UserError) as error:
    model_spec(_config(tiny_model_config, **overrides), {}, [])
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rotary_scores_depend_on_the_offset_only(fraction):
  """q(m)·k(n) after turning equals q(m + c)·k(n + c); channels past the fraction stay."""
  rng = np.random.default_rng(0)
  query, key = (jnp.asarray(rng.standard_normal((1, 6, 2, 8)), jnp.float32) for _ in range(2))
  positions = jnp.arange(6)[None]
  scores = lambda shift: jnp.einsum("bqhd,bkhd->bhqk", rotary(query, positions + shift, 10_000.0,
                                                              fraction),
                                    rotary(key, positions + shift, 10_000.0, fraction))
  np.testing.assert_allclose(scores(0), scores(37), rtol=1e-4, atol=1e-4)
  assert not np.allclose(scores(0), jnp.einsum("bqhd,bkhd->bhqk", query, key), atol=1e-2)
  turned = rotary(query, positions, 10_000.0, fraction)
  kept = int(8 * fraction)
  np.testing.assert_array_equal(turned[..., kept:], query[..., kept:])
  np.testing.assert_array_equal(turned[:, 0], query[:, 0])  # Position 0 turns by 0.


@pytest.mark.parametrize("overrides", [dict(positions="rope"), dict(attention_window=3),
                                       dict(positions="alibi"), dict(positions="t5_bias")],
                         ids=["rope", "sliding_window", "alibi", "t5_bias"])
def test_a_prefix_lm_decodes_from_its_cache_as_the_full_model(tiny_model_config, overrides):
  """Prompts of two lengths: slots and positions part ways; keys are cached turned, and a
  window counts positions, not slots."""
  model = DecoderOnly(_config(tiny_model_config, **overrides))
  params = nn.unbox(model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"])
  sources = jnp.array([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
  targets = jnp.array([[11, 12, 13, EOS_ID], [14, 15, 16, 17]])
  rows = pair_rows(dict(src_tokens=sources, target_tokens=targets), shift_right(targets))
  expected = model.apply({"params": params}, rows.tokens, positions=rows.positions,
                         prefix=rows.prefix)[:, sources.shape[1]:]
  _, cache = prefix_lm.prefill(model, params, sources, sources.shape[1] + targets.shape[1],
                               prefix_lm=True)
  step = prefix_lm.step_logits(model, params, sources)
  inputs = shift_right(targets)
  for t in range(targets.shape[1]):
    logits, cache = step(inputs[:, t:t + 1], cache, jnp.int32(t))
    np.testing.assert_allclose(logits, expected[:, t], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_query_attention_is_multi_head_attention_with_shared_keys_and_values(
    num_kv_heads):
  """Each key/value head, repeated for its group of query heads, gives the same output as
  multi-head attention with those repeated kernels; num_kv_heads = num_heads is plain MHA."""
  heads, depth, d_model = 4, 4, 16
  x = np.random.default_rng(0).standard_normal((2, 5, d_model)).astype(np.float32)
  mask = AttentionMask.self_attention(jnp.ones((2, 5), jnp.int32), None, causal=True)
  grouped = MultiHeadAttention(num_heads=heads, d_k=depth, d_v=depth, d_model=d_model,
                               num_kv_heads=num_kv_heads)
  params = nn.unbox(grouped.init(jax.random.key(0), x, x, mask)["params"])
  assert params["key"].shape == params["value"].shape == (d_model, num_kv_heads, depth)
  repeated = dict(params, **{name: jnp.repeat(params[name], heads // num_kv_heads, axis=1)
                             for name in ("key", "value")})
  full = MultiHeadAttention(num_heads=heads, d_k=depth, d_v=depth, d_model=d_model)
  np.testing.assert_allclose(grouped.apply({"params": params}, x, x, mask),
                             full.apply({"params": repeated}, x, x, mask), rtol=1e-6, atol=1e-6)
  explicit = MultiHeadAttention(num_heads=heads, d_k=depth, d_v=depth, d_model=d_model,
                                num_kv_heads=heads)
  np.testing.assert_array_equal(explicit.apply({"params": repeated}, x, x, mask),
                                full.apply({"params": repeated}, x, x, mask))


def test_a_tensor_axis_that_does_not_divide_the_kv_heads_is_one_line():
  from transformer_jax import sharding

  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  sharding.check_tensor_divides(mesh, num_heads=4, num_kv_heads=1)  # One way: nothing split.
  mesh = type("FakeMesh", (), {"shape": {"tensor": 2}})()
  with pytest.raises(UserError) as error:
    sharding.check_tensor_divides(mesh, num_heads=4, num_kv_heads=1)
  assert str(error.value).startswith("config.mesh.tensor=2 does not divide "
                                     "config.model.num_kv_heads=1")


def test_the_kv_cache_per_token_falls_by_the_heads_sharing_each_kv_head(tiny_model_config):
  from transformer_jax.model.info import kv_cache_bytes_per_token

  full = kv_cache_bytes_per_token(_config(tiny_model_config.copy_and_resolve_references()))
  assert full == 2 * 4 * (8 + 8) * 4  # 2 decoder layers x 4 heads x (d_k + d_v) x float32.
  assert kv_cache_bytes_per_token(_config(tiny_model_config, num_kv_heads=1)) * 4 == full


def test_a_sliding_window_mask_sees_the_tokens_less_than_a_window_away():
  causal = np.asarray(AttentionMask(causal=True, window=3).dense(6, 6))[0, 0]
  two_way = np.asarray(AttentionMask(window=3).dense(6, 6))[0, 0]
  distance = np.arange(6)[:, None] - np.arange(6)[None, :]
  np.testing.assert_array_equal(causal, (distance >= 0) & (distance < 3))
  np.testing.assert_array_equal(two_way, np.abs(distance) < 3)


def test_sliding_window_chunked_attention_reads_only_the_blocks_in_the_window():
  """Queries 32..39 with a causal window of 8 see keys 25..39: key blocks 3 and 4 of 8. Values
  poisoned everywhere else stay out of their outputs, so the loop skips every other block:
  per query block, a fixed number of key blocks, a cost linear in the length."""
  from transformer_jax.model.chunked_attention import chunked_attention

  rng = np.random.default_rng(0)
  query, key, value = (jnp.asarray(rng.standard_normal((1, 64, 2, 4)), jnp.float32)
                       for _ in range(3))
  poisoned = value.at[:, :24].set(jnp.nan).at[:, 40:].set(jnp.nan)
  mask = AttentionMask(causal=True, window=8)
  out = chunked_attention(query, key, poisoned, mask, block_size=8)
  assert np.isfinite(np.asarray(out[:, 32:40])).all()
  plain = chunked_attention(query, key, value, mask, block_size=64)  # One block: all read.
  np.testing.assert_allclose(out[:, 32:40], plain[:, 32:40], rtol=1e-5, atol=1e-6)


def test_a_windowed_beam_search_over_a_shared_cache_finds_the_reordering_searchs_beams(
    tiny_model_config):
  """A shared beam cache holds beam_size slots a position: the window must count positions."""
  from transformer_jax.decode.translator import DecodeOptions, decode_batch

  model = Transformer(_config(tiny_model_config, attention_window=2))
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), SRC, SRC)["params"])
  outputs = [np.asarray(jax.jit(lambda p, shared=shared: decode_batch(
      model, p, SRC, DecodeOptions(beam_size=3, shared_beam_cache=shared, min_length=0), 12))(
          params)) for shared in (True, False)]
  np.testing.assert_array_equal(outputs[0], outputs[1])


def test_alibi_slopes_are_the_papers():
  from transformer_jax.model.positions import alibi_slopes

  assert alibi_slopes(8) == tuple(2.0 ** -h for h in range(1, 9))  # 1/2, 1/4, ..., 1/256.
  # 12 heads: the 8 slopes of 8 heads, then slopes 1, 3, 5, 7 of 16 heads, 2^(-k/2) for odd k.
  assert alibi_slopes(12) == (tuple(2.0 ** -h for h in range(1, 9))
                              + tuple(2.0 ** (-k / 2) for k in (1, 3, 5, 7)))


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_alibi_equals_plain_in_outputs_and_gradients(causal):
  """The bias computed a block at a time equals the whole matrix's: -m_h·|i - j|."""
  from transformer_jax.model.attention import dot_product_attention
  from transformer_jax.model.positions import alibi_slopes

  rng = np.random.default_rng(0)
  query, key, value = (jnp.asarray(rng.standard_normal((2, 12, 4, 8)), jnp.float32)
                       for _ in range(3))
  tokens = jnp.array([[5] * 12, [5] * 9 + [0] * 3])
  mask = AttentionMask.self_attention(tokens, None, causal=causal,
                                      positions=jnp.broadcast_to(jnp.arange(12), (2, 12)))
  slopes = alibi_slopes(4)
  valid = np.asarray(tokens != 0)

  def loss(implementation, q, k, v):
    out = dot_product_attention(q, k, v, mask, implementation, block_size=4,
                                alibi_slopes=slopes)
    return jnp.sum(jnp.where(valid[:, :, None, None], out, 0.0) ** 2), out

  (plain_loss, plain), plain_grads = jax.value_and_grad(
      lambda *x: loss("plain", *x), argnums=(0, 1, 2), has_aux=True)(query, key, value)
  (chunked_loss, chunked), chunked_grads = jax.value_and_grad(
      lambda *x: loss("chunked", *x), argnums=(0, 1, 2), has_aux=True)(query, key, value)
  np.testing.assert_allclose(np.asarray(chunked)[valid], np.asarray(plain)[valid],
                             rtol=1e-5, atol=1e-5)
  for a, b in zip(chunked_grads, plain_grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # The bias is the formula: softmax(QKᵀ/√d_k - m_h·|i - j|) over the visible keys, in NumPy.
  from transformer_jax.model.attention import dot_product_attention_weights
  from transformer_jax.model.positions import alibi_bias

  weights = dot_product_attention_weights(query, key, mask.dense(12, 12), None,
                                          alibi_bias(slopes, mask.distance(0, 12, 0, 12)))
  scores = np.einsum("bqhd,bkhd->bhqk", np.asarray(query, np.float64),
                     np.asarray(key, np.float64)) / np.sqrt(8)
  distance = np.abs(np.arange(12)[:, None] - np.arange(12)[None, :])
  scores = scores - np.asarray(slopes)[None, :, None, None] * distance
  visible = np.asarray(mask.dense(12, 12))
  scores = np.where(visible, scores, -np.inf)
  want = np.exp(scores - scores.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(weights), want, rtol=1e-5, atol=1e-6)


def _t5_bucket(relative_position: int, bidirectional: bool, num_buckets: int,
               max_distance: int) -> int:
  """T5's `_relative_position_bucket` for one key-minus-query position, as its code reads."""
  bucket, n = 0, -relative_position
  if bidirectional:
    num_buckets //= 2
    bucket += num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return bucket + n
  large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
  return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16)])
def test_t5_buckets_equal_t5s_own_on_a_grid(bidirectional, num_buckets, max_distance):
  from transformer_jax.model.positions import relative_position_bucket

  grid = np.arange(-300, 301)
  got = relative_position_bucket(jnp.asarray(grid), bidirectional, num_buckets, max_distance)
  want = [_t5_bucket(int(r), bidirectional, num_buckets, max_distance) for r in grid]
  np.testing.assert_array_equal(np.asarray(got), want)


def test_t5_bias_is_one_table_a_stack_shared_by_its_layers(tiny_model_config):
  model = Transformer(_config(tiny_model_config, positions="t5_bias"))
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), SRC, SRC)["params"])
  tables = {name: value.shape for name, value in params.items() if "relative_bias" in name}
  assert tables == {"encoder_relative_bias": (32, 4), "decoder_relative_bias": (32, 4)}
  # Each stack's scores follow its table: a changed encoder table changes the outputs.
  shifted = params["encoder_relative_bias"] + jnp.arange(32.0)[:, None]
  changed = dict(params, encoder_relative_bias=shifted)
  assert not np.allclose(model.apply({"params": params}, SRC, SRC),
                         model.apply({"params": changed}, SRC, SRC))


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize("positions", ["alibi", "t5_bias"])
@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_a_score_bias_equals_plain_in_outputs_and_gradients(
    tiny_model_config, implementation, positions, family):
  """ALiBi's and T5's biases as jax.nn.dot_product_attention's bias (xla) or a block at a
  time (chunked, blocks of 2 tokens, the T5 table's gradient summed by bucket in its own
  backward pass): the same logits and gradients, the tables' included, as the plain path's."""
  tokens = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 0, 0, 0]])
  models = [(Transformer if family == "encoder_decoder" else DecoderOnly)(
      _config(tiny_model_config.copy_and_resolve_references(), positions=positions,
              attention_impl=impl, attention_block_size=2))
      for impl in ("plain", implementation)]
  args = (tokens, tokens) if family == "encoder_decoder" else (tokens,)
  params = nn.unbox(jax.jit(models[0].init)(jax.random.key(0), *args)["params"])
  valid = np.asarray(tokens != 0)

  def loss(model, p):
    scores = jax.nn.log_softmax(model.apply({"params": p}, *args))[..., 3] ** 2
    return jnp.sum(jnp.where(valid, scores, 0.0)) / valid.sum()

  plain, other = (np.asarray(m.apply({"params": params}, *args)) for m in models)
  np.testing.assert_allclose(other[valid], plain[valid], rtol=1e-5, atol=1e-5)
  plain_grads, other_grads = (flax.traverse_util.flatten_dict(
      jax.grad(lambda p, m=m: loss(m, p))(params), sep="/") for m in models)
  for path, a in plain_grads.items():
    np.testing.assert_allclose(np.asarray(other_grads[path]), np.asarray(a), rtol=1e-4,
                               atol=1e-5, err_msg=path)
  tables = [path for path in plain_grads if "relative_bias" in path]
  assert bool(tables) == (positions == "t5_bias")
  assert all(np.abs(np.asarray(plain_grads[path])).sum() > 0 for path in tables)
