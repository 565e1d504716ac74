"""Speed benchmarks: the training step, decoding, and attention against length.

  # Training step (target tokens/s, FLOP/s, MFU, compile time, peak memory):
  python experiments/benchmark.py --config=experiments/configs/wmt14_base.py \
      --batch_size=64 --src_len=32 --tgt_len=32 --vocab_size=32000 --steps=5 --json \
      [--compare=torch]
  # Decoding, greedy and beam; every sentence decodes exactly --decode_steps tokens:
  python experiments/benchmark.py --config=experiments/configs/wmt14_base.py --decode \
      --beam_size=4 --batch_size=64 --src_len=32 --decode_steps=40 --vocab_size=32000 --json \
      [--compare=marian]
  # Attention time and memory from 128 to 8192 tokens, plain against fused:
  python experiments/benchmark.py --attention --json

Any config key can be overridden as in training (`--config.model.dtype=bfloat16`,
`--config.model.attention_impl=cudnn`). With `--json` the last line printed is
one JSON object (training: `target_tokens_per_s`; decoding: `sentences_per_s`).
Each run is also appended to `benchmarks/results/<device>_<date>.json`, and
`benchmarks/README.md` is rebuilt from every results file.

The comparisons go through `experiments/torch_reference.py` and need the `[bench]`
extra (torch, transformers). By default (`--compare_mode=paired`) the reference is
loaded into this process and its steps alternate with JAX's, so both see the same
load on a shared host; `--compare_mode=separate` runs it in a subprocess afterwards
(its own peak memory). `--profile_dir` adds an op-by-op breakdown of the train step.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from absl import app, flags
from ml_collections import config_flags

from profiling import profile_steps  # experiments/profiling.py
from timing import median_time  # experiments/timing.py

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", str(REPO_ROOT / "experiments" / "configs" / "wmt14_base.py"),
    "Experiment config file; its model and optimizer are benchmarked.", lock_config=False,
)
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (no padding).")
flags.DEFINE_integer("tgt_len", 32, "Target tokens per sentence (no padding).")
flags.DEFINE_integer("vocab_size", 0, "Overrides config.model.vocab_size; 0 keeps the config's.")
flags.DEFINE_integer("steps", 10, "Timed steps (training) after warm-up; the median is reported.")
flags.DEFINE_integer("warmup", 2, "Untimed steps after compiling.")
flags.DEFINE_bool("decode", False, "Benchmark decoding instead of training.")
flags.DEFINE_integer("beam_size", 4, "Beam size; greedy search is timed too (1: greedy only).")
flags.DEFINE_integer("decode_steps", 40, "New tokens per sentence (EOS ignored).")
flags.DEFINE_integer("decode_repeats", 3, "Timed decoding calls per method; the median is reported.")
flags.DEFINE_bool("growing_cache", None, "Decode with a growing self-attention cache "
                  "(DecodeOptions.growing_cache); unset: the package's default (on for beam "
                  "search, off for greedy).")
flags.DEFINE_bool("attention", False, "Benchmark attention against sequence length.")
flags.DEFINE_list("attention_lengths", "128,256,512,1024,2048,4096,8192", "Sequence lengths.")
flags.DEFINE_list("attention_impls", "", "Implementations; default plain,xla (+cudnn on GPU).")
flags.DEFINE_integer("attention_tokens", 8192, "batch = max(1, attention_tokens / length).")
flags.DEFINE_integer("attention_heads", 8, "Heads.")
flags.DEFINE_integer("attention_depth", 64, "Depth per head.")
flags.DEFINE_string("attention_dtype", "", "Default: float32 on CPU, bfloat16 on GPU.")
flags.DEFINE_float("attention_max_seconds", 10.0,
                   "Longer lengths are skipped once one call takes longer than this.")
flags.DEFINE_float("attention_max_gib", 6.0,
                   "Skip a length whose compiled temporary buffers exceed this (CPU RAM guard).")
flags.DEFINE_enum("compare", "", ["", "torch", "marian"],
                  "torch: the training step in torch.nn.Transformer; marian: decoding in "
                  "transformers.MarianMTModel (random weights of the same size).")
flags.DEFINE_enum("compare_mode", "paired", ["paired", "separate"],
                  "paired: the reference runs in this process and its steps alternate with "
                  "JAX's (A B B A ...), so both see the same load on a shared host; separate: "
                  "a subprocess after the JAX run (its own peak memory, but another moment's load).")
flags.DEFINE_integer("torch_threads", 2, "torch.set_num_threads for the comparison.")
flags.DEFINE_enum("reference_dtype", "auto", ["auto", "float32", "bfloat16"],
                  "The reference's precision. auto: bf16 autocast when JAX's matmuls are bf16, "
                  "else float32 (like for like); float32 compares a mixed JAX run with the "
                  "reference's default.")
flags.DEFINE_bool("json", False, "Print one JSON object as the last line.")
flags.DEFINE_string("label", "", "Free text stored with the run (e.g. 'bf16', 'rbg-prng').")
flags.DEFINE_string("note", "", "A remark shown in benchmarks/README.md (e.g. what else was running).")
flags.DEFINE_string("results_dir", "benchmarks/results",
                    "Where runs are appended (relative to the repo root); '' saves nothing.")
flags.DEFINE_string("summary", "benchmarks/README.md",
                    "Markdown summary rebuilt from results_dir; '' writes none.")
flags.DEFINE_string("profile_dir", "",
                    "Trace 2 train steps (or one call per decoding method) here and print "
                    "where the time goes.")
flags.DEFINE_integer("peak_matmul_size", 0, "n of the n×n matmul timed for the peak; 0: auto.")
flags.DEFINE_string("prng_impl", "", "jax_default_prng_impl for dropout (e.g. rbg); '' keeps.")

Result = dict[str, Any]


# --- Shared helpers ------------------------------------------------------------------


def load_average() -> list[float]:
  """The 1-, 5- and 15-minute load averages (timings on a shared host are noisy)."""
  return [round(x, 2) for x in os.getloadavg()]


def device_info() -> Result:
  """What the numbers were measured on."""
  import jax

  device = jax.devices()[0]
  info = dict(platform=device.platform, device_kind=device.device_kind,
              devices=jax.device_count(), jax=jax.__version__,
              host_cpus=os.cpu_count(), host_cpu=_cpu_model(),
              xla_flags=os.environ.get("XLA_FLAGS", ""))
  return info


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def peak_memory() -> tuple[int, str]:
  """(bytes, source): the device's peak on an accelerator, else this process's peak RSS."""
  import jax

  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host peak RSS"


def measure_matmul_peak(dtype: str, size: int = 0, repeats: int = 8,
                        result_dtype: str = "") -> Result:
  """The best FLOP/s of an n×n×n matmul on device 0, the denominator of MFU.

  `dtype` is the operand dtype; with a different `result_dtype` the product
  accumulates into that dtype, as the model's mixed-precision matmuls do
  (`transformer_jax/precision.py`). Best of `repeats`: other jobs on a shared
  host only ever make it slower.
  """
  import jax
  import jax.numpy as jnp

  device = jax.devices()[0]
  size = size or (2048 if device.platform == "cpu" else 8192)
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(k, (size, size), jnp.dtype(dtype)) for k in keys)
  result_dtype = jnp.dtype(result_dtype or dtype)
  matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=result_dtype))
  matmul(a, b).block_until_ready()
  _, times = median_time(lambda: matmul(a, b).block_until_ready(), repeats)
  peak_dtype = str(jnp.dtype(dtype))
  if result_dtype != jnp.dtype(dtype):
    peak_dtype += f" -> {result_dtype}"
  return dict(peak_flops_per_s=2 * size**3 / min(times), peak_matmul_size=size,
              peak_dtype=peak_dtype)


def cost_analysis(compiled, key: str = "flops") -> float | None:
  """XLA's own count ("flops", "bytes accessed") for a compiled executable, or None."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # Not every backend implements it.
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  value = (analysis or {}).get(key)
  return float(value) if value and value > 0 else None


def analytic_train_flops(model_config, batch_size: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs of one training step: 3 × forward (backward = 2 × forward).

  Counts every projection, QKᵀ, the attention-weighted sum of V, the FFN and
  the output projection; ignores softmax, LayerNorm and the optimizer.
  """
  m = model_config
  d, qk, v = m.d_model, m.num_heads * m.d_k, m.num_heads * m.d_v

  def attention(q_len: int, kv_len: int) -> float:
    projections = 2 * q_len * d * qk + 2 * kv_len * d * (qk + v) + 2 * q_len * v * d
    return projections + 2 * q_len * kv_len * (qk + v)

  ffn = lambda n: 4 * n * d * m.d_ff
  encoder = m.num_encoder_layers * (attention(src_len, src_len) + ffn(src_len))
  decoder = m.num_decoder_layers * (
      attention(tgt_len, tgt_len) + attention(tgt_len, src_len) + ffn(tgt_len))
  logits = 2 * tgt_len * d * m.vocab_size
  return 3.0 * batch_size * (encoder + decoder + logits)


def synthetic_tokens(rows: int, length: int, vocab_size: int, seed: int):
  """int32[rows, length]: random non-special tokens ending in EOS; no PAD."""
  import numpy as np

  from transformer_jax.special_tokens import EOS_ID

  tokens = np.random.default_rng(seed).integers(4, vocab_size, size=(rows, length))
  tokens[:, -1] = EOS_ID
  return tokens.astype(np.int32)


def config_name() -> str:
  filename = config_flags.get_config_filename(FLAGS["config"])
  return pathlib.Path(filename).stem if filename else "default"


def _model_summary(model_config) -> Result:
  m = model_config
  return dict(d_model=m.d_model, d_ff=m.d_ff, num_heads=m.num_heads,
              encoder_layers=m.num_encoder_layers, decoder_layers=m.num_decoder_layers,
              vocab_size=m.vocab_size, dtype=m.dtype, matmul_dtype=m.matmul_dtype,
              attention_impl=m.attention_impl,
              dropout_rate=m.dropout_rate, norm=m.norm)


def _check_batch(mesh) -> None:
  from transformer_jax import sharding
  from transformer_jax.errors import UserError

  shards = sharding.batch_shards(mesh)
  if FLAGS.batch_size % shards:
    raise UserError(f"--batch_size={FLAGS.batch_size} does not divide over {shards} batch "
                    f"shards; use a multiple of {shards}")


# --- Training ------------------------------------------------------------------------


def benchmark_training(config) -> Result:
  """Times the translation task's compiled train step on a synthetic batch (no padding)."""
  import jax

  from transformer_jax import sharding
  from transformer_jax.model.config import ModelConfig
  from transformer_jax.model.info import parameter_counts
  from transformer_jax.tasks.translation import TranslationTask
  from transformer_jax.training import loop

  mesh = sharding.make_mesh(config.mesh)
  _check_batch(mesh)
  model_config = ModelConfig.from_config(config.model)
  # The peak is measured before and after the steps and the higher kept, so a burst of
  # load during one measurement does not inflate MFU.
  peak_before = measure_matmul_peak(
      model_config.matmul_dtype, FLAGS.peak_matmul_size, result_dtype=model_config.dtype)
  start = time.perf_counter()
  model, state, train_fn, _ = loop.build_steps(config, TranslationTask(config), mesh)
  jax.block_until_ready(state)
  init_s = time.perf_counter() - start  # Initialisation; the steps compile below.
  params = parameter_counts(state.params)["total"]
  vocab = model.config.vocab_size
  batch = sharding.global_batch(dict(
      src_tokens=synthetic_tokens(FLAGS.batch_size, FLAGS.src_len, vocab, 1),
      target_tokens=synthetic_tokens(FLAGS.batch_size, FLAGS.tgt_len, vocab, 2),
  ), mesh)

  with sharding.mesh_context(mesh):
    # Lowering the step ahead of time separates compiling from running.
    start = time.perf_counter()
    compiled = train_fn.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    holder = dict(state=state)

    def step():
      holder["state"], metrics = compiled(holder["state"], batch)
      jax.block_until_ready((holder["state"], metrics))
      holder["metrics"] = metrics

    for _ in range(FLAGS.warmup):
      step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step_s, times = median_time(step, FLAGS.steps)
    # Minor page faults per step: on the CPU, temporaries the allocator hands back to
    # the OS are faulted in (and zeroed) again on every step.
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / max(1, FLAGS.steps)
    jax_only_memory = peak_memory()
    paired = None
    if FLAGS.compare == "torch" and FLAGS.compare_mode == "paired":
      reference = load_reference(["train", *model_args(model.config), f"--tgt_len={FLAGS.tgt_len}"])
      torch_step, info = reference.module.make_train_step(reference.args)
      for _ in range(FLAGS.warmup):
        torch_step()
      solo_times = times
      times, torch_times = alternate(step, torch_step, FLAGS.steps)
      step_s = statistics.median(times)
      paired = reference.module.train_result(reference.args, info, torch_times,
                                             compare_mode="paired", load_average=load_average(),
                                             jax_solo_step_times_s=solo_times)
    profile = None
    if FLAGS.profile_dir:
      profile = profile_steps(compiled, step, FLAGS.profile_dir)
  loss = float(holder["metrics"]["loss"])
  memory, memory_source = jax_only_memory

  flops = cost_analysis(compiled, "flops")
  analytic = analytic_train_flops(model.config, FLAGS.batch_size, FLAGS.src_len, FLAGS.tgt_len)
  peak_after = measure_matmul_peak(
      model.config.matmul_dtype, FLAGS.peak_matmul_size, result_dtype=model.config.dtype)
  peak = max(peak_before, peak_after, key=lambda p: p["peak_flops_per_s"])
  used = flops if flops else analytic
  target_tokens = FLAGS.batch_size * FLAGS.tgt_len
  result = dict(
      mode="train", config=config_name(), model=_model_summary(model.config), params=params,
      batch_size=FLAGS.batch_size, src_len=FLAGS.src_len, tgt_len=FLAGS.tgt_len,
      steps=FLAGS.steps, step_time_s=step_s, step_times_s=times, step_time_best_s=min(times),
      target_tokens_per_s=target_tokens / step_s,
      tokens_per_s=FLAGS.batch_size * (FLAGS.src_len + FLAGS.tgt_len) / step_s,
      flops_per_step=used,
      flops_source="xla cost_analysis" if flops else "analytic (matmuls, 3x forward)",
      flops_per_step_analytic=analytic, achieved_flops_per_s=used / step_s,
      mfu=used / step_s / peak["peak_flops_per_s"],
      mfu_best_step=used / min(times) / peak["peak_flops_per_s"], **peak,
      peak_flops_per_s_before_after=[peak_before["peak_flops_per_s"],
                                     peak_after["peak_flops_per_s"]],
      compile_s=compile_s, init_s=init_s, final_loss=loss,
      peak_memory_bytes=memory, peak_memory_source=memory_source,
      compiled_temp_bytes=_compiled_temp_bytes(compiled), minor_page_faults_per_step=faults,
      bytes_accessed_per_step=cost_analysis(compiled, "bytes accessed"),
  )
  if profile is not None:
    result["profile"] = profile
  if paired is not None:
    result["torch"] = paired
  return result


def _compiled_temp_bytes(compiled) -> int | None:
  try:
    return int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:
    return None


# --- Decoding ------------------------------------------------------------------------


def benchmark_decoding(config) -> Result:
  """Greedy and beam search with `Translator`, each sentence exactly --decode_steps tokens."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import linen as nn

  from transformer_jax import sharding
  from transformer_jax.decode.translator import DecodeOptions, Translator
  from transformer_jax.errors import UserError
  from transformer_jax.model.transformer import Transformer
  from transformer_jax.model.info import parameter_counts

  if FLAGS.decode_steps < FLAGS.src_len:
    raise UserError(f"--decode_steps={FLAGS.decode_steps} must be >= --src_len={FLAGS.src_len}: "
                    "Translator decodes up to input length + max_extra_len tokens")
  mesh = sharding.make_mesh(config.mesh)
  _check_batch(mesh)
  model = Transformer(config.model)
  tokens = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(lambda key: nn.unbox(model.init(key, tokens, tokens)["params"]))(
      jax.random.key(config.seed))
  src = synthetic_tokens(FLAGS.batch_size, FLAGS.src_len, model.config.vocab_size, 3)
  methods = [("greedy", 1)] + ([("beam", FLAGS.beam_size)] if FLAGS.beam_size > 1 else [])
  runs, marian_runs, profiles = {}, {}, {}
  if FLAGS.compare == "marian" and FLAGS.compare_mode == "paired":
    reference = load_reference(["decode", *model_args(model.config),
                                f"--decode_steps={FLAGS.decode_steps}",
                                f"--beam_size={FLAGS.beam_size}"])
    generators, marian_info = reference.module.make_generators(reference.args)
  for method, beam_size in methods:
    options = DecodeOptions(method=method, beam_size=beam_size, ignore_eos=True,
                            max_extra_len=FLAGS.decode_steps - FLAGS.src_len,
                            growing_cache=FLAGS.growing_cache)
    translator = Translator(model, params, mesh, options)
    start = time.perf_counter()
    out = translator(src)
    first_s = time.perf_counter() - start
    if out.shape != (FLAGS.batch_size, FLAGS.decode_steps):
      raise RuntimeError(f"decoded shape {out.shape}, expected "
                         f"{(FLAGS.batch_size, FLAGS.decode_steps)}")
    if FLAGS.compare == "marian" and FLAGS.compare_mode == "paired":
      generate = generators[method][1]
      start = time.perf_counter()
      generate()
      marian_first_s = time.perf_counter() - start
      times, marian_times = alternate(lambda: translator(src), generate, FLAGS.decode_repeats)
      seconds = statistics.median(times)
      marian_runs[method] = dict(beam_size=beam_size, times_s=marian_times,
                                 first_call_s=marian_first_s)
    else:
      seconds, times = median_time(lambda: translator(src), FLAGS.decode_repeats)
    if FLAGS.profile_dir:
      profiles[method] = profile_steps(translator.lower(src).compile(), lambda: translator(src),
                                       os.path.join(FLAGS.profile_dir, method), steps=1,
                                       name=f"decode_{method}")
    runs[method] = dict(
        beam_size=beam_size, seconds=seconds, times_s=times, best_s=min(times),
        sentences_per_s=FLAGS.batch_size / seconds,
        tokens_per_s=FLAGS.batch_size * FLAGS.decode_steps / seconds,
        first_call_s=first_s,  # Compiling + one run: on a loaded host the difference is noise.
        growing_cache=options.grows_cache,
        distinct_tokens=int(len(np.unique(out))),
    )
  memory, memory_source = peak_memory()
  main = runs["beam" if FLAGS.beam_size > 1 else "greedy"]
  result = dict(
      mode="decode", config=config_name(), model=_model_summary(model.config),
      params=parameter_counts(params)["total"], batch_size=FLAGS.batch_size,
      src_len=FLAGS.src_len, decode_steps=FLAGS.decode_steps, beam_size=FLAGS.beam_size,
      sentences_per_s=main["sentences_per_s"], tokens_per_s=main["tokens_per_s"],
      seconds=main["seconds"], methods=runs,
      peak_memory_bytes=memory, peak_memory_source=memory_source,
  )
  if profiles:
    result["profiles"] = profiles
  if marian_runs:
    result["marian"] = reference.module.decode_result(
        reference.args, marian_info, marian_runs, compare_mode="paired",
        load_average=load_average())
  return result


# --- Attention against length ----------------------------------------------------------


def benchmark_attention() -> Result:
  """Forward and forward+backward time and compiled memory of `dot_product_attention`."""
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.attention import dot_product_attention

  on_cpu = jax.devices()[0].platform == "cpu"
  impls = FLAGS.attention_impls or (["plain", "xla"] + ([] if on_cpu else ["cudnn"]))
  dtype = jnp.dtype(FLAGS.attention_dtype or ("float32" if on_cpu else "bfloat16"))
  heads, depth = FLAGS.attention_heads, FLAGS.attention_depth
  rows = []
  for impl in impls:
    too_slow = None
    for length in (int(x) for x in FLAGS.attention_lengths):
      batch = max(1, FLAGS.attention_tokens // length)
      row = dict(impl=impl, length=length, batch=batch, heads=heads, depth=depth,
                 dtype=str(dtype))
      if too_slow:
        rows.append(dict(row, skipped=too_slow))
        continue
      keys = jax.random.split(jax.random.key(length), 3)
      q, k, v = (jax.random.normal(key, (batch, length, heads, depth), dtype) for key in keys)
      mask = jnp.ones((batch, 1, 1, length), bool)  # Encoder-style key padding mask.
      attend = lambda q, k, v, mask: dot_product_attention(q, k, v, mask, impl)
      loss = lambda q, k, v, mask: jnp.sum(attend(q, k, v, mask).astype(jnp.float32))
      for name, fn in (("forward", attend),
                       ("forward_backward", jax.grad(loss, argnums=(0, 1, 2)))):
        try:
          compiled = jax.jit(fn).lower(q, k, v, mask).compile()
          temp = _compiled_temp_bytes(compiled)
          row[f"{name}_temp_bytes"] = temp
          if on_cpu and temp and temp > FLAGS.attention_max_gib * 2**30:
            row[f"{name}_skipped"] = f"needs {temp / 2**30:.1f} GiB > --attention_max_gib"
            too_slow = row[f"{name}_skipped"]
            continue
          jax.block_until_ready(compiled(q, k, v, mask))
          seconds, _ = median_time(lambda: jax.block_until_ready(compiled(q, k, v, mask)), 3)
          row[f"{name}_s"] = seconds
          row[f"{name}_tokens_per_s"] = batch * length / seconds
          if seconds > FLAGS.attention_max_seconds:
            too_slow = f"length {length} took {seconds:.1f} s > --attention_max_seconds"
        except Exception as e:  # e.g. cuDNN's dtype / shape limits: record, go on.
          row[f"{name}_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
      rows.append(row)
      print(_attention_line(row), flush=True)
  memory, memory_source = peak_memory()
  return dict(mode="attention", rows=rows, peak_memory_bytes=memory,
              peak_memory_source=memory_source)


def _attention_line(row: Result) -> str:
  def cell(name: str) -> str:
    if f"{name}_s" in row:
      temp = row.get(f"{name}_temp_bytes")
      memory = f"{temp / 2**20:8.1f} MiB" if temp is not None else "      ? MiB"
      return f"{row[f'{name}_s'] * 1e3:9.2f} ms {memory}"
    return f"{(row.get(f'{name}_error') or row.get(f'{name}_skipped') or row.get('skipped', ''))[:40]:>23}"
  return (f"attention {row['impl']:<6} L={row['length']:<5} batch={row['batch']:<3} "
          f"fwd {cell('forward')}  fwd+bwd {cell('forward_backward')}")


# --- Comparisons ---------------------------------------------------------------------------


class Reference:
  """experiments/torch_reference.py loaded in this process, with its parsed arguments."""

  def __init__(self, argv: list[str]):
    from transformer_jax.configs import load_module
    from transformer_jax.errors import UserError

    try:
      self.module = load_module(REPO_ROOT / "experiments" / "torch_reference.py")
    except ModuleNotFoundError as e:
      raise UserError(f"--compare needs the [bench] extra ({e}): "
                      "pip install torch==2.13.0 transformers") from None
    self.module.torch.set_num_threads(FLAGS.torch_threads)
    self.args = self.module.parse_args(argv)


def load_reference(argv: list[str]) -> Reference:
  return Reference(argv)


def alternate(first: Callable[[], Any], second: Callable[[], Any],
              pairs: int) -> tuple[list[float], list[float]]:
  """Times `pairs` calls of each, in the order A B B A A B ...; returns both lists of seconds."""
  times: tuple[list[float], list[float]] = ([], [])
  for i in range(max(1, pairs)):
    order = (0, 1) if i % 2 == 0 else (1, 0)
    for which in order:
      start = time.perf_counter()
      (first, second)[which]()
      times[which].append(time.perf_counter() - start)
  return times


def run_reference(args: list[str]) -> Result:
  """Runs experiments/torch_reference.py in a subprocess and parses its JSON last line."""
  from transformer_jax.errors import UserError

  command = [sys.executable, str(REPO_ROOT / "experiments" / "torch_reference.py"), *args,
             f"--threads={FLAGS.torch_threads}", "--json"]
  completed = subprocess.run(command, capture_output=True, text=True)
  lines = completed.stdout.strip().splitlines()
  if completed.returncode != 0 or not lines:
    error = (completed.stderr.strip().splitlines() or ["no output"])[-1]
    if "No module named" in error:
      raise UserError(f"--compare needs the [bench] extra ({error}): "
                      "pip install torch==2.13.0 transformers")
    raise RuntimeError(f"the reference failed: {error}")
  return json.loads(lines[-1])


def _torch_dtype(model_config) -> str:
  """--reference_dtype; auto: bfloat16 (autocast) when JAX's matmuls are bf16, else float32."""
  if FLAGS.reference_dtype != "auto":
    return FLAGS.reference_dtype
  return "bfloat16" if "bfloat16" in (model_config.dtype, model_config.matmul_dtype) else "float32"


_SHORT_DTYPES = {"bfloat16": "bf16", "float32": "f32"}


def precision_label(model: Result) -> str:
  """"float32", "bfloat16", or "float32, bf16 matmuls" for a result's model summary."""
  matmul = model.get("matmul_dtype", model["dtype"])
  short = _SHORT_DTYPES.get(matmul, matmul)
  return model["dtype"] if matmul == model["dtype"] else f"{model['dtype']}, {short} matmuls"


def reference_dtype(reference: Result | None) -> str:
  """The reference's precision for the summary: "f32", "bf16 autocast" or ""."""
  if not reference or "dtype" not in reference:
    return ""
  dtype = reference["dtype"]
  return _SHORT_DTYPES.get(dtype, dtype) + (" autocast" if dtype == "bfloat16" else "")


def model_args(model_config) -> list[str]:
  m = model_config
  return [f"--vocab_size={m.vocab_size}", f"--d_model={m.d_model}", f"--d_ff={m.d_ff}",
          f"--num_heads={m.num_heads}", f"--encoder_layers={m.num_encoder_layers}",
          f"--decoder_layers={m.num_decoder_layers}", f"--dropout={m.dropout_rate}",
          f"--dtype={_torch_dtype(m)}", f"--batch_size={FLAGS.batch_size}", f"--src_len={FLAGS.src_len}"]


def compare_torch(result: Result, model_config) -> None:
  reference = result.get("torch") or run_reference(
      ["train", *model_args(model_config), f"--tgt_len={FLAGS.tgt_len}",
       f"--steps={FLAGS.steps}", f"--warmup={FLAGS.warmup}"])
  reference.setdefault("compare_mode", "separate")
  result["torch"] = reference
  result["torch_target_tokens_per_s"] = reference["target_tokens_per_s"]
  result["jax_over_torch"] = result["target_tokens_per_s"] / reference["target_tokens_per_s"]
  # Best-of-N: less sensitive to other jobs on a shared host than the median.
  result["jax_over_torch_best"] = reference["step_time_best_s"] / result["step_time_best_s"]


def compare_marian(result: Result, model_config) -> None:
  reference = result.get("marian") or run_reference(
      ["decode", *model_args(model_config), f"--decode_steps={FLAGS.decode_steps}",
       f"--beam_size={FLAGS.beam_size}", f"--repeats={FLAGS.decode_repeats}"])
  reference.setdefault("compare_mode", "separate")
  result["marian"] = reference
  result["marian_sentences_per_s"] = reference["sentences_per_s"]
  result["jax_over_marian"] = result["sentences_per_s"] / reference["sentences_per_s"]
  for method, run in result["methods"].items():
    if method in reference.get("methods", {}):
      theirs = reference["methods"][method]
      run["jax_over_marian"] = run["sentences_per_s"] / theirs["sentences_per_s"]
      run["jax_over_marian_best"] = theirs["best_s"] / run["best_s"]


# --- Reporting -------------------------------------------------------------------------------


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
  return str(value)


def console_table(result: Result) -> str:
  """A two-column table of the headline numbers."""
  mib = lambda b: f"{b / 2**20:,.0f} MiB" if b else "?"
  if result["mode"] == "train":
    rows = [
        ("config", f"{result['config']} ({result['params'] / 1e6:.1f}M params, "
                   f"{precision_label(result['model'])}, attention {result['model']['attention_impl']})"),
        ("batch", f"{result['batch_size']} × ({result['src_len']} + {result['tgt_len']}) tokens"),
        ("step time (median)", f"{result['step_time_s'] * 1e3:.1f} ms over {result['steps']} steps "
                               f"(best {result['step_time_best_s'] * 1e3:.1f} ms)"),
        ("target tokens/s", _format(result["target_tokens_per_s"])),
        ("src+tgt tokens/s", _format(result["tokens_per_s"])),
        ("FLOPs/step", f"{result['flops_per_step']:.4g} ({result['flops_source']}; analytic "
                       f"{result['flops_per_step_analytic']:.4g})"),
        ("achieved", f"{result['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s"),
        ("matmul peak", f"{result['peak_flops_per_s'] / 1e9:.2f} GFLOP/s "
                        f"({result['peak_matmul_size']}² {result['peak_dtype']} matmul, measured)"),
        ("MFU", f"{result['mfu'] * 100:.1f}% (best step: {result['mfu_best_step'] * 100:.1f}%)"),
        ("compile", f"{result['compile_s']:.1f} s"),
        ("page faults/step", f"{result['minor_page_faults_per_step']:,.0f} minor "
                             f"(≈{result['minor_page_faults_per_step'] * 4 / 2**20:.2f} GiB of 4 KiB pages)"),
        ("peak memory", f"{mib(result['peak_memory_bytes'])} ({result['peak_memory_source']})"),
    ]
    if "torch" in result:
      rows += [("torch target tokens/s", _format(result["torch_target_tokens_per_s"])),
               ("JAX / torch", f"{result['jax_over_torch']:.2f}× (median), "
                               f"{result['jax_over_torch_best']:.2f}× (best step); "
                               f"{result['torch']['compare_mode']}")]
  elif result["mode"] == "decode":
    rows = [("config", f"{result['config']} ({result['params'] / 1e6:.1f}M params)"),
            ("batch", f"{result['batch_size']} × {result['src_len']} source tokens, "
                      f"{result['decode_steps']} new tokens each")]
    for method, run in result["methods"].items():
      rows.append((f"{method} (beam {run['beam_size']})",
                   f"{run['sentences_per_s']:.2f} sentences/s, {run['tokens_per_s']:.1f} "
                   f"tokens/s, {run['seconds']:.2f} s/batch (best {run['best_s']:.2f}), "
                   f"first call {run['first_call_s']:.1f} s"))
      marian = result.get("marian", {}).get("methods", {}).get(method)
      if marian:
        rows.append((f"  Marian {method}",
                     f"{marian['sentences_per_s']:.2f} sentences/s, {marian['seconds']:.2f} s/batch "
                     f"(best {marian['best_s']:.2f}); JAX / Marian {run['jax_over_marian']:.2f}× "
                     f"(median), {run['jax_over_marian_best']:.2f}× (best); "
                     f"{result['marian']['compare_mode']}"))
    rows.append(("peak memory", f"{mib(result['peak_memory_bytes'])} "
                                f"({result['peak_memory_source']})"))
  else:
    rows = [("attention rows", str(len(result["rows"])))]
  rows.append(("device", f"{result['device']['device_kind']} × {result['device']['devices']}"))
  rows.append(("load average", " ".join(map(str, result["load_average"]))))
  width = max(len(name) for name, _ in rows)
  lines = [f"  {name:<{width}}  {value}" for name, value in rows]
  if "profile" in result:
    lines.append(profile_table(result["profile"]))
  for method, profile in result.get("profiles", {}).items():
    lines.append(profile_table(profile, f"{method} decoding call"))
  return "\n".join(lines)


def profile_table(profile: Result, unit: str = "step") -> str:
  if "error" in profile:
    return f"  profile: {profile['error']}"
  lines = [f"  profile: {profile['op_seconds_per_step'] * 1e3:.0f} ms of op time per {unit} "
           "(summed over threads)"]
  for key in ("by_category", "by_component", "by_pass"):
    parts = ", ".join(f"{k} {v * 100:.0f}%" for k, v in profile[key].items())
    lines.append(f"    {key[3:]}: {parts}")
  lines.append("    top ops:")
  for op in profile["top_ops"][:12]:
    lines.append(f"      {op['share'] * 100:5.1f}% {op['seconds'] * 1e3:8.1f} ms  {op['op'][:28]:<28} "
                 f"{op['category']:<22} {op['component']:<22} {op['shape']}")
  return "\n".join(lines)


def results_path(result: Result) -> pathlib.Path:
  device = re.sub(r"[^a-z0-9]+", "_", result["device"]["device_kind"].lower()).strip("_")
  directory = pathlib.Path(FLAGS.results_dir)
  if not directory.is_absolute():
    directory = REPO_ROOT / directory
  return directory / f"{device}_{result['date']}.json"


def save_result(result: Result) -> pathlib.Path:
  """Appends the run to its device/date file (created on first use)."""
  path = results_path(result)
  path.parent.mkdir(parents=True, exist_ok=True)
  data = json.loads(path.read_text()) if path.exists() else dict(device=result["device"], runs=[])
  data["runs"].append(result)
  path.write_text(json.dumps(data, indent=1) + "\n")
  return path


GENERATED_MARKER = ("<!-- Everything below is generated by experiments/benchmark.py from "
                    "benchmarks/results/*.json; do not edit it by hand. -->")


def write_summary(results_dir: pathlib.Path, summary: pathlib.Path) -> None:
  """benchmarks/README.md: the hand-written part above GENERATED_MARKER is kept; below it,
  every saved run, one table per mode."""
  runs = []
  for path in sorted(results_dir.glob("*.json")):
    runs.extend(json.loads(path.read_text()).get("runs", []))
  mib = lambda b: f"{b / 2**20:,.0f}" if b else ""
  ratio = lambda x: f"{x:.2f}×" if isinstance(x, (int, float)) else ""
  when = lambda r: f"{r['date']} {r.get('time', '')[:5]}".strip()
  load = lambda r: str(r.get("load_average", [""])[0])
  kind = lambda r: f"{r['device']['device_kind']}×{r['device']['devices']}"
  written = summary.read_text() if summary.exists() else ""
  head = written[: written.index(GENERATED_MARKER)] if GENERATED_MARKER in written else "# Benchmarks\n\n"
  lines = [
      head.rstrip("\n"), "", GENERATED_MARKER, "", "## Every run", "",
      "Findings, profiles and optimisation candidates are in `NOTES.md`. On the shared 2-core",
      "CPU hosts timings are noisy: `load` is the 1-minute load average at the run's start;",
      "comparisons marked `paired` alternate JAX and reference steps in one process.",
      "", "Reproduce:", "", "```",
      "python experiments/benchmark.py --config=experiments/configs/wmt14_base.py --batch_size=64 \\",
      "    --src_len=32 --tgt_len=32 --vocab_size=32000 --steps=5 --json [--compare=torch]",
      "python experiments/benchmark.py --config=experiments/configs/wmt14_base.py --decode \\",
      "    --beam_size=4 --batch_size=64 --src_len=32 --decode_steps=40 --vocab_size=32000 --json \\",
      "    [--compare=marian]",
      "python experiments/benchmark.py --attention --json",
      "bash benchmarks/gpu_run.sh   # on a GPU: base and big in bf16, cuDNN attention, decoding",
      "```", "", "### Training step", "",
      "| date | device | config | label | dtype | batch × (src+tgt) | step ms | target tok/s | "
      "MFU | compile s | peak MiB | torch tok/s | torch dtype | JAX/torch (median) | JAX/torch (best) "
      "| load | note |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in (r for r in runs if r["mode"] == "train"):
    lines.append(
        f"| {when(r)} | {kind(r)} | {r['config']} | {r.get('label', '')} | {precision_label(r['model'])} "
        f"| {r['batch_size']} × ({r['src_len']}+{r['tgt_len']}) | {r['step_time_s'] * 1e3:.0f} "
        f"| {r['target_tokens_per_s']:,.0f} | {r['mfu'] * 100:.1f}% | {r['compile_s']:.1f} "
        f"| {mib(r['peak_memory_bytes'])} | {_format(r.get('torch_target_tokens_per_s', ''))} "
        f"| {reference_dtype(r.get('torch'))} | {ratio(r.get('jax_over_torch'))} "
        f"| {ratio(r.get('jax_over_torch_best'))} "
        f"| {load(r)} | {r.get('note', '')} |")
  lines += ["", "### Decoding (every sentence decodes exactly `decode_steps` tokens)", "",
            "| date | device | config | label | dtype | batch × src → new | method | sentences/s | "
            "tokens/s | Marian sentences/s | Marian dtype | JAX/Marian (median) | JAX/Marian (best) "
            "| load | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in (r for r in runs if r["mode"] == "decode"):
    for method, m in r["methods"].items():
      marian = r.get("marian", {}).get("methods", {}).get(method, {})
      lines.append(
          f"| {when(r)} | {kind(r)} | {r['config']} | {r.get('label', '')} "
          f"| {precision_label(r['model'])} | {r['batch_size']} × "
          f"{r['src_len']} → {r['decode_steps']} | {method} {m['beam_size']} "
          f"| {m['sentences_per_s']:.2f} | {m['tokens_per_s']:,.0f} "
          f"| {_format(marian.get('sentences_per_s', ''))} | {reference_dtype(r.get('marian'))} "
          f"| {ratio(m.get('jax_over_marian'))} "
          f"| {ratio(m.get('jax_over_marian_best'))} | {load(r)} | {r.get('note', '')} |")
  lines += ["", "### Attention against sequence length (forward / forward+backward)", "",
            "| date | device | impl | dtype | length | batch | fwd ms | fwd+bwd ms | "
            "fwd temp MiB | fwd+bwd temp MiB | note | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in (r for r in runs if r["mode"] == "attention"):
    for row in r["rows"]:
      ms = lambda name: f"{row[name] * 1e3:.1f}" if name in row else ""
      note = next((row[k] for k in ("skipped", "forward_skipped", "forward_error",
                                    "forward_backward_skipped", "forward_backward_error")
                   if k in row), "")
      lines.append(
          f"| {when(r)} | {kind(r)} | {row['impl']} | {row['dtype']} | {row['length']} "
          f"| {row['batch']} | {ms('forward_s')} | {ms('forward_backward_s')} "
          f"| {mib(row.get('forward_temp_bytes'))} | {mib(row.get('forward_backward_temp_bytes'))} "
          f"| {note[:60].replace('|', '/')} | {load(r)} |")
  summary.parent.mkdir(parents=True, exist_ok=True)
  summary.write_text("\n".join(lines) + "\n")


# --- Entry point ---------------------------------------------------------------------------------


def run(config) -> Result:
  """The benchmark the flags ask for, with the comparison if any."""
  import jax

  from transformer_jax.errors import UserError
  from transformer_jax.model.config import ModelConfig

  if FLAGS.prng_impl:
    jax.config.update("jax_default_prng_impl", FLAGS.prng_impl)
  if FLAGS.vocab_size:
    config.model.vocab_size = FLAGS.vocab_size
  model_config = ModelConfig.from_config(config.model)
  start_load = load_average()
  if FLAGS.attention:
    result = benchmark_attention()
  elif FLAGS.decode:
    if FLAGS.compare == "torch":
      raise UserError("--compare=torch times training; for --decode use --compare=marian")
    result = benchmark_decoding(config)
    if FLAGS.compare == "marian":
      compare_marian(result, model_config)
  else:
    if FLAGS.compare == "marian":
      raise UserError("--compare=marian times decoding; add --decode, or use --compare=torch")
    result = benchmark_training(config)
    if FLAGS.compare == "torch":
      compare_torch(result, model_config)
  now = datetime.datetime.now()
  result.update(label=FLAGS.label, note=FLAGS.note, device=device_info(), date=now.strftime("%Y-%m-%d"),
                time=now.strftime("%H:%M:%S"), load_average=start_load,
                load_average_end=load_average(), prng_impl=FLAGS.prng_impl or "default",
                command=" ".join(sys.argv[1:]))
  return result


def main(argv: list[str]) -> None:
  from transformer_jax.errors import exit_on_user_error

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  result = exit_on_user_error(run)(FLAGS.config)
  print(console_table(result), flush=True)
  if FLAGS.results_dir:
    path = save_result(result)
    print(f"  saved to {path}", flush=True)
    if FLAGS.summary:
      summary = pathlib.Path(FLAGS.summary)
      write_summary(path.parent, summary if summary.is_absolute() else REPO_ROOT / summary)
  if FLAGS.json:
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
  from transformer_jax.cli import common

  common.keep_freed_host_memory()  # As the package's commands do (see common.py); both sides share it.
  app.run(main)
