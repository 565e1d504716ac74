"""Mixed precision: bfloat16 matmul operands, float32 accumulation (precision.py)."""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from transformer_jax.model import precision
from transformer_jax.errors import UserError
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID

# Every product training runs, in the shapes it runs them (see model.py, attention.py).
PRODUCTS = [
    ("md,dn->mn", (48, 16), (16, 24)),  # Dense, Q/K/V and output projections.
    # Tied pre-softmax projection: E's gradient comes as (Xᵀ·G)ᵀ (G is the larger operand),
    # or as Gᵀ·X when G is the smaller (12 tokens) or X's 44 rows cannot be copied transposed.
    ("md,vd->mv", (48, 16), (40, 16)),
    ("md,vd->mv", (12, 16), (40, 16)),
    ("md,vd->mv", (44, 16), (80, 16)),
    ("bqhd,bkhd->bhqk", (2, 8, 4, 16), (2, 8, 4, 16)),  # QKᵀ.
    ("bhqk,bkhd->bqhd", (2, 4, 8, 8), (2, 8, 4, 16)),  # weights · V.
]
# Decoding's products against the cache (gradients: JAX's own, float32).
CACHE_PRODUCTS = [
    ("bqhd,bhdk->bhqk", (2, 8, 4, 16), (2, 4, 16, 8)),
    ("bhqk,bhkd->bqhd", (2, 4, 8, 8), (2, 4, 8, 16)),
]


def _operands(lhs_shape, rhs_shape, seed=0):
  lhs_key, rhs_key, weight_key = jax.random.split(jax.random.key(seed), 3)
  return jax.random.normal(lhs_key, lhs_shape), jax.random.normal(rhs_key, rhs_shape), weight_key


def _rounded(x):
  return x.astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("subscripts,lhs_shape,rhs_shape", PRODUCTS)
def test_mixed_product_and_gradients_are_float32_arithmetic_on_rounded_operands(
    subscripts, lhs_shape, rhs_shape
):
  """Forward: round the operands, multiply in float32. Backward: the same for
  d lhs = g · rhs and d rhs = lhs · g, with the cotangent g rounded too."""
  lhs, rhs, weight_key = _operands(lhs_shape, rhs_shape)
  product = precision.einsum(subscripts, lhs, rhs, jnp.bfloat16, jnp.float32)
  assert product.dtype == jnp.float32
  expected = jnp.einsum(subscripts, _rounded(lhs), _rounded(rhs), precision="highest")
  np.testing.assert_allclose(product, expected, rtol=1e-5, atol=1e-5)

  cotangent = jax.random.normal(weight_key, product.shape)
  _, vjp = jax.vjp(lambda a, b: precision.einsum(subscripts, a, b, jnp.bfloat16, jnp.float32), lhs, rhs)
  d_lhs, d_rhs = vjp(cotangent)
  _, reference_vjp = jax.vjp(
      lambda a, b: jnp.einsum(subscripts, a, b, precision="highest"), _rounded(lhs), _rounded(rhs)
  )
  expected_lhs, expected_rhs = reference_vjp(_rounded(cotangent))
  assert d_lhs.dtype == d_rhs.dtype == jnp.float32
  np.testing.assert_allclose(d_lhs, expected_lhs, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(d_rhs, expected_rhs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("subscripts,lhs_shape,rhs_shape", PRODUCTS)
def test_gradient_matmuls_take_bfloat16_operands(subscripts, lhs_shape, rhs_shape):
  """JAX's own transpose would multiply float32 copies: the backward pass at the float32 rate."""
  lhs, rhs, _ = _operands(lhs_shape, rhs_shape)
  loss = lambda a, b: jnp.sum(precision.einsum(subscripts, a, b, jnp.bfloat16, jnp.float32) ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)

  def dots(jaxpr):
    for equation in jaxpr.eqns:
      if equation.primitive.name == "dot_general":
        yield equation
      for value in equation.params.values():
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns"):
          yield from dots(inner)

  found = list(dots(jaxpr.jaxpr))
  assert len(found) == 3  # The forward product and the two gradients.
  for equation in found:
    assert [v.aval.dtype for v in equation.invars] == [jnp.bfloat16, jnp.bfloat16], equation


@pytest.mark.parametrize("subscripts,lhs_shape,rhs_shape", CACHE_PRODUCTS)
def test_products_without_bf16_gradients_round_operands_and_still_differentiate(
    subscripts, lhs_shape, rhs_shape
):
  lhs, rhs, _ = _operands(lhs_shape, rhs_shape)
  product = lambda a, b: precision.einsum(subscripts, a, b, jnp.bfloat16, jnp.float32, False)
  expected = jnp.einsum(subscripts, _rounded(lhs), _rounded(rhs), precision="highest")
  np.testing.assert_allclose(product(lhs, rhs), expected, rtol=1e-5, atol=1e-5)
  d_lhs, d_rhs = jax.jit(jax.grad(lambda a, b: product(a, b).sum(), argnums=(0, 1)))(lhs, rhs)
  _, reference_vjp = jax.vjp(
      lambda a, b: jnp.einsum(subscripts, a, b, precision="highest"), _rounded(lhs), _rounded(rhs)
  )
  expected_lhs, expected_rhs = reference_vjp(jnp.ones_like(expected))
  # JAX's transpose returns the operand gradients in bfloat16: 2⁻⁸ relative.
  np.testing.assert_allclose(d_lhs, expected_lhs, rtol=2**-8, atol=1e-3)
  np.testing.assert_allclose(d_rhs, expected_rhs, rtol=2**-8, atol=1e-3)


def test_same_operand_and_result_dtype_is_the_plain_einsum():
  lhs, rhs, _ = _operands((8, 4), (4, 6))
  np.testing.assert_array_equal(
      precision.einsum("md,dn->mn", lhs, rhs, jnp.float32, jnp.float32), lhs @ rhs
  )


@pytest.mark.parametrize("subscripts", ["md,dn", "mm,mn->mn", "...d,dn->...n", "md,kn->mn"])
def test_unsupported_subscripts_are_named(subscripts):
  lhs, rhs, _ = _operands((4, 4), (4, 4))
  with pytest.raises(ValueError, match="einsum|subscripts|->"):
    precision.einsum(subscripts, lhs, rhs, jnp.bfloat16, jnp.float32)


def _model(tiny_model_config, matmul_dtype):
  config = tiny_model_config.copy_and_resolve_references()
  config.matmul_dtype = matmul_dtype
  return Transformer(config)


SRC = jnp.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, 12, EOS_ID, 0, 0]])
TARGETS = jnp.array([[20, 21, 22, 23, EOS_ID], [24, 25, 26, EOS_ID, 0]])


def test_mixed_model_keeps_float32_parameters_and_tracks_the_float32_model(tiny_model_config):
  full, mixed = _model(tiny_model_config, "float32"), _model(tiny_model_config, "bfloat16")
  inputs = shift_right(TARGETS)
  params = full.init(jax.random.key(0), SRC, inputs)["params"]
  assert jax.tree.structure(params) == jax.tree.structure(
      mixed.init(jax.random.key(0), SRC, inputs)["params"]
  )

  def loss(model, params):
    logits = model.apply({"params": params}, SRC, inputs)
    log_probs = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(log_probs, TARGETS[..., None], axis=-1)[..., 0]
    return -jnp.sum(picked * (TARGETS != 0)), logits

  (full_loss, full_logits), full_grads = jax.value_and_grad(loss, argnums=1, has_aux=True)(full, params)
  (mixed_loss, mixed_logits), mixed_grads = jax.value_and_grad(loss, argnums=1, has_aux=True)(
      mixed, params
  )
  assert mixed_logits.dtype == jnp.float32
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(mixed_grads))
  assert not np.array_equal(mixed_logits, full_logits)  # The bf16 path is really taken.
  np.testing.assert_allclose(mixed_logits, full_logits, atol=0.05)
  np.testing.assert_allclose(mixed_loss, full_loss, rtol=1e-2)
  flat_full, flat_mixed = (
      jnp.concatenate([g.ravel() for g in jax.tree.leaves(t)]) for t in (full_grads, mixed_grads)
  )
  relative = jnp.linalg.norm(flat_mixed - flat_full) / jnp.linalg.norm(flat_full)
  assert relative < 0.05, relative


def test_mixed_cached_decoding_equals_full_recomputation(tiny_model_config, step_by_step_logits):
  model = _model(tiny_model_config, "bfloat16")
  inputs = shift_right(TARGETS)
  params = model.init(jax.random.key(0), SRC, inputs)["params"]
  full = model.apply({"params": params}, SRC, inputs)
  stepped, cache = step_by_step_logits(model, params, SRC, inputs, return_cache=True)
  # The cache the decoder read and wrote holds keys and values rounded as the matmuls read
  # them: in bfloat16 (half the bytes), or on a CPU in float32, where XLA computes the
  # products over the cache in float32 anyway (precision.decoding_cache_dtype).
  cached = {path[-1]: leaf for path, leaf in traverse_util.flatten_dict(cache).items()
            if path[-1] != "cache_index"}
  assert set(cached) == {"cached_key", "cached_value", "cross_key", "cross_value"}
  stored = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  assert {leaf.dtype for leaf in cached.values()} == {jnp.dtype(stored)}, cached
  for name, leaf in cached.items():
    rounded = np.asarray(leaf.astype(jnp.bfloat16).astype(leaf.dtype))
    np.testing.assert_array_equal(np.asarray(leaf), rounded, err_msg=f"{name} is not rounded")
  valid = np.asarray(TARGETS != 0)
  np.testing.assert_allclose(np.asarray(stepped)[valid], np.asarray(full)[valid],
                             atol=1e-4, rtol=1e-4)


def test_unknown_matmul_dtype_is_a_one_line_error(tiny_model_config):
  with pytest.raises(UserError, match="config.model.matmul_dtype='float16'"):
    _model(tiny_model_config, "float16").init(jax.random.key(0), SRC, SRC)


@pytest.mark.parametrize("backend, flags, capability, native", [
    ("cpu", {"avx2", "avx512f", "avx512_bf16"}, "", True),   # AMD Zen 4/5, Intel Cooper Lake.
    ("cpu", {"avx2", "amx_bf16", "amx_tile"}, "", True),     # Intel Sapphire Rapids.
    ("cpu", {"avx2", "fma"}, "", False),                      # AVX2 only: float32 is faster.
    ("cpu", set(), "", False),                                # No /proc/cpuinfo.
    ("tpu", set(), "", True),
    ("gpu", set(), "8.0", True),
    ("gpu", set(), "7.5", False),
])
def test_auto_matmul_dtype_takes_bfloat16_only_where_it_is_native(
    monkeypatch, backend, flags, capability, native):
  chosen, reason = precision.native_bfloat16(backend, frozenset(flags), capability)
  assert chosen == native and reason, (backend, flags, reason)
  monkeypatch.setattr(precision, "native_bfloat16_here", lambda: (native, reason))
  config = ModelConfig(matmul_dtype="auto")
  assert config.matmul_dtype == ("bfloat16" if native else "float32"), reason


@pytest.mark.parametrize("native", [True, False])
def test_a_run_records_the_matmul_dtype_auto_chose_and_keeps_it_on_any_host(monkeypatch, native):
  """config.json holds the resolved dtype: read on a host that would choose otherwise, the
  run computes as it trained."""
  from transformer_jax.configs import load_module
  from transformer_jax.tasks.registry import make_task

  config_file = pathlib.Path(__file__).parents[1] / "experiments/configs/length_generalisation.py"
  config = load_module(config_file, "config_length_generalisation").get_config("decoder_only")
  config.model.matmul_dtype = "auto"
  monkeypatch.setattr(precision, "native_bfloat16_here", lambda: (native, "measured"))
  recorded = make_task(config).run_config()["model"]
  assert recorded["matmul_dtype"] == ("bfloat16" if native else "float32")
  monkeypatch.setattr(precision, "native_bfloat16_here", lambda: (not native, "another host"))
  assert ModelConfig.from_config(recorded).matmul_dtype == recorded["matmul_dtype"]


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
  assert precision.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512_bf16"}
  assert precision.cpu_flags(str(tmp_path / "absent")) == frozenset()


# int8 weight matmuls (decoding only: ModelConfig.quantize, translate --quantize=int8).


def test_int8_matmul_is_exact_where_int8_holds_the_operands():
  # Integers within ±127 whose rows (lhs) and columns (rhs) each reach 127 have scale 1:
  # the int8 product is the integer product, exactly.
  rng = np.random.default_rng(0)
  lhs = rng.integers(-127, 128, size=(6, 40)).astype(np.float32)
  rhs = rng.integers(-127, 128, size=(40, 9)).astype(np.float32)
  lhs[:, 0], rhs[0, :] = 127, -127
  product = precision.int8_matmul(jnp.asarray(lhs), jnp.asarray(rhs), jnp.float32)
  np.testing.assert_array_equal(np.asarray(product), lhs @ rhs)


def test_int8_matmul_tracks_float32_and_keeps_zero_rows():
  lhs, rhs, _ = _operands((64, 256), (256, 96))
  lhs = lhs.at[3].set(0.0)  # A row of zeros (padding) must give zeros, not NaN.
  product = np.asarray(precision.int8_matmul(lhs, rhs, jnp.float32))
  exact = np.asarray(lhs @ rhs)
  assert np.all(product[3] == 0.0)
  relative = np.linalg.norm(product - exact) / np.linalg.norm(exact)
  assert 0 < relative < 0.02, relative  # Rounded for real, and by about 1 %.


def test_int8_model_tracks_the_float32_model_and_decodes_from_its_cache(tiny_model_config,
                                                                         step_by_step_logits):
  full = _model(tiny_model_config, "float32")
  quantized = full.clone(config=dataclasses.replace(full.config, quantize="int8"))
  inputs = shift_right(TARGETS)
  params = full.init(jax.random.key(0), SRC, inputs)["params"]
  # Every weight matmul is int8: per encoder layer Q·K·V and the output projection, the two
  # feed-forward ones (4); per decoder layer those and the cross-attention's query, key·value
  # and output (7); the tied logits (1). The attention products stay float.
  jaxpr = str(jax.make_jaxpr(lambda p: quantized.apply({"params": p}, SRC, inputs))(params))
  assert jaxpr.count("preferred_element_type=int32") == 2 * 4 + 2 * 7 + 1
  full_logits = np.asarray(full.apply({"params": params}, SRC, inputs))
  int8_logits = np.asarray(quantized.apply({"params": params}, SRC, inputs))
  valid = np.asarray(TARGETS != 0)
  difference = np.abs(int8_logits - full_logits)[valid]
  assert 0 < difference.max() < 0.1 * np.abs(full_logits[valid]).max(), difference.max()
  # The cached, step-by-step int8 decoder computes what the int8 model computes at once.
  np.testing.assert_allclose(
      np.asarray(step_by_step_logits(quantized, params, SRC, inputs))[valid], int8_logits[valid],
      atol=1e-4, rtol=1e-4)


def test_training_refuses_a_quantized_model():
  from transformer_jax.configs import default_config, validate_config

  config = default_config()
  config.model.quantize = "int8"
  with pytest.raises(UserError, match="config.model.quantize='int8' is for decoding"):
    validate_config(config)
