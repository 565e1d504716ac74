"""Matmuls with low-precision operands and float32 accumulation.

`config.model.matmul_dtype="bfloat16"` with `dtype="float32"` rounds the two
operands of every matmul to bfloat16, accumulates in float32 and returns
float32, forward and backward; LayerNorm, softmax, residuals and the optimizer
stay in float32. This is what a TPU's matrix unit does, and on a CPU with AMX
(Sapphire Rapids and later) or AVX512-BF16 (AMD Zen 4) it is the only bfloat16
form XLA runs fast: faster than float32 there, where a bfloat16 result runs
slower than float32 (the 2048² matmul rates of an AMX and a Zen 4 host:
benchmarks/NOTES.md, 2026-12-01).

JAX's own transpose of a bfloat16 x bfloat16 -> float32 dot multiplies the
float32 cotangent by a float32 copy of the other operand: the backward pass
would run at the float32 rate. `einsum` therefore has a custom VJP whose two
gradient matmuls take bfloat16 operands (the cotangent rounded like the
forward operands) and accumulate in float32 too.
"""

from __future__ import annotations

import platform
import functools
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.model.platform import platform_in_force

Array = jax.Array


def einsum(
    subscripts: str,
    lhs: Array,
    rhs: Array,
    operand_dtype: Any,
    result_dtype: Any,
    bf16_gradients: bool = True,
) -> Array:
  """`jnp.einsum(subscripts, lhs, rhs)` with operands in `operand_dtype`.

  Args:
    subscripts: explicit two-operand subscripts, "ab,bc->ac"; every index of
      an operand must appear in the other operand or in the output.
    lhs, rhs: the operands, any float dtype.
    operand_dtype: dtype both operands are rounded to.
    result_dtype: dtype of the result.
    bf16_gradients: the custom VJP (gradient matmuls with low-precision
      operands). False keeps JAX's own transpose (float32 gradient matmuls),
      for products trained through rarely: XLA:CPU has no kernel for some
      layouts of their gradients (the decoding cache's weights · V, whose
      value gradient contracts the query axis into [b, h, k, d]).

  Returns:
    The product in `result_dtype`. When `operand_dtype` equals
    `result_dtype` this is the plain einsum (the product's dtype is the
    operands'); otherwise the product is accumulated in float32.
  """
  operand_dtype, result_dtype = jnp.dtype(operand_dtype), jnp.dtype(result_dtype)
  _check_subscripts(subscripts)
  if operand_dtype == result_dtype:
    return jnp.einsum(subscripts, lhs.astype(operand_dtype), rhs.astype(operand_dtype))
  if not bf16_gradients:
    return jnp.einsum(
        subscripts,
        lhs.astype(operand_dtype),
        rhs.astype(operand_dtype),
        preferred_element_type=jnp.float32,
    ).astype(result_dtype)
  return _mixed_einsum(subscripts, operand_dtype, lhs, rhs).astype(result_dtype)


# How weight matmuls may run at inference (`ModelConfig.quantize`): "" as trained, or int8.
QUANTIZATIONS = ("", "int8")
_INT8_MAX = 127.0


def int8_scales(x: Array, axis: int) -> Array:
  """max |x| / 127 along `axis` (kept), 1 where that maximum is 0: float32."""
  largest = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis, keepdims=True)
  return jnp.where(largest > 0, largest / _INT8_MAX, 1.0)


def int8_matmul(lhs: Array, rhs: Array, result_dtype: Any) -> Array:
  """lhs[m, d] · rhs[d, n] with both operands rounded to int8; inference only.

  Symmetric quantization with one scale per row of `lhs` (each token's
  activations, measured as it goes) and one per column of `rhs` (each output
  unit's weights), products accumulated exactly in int32, then scaled back:
  CTranslate2's int8 scheme. The weights' rounding depends only on the
  parameters, so inside a decoding loop XLA computes it once, before the loop
  (a loop of 40 [256, 512]·[512, 2048] steps took the same time with the
  weights rounded inside or passed in rounded). round() has no useful
  gradient: training refuses a quantized model.
  """
  lhs_scale, rhs_scale = int8_scales(lhs, 1), int8_scales(rhs, 0)
  lhs_int8 = jnp.round(lhs.astype(jnp.float32) / lhs_scale).astype(jnp.int8)
  rhs_int8 = jnp.round(rhs.astype(jnp.float32) / rhs_scale).astype(jnp.int8)
  product = jax.lax.dot_general(lhs_int8, rhs_int8, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.int32)
  return (product.astype(jnp.float32) * lhs_scale * rhs_scale).astype(result_dtype)


def weight_matmul(inputs: Array, weights: Array, operand_dtype: Any, result_dtype: Any,
                  quantize: str = "") -> Array:
  """inputs[m, d] · weights[d, n], a layer's weight product: `int8_matmul` where
  `quantize` is "int8", else `einsum` with `operand_dtype` operands."""
  if quantize == "int8":
    return int8_matmul(inputs, weights, result_dtype)
  return einsum("md,dn->mn", inputs, weights, operand_dtype, result_dtype)


def dot_general(
    lhs: Array,
    rhs: Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    operand_dtype: Any,
    result_dtype: Any,
    quantize: str = "",
) -> Array:
  """A `dot_general` for `nn.Dense(dot_general=partial(dot_general, ...))`.

  Takes the one contraction nn.Dense uses (last axis of `lhs` with the first
  of `rhs`, no batch axes) and runs it through `einsum`, or `int8_matmul`
  with `quantize="int8"`.
  """
  del precision, preferred_element_type  # The dtypes above decide both.
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  if (tuple(lhs_contract), tuple(rhs_contract)) != ((lhs.ndim - 1,), (0,)) or lhs_batch or rhs_batch:
    raise ValueError(f"dot_general supports nn.Dense's contraction only, got {dimension_numbers}")
  leading = lhs.shape[:-1]
  flat = lhs.reshape(-1, lhs.shape[-1])
  matrix = rhs.reshape(rhs.shape[0], -1)
  product = weight_matmul(flat, matrix, operand_dtype, result_dtype, quantize)
  return product.reshape(*leading, *rhs.shape[1:])


def _check_subscripts(subscripts: str) -> tuple[str, str, str]:
  """(lhs, rhs, output) of "A,B->C"; each operand index must also be elsewhere."""
  compact = subscripts.replace(" ", "")
  if compact.count("->") != 1 or compact.split("->")[0].count(",") != 1:
    raise ValueError(f"einsum {subscripts!r}: give two operands and the output, as 'md,dn->mn'")
  inputs, output = compact.split("->")
  lhs, rhs = inputs.split(",")
  for name, operand, other in (("lhs", lhs, rhs), ("rhs", rhs, lhs)):
    missing = set(operand) - set(other) - set(output)
    if missing or len(set(operand)) != len(operand) or "." in operand:
      raise ValueError(
          f"einsum {subscripts!r}: the {name} indices must be distinct letters, each "
          "also in the other operand or the output"
      )
  return lhs, rhs, output


# Rows are split into blocks of this many to make the 3-D view XLA does not fold.
_TRANSPOSE_BLOCK = 8


def _physically_transposed(matrix: Array) -> Array:
  """matrix[m, d] -> [d, m] as a real copy.

  XLA folds a plain 2-D transpose into the dot's dimension numbers, and
  XLA:CPU then runs the dot (contracting both operands' first axes) through a
  float32 fallback; a transpose of a 3-D view is not folded, and the dot
  runs at the bfloat16 rate (1,045 against 283 GFLOP/s for [2048, 512]ᵀ ·
  [2048, 1024] here).
  """
  rows, cols = matrix.shape
  if rows % _TRANSPOSE_BLOCK:
    return matrix.T
  blocks = matrix.reshape(rows // _TRANSPOSE_BLOCK, _TRANSPOSE_BLOCK, cols)
  return jnp.transpose(blocks, (2, 0, 1)).reshape(cols, rows)


def _low_precision_product(
    first: tuple[str, Array], second: tuple[str, Array], output: str
) -> Array:
  """einsum of two low-precision operands into float32 `output` indices.

  Lays out the operands the way XLA:CPU's fast (YNNPACK) dot takes them:
  - batched products (shared indices, as in attention) put first the operand
    whose shared indices lead; the other order hit an unsupported dot there.
  - matrix products contracting both operands' first axes (weight gradients,
    Xᵀ·G) physically transpose the operand that supplies the output's rows, or,
    when that operand is by far the larger (the tied logits' gradient G [tokens,
    vocab]), the other operand and the float32 result: on an Intel AMX host the
    copy of G took 149 ms of a 1.4 s Multi30k step, and the step ran 1.21x as
    many tokens a second without it (benchmarks/NOTES.md, the 2026-12-03 04:30 (Intel AMX host) runs).
  """
  (first_subscripts, first_operand), (second_subscripts, second_operand) = first, second
  transpose_result = False
  shared = set(first_subscripts) & set(second_subscripts) & set(output)
  if shared:
    leading = lambda subscripts: set(subscripts[: len(shared)]) == shared
    if leading(second_subscripts) and not leading(first_subscripts):
      first, second = second, first
  elif len(first_subscripts) == len(second_subscripts) == 2:
    contracted = (set(first_subscripts) & set(second_subscripts)) - set(output)
    if {first_subscripts[0], second_subscripts[0]} == contracted:
      # Output rows come from `rows_from`; its contracted axis goes last.
      rows_from, other = (first, second) if output[0] in first_subscripts else (second, first)
      rows_subscripts, rows_operand = rows_from
      other_subscripts, other_operand = other
      result_elements = rows_operand.shape[1] * other_operand.shape[1]
      if (other_operand.size + result_elements < rows_operand.size
          and other_operand.shape[0] % _TRANSPOSE_BLOCK == 0
          and other_operand.shape[1] % _TRANSPOSE_BLOCK == 0):
        # Cheaper to transpose the other operand and the float32 result: the shared
        # logits' gradient Eᵀ = (Xᵀ·G)ᵀ copies 1M + 2M elements instead of G's 33M.
        # Both copies are real ones: with plain .T here XLA:CPU failed at run time
        # ("Unsupported element type for DotThunk: BF16 x BF16 = F32").
        first = (other_subscripts[::-1], _physically_transposed(other_operand))
        second, output, transpose_result = rows_from, output[::-1], True
      else:
        first = (rows_subscripts[::-1], _physically_transposed(rows_operand))
        second = other
  (first_subscripts, first_operand), (second_subscripts, second_operand) = first, second
  product = jnp.einsum(
      f"{first_subscripts},{second_subscripts}->{output}",
      first_operand,
      second_operand,
      preferred_element_type=jnp.float32,
  )
  return _physically_transposed(product) if transpose_result else product


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _mixed_einsum(subscripts: str, operand_dtype: Any, lhs: Array, rhs: Array) -> Array:
  return jnp.einsum(
      subscripts,
      lhs.astype(operand_dtype),
      rhs.astype(operand_dtype),
      preferred_element_type=jnp.float32,
  )


def _mixed_einsum_forward(
    subscripts: str, operand_dtype: Any, lhs: Array, rhs: Array
) -> tuple[Array, tuple[Array, Array, Array, Array]]:
  lhs_low, rhs_low = lhs.astype(operand_dtype), rhs.astype(operand_dtype)
  product = jnp.einsum(subscripts, lhs_low, rhs_low, preferred_element_type=jnp.float32)
  # Empty arrays carry the operands' dtypes (residuals must be arrays).
  return product, (lhs_low, rhs_low, jnp.zeros((0,), lhs.dtype), jnp.zeros((0,), rhs.dtype))


def _mixed_einsum_backward(
    subscripts: str, operand_dtype: Any, residuals: tuple, cotangent: Array
) -> tuple[Array, Array]:
  lhs_low, rhs_low, lhs_like, rhs_like = residuals
  lhs, rhs, output = _check_subscripts(subscripts)
  cotangent_low = cotangent.astype(operand_dtype)
  d_lhs = _low_precision_product((output, cotangent_low), (rhs, rhs_low), lhs)
  d_rhs = _low_precision_product((lhs, lhs_low), (output, cotangent_low), rhs)
  return d_lhs.astype(lhs_like.dtype), d_rhs.astype(rhs_like.dtype)


_mixed_einsum.defvjp(_mixed_einsum_forward, _mixed_einsum_backward)


# CPU flags (/proc/cpuinfo) of a native bfloat16 dot product: XLA:CPU's bfloat16-operand,
# float32-result matmuls beat float32 only with one of them (the rates in the module docstring).
NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The first processor's model name ("Intel(R) Xeon(R) Processor @ 2.80GHz"), for labelling
  measurements; platform.processor() where /proc/cpuinfo is absent."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
  """The first processor's flags (empty where /proc/cpuinfo is absent, e.g. macOS)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("flags"):
          return frozenset(line.split(":", 1)[1].split())
  except OSError:
    pass
  return frozenset()


def native_bfloat16(backend: str, flags: frozenset[str] = frozenset(),
                    gpu_capability: str = "") -> tuple[bool, str]:
  """(whether bfloat16 matmul operands run faster than float32 here, the reason in words).

  Args:
    backend: jax.default_backend().
    flags: the CPU's flags (`cpu_flags()`), for backend "cpu".
    gpu_capability: the GPU's compute capability ("9.0"), for backend "gpu".
  """
  if backend == "tpu":
    return True, "a TPU's matrix units take bfloat16 operands"
  if backend == "gpu":
    major = int(gpu_capability.split(".")[0]) if gpu_capability else 0
    if major >= 8:
      return True, f"a GPU of compute capability {gpu_capability} has bfloat16 tensor cores"
    return False, f"a GPU of compute capability {gpu_capability or 'unknown'} (< 8.0) has no bfloat16 tensor cores"
  native = [flag for flag in NATIVE_BF16_CPU_FLAGS if flag in flags]
  if native:
    return True, f"this CPU has {' and '.join(native)}"
  return False, "this CPU has neither AMX nor AVX512-BF16 (bfloat16 operands would run slower)"


def decoding_cache_dtype(operand_dtype: Any, compute_dtype: Any) -> Any:
  """The dtype a decoding cache stores keys and values in, for attention with `operand_dtype`.

  The operand dtype (a bfloat16 cache has half the bytes), except on a CPU with float32
  compute: XLA:CPU computes attention's batched products over bfloat16 operands in
  float32, converting the whole bfloat16 cache to float32 at every step and writing the
  new token through a float32 copy too (the optimized HLO of greedy decoding on an AMX
  host; benchmarks/NOTES.md). There the cache stores the rounded values in float32 and
  the products run in float32: the same numbers, without those conversions. Beam
  search, which reorders its self-attention cache every step, stores that part in the
  operand dtype again (cache.stored_as): half the bytes to move.
  """
  if platform_in_force() == "cpu" and jnp.dtype(compute_dtype) == jnp.float32:
    return jnp.dtype(jnp.float32)
  return jnp.dtype(operand_dtype)


@functools.cache
def native_bfloat16_here() -> tuple[bool, str]:
  """`native_bfloat16` of this process's default backend and first device (probed once)."""
  backend = jax.default_backend()
  capability = getattr(jax.devices()[0], "compute_capability", "") if backend == "gpu" else ""
  return native_bfloat16(backend, cpu_flags() if backend == "cpu" else frozenset(),
                         str(capability or ""))
