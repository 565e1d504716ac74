"""A trained run translating a real test set: `translate` against CTranslate2 on its export.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python benchmarks/translate_real.py \
      --workdir=runs/multi30k --checkpoint=averaged \
      --source=../shared/data/multi30k/test2016.en --reference=../shared/data/multi30k/test2016.de \
      --beam_size=4 --json

The comparison a user makes before deploying: the same weights (exported with
`transformer_jax.export`, float32 and int8), the same source sentences in file
order, the same beam size and length limit (source + `--max_extra_len` tokens),
each engine batching as it does by default (`translate_lines`: length-sorted
batches of --tokens_per_batch; CTranslate2: `max_batch_size=--ct2_batch_size`,
sorted by length). Untimed warm-up first (our compiles), then --repeats rounds
in the order ours, theirs..., theirs..., ours, so drift in the host's load falls
on both. The length penalties differ in form (ours GNMT's ((5+|y|)/6)^α,
CTranslate2's |y|^α), so each engine's BLEU is printed beside its speed: tok-lc
BLEU always, sacreBLEU only on raw references (not for a run on Multi30k tok/).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

from absl import flags

import common
from transformer_jax.cli import common as cli_common

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained encoder-decoder run.")
flags.DEFINE_string("checkpoint", "averaged", "latest, averaged or a step.")
flags.DEFINE_string("source", None, "Source sentences, one a line.")
flags.DEFINE_string("reference", None, "References, line-aligned (for BLEU).")
flags.DEFINE_integer("ct2_batch_size", 64, "CTranslate2's max_batch_size (sentences).")
flags.DEFINE_list("ct2_compute_types", ["float32", "int8"], "CTranslate2 compute types.")
flags.DEFINE_integer("repeats", 2, "Timed rounds.")
# The search: translate's own flags (--method, --beam_size, --alpha, --max_extra_len,
# --beam_stop, --quantize, --matmul_dtype, --shrink_batch, --shared_beam_cache,
# --tokens_per_batch, ...), with translate's defaults. CTranslate2 gets the same method, beam
# and α (in its own penalty's form) and always stops a sentence once its best candidate ends
# (best_finished); it runs its own --ct2_compute_types.
cli_common.define_search_flags()
flags.DEFINE_bool("pair_shrink", False, "Time our search with the other --shrink_batch setting "
                  "too, in the same rounds (engine jax_shrinking or jax_whole_batch).")
flags.DEFINE_bool("pair_shared_cache", False, "Time beam search with the other "
                  "--shared_beam_cache setting too, in the same rounds (engine "
                  "jax_shared_cache or jax_reordered_cache).")

Result = common.Result


def measure() -> tuple[Result, list[tuple[str, str]]]:
  import ctranslate2

  from transformer_jax.errors import UserError
  from transformer_jax.decode.translator import (DecodeOptions, default_tokens_per_batch,
                                                 for_decoding, shares_beam_cache, translate_lines)
  from transformer_jax.interop.ctranslate2_export import export_ctranslate2
  from transformer_jax.data.pipeline import references_kind
  from transformer_jax.metrics.bleu import all_scores
  from transformer_jax.tasks.registry import TRANSLATION_TASKS, load_run

  run = load_run(FLAGS.workdir, FLAGS.checkpoint, expected_task=TRANSLATION_TASKS)
  with open(FLAGS.source, encoding="utf-8") as f:
    sources = f.read().splitlines()
  with open(FLAGS.reference, encoding="utf-8") as f:
    references = f.read().splitlines()
  options = cli_common.decode_options()
  if options.method == "sample":
    raise UserError("--method=sample: CTranslate2's sampling draws other tokens; compare beam "
                    "or greedy search")
  beam_size = options.beam_size if options.method == "beam" else 1
  directory = tempfile.mkdtemp(prefix="ct2_real_")
  export_ctranslate2(run, directory)
  engines = {compute_type: ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                                  intra_threads=os.cpu_count() or 1)
             for compute_type in FLAGS.ct2_compute_types}
  pieces = [[run.tokenizer.id_to_piece(i) for i in run.tokenizer.encode(text)[:-1]]
            for text in sources]  # CTranslate2 appends </s> itself.
  piece_ids = {run.tokenizer.id_to_piece(i): i for i in range(run.tokenizer.vocab_size)}

  def ours(decode_options: DecodeOptions = options) -> list[str]:
    return translate_lines(run, sources, decode_options, FLAGS.tokens_per_batch)

  def theirs(engine) -> list[str]:
    results = engine.translate_batch(
        pieces, beam_size=beam_size, length_penalty=options.alpha,
        max_decoding_length=max(map(len, pieces)) + 1 + options.max_extra_len,
        max_batch_size=FLAGS.ct2_batch_size, suppress_sequences=[["<pad>"], ["<s>"]])
    return [run.tokenizer.decode([piece_ids[p] for p in r.hypotheses[0]]) for r in results]

  calls = {"jax": ours}
  if FLAGS.pair_shrink:
    other = dataclasses.replace(options, shrink_batch=not options.shrink_batch)
    calls["jax_shrinking" if other.shrink_batch else "jax_whole_batch"] = lambda: ours(other)
  shared = shares_beam_cache(run.model, options)
  if FLAGS.pair_shared_cache and options.method == "beam":
    other_cache = dataclasses.replace(options, shared_beam_cache=not shared)
    calls["jax_reordered_cache" if shared else "jax_shared_cache"] = lambda: ours(other_cache)
  calls.update({f"ct2_{t}": (lambda e=e: theirs(e)) for t, e in engines.items()})
  outputs, first_call_s = {}, {}
  for name, call in calls.items():  # Warm-up: compiles, caches.
    start = time.perf_counter()
    outputs[name] = call()
    first_call_s[name] = time.perf_counter() - start
  seconds: dict[str, list[float]] = {name: [] for name in calls}
  names = list(calls)
  for round_index in range(FLAGS.repeats):
    for name in names if round_index % 2 == 0 else names[::-1]:
      start = time.perf_counter()
      outputs[name] = calls[name]()
      seconds[name].append(time.perf_counter() - start)
  engines_result = {}
  kind = references_kind(run.config.data)  # On tokenized text (Multi30k tok/): no sacreBLEU.
  for name in names:
    median = statistics.median(seconds[name])
    scores = all_scores(outputs[name], references, references_kind=kind)
    engines_result[name] = dict(
        seconds=seconds[name], sentences_per_s=len(sources) / median,
        first_call_s=first_call_s[name],
        sacrebleu=scores.get("sacrebleu"), tok_bleu=scores["tok_bleu"])
  ours_speed = engines_result["jax"]["sentences_per_s"]
  for name in names[1:]:
    engines_result["jax"][f"jax_over_{name}"] = ours_speed / engines_result[name]["sentences_per_s"]
  result = dict(mode="translate_real", workdir=os.path.basename(os.path.abspath(FLAGS.workdir)),
                checkpoint=FLAGS.checkpoint, step=run.step, sentences=len(sources),
                source=os.path.basename(FLAGS.source), beam_size=beam_size,
                alpha=options.alpha, max_extra_len=options.max_extra_len,
                beam_stop=options.stop_rule if options.method == "beam" else None,
                quantize=options.quantize or None,
                matmul_dtype=for_decoding(run.model, options).config.matmul_dtype,
                shrink_batch=options.shrink_batch, shared_beam_cache=shared,
                tokens_per_batch=FLAGS.tokens_per_batch or default_tokens_per_batch(),
                ctranslate2_version=ctranslate2.__version__, engines=engines_result,
                compare_mode="paired")
  table = [(name, f"{r['sentences_per_s']:.1f} sentences/s (median of {FLAGS.repeats}), "
                  + (f"sacreBLEU {r['sacrebleu']:.2f}, " if r["sacrebleu"] is not None else "")
                  + f"tok-lc BLEU {r['tok_bleu']:.2f}"
                  + (f"; ours is {ours_speed / r['sentences_per_s']:.2f}x" if name != "jax" else ""))
           for name, r in engines_result.items()]
  return result, table


if __name__ == "__main__":
  common.main(measure)
