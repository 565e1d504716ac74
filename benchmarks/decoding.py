"""How fast does a trained model translate? Greedy and beam search, sentences/s at fixed work.

  python benchmarks/decoding.py --config=experiments/configs/wmt14_base.py --beam_size=4 \
      --batch_size=64 --src_len=32 --decode_steps=40 --vocab_size=32000 --json \
      [--compare=marian|ctranslate2] [--growing_cache] [--profile_dir=DIR] \
      [--shared_beam_cache] [--pair_shared_cache]

`Translator` with random weights on synthetic sources; every sentence decodes exactly
--decode_steps tokens (EOS ignored), so the work is the same on both sides.
--compare=marian pairs it with Hugging Face's `MarianMTModel.generate` at the same size
(`torch_reference.py`, the `[bench]` extra), alternating calls in one process.
--compare=ctranslate2 pairs it with CTranslate2's `translate_batch` on the same
model: these very weights, written by `transformer_jax.export` (whose outputs
tests/test_export.py checks against ours), in each of --ct2_compute_types, the
same source tokens and fixed work (min_decoding_length = max_decoding_length).
--pair_shared_cache times beam search with the other `shared_beam_cache` setting
too, alternating with ours before any comparison (`other_cache` in the row).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

from absl import flags

import common
from transformer_jax.cli import common as cli_common
from profiling import profile_steps, profile_table
from report import precision_label
from timing import alternate, median_time

FLAGS = flags.FLAGS
flags.DEFINE_integer("decode_steps", 40, "New tokens per sentence (EOS ignored).")
flags.DEFINE_integer("decode_repeats", 3, "Timed decoding calls per method; the median is reported.")
flags.DEFINE_enum("compare", "", ["", "marian", "ctranslate2"],
                  "marian: transformers.MarianMTModel.generate, random weights of the same size; "
                  "ctranslate2: CTranslate2 on this model's own weights.")
flags.DEFINE_list("ct2_compute_types", ["float32", "int8"],
                  "--compare=ctranslate2: CTranslate2 compute types to time.")
flags.DEFINE_bool("pair_shared_cache", False, "Also time beam search with the other "
                  "--shared_beam_cache setting, alternating with ours.")
# The search: translate's own flags (--beam_size, --alpha, --growing_cache, --quantize,
# --matmul_dtype, --shared_beam_cache, ...), with translate's defaults. Greedy search is timed,
# and beam search where --beam_size > 1 (--method is not read); CTranslate2 gets the float32
# weights either way.
cli_common.define_search_flags()

Result = common.Result


def measure() -> tuple[Result, list[tuple[str, str]]]:
  import jax
  import numpy as np
  from flax import linen as nn

  from transformer_jax import sharding
  from transformer_jax.decode.translator import Translator, shares_beam_cache
  from transformer_jax.errors import UserError
  from transformer_jax.model.info import parameter_counts
  from transformer_jax.tasks.translation import TranslationTask

  if FLAGS.decode_steps < FLAGS.src_len:
    raise UserError(f"--decode_steps={FLAGS.decode_steps} must be >= --src_len={FLAGS.src_len}: "
                    "Translator decodes up to input length + max_extra_len tokens")
  config = common.benchmark_config()
  sharding.use_cpu_devices(config.cpu_devices)  # --config.cpu_devices=2: the batch split.
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
  engines = ctranslate2_engines(model.config, params) if FLAGS.compare == "ctranslate2" else {}
  ct2_runs = {compute_type: {} for compute_type in engines}
  for method, beam_size in methods:
    options = dataclasses.replace(cli_common.decode_options(), method=method,
                                  beam_size=beam_size, ignore_eos=True,
                                  max_extra_len=FLAGS.decode_steps - FLAGS.src_len)
    translator = Translator(model, params, mesh, options)
    start = time.perf_counter()
    out = translator(src)
    first_s = time.perf_counter() - start
    if out.shape != (FLAGS.batch_size, FLAGS.decode_steps):
      raise RuntimeError(f"decoded shape {out.shape}, expected "
                         f"{(FLAGS.batch_size, FLAGS.decode_steps)}")
    shared = shares_beam_cache(translator.model, options)
    other_cache = None
    if FLAGS.pair_shared_cache and method == "beam":
      other = Translator(model, params, mesh,
                         dataclasses.replace(options, shared_beam_cache=not shared))
      other(src)  # Compiles.
      ours_s, other_s = alternate(lambda: translator(src), lambda: other(src),
                                  FLAGS.decode_repeats)
      other_cache = dict(shared_beam_cache=not shared, times_s=other_s,
                         sentences_per_s=FLAGS.batch_size / statistics.median(other_s),
                         ours_times_s=ours_s,
                         ours_over_other=statistics.median(other_s) / statistics.median(ours_s))
    if paired:
      generate = generators[method][1]
      start = time.perf_counter()
      generate()
      marian_first_s = time.perf_counter() - start
      times, marian_times = alternate(lambda: translator(src), generate, FLAGS.decode_repeats)
      seconds = statistics.median(times)
      marian_runs[method] = dict(beam_size=beam_size, times_s=marian_times,
                                 first_call_s=marian_first_s)
    elif engines:
      times = []
      for compute_type, engine in engines.items():
        decode = ctranslate2_call(engine, src, beam_size)
        start = time.perf_counter()
        decode()
        engine_first_s = time.perf_counter() - start
        ours, theirs = alternate(lambda: translator(src), decode, FLAGS.decode_repeats)
        times += ours
        ct2_runs[compute_type][method] = dict(
            beam_size=beam_size, times_s=theirs, seconds=statistics.median(theirs),
            best_s=min(theirs), sentences_per_s=FLAGS.batch_size / statistics.median(theirs),
            first_call_s=engine_first_s)
      seconds = statistics.median(times)
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
        shrink_batch=options.shrink_batch,  # Fixed work (EOS ignored, equal lengths): no effect.
        shared_beam_cache=shared,
        distinct_tokens=int(len(np.unique(out))),
    )
    if other_cache:
      runs[method]["other_cache"] = other_cache
  memory, memory_source = common.peak_memory()
  main = runs["beam" if FLAGS.beam_size > 1 else "greedy"]
  result = dict(
      mode="decode", config=common.config_name(),
      model=common.model_summary(translator.model.config),
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
  if ct2_runs:
    import ctranslate2

    result["ctranslate2"] = dict(version=ctranslate2.__version__, compare_mode="paired",
                                 threads=os.cpu_count(), compute_types=ct2_runs)
    for compute_type, engine_runs in ct2_runs.items():
      for method, theirs in engine_runs.items():
        run = runs[method]
        run[f"jax_over_ct2_{compute_type}"] = run["sentences_per_s"] / theirs["sentences_per_s"]
  return result, table(result)


def ctranslate2_engines(model_config, params) -> dict:
  """{compute type: ctranslate2.Translator} of this model's weights (`transformer_jax.export`)."""
  import tempfile

  import ctranslate2
  import jax
  import numpy as np

  from transformer_jax.interop.ctranslate2_export import model_spec, write_model

  tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, model_config.vocab_size)]
  spec = model_spec(model_config, jax.tree.map(np.array, params), tokens)
  directory = tempfile.mkdtemp(prefix="ct2_benchmark_")
  write_model(spec, directory)
  return {compute_type: ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                               intra_threads=os.cpu_count() or 1)
          for compute_type in FLAGS.ct2_compute_types}


def ctranslate2_call(engine, src, beam_size: int):
  """One translate_batch over the same sources: every sentence --decode_steps tokens."""
  batch = [[f"t{i}" for i in row[:-1]] for row in src.tolist()]  # It appends </s> itself.

  def decode():
    results = engine.translate_batch(
        batch, beam_size=beam_size, max_decoding_length=FLAGS.decode_steps,
        min_decoding_length=FLAGS.decode_steps, max_batch_size=0, return_scores=False)
    if len(results[0].hypotheses[0]) != FLAGS.decode_steps:
      raise RuntimeError(f"CTranslate2 decoded {len(results[0].hypotheses[0])} tokens, "
                         f"expected {FLAGS.decode_steps}")
    return results

  return decode


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
                 f"first call {run['first_call_s']:.1f} s"
                 + ("" if run["beam_size"] == 1 else
                    f"; {'shared' if run.get('shared_beam_cache') else 'reordered'} beam cache")))
    other = run.get("other_cache")
    if other:
      rows.append((f"  {'shared' if other['shared_beam_cache'] else 'reordered'} beam cache",
                   f"{other['sentences_per_s']:.2f} sentences/s; ours / it "
                   f"{other['ours_over_other']:.3f}× (median, paired)"))
    marian = result.get("marian", {}).get("methods", {}).get(method)
    if marian:
      rows.append((f"  Marian {method}",
                   f"{marian['sentences_per_s']:.2f} sentences/s, {marian['seconds']:.2f} s/batch "
                   f"(best {marian['best_s']:.2f}); JAX / Marian {run['jax_over_marian']:.2f}× "
                   f"(median), {run['jax_over_marian_best']:.2f}× (best); "
                   f"{result['marian']['compare_mode']}"))
    for compute_type, engine_runs in result.get("ctranslate2", {}).get("compute_types", {}).items():
      theirs = engine_runs.get(method)
      if theirs:
        rows.append((f"  CTranslate2 {compute_type} {method}",
                     f"{theirs['sentences_per_s']:.2f} sentences/s, {theirs['seconds']:.2f} s/batch "
                     f"(best {theirs['best_s']:.2f}); JAX / CTranslate2 "
                     f"{run[f'jax_over_ct2_{compute_type}']:.2f}× (median); paired"))
  rows.append(("peak memory", f"{common.mib(result['peak_memory_bytes'])} "
                              f"({result['peak_memory_source']})"))
  for method, profile in result.get("profiles", {}).items():
    rows.append((f"profile ({method})", "\n" + profile_table(profile, f"{method} decoding call")))
  return rows


if __name__ == "__main__":
  common.main(measure)
