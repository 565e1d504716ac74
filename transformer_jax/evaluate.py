"""Translates a source file and scores it against references.

  python -m transformer_jax.evaluate --workdir=DIR --source=FILE --reference=FILE \
      [--checkpoint=latest|averaged|STEP] [--beam_size=4] [--alpha=0.6]

Prints one JSON object (sacrebleu, paper_bleu, tok_bleu, chrf, sentences,
decode_seconds, sentences_per_second) and writes the hypotheses beside the
checkpoint folder as <workdir>/hypotheses/<source name>.<checkpoint>.txt.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from transformer_jax.errors import UserError, exit_on_user_error

FLAGS = flags.FLAGS


def evaluate_texts(run, sources, references, options, tokens_per_batch=4096,
                   tok_references=None) -> tuple[dict, list[str]]:
  """Decodes `sources` and scores them: (scores dict, hypotheses)."""
  from transformer_jax.metrics.bleu import all_scores
  from transformer_jax.translate import translate_lines

  started = time.time()
  hypotheses = translate_lines(run, list(sources), options, tokens_per_batch)
  seconds = time.time() - started
  scores = all_scores(hypotheses, list(references), tok_references)
  scores.update(sentences=len(sources), decode_seconds=round(seconds, 3),
                sentences_per_second=round(len(sources) / max(seconds, 1e-9), 3))
  return scores, hypotheses


def final_report(config, workdir: str, split: str | None = None) -> dict:
  """After training: decode a split of the run's dataset with the §6.1 recipe, print BLEU.

  The recipe includes the checkpoint: the average of the newest
  `config.average_last_checkpoints` (written to checkpoints_averaged/), or the
  latest where that is 1.
  """
  from transformer_jax.average_checkpoints import average_checkpoints
  from transformer_jax.data.pipeline import load_dataset
  from transformer_jax.decode import DecodeOptions
  from transformer_jax.inference import load_run

  data = load_dataset(config.data)
  split = split or config.final_eval_split
  sources, references = data.texts(split)
  averaged_steps = None
  if config.average_last_checkpoints > 1:
    _, averaged_steps = average_checkpoints(workdir, config.average_last_checkpoints)
  run = load_run(workdir, "averaged" if averaged_steps else "latest")
  checkpoint = (f"the average of steps {', '.join(map(str, averaged_steps))}"
                if averaged_steps else f"step {run.step}")
  options = DecodeOptions(beam_size=config.beam_size, alpha=config.length_penalty,
                          max_extra_len=config.max_decode_extra_len)
  scores, hypotheses = evaluate_texts(run, sources, references, options)
  for source, hypothesis, reference in list(zip(sources, hypotheses, references))[: config.final_eval_examples]:
    print(f"source:     {source}\ntranslated: {hypothesis}\nreference:  {reference}\n")
  print(f"BLEU on {split} ({len(sources)} sentences, {checkpoint}, beam {config.beam_size}, α "
        f"{config.length_penalty}): sacreBLEU {scores['sacrebleu']:.2f}, tokenized BLEU "
        f"{scores['paper_bleu']:.2f}, chrF {scores['chrf']:.2f}")
  print(f"sacreBLEU signature: {scores['sacrebleu_signature']}")
  scores.update(checkpoint_step=run.step, averaged_steps=averaged_steps)
  with open(os.path.join(workdir, f"final_{split}.json"), "w") as f:
    json.dump(scores, f, indent=2)
  return scores


def _read(path: str, name: str) -> list[str]:
  from transformer_jax.translate import read_lines

  if not path or not os.path.exists(path):
    raise UserError(f"--{name}={path!r} does not exist; give a UTF-8 text file, one sentence a line")
  with open(path, "rb") as f:
    return read_lines(f, FLAGS.replace_invalid_utf8, name=path)


@exit_on_user_error
def main(argv):
  del argv
  from transformer_jax.inference import load_run
  from transformer_jax.translate import decode_options

  if not FLAGS.workdir:
    raise UserError("--workdir is required: the run directory of a training run")
  sources, references = _read(FLAGS.source, "source"), _read(FLAGS.reference, "reference")
  if len(sources) != len(references):
    raise UserError(f"--source has {len(sources)} lines but --reference has {len(references)}")
  options = decode_options()
  run = load_run(FLAGS.workdir, FLAGS.checkpoint)
  scores, hypotheses = evaluate_texts(run, sources, references, options, FLAGS.tokens_per_batch)
  out_dir = os.path.join(os.path.abspath(FLAGS.workdir), "hypotheses")
  os.makedirs(out_dir, exist_ok=True)
  out_path = os.path.join(out_dir, f"{os.path.basename(FLAGS.source)}.{FLAGS.checkpoint}.txt")
  with open(out_path, "w") as f:
    f.writelines(h + "\n" for h in hypotheses)
  scores.update(hypotheses_file=out_path, checkpoint_step=run.step)
  print(json.dumps(scores), flush=True)


if __name__ == "__main__":
  from transformer_jax.translate import define_flags

  define_flags()
  flags.DEFINE_string("source", None, "Source sentences, one per line.")
  flags.DEFINE_string("reference", None, "Reference translations, line-aligned.")
  from transformer_jax import cli

  cli.keep_freed_host_memory()
  cli.enable_compilation_cache()  # A repeated decode of the same shapes does not compile again.
  app.run(main, flags_parser=cli.parse_flags)
