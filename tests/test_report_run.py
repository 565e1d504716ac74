"""experiments/report_run.py: candidates are chosen on dev, and only the choice sees test."""

from __future__ import annotations

import json

import pytest

from test_ablations import load_module, tiny_base


@pytest.fixture(scope="module")
def report_run():
  return load_module("experiments/report_run.py")


def test_report_chooses_on_dev_and_scores_test_once(report_run, tmp_path, capsys):
  from transformer_jax.train import train_and_evaluate

  config = tiny_base()
  config.checkpoint_every_steps = 2
  config.keep_checkpoints = 3
  config.final_eval_split = "test"
  workdir, out = tmp_path / "run", tmp_path / "report"
  train_and_evaluate(config, str(workdir))
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
  assert sum(" on test:" in line for line in printed.splitlines()) == 1, printed
  assert json.loads((out / "result.json").read_text())["chosen_checkpoint"] == best
  assert (out / "curves.png").stat().st_size > 5000 and (out / "metrics.jsonl").exists()


def test_report_refuses_a_count_below_one(report_run, tmp_path):
  from transformer_jax.errors import UserError
  from transformer_jax.train import train_and_evaluate

  config = tiny_base()
  config.num_train_steps = 2
  config.checkpoint_every_steps = 2
  train_and_evaluate(config, str(tmp_path / "run"))
  with pytest.raises(UserError, match="at least 1"):
    report_run.report(str(tmp_path / "run"), str(tmp_path / "out"), [0], None, "test")
