"""How fast is the train step? Target tokens/s, FLOP/s, MFU, compile time and peak memory.

  python benchmarks/train_step.py --config=experiments/configs/wmt14_base.py \
      --batch_size=64 --src_len=32 --tgt_len=32 --vocab_size=32000 --steps=5 --json \
      [--compare=torch] [--profile_dir=DIR]

The translation task's compiled step (the one training runs) on a synthetic batch
without padding; the median of --steps after --warmup. MFU is against an n×n matmul
peak measured before and after. --compare=torch pairs it with the same model in
`torch.nn.Transformer` layers (`torch_reference.py`, the `[bench]` extra), alternating
steps in one process; any config key can be overridden (`--config.model.dtype=bfloat16`).
"""

from __future__ import annotations

import resource
import statistics
import time

from absl import flags

import common
from profiling import profile_steps, profile_table
from report import format_number, precision_label
from timing import alternate, median_time

FLAGS = flags.FLAGS
flags.DEFINE_integer("tgt_len", 32, "Target tokens per sentence (no padding).")
flags.DEFINE_integer("steps", 10, "Timed steps after warm-up; the median is reported.")
flags.DEFINE_integer("warmup", 2, "Untimed steps after compiling.")
flags.DEFINE_enum("compare", "", ["", "torch"], "torch: the same step in torch.nn.Transformer layers.")
flags.DEFINE_bool("torch_compile", False, "--compare=torch: the reference under torch.compile "
                  "(inductor); its compile time (the first step) is reported apart.")
flags.DEFINE_integer("peak_matmul_size", 0, "n of the n×n matmul timed for the peak; 0: auto.")
flags.DEFINE_string("prng_impl", "", "jax_default_prng_impl for dropout (e.g. rbg); '' keeps.")

Result = common.Result


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


def measure() -> tuple[Result, list[tuple[str, str]]]:
  import jax

  from transformer_jax import sharding
  from transformer_jax.model.config import ModelConfig
  from transformer_jax.model.info import parameter_counts
  from transformer_jax.tasks.translation import TranslationTask
  from transformer_jax.training import loop
  from transformer_jax.training.config import LoopConfig
  from transformer_jax.training.schedules import OptimizerConfig

  if FLAGS.prng_impl:
    jax.config.update("jax_default_prng_impl", FLAGS.prng_impl)
  config = common.benchmark_config()
  sharding.use_cpu_devices(config.cpu_devices)  # --config.cpu_devices=2: as the train command.
  mesh = sharding.make_mesh(config.mesh)
  common.check_batch(mesh)
  model_config = ModelConfig.from_config(config.model)
  # The peak is measured before and after the steps and the higher kept, so a burst of
  # load during one measurement does not inflate MFU.
  peak_before = common.measure_matmul_peak(
      model_config.matmul_dtype, FLAGS.peak_matmul_size, result_dtype=model_config.dtype)
  start = time.perf_counter()
  _, state, train_fn, _ = loop.build_steps(LoopConfig.from_config(config),
                                           OptimizerConfig.from_config(config),
                                           TranslationTask(config), mesh)
  jax.block_until_ready(state)
  init_s = time.perf_counter() - start  # Initialisation; the step compiles below.
  params = parameter_counts(state.params)["total"]
  vocab = model_config.vocab_size
  batch = sharding.global_batch(dict(
      src_tokens=common.synthetic_tokens(FLAGS.batch_size, FLAGS.src_len, vocab, 1),
      target_tokens=common.synthetic_tokens(FLAGS.batch_size, FLAGS.tgt_len, vocab, 2),
  ), mesh)

  with sharding.mesh_context(mesh):
    start = time.perf_counter()
    compiled = train_fn.lower(state, batch).compile()  # Compiling apart from running.
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
    memory, memory_source = common.peak_memory()  # JAX alone, before a paired reference.
    paired = None
    if FLAGS.compare == "torch" and FLAGS.compare_mode == "paired":
      reference = common.Reference(["train", *common.reference_args(model_config),
                                    f"--tgt_len={FLAGS.tgt_len}", *torch_compile_args()])
      torch_step, info = reference.module.make_train_step(reference.args)
      start = time.perf_counter()
      torch_step()  # Under --torch_compile this compiles.
      info["first_step_s"] = time.perf_counter() - start
      for _ in range(FLAGS.warmup - 1):
        torch_step()
      solo_times = times
      times, torch_times = alternate(step, torch_step, FLAGS.steps)
      step_s = statistics.median(times)
      paired = reference.module.train_result(reference.args, info, torch_times,
                                             compare_mode="paired",
                                             load_average=common.load_average(),
                                             jax_solo_step_times_s=solo_times)
    profile = profile_steps(compiled, step, FLAGS.profile_dir) if FLAGS.profile_dir else None

  def whole_step(key: str) -> float | None:  # XLA counts one device's share of the step.
    count = common.cost_analysis(compiled, key)
    return count * mesh.devices.size if count else count

  flops, bytes_accessed = whole_step("flops"), whole_step("bytes accessed")
  analytic = analytic_train_flops(model_config, FLAGS.batch_size, FLAGS.src_len, FLAGS.tgt_len)
  peak_after = common.measure_matmul_peak(
      model_config.matmul_dtype, FLAGS.peak_matmul_size, result_dtype=model_config.dtype)
  peak = max(peak_before, peak_after, key=lambda p: p["peak_flops_per_s"])
  # The peak is one device's; CPU devices (--config.cpu_devices) share one set of cores,
  # all of which the peak's matmul uses.
  if jax.devices()[0].platform != "cpu":
    peak = dict(peak, peak_flops_per_s=peak["peak_flops_per_s"] * mesh.devices.size)
  used = flops if flops else analytic
  result = dict(
      mode="train", config=common.config_name(), model=common.model_summary(model_config),
      params=params, batch_size=FLAGS.batch_size, src_len=FLAGS.src_len, tgt_len=FLAGS.tgt_len,
      steps=FLAGS.steps, step_time_s=step_s, step_times_s=times, step_time_best_s=min(times),
      target_tokens_per_s=FLAGS.batch_size * FLAGS.tgt_len / step_s,
      tokens_per_s=FLAGS.batch_size * (FLAGS.src_len + FLAGS.tgt_len) / step_s,
      flops_per_step=used,
      flops_source="xla cost_analysis" if flops else "analytic (matmuls, 3x forward)",
      flops_per_step_analytic=analytic, achieved_flops_per_s=used / step_s,
      mfu=used / step_s / peak["peak_flops_per_s"],
      mfu_best_step=used / min(times) / peak["peak_flops_per_s"], **peak,
      peak_flops_per_s_before_after=[peak_before["peak_flops_per_s"],
                                     peak_after["peak_flops_per_s"]],
      compile_s=compile_s, init_s=init_s, final_loss=float(holder["metrics"]["loss"]),
      peak_memory_bytes=memory, peak_memory_source=memory_source,
      devices=int(mesh.devices.size),
      # XLA's memory analysis is one device's: the temporaries per device, of `devices`.
      compiled_temp_bytes=common.compiled_temp_bytes(compiled),
      minor_page_faults_per_step=faults,
      bytes_accessed_per_step=bytes_accessed,
      prng_impl=FLAGS.prng_impl or "default",
  )
  if profile is not None:
    result["profile"] = profile
  if FLAGS.compare == "torch":
    compare_torch(result, model_config, paired)
  return result, table(result)


def torch_compile_args() -> list[str]:
  return ["--compile"] if FLAGS.torch_compile else []


def compare_torch(result: Result, model_config, paired: Result | None) -> None:
  reference = paired or common.run_reference(
      ["train", *common.reference_args(model_config), f"--tgt_len={FLAGS.tgt_len}",
       *torch_compile_args(),
       f"--steps={FLAGS.steps}", f"--warmup={FLAGS.warmup}"])
  reference.setdefault("compare_mode", "separate")
  result["torch"] = reference
  result["torch_target_tokens_per_s"] = reference["target_tokens_per_s"]
  result["jax_over_torch"] = result["target_tokens_per_s"] / reference["target_tokens_per_s"]
  # Best-of-N: less sensitive to other jobs on a shared host than the median.
  result["jax_over_torch_best"] = reference["step_time_best_s"] / result["step_time_best_s"]


def devices_note(result: Result) -> str:
  """', split over N devices' for a sharded step; empty on one device."""
  devices = result.get("devices", 1)
  return f", split over {devices} devices" if devices > 1 else ""


def table(result: Result) -> list[tuple[str, str]]:
  """The headline numbers, one (name, value) a line."""
  number = format_number
  rows = [
      ("config", f"{result['config']} ({result['params'] / 1e6:.1f}M params, "
                 f"{precision_label(result['model'])}, "
                 f"attention {result['model']['attention_impl']})"),
      ("batch", f"{result['batch_size']} × ({result['src_len']} + {result['tgt_len']}) tokens"
                f"{devices_note(result)}"),
      ("step time (median)", f"{result['step_time_s'] * 1e3:.1f} ms over {result['steps']} steps "
                             f"(best {result['step_time_best_s'] * 1e3:.1f} ms)"),
      ("target tokens/s", number(result["target_tokens_per_s"])),
      ("src+tgt tokens/s", number(result["tokens_per_s"])),
      ("FLOPs/step", f"{result['flops_per_step']:.4g} ({result['flops_source']}; analytic "
                     f"{result['flops_per_step_analytic']:.4g})"),
      ("achieved", f"{result['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s"),
      ("matmul peak", f"{result['peak_flops_per_s'] / 1e9:.2f} GFLOP/s "
                      f"({result['peak_matmul_size']}² {result['peak_dtype']} matmul, measured)"),
      ("MFU", f"{result['mfu'] * 100:.1f}% (best step: {result['mfu_best_step'] * 100:.1f}%)"),
      ("compile", f"{result['compile_s']:.1f} s"),
      ("page faults/step", f"{result['minor_page_faults_per_step']:,.0f} minor "
                           f"(≈{result['minor_page_faults_per_step'] * 4 / 2**20:.2f} GiB of 4 KiB pages)"),
      ("peak memory", f"{common.mib(result['peak_memory_bytes'])} ({result['peak_memory_source']})"),
  ]
  if "torch" in result:
    rows += [("torch target tokens/s", number(result["torch_target_tokens_per_s"])),
             ("JAX / torch", f"{result['jax_over_torch']:.2f}× (median), "
                             f"{result['jax_over_torch_best']:.2f}× (best step); "
                             f"{result['torch']['compare_mode']}")]
  if "profile" in result:
    rows.append(("profile", "\n" + profile_table(result["profile"])))
  return rows


if __name__ == "__main__":
  common.main(measure)
