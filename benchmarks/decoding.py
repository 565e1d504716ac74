"""How fast does a trained model translate? Greedy and beam search, sentences/s at fixed work.

  python benchmarks/decoding.py --config=experiments/configs/wmt14_base.py --beam_size=4 \
      --batch_size=64 --src_len=32 --decode_steps=40 --vocab_size=32000 --json \
      [--compare=marian] [--growing_cache] [--profile_dir=DIR]

`Translator` with random weights on synthetic sources; every sentence decodes exactly
--decode_steps tokens (EOS ignored), so the work is the same on both sides.
--compare=marian pairs it with Hugging Face's `MarianMTModel.generate` at the same size
(`torch_reference.py`, the `[bench]` extra), alternating calls in one process.
"""

from __future__ import annotations

import os
import statistics
import time

from absl import flags

import common
from profiling import profile_steps, profile_table
from report import precision_label
from timing import alternate, median_time

FLAGS = flags.FLAGS
flags.DEFINE_integer("beam_size", 4, "Beam size; greedy search is timed too (1: greedy only).")
flags.DEFINE_integer("decode_steps", 40, "New tokens per sentence (EOS ignored).")
flags.DEFINE_integer("decode_repeats", 3, "Timed decoding calls per method; the median is reported.")
flags.DEFINE_bool("growing_cache", None, "Decode with a growing self-attention cache "
                  "(DecodeOptions.growing_cache); unset: the package's default (on for beam "
                  "search, off for greedy).")
flags.DEFINE_enum("compare", "", ["", "marian"],
                  "marian: transformers.MarianMTModel.generate, random weights of the same size.")

Result = common.Result


def measure() -> tuple[Result, list[tuple[str, str]]]:
  import jax
  import numpy as np
  from flax import linen as nn

  from transformer_jax import sharding
  from transformer_jax.decode.translator import DecodeOptions, Translator
  from transformer_jax.errors import UserError
  from transformer_jax.model.info import parameter_counts
  from transformer_jax.tasks.translation import TranslationTask

  if FLAGS.decode_steps < FLAGS.src_len:
    raise UserError(f"--decode_steps={FLAGS.decode_steps} must be >= --src_len={FLAGS.src_len}: "
                    "Translator decodes up to input length + max_extra_len tokens")
  config = common.benchmark_config()
  mesh = sharding.make_mesh(config.mesh)
  common.check_batch(mesh)
  task = TranslationTask(config)
  model = task.build_model()
  params = jax.jit(lambda key: nn.unbox(task.init_params(model, key)))(jax.random.key(config.seed))
  src = common.synthetic_tokens(FLAGS.batch_size, FLAGS.src_len, model.config.vocab_size, 3)
  methods = [("greedy", 1)] + ([("beam", FLAGS.beam_size)] if FLAGS.beam_size > 1 else [])
  runs, marian_runs, profiles = {}, {}, {}
  paired = FLAGS.compare == "marian" and FLAGS.compare_mode == "paired"
  if paired:
    reference = common.Reference(["decode", *common.reference_args(model.config),
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
    if paired:
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
  memory, memory_source = common.peak_memory()
  main = runs["beam" if FLAGS.beam_size > 1 else "greedy"]
  result = dict(
      mode="decode", config=common.config_name(), model=common.model_summary(model.config),
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
        load_average=common.load_average())
  if FLAGS.compare == "marian":
    compare_marian(result, model.config)
  return result, table(result)


def compare_marian(result: Result, model_config) -> None:
  reference = result.get("marian") or common.run_reference(
      ["decode", *common.reference_args(model_config), f"--decode_steps={FLAGS.decode_steps}",
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


def table(result: Result) -> list[tuple[str, str]]:
  """The headline numbers, one (name, value) a line."""
  rows = [("config", f"{result['config']} ({result['params'] / 1e6:.1f}M params, "
                     f"{precision_label(result['model'])})"),
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
  rows.append(("peak memory", f"{common.mib(result['peak_memory_bytes'])} "
                              f"({result['peak_memory_source']})"))
  for method, profile in result.get("profiles", {}).items():
    rows.append((f"profile ({method})", "\n" + profile_table(profile, f"{method} decoding call")))
  return rows


if __name__ == "__main__":
  common.main(measure)
