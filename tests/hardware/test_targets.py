"""Each family and attention implementation compiled for a TPU slice and a GPU node from this CPU.

These need the compilers of the [test] extra (libtpu, the CUDA plugin, cuDNN) and do not skip
without them: a missing compiler fails with the install that brings it. Each asserts that
the program fits, that the partitioner replicated nothing in full, that parameters sit where
the rule table puts them, and that the kernel asked for is the one in the program.
"""

from __future__ import annotations

import jax
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from transformer_jax.configs import default_config
from transformer_jax.hardware import precompile, targets

# Four TPU v5e chips (v5e:2x2) and eight H100s, each split three ways.
TPU = ("v5e-4", dict(data=1, fsdp=2, tensor=2))
GPU = ("h100x8", dict(data=2, fsdp=2, tensor=2))
CASES = {
    # name: (target, task, attention_impl, the custom call that must appear, or "")
    "tpu-translation-plain": (TPU, "translation", "plain", ""),
    "tpu-translation-pallas": (TPU, "translation", "pallas", "tpu_custom_call"),
    "tpu-causal_lm-chunked": (TPU, "causal_lm", "chunked", ""),
    "tpu-masked_lm-plain": (TPU, "masked_lm", "plain", ""),
    "gpu-translation-plain": (GPU, "translation", "plain", ""),
    "gpu-translation-cudnn": (GPU, "translation", "cudnn", "__cudnn$fmha"),
    "gpu-causal_lm-pallas": (GPU, "causal_lm", "pallas", "__gpu$xla.gpu.triton"),
    "gpu-masked_lm-chunked": (GPU, "masked_lm", "chunked", ""),
    # A ViT's 17-token rows: on the GPU a dot XLA's Triton GEMM cannot tile without autotuning
    # (precompile.NO_TRITON_TILE), compiled with cuBLAS instead.
    "tpu-image_classification-plain": (TPU, "image_classification", "plain", ""),
    "gpu-image_classification-plain": (GPU, "image_classification", "plain", ""),
}


def tiny_config(task: str, attention_impl: str):
  config = default_config()
  config.task = task
  config.model.update(dict(vocab_size=256, num_layers=1, d_model=64, d_ff=128, num_heads=4,
                           max_len=64, dropout_rate=0.0, attention_impl=attention_impl,
                           matmul_dtype="bfloat16" if attention_impl == "cudnn" else ""))
  config.data.update(dict(max_len=32, tokens_per_batch=32 * 16))
  config.image.batch_size = 16
  return config


@pytest.fixture(scope="module", autouse=True)
def no_compilation_cache():
  """A compile read from the persistent cache skips the partitioner, and its log with it."""
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", True)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def compiled(request):
  (target_name, mesh), task, impl, kernel = CASES[request.param]
  target = targets.get_target(target_name)
  config = tiny_config(task, impl)
  report, executable = precompile.compile_train_step(config, target, mesh)
  decoding = precompile.compile_decoding(config, target, mesh, rows=8, length=16)
  return request.param, target, mesh, kernel, report, executable, decoding


def test_the_train_step_fits_without_replicating_a_tensor(compiled):
  name, target, _, _, report, executable, _ = compiled
  assert executable is not None and report.fits, f"{name}: {report.error or report.memory}"
  assert not report.rematerializations, f"{name}: {report.rematerializations}"
  assert 0 < report.peak_bytes < target.memory_bytes
  device = executable.input_shardings[0][0].params
  assert {d.platform for d in jax.tree.leaves(device)[0].mesh.devices.flat} == {target.platform}


def test_the_kernel_asked_for_is_in_the_program(compiled):
  name, _, _, kernel, report, _, _ = compiled
  if kernel:
    assert any(kernel in call for call in report.custom_calls), (
        f"{name}: no {kernel} among the custom calls {report.custom_calls}")
  else:
    flash = [c for c in report.custom_calls if "fmha" in c or "triton" in c or "tpu_custom" in c]
    assert not flash, f"{name}: a flash kernel in a program that asked for none: {flash}"


def test_parameters_are_split_as_the_rules_say(compiled):
  name, _, mesh, _, _, executable, _ = compiled
  params = traverse_util.flatten_dict(executable.input_shardings[0][0].params, sep="/")
  if "image" in name:  # Patches, not a vocabulary: d_model is split as every "embed" axis.
    assert params["patch_embedding/kernel"].spec == P(None, "fsdp")
  else:
    table = next(key for key in params if key.endswith("embedding/embedding"))
    assert params[table].spec == P("tensor", "fsdp"), f"{name}: {table} {params[table].spec}"
  kernel = next(s for key, s in params.items() if key.endswith("feed_forward/wi/kernel"))
  assert kernel.spec == P("fsdp", "tensor")
  shape = (64, 128)
  assert kernel.shard_shape(shape) == (64 // mesh["fsdp"], 128 // mesh["tensor"])


def test_decoding_compiles_where_the_task_decodes(compiled):
  name, _, _, _, report, _, decoding = compiled
  task = name.split("-")[1]
  if task in ("masked_lm", "image_classification"):
    assert decoding is None
    return
  decode_report, executable = decoding
  assert executable is not None and decode_report.fits, f"{name}: {decode_report.error}"
  assert not decode_report.rematerializations, f"{name}: {decode_report.rematerializations}"
  assert decode_report.program == ("beam search" if task == "translation" else "sampling")
