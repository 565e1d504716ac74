"""kill -9 and SIGTERM during training: rerunning the command finishes bit for bit
like a run that was never interrupted."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import time

from fault_tolerance import runner

KILL_AFTER_SAVE = "tests/fault_tolerance/kill_after_save.py"
SIGTERM_AT_DEVICE_STEP = "tests/fault_tolerance/sigterm_at_device_step.py"
SIGTERM_AT_STEP = "tests/fault_tolerance/sigterm_at_step.py"


def _kill_after_save(step: int, workdir, prepared_dir) -> runner.Result:
  result = runner.run([sys.executable, KILL_AFTER_SAVE, str(step),
                       *runner.base_flags(prepared_dir), f"--workdir={workdir}"])
  assert result.returncode == -signal.SIGKILL, result.describe()
  assert f"SIGKILL after starting the save of step {step}" in result.stderr
  return result


def _resumed_step(output: str) -> int:
  """The step a run resumed from (0: it started fresh)."""
  found = re.search(r"resumed from step (\d+)", output)
  return int(found.group(1)) if found else 0


def test_kill_9_at_two_points_then_rerun_equals_uninterrupted(prepared_dir, uninterrupted,
                                                               tmp_path):
  workdir = tmp_path / "run"

  # 1. SIGKILL right after the save of step 10 started (its write may be in flight).
  _kill_after_save(10, workdir, prepared_dir)
  complete = runner.checkpoint_steps(workdir)
  assert set(complete) <= {10}
  in_flight = runner.partial_checkpoints(workdir)

  # 2. SIGKILL from outside between checkpoints, once step 15 is logged.
  job = runner.Background(runner.train_command(workdir, prepared_dir), tmp_path / "run2.log")
  job.wait_for_text("step 15/20")
  job.kill()
  job.wait(10)
  assert _resumed_step(job.output()) == max(complete, default=0), (
      f"after a kill with complete checkpoints {complete} and partial {in_flight}, the rerun "
      f"resumed from step {_resumed_step(job.output())}:\n{job.output()[-3000:]}")

  # A partial (never renamed) checkpoint of a newer step must not be taken as the latest.
  complete = runner.checkpoint_steps(workdir)
  assert complete, "no checkpoint after step 15"
  shutil.copytree(workdir / "checkpoints" / str(complete[-1]),
                  workdir / "checkpoints" / "30.orbax-checkpoint-tmp")
  final = runner.train_ok(workdir, prepared_dir)
  assert _resumed_step(final.stderr) == complete[-1], final.describe()

  runner.assert_states_bitwise_equal(workdir, uninterrupted)
  runner.assert_same_metrics(workdir, uninterrupted)


def test_sigterm_saves_the_current_step_exits_0_and_resumes_exactly(prepared_dir, uninterrupted,
                                                                    tmp_path):
  workdir = tmp_path / "run"
  job = runner.Background(runner.train_command(workdir, prepared_dir), tmp_path / "train.log")
  job.wait_for_text("step 5/20")
  job.signal(signal.SIGTERM)
  signalled = time.time()
  status = job.wait(timeout=60)
  seconds = time.time() - signalled
  output = job.output()
  assert status == 0, f"exit {status} {seconds:.0f}s after SIGTERM:\n{output[-3000:]}"
  saved = re.search(r"SIGTERM: saved step (\d+)", output)
  assert saved, output[-3000:]
  step = int(saved.group(1))
  assert 5 <= step < runner.STEPS
  assert runner.checkpoint_steps(workdir)[-1] == step, "the SIGTERM checkpoint is not the latest"
  assert not runner.partial_checkpoints(workdir), "exit 0 with a checkpoint still in flight"

  rerun = runner.train_ok(workdir, prepared_dir)
  assert f"resumed from step {step}" in rerun.stderr, rerun.describe()
  runner.assert_states_bitwise_equal(workdir, uninterrupted)
  runner.assert_same_metrics(workdir, uninterrupted)


def test_sigterm_is_answered_within_a_step_of_the_device(prepared_dir, tmp_path):
  """The host may not queue steps far ahead of the device: a preempted job has seconds, and
  every queued step must finish before the save. The SIGTERM comes as step 6 finishes on the
  device; the next sync the loop would otherwise make is the log at step 10."""
  signal_step = 6
  result = runner.run([sys.executable, SIGTERM_AT_DEVICE_STEP, str(signal_step),
                       *runner.base_flags(prepared_dir), f"--workdir={tmp_path / 'run'}"])
  assert result.returncode == 0, result.describe()
  assert f"SIGTERM as step {signal_step} finished" in result.stderr, result.describe()
  saved = re.search(r"SIGTERM: saved step (\d+)", result.stderr)
  assert saved, result.describe()
  assert signal_step <= int(saved.group(1)) <= signal_step + 1, result.describe()


def test_sigterm_at_the_last_step_saves_and_leaves_its_evaluation_to_the_rerun(
    prepared_dir, uninterrupted, tmp_path):
  """The last step is due a dev evaluation and the final report: after a SIGTERM there the
  job saves and exits (a preempted job has seconds); the rerun resumes at that step,
  evaluates it, reports, and its metrics equal an uninterrupted run's."""
  workdir, report = tmp_path / "run", "--config.final_eval_split=test"
  result = runner.run([sys.executable, SIGTERM_AT_STEP, str(runner.STEPS),
                       *runner.base_flags(prepared_dir), f"--workdir={workdir}", report])
  assert result.returncode == 0, result.describe()
  assert f"SIGTERM: saved step {runner.STEPS}" in result.stderr, result.describe()
  assert runner.checkpoint_steps(workdir)[-1] == runner.STEPS
  evaluated = [row["step"] for row in runner.metrics_rows(workdir) if row["split"] == "eval"]
  assert evaluated == [10], "evaluated the SIGTERM's step before exiting"
  assert "BLEU on test" not in result.stdout, "ran the final report after a SIGTERM"

  rerun = runner.train_ok(workdir, prepared_dir, report)
  assert f"resumed from step {runner.STEPS}" in rerun.stderr, rerun.describe()
  assert f"step {runner.STEPS} had no dev evaluation" in rerun.stderr, rerun.describe()
  assert "BLEU on test" in rerun.stdout, rerun.describe()
  runner.assert_same_metrics(workdir, uninterrupted)
