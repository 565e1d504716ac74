"""experiments/report_run.py: candidates are chosen on dev, and only the choice sees test."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest


@pytest.fixture(scope="module")
def report_run(experiment_module):
  return experiment_module("experiments/report_run.py")


def test_report_chooses_on_dev_and_scores_test_once(report_run, tmp_path, capsys, tiny_base):
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.loop import train_and_evaluate

  config = tiny_base()
  config.checkpoint_every_steps = 2
  config.keep_checkpoints = 3
  config.final_eval_split = "test"
  workdir, out = tmp_path / "run", tmp_path / "report"
  train_and_evaluate(config, str(workdir), make_task(config))
  capsys.readouterr()

  result = report_run.report(str(workdir), str(out), [1, 2, 3], None, None, metric="sacrebleu")

  dev = result["dev"]
  assert list(dev) == ["latest", "average_2", "average_3"]
  assert len({scores["split"] for scores in dev.values()}) == 1
  assert dev["latest"]["steps"] is None and dev["latest"]["step"] == 6
  assert dev["average_2"]["steps"] == [4, 6] and dev["average_3"]["steps"] == [2, 4, 6]
  best = max(dev.values(), key=lambda scores: scores["sacrebleu"])["checkpoint"]
  assert result["chosen_checkpoint"] == best
  assert result["test"]["checkpoint"] == best and result["test"]["split"] == "test"
  assert result["averaged_steps"] == dev[best]["steps"]
  # Test was decoded once, for the chosen candidate only.
  printed = capsys.readouterr().out
  assert sum(" on test " in line for line in printed.splitlines()) == 1, printed
  assert json.loads((out / "result.json").read_text())["chosen_checkpoint"] == best
  assert (out / "curves.png").stat().st_size > 5000 and (out / "metrics.jsonl").exists()


def test_report_tunes_beam_settings_on_dev_only(report_run, tmp_path, capsys, tiny_base):
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.loop import train_and_evaluate

  config = tiny_base()
  config.checkpoint_every_steps = 3
  config.final_eval_split = "test"
  train_and_evaluate(config, str(tmp_path / "run"), make_task(config))
  capsys.readouterr()

  result = report_run.report(str(tmp_path / "run"), str(tmp_path / "out"), [1], None, None,
                             metric="sacrebleu", alphas=[0.0, 1.0], beam_sizes=[1, 2])

  searched = result["dev_decode_search"]
  # The config's pair (beam 2, alpha 0.6) then the 2 x 2 grid, all on dev, for the chosen one.
  pairs = [(scores["beam_size"], scores["alpha"]) for scores in searched]
  assert pairs == [(2, 0.6), (1, 0.0), (1, 1.0), (2, 0.0), (2, 1.0)]
  assert {scores["split"] for scores in searched} == {result["dev"]["latest"]["split"]} != {"test"}
  best = max(searched, key=lambda scores: scores["sacrebleu"])
  assert (result["decode"]["beam_size"], result["decode"]["alpha"]) == (best["beam_size"], best["alpha"])
  assert (result["test"]["beam_size"], result["test"]["alpha"]) == (best["beam_size"], best["alpha"])
  printed = capsys.readouterr().out
  assert sum(" on test " in line for line in printed.splitlines()) == 1, printed


def test_report_refuses_a_count_below_one(report_run, tmp_path, tiny_base):
  from transformer_jax.errors import UserError
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.loop import train_and_evaluate

  config = tiny_base()
  config.num_train_steps = 2
  config.checkpoint_every_steps = 2
  train_and_evaluate(config, str(tmp_path / "run"), make_task(config))
  with pytest.raises(UserError, match="at least 1"):
    report_run.report(str(tmp_path / "run"), str(tmp_path / "out"), [0], None, "test")


def test_training_time_of_a_resumed_run_adds_up_every_process(report_run):
  """elapsed_s restarts in each process; report_run's train_seconds is their sum."""
  rows = [dict(step=50, elapsed_s=40.0), dict(step=100, elapsed_s=80.0),
          # Killed after step 100's checkpoint, resumed there: a new process.
          dict(step=150, elapsed_s=45.0), dict(step=200, elapsed_s=85.0),
          # Killed before step 250's checkpoint; the resumed process repeats step 250.
          dict(step=250, elapsed_s=120.0), dict(step=250, elapsed_s=30.0)]
  assert report_run.training_seconds(rows) == 80.0 + 120.0 + 30.0
  assert report_run.training_seconds(rows[:2]) == 80.0
  # Killed after its first log, before any checkpoint: the rerun starts over from step 1
  # and is slower to its first log, so only the step shows the new process.
  restarted = [dict(step=50, elapsed_s=40.0), dict(step=50, elapsed_s=44.0),
               dict(step=100, elapsed_s=85.0)]
  assert report_run.training_seconds(restarted) == 40.0 + 85.0
  assert report_run.training_seconds([]) is None


@pytest.mark.parametrize("average", [1, 2])
def test_final_report_decodes_the_configured_checkpoint_average(tmp_path, capsys, average, tiny_base):
  """Training's own final BLEU uses the recipe's average_last_checkpoints, like report_run."""
  from transformer_jax.decode.translator import DecodeOptions
  from transformer_jax.tasks.registry import load_run, make_task
  from transformer_jax.tasks.translation import evaluate_texts
  from transformer_jax.training.loop import train_and_evaluate

  config = tiny_base()
  config.checkpoint_every_steps = 2
  config.average_last_checkpoints = average
  config.final_eval_split = "test"
  workdir = str(tmp_path / "run")
  task = make_task(config)
  train_and_evaluate(config, workdir, task)

  scores = task.final_report(workdir)

  expected_checkpoint = "averaged" if average > 1 else "latest"
  assert scores["averaged_steps"] == ([4, 6] if average > 1 else None)
  assert scores["checkpoint_step"] == 6
  printed = capsys.readouterr().out
  assert ("the average of steps 4, 6" if average > 1 else "step 6,") in printed, printed
  # The scores are those of that checkpoint, decoded with the config's beam settings.
  from transformer_jax.data.pipeline import load_dataset
  sources, references = load_dataset(config.data).texts("test")
  options = DecodeOptions.from_config(config)
  direct, _ = evaluate_texts(load_run(workdir, expected_checkpoint), sources, references, options)
  assert direct["sacrebleu"] == scores["sacrebleu"]
  if average > 1:  # Averaging changed the parameters, so the latest alone decodes differently.
    latest = load_run(workdir, "latest").params
    averaged = load_run(workdir, "averaged").params
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(latest),
                                                        jax.tree.leaves(averaged)))
