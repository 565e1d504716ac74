"""config.train_minutes: the step count fixed once from the measured speed, and a run that
equals one started with that count."""

from __future__ import annotations

import json
import re
import sys

from fault_tolerance import runner
from transformer_jax.training import budget


def test_evaluations_after_a_step():
  assert budget.evaluations_after(5, 20, 10) == 2  # 10, 20.
  assert budget.evaluations_after(5, 23, 10) == 3  # 10, 20 and the last, 23.
  assert budget.evaluations_after(10, 10, 10) == 0


def test_steps_that_fit_the_budget():
  # 100 s left at step 10: 1 s a step, evaluations of 5 s every 10 steps and at the end.
  count = budget.steps_that_fit(160.0, 60.0, 10, 1.0, 5.0, 10, 10_000)
  spent = (count - 10) * 1.0 + budget.evaluations_after(10, count, 10) * 5.0
  assert spent == 100.0 and count == 75  # 65 steps, and evaluations at 20, 30, ..., 70 and 75.
  assert budget.steps_that_fit(160.0, 60.0, 10, 1.0, 5.0, 10, 50) == 50  # At most the config's.
  assert budget.steps_that_fit(60.0, 70.0, 10, 1.0, 5.0, 10, 10_000) == 10  # Already spent.


SIGTERM_AT_STEP = "tests/fault_tolerance/sigterm_at_step.py"
BUDGET_FLAGS = ("--config.schedule=linear_cosine", "--config.learning_rate=2e-3",
                "--config.warmup_steps=10", "--config.eval_every_steps=20",
                "--config.checkpoint_every_steps=20")


def test_a_budgeted_run_equals_one_started_with_the_count_it_chose(tmp_path):
  """The count is fixed at step 5, inside the warm-up, where the cosine schedule does not
  depend on it yet: the run's parameters and metrics equal those of a run told that count.
  A SIGTERM at step 8 stops it; the rerun keeps the count (it is saved with the checkpoint)."""
  prepared, flags = tmp_path / "prepared", (*BUDGET_FLAGS, "--config.num_train_steps=100000",
                                            "--config.train_minutes=0.4")
  stopped = runner.run([sys.executable, SIGTERM_AT_STEP, "8", *runner.base_flags(prepared),
                        f"--workdir={tmp_path / 'budgeted'}", *flags])
  assert stopped.returncode == 0 and "SIGTERM: saved step 8" in stopped.stderr, stopped.describe()
  chosen = re.search(r"train_minutes=0.4: (\d+) steps fit", stopped.stdout)
  assert chosen, stopped.describe()
  count = int(chosen.group(1))
  assert 8 < count < 100_000
  rerun = runner.train_ok(tmp_path / "budgeted", prepared, *flags)
  assert f"the step count fixed before, {count}, is kept" in rerun.stderr, rerun.describe()
  history = [json.loads(line) for line in
             (tmp_path / "budgeted" / "config_history.jsonl").read_text().splitlines()]
  decisions = [row["budget_decision"] for row in history if "budget_decision" in row]
  assert [(d["step"], d["num_train_steps"]) for d in decisions] == [(5, count)]  # Taken once.
  assert runner.checkpoint_steps(tmp_path / "budgeted")[-1] == count

  runner.train_ok(tmp_path / "told", prepared, *BUDGET_FLAGS, f"--config.num_train_steps={count}")
  runner.assert_states_bitwise_equal(tmp_path / "budgeted", tmp_path / "told")
  runner.assert_same_metrics(tmp_path / "budgeted", tmp_path / "told")
