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
                "--config.warmup_steps=20", "--config.eval_every_steps=20",
                "--config.checkpoint_every_steps=20", "--config.num_train_steps=100000",
                "--config.train_minutes=0.25")


def _sigterm_at(step: int, workdir, prepared) -> runner.Result:
  stopped = runner.run([sys.executable, SIGTERM_AT_STEP, str(step), *runner.base_flags(prepared),
                        f"--workdir={workdir}", *BUDGET_FLAGS])
  assert stopped.returncode == 0 and f"SIGTERM: saved step {step}" in stopped.stderr, (
      stopped.describe())
  return stopped


def test_a_budgeted_run_equals_one_started_with_the_count_it_chose(tmp_path):
  """The count is due at step 10, halfway through the warm-up, where the cosine schedule does
  not depend on it yet. A SIGTERM there leaves it to the rerun, which measures its own steps
  and fixes it at step 16, still inside the warm-up; a SIGTERM at 20 stops that one, and the
  third process keeps the count (saved with the checkpoint). Parameters and metrics equal a
  run started with --config.num_train_steps=<the count>."""
  prepared, workdir = tmp_path / "prepared", tmp_path / "budgeted"
  first = _sigterm_at(10, workdir, prepared)
  assert "steps fit" not in first.stdout, "fixed the count at the SIGTERM's step"
  second = _sigterm_at(20, workdir, prepared)
  chosen = re.search(r"train_minutes=0.25: (\d+) steps fit", second.stdout)
  assert chosen, second.describe()
  count = int(chosen.group(1))
  assert 20 < count < 100_000
  third = runner.train_ok(workdir, prepared, *BUDGET_FLAGS)
  assert f"the step count fixed before, {count}, is kept" in third.stderr, third.describe()
  assert "steps fit" not in third.stdout
  history = [json.loads(line) for line in (workdir / "config_history.jsonl").read_text().splitlines()]
  decisions = [row["budget_decision"] for row in history if "budget_decision" in row]
  assert [(d["step"], d["num_train_steps"]) for d in decisions] == [(16, count)]  # Once.
  assert runner.checkpoint_steps(workdir)[-1] == count

  told = tmp_path / "told"
  runner.train_ok(told, prepared, *BUDGET_FLAGS[:-2], f"--config.num_train_steps={count}")
  runner.assert_states_bitwise_equal(workdir, told)
  runner.assert_same_metrics(workdir, told)
