"""The result of one finished training run, chosen on dev and reported on test.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python experiments/report_run.py \
      --workdir=runs/multi30k --out=results/multi30k/v20_rsqrt

For the latest checkpoint and for the average of the last N ones, for each N
in `--average` (e.g. `--average=5,10`), it decodes the dev split (§6.1 beam
search), picks the best by dev BLEU (the test split is never used to choose),
then decodes the test split with that one. With `--alphas` and/or
`--beam_sizes` (e.g. `--alphas=0.6,1.0 --beam_sizes=4,8`) it then also decodes
dev with the chosen checkpoint under each other (beam size, α) pair and takes
the best pair for test: the beam settings are tuned on dev too. Writes
`<out>/result.json` (every score, the choice, the training time, the config),
`<out>/curves.png` (train and dev NLL against step) and a copy of the run's
`metrics.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "A finished training run.")
  flags.DEFINE_string("out", None, "Folder for result.json, curves.png, metrics.jsonl.")
  flags.DEFINE_list("average", ["5"], "Counts of newest checkpoints to average, one candidate "
                    "each (e.g. 5,10); 1: the latest only.")
  flags.DEFINE_string("dev_split", None, "Split to choose on; default: the dataset's dev split.")
  flags.DEFINE_string("test_split", None, "Split to report; default: config.final_eval_split.")
  flags.DEFINE_string("metric", "auto", "Score to choose by: tok_bleu on multi30k, else paper_bleu.")
  flags.DEFINE_list("alphas", [], "Length penalties to try on dev with the chosen checkpoint; "
                    "default: the config's only.")
  flags.DEFINE_list("beam_sizes", [], "Beam sizes to try on dev with the chosen checkpoint; "
                    "default: the config's only.")


def training_seconds(train_rows: Sequence[dict]) -> float | None:
  """Seconds spent training, over every process that worked on the run.

  `elapsed_s` counts from the start of the process that logged it, so a resumed run
  (after a preemption, or to train on) starts again from zero: the total is the sum of
  each process's last `elapsed_s`. A new process shows as a row whose `elapsed_s` falls
  or whose step does not advance (it resumed from an earlier checkpoint). Steps
  repeated after a crash count, as time spent.
  """
  rows = [row for row in train_rows if "elapsed_s" in row]
  if not rows:
    return None
  segment_ends = [row["elapsed_s"] for row, later in zip(rows, rows[1:])
                  if later["elapsed_s"] < row["elapsed_s"] or later["step"] <= row["step"]]
  return sum(segment_ends) + rows[-1]["elapsed_s"]


def report(workdir: str, out: str, average: int | Sequence[int], dev_split: str | None,
           test_split: str | None, metric: str = "auto", alphas: Sequence[float] = (),
           beam_sizes: Sequence[int] = ()) -> dict:
  """Scores the run (see the module docstring) and writes the report files; returns the result."""
  from ablations import plot_curves, read_metrics  # experiments/ablations.py

  from transformer_jax.decode.translator import DecodeOptions
  from transformer_jax.model.precision import cpu_model
  from transformer_jax.errors import UserError
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.metrics.bleu import REFERENCES_TOKENIZED, summary
  from transformer_jax.tasks.translation import evaluate_texts, reference_sets
  from transformer_jax.training.run_dir import read_config

  config = read_config(workdir)
  task = make_task(config)
  data = task.data
  dev_split = dev_split or data.eval_split
  test_split = test_split or config.final_eval_split
  metric = metric if metric != "auto" else ("tok_bleu" if config.data.dataset == "multi30k"
                                            else "paper_bleu")
  if data.references_kind == REFERENCES_TOKENIZED and metric in ("sacrebleu", "paper_bleu"):
    raise UserError(f"--metric={metric}: this run's references are tokenized and lowercased "
                    "(Multi30k tok/), so cased detokenized BLEU does not apply; use tok_bleu or chrf")
  options = DecodeOptions.from_config(config)
  counts = [average] if isinstance(average, int) else list(average)
  if any(count < 1 for count in counts):
    raise UserError(f"--average={','.join(map(str, counts))}: each count must be at least 1")
  # "latest", then one "average_N" per count (N > 1); averaged_steps[name] = steps averaged.
  averaged_steps = {"latest": None}
  on_disk = {"average": None}  # The candidate whose average the "averaged" folder holds.

  def checkpoint_for(name: str) -> str:
    """The checkpoint to load for `name`: the latest, or its average (written if not there)."""
    if name == "latest":
      return "latest"
    if on_disk["average"] != name:
      _, averaged_steps[name] = task.average_checkpoints(workdir, int(name.split("_")[1]))
      on_disk["average"] = name
    return "averaged"

  def score(name: str, split: str, options: DecodeOptions = options) -> dict:
    run = task.load_run(workdir, checkpoint_for(name))
    sources, references = data.texts(split)
    scores, _ = evaluate_texts(run, sources, references, options, **reference_sets(data, split))
    scores.update(checkpoint=name, step=run.step, split=split, steps=averaged_steps[name],
                  beam_size=options.beam_size, alpha=options.alpha)
    print(f"{name} on {split} (beam {options.beam_size}, alpha {options.alpha:g}): "
          f"{summary(scores)}", flush=True)
    return scores

  candidates = ["latest"] + [f"average_{count}" for count in sorted(set(counts)) if count > 1]
  dev = {name: score(name, dev_split) for name in candidates}
  chosen = max(candidates, key=lambda name: dev[name][metric])
  # Then the beam settings, on dev, for the chosen checkpoint (the config's pair is scored).
  searched = {(options.beam_size, options.alpha): dev[chosen]}
  for beam_size in beam_sizes or [options.beam_size]:
    for alpha in alphas or [options.alpha]:
      if (beam_size, alpha) not in searched:
        searched[beam_size, alpha] = score(
            chosen, dev_split, dataclasses.replace(options, beam_size=beam_size, alpha=alpha))
  best_pair = max(searched, key=lambda pair: searched[pair][metric])
  test_options = dataclasses.replace(options, beam_size=best_pair[0], alpha=best_pair[1])
  test = score(chosen, test_split, test_options)
  metrics = read_metrics(Path(workdir))
  train_rows = [r for r in metrics if r["split"] == "train"]
  result = dict(
      chosen_checkpoint=chosen, chosen_by=f"{metric} on {dev_split}", metric=metric,
      test=test, dev=dev,
      dev_decode_search=list(searched.values()) if len(searched) > 1 else None,
      averaged_steps=averaged_steps[chosen],
      train_steps=train_rows[-1]["step"] if train_rows else None,
      train_seconds=training_seconds(train_rows),
      decode=dict(beam_size=test_options.beam_size, alpha=test_options.alpha,
                  max_extra_len=test_options.max_extra_len),
      config=json.loads(config.to_json_best_effort()),
      host=cpu_model(), date=time.strftime("%Y-%m-%d", time.gmtime()),
  )
  out_dir = Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
  shutil.copyfile(Path(workdir) / "metrics.jsonl", out_dir / "metrics.jsonl")
  plot_curves(out_dir / "curves.png", {Path(workdir).name: metrics},
              f"scored on {result['host']}, {result['date']}")
  print(f"test ({test_split}, {chosen}, chosen by {metric}): {summary(test)}; wrote "
        f"{out_dir}/result.json and curves.png")
  return result


def main(argv: list[str]) -> None:
  del argv
  from transformer_jax.errors import UserError, exit_on_user_error

  def run():
    if not FLAGS.workdir or not FLAGS.out:
      raise UserError("--workdir (a finished run) and --out (a folder) are required")
    try:
      counts = [int(count) for count in FLAGS.average]
    except ValueError:
      raise UserError(f"--average={','.join(FLAGS.average)} must be whole numbers, e.g. 5,10") from None
    try:
      alphas = [float(alpha) for alpha in FLAGS.alphas]
      beam_sizes = [int(size) for size in FLAGS.beam_sizes]
    except ValueError:
      raise UserError(f"--alphas={','.join(FLAGS.alphas)} must be numbers and --beam_sizes="
                      f"{','.join(FLAGS.beam_sizes)} whole numbers, e.g. --alphas=0.6,1.0 "
                      "--beam_sizes=4,8") from None
    report(FLAGS.workdir, FLAGS.out, counts, FLAGS.dev_split, FLAGS.test_split, FLAGS.metric,
           alphas, beam_sizes)

  exit_on_user_error(run)()


if __name__ == "__main__":
  from transformer_jax.cli import common

  common.keep_freed_host_memory()
  common.enable_compilation_cache()  # A repeated decode of the same shapes does not compile again.
  define_flags()
  app.run(main, flags_parser=common.parse_flags)
