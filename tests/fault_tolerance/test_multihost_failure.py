"""Two processes on 127.0.0.1 (2 simulated devices each): one is killed, the other
stops within a bounded time with JAX's message, and rerunning both resumes."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from fault_tolerance import runner

# JAX's coordination service: the worker notices a dead coordinator at once; the
# coordinator notices a dead worker after missed heartbeats (jax.distributed's
# heartbeat_timeout_seconds: 100 by default, 30 here through
# TRANSFORMER_JAX_HEARTBEAT_TIMEOUT_S; measured ~60 s with the default).
STOP_BOUND_S = {0: 30, 1: 180}
DIED = re.compile(r"another task died|unhealthy|coordination service", re.IGNORECASE)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_both(workdir, prepared_dir, logs_dir, attempt: str) -> list[runner.Background]:
  port = _free_port()
  return [
      runner.Background(
          runner.train_command(workdir, prepared_dir),
          logs_dir / f"{attempt}_process{i}.log",
          runner.env(devices=2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                     JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i),
      )
      for i in range(2)
  ]


@pytest.mark.parametrize("victim", [
    0,
    pytest.param(1, marks=pytest.mark.slow),  # Waits out JAX's heartbeat timeout (~60 s).
], ids=["coordinator_killed", "worker_killed"])
def test_killing_one_process_stops_the_other_and_both_resume(victim, prepared_dir, tmp_path):
  workdir = tmp_path / "run"
  first = _start_both(workdir, prepared_dir, tmp_path, "first")
  try:
    first[0].wait_for(lambda: (workdir / "checkpoints" / "10").is_dir(),
                      what="checkpoint 10 of the 2-process run")
    first[victim].kill()
    killed_at = time.time()
    survivor = first[1 - victim]
    status = survivor.wait(timeout=STOP_BOUND_S[victim])
    seconds = time.time() - killed_at
  finally:
    for job in first:
      job.kill()
  output = survivor.output()
  assert status is not None, (
      f"process {1 - victim} still ran {STOP_BOUND_S[victim]}s after process {victim} was "
      f"killed:\n{output[-3000:]}")
  assert status != 0, f"process {1 - victim} exited 0 after its peer died:\n{output[-3000:]}"
  assert DIED.search(output), f"no message about the dead peer:\n{output[-3000:]}"
  print(f"process {1 - victim} stopped {seconds:.1f}s after process {victim} was killed")
  complete = runner.checkpoint_steps(workdir)
  assert complete and complete[-1] >= 10

  _rerun_both_and_check(workdir, prepared_dir, tmp_path, resumed_from=complete[-1])


def _rerun_both_and_check(workdir, prepared_dir, tmp_path, resumed_from: int) -> None:
  """Both processes again: they resume from `resumed_from`, finish, log each step once."""
  second = _start_both(workdir, prepared_dir, tmp_path, "second")
  try:
    statuses = [job.wait(timeout=runner.TRAIN_TIMEOUT_S) for job in second]
  finally:
    for job in second:
      job.kill()
  for i, (job, code) in enumerate(zip(second, statuses)):
    assert code == 0, f"rerun process {i} exit {code}:\n{job.output()[-3000:]}"
  assert f"resumed from step {resumed_from}" in second[0].output(), second[0].output()[-3000:]
  assert runner.checkpoint_steps(workdir)[-1] == runner.STEPS
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train_steps = [r["step"] for r in rows if r["split"] == "train"]
  assert train_steps == [5, 10, 15, 20], f"each logged step exactly once: {train_steps}"


def test_sigterm_to_one_process_stops_both_at_the_same_saved_step(prepared_dir, tmp_path):
  """A preemption notice that reaches one host only: both save the same step and exit 0."""
  import signal

  workdir = tmp_path / "run"
  first = _start_both(workdir, prepared_dir, tmp_path, "first")
  try:
    first[0].wait_for_text("step 5/20")
    first[1].signal(signal.SIGTERM)
    statuses = [job.wait(timeout=90) for job in first]
  finally:
    for job in first:
      job.kill()
  outputs = [job.output() for job in first]
  assert statuses == [0, 0], f"exits {statuses}:\n{outputs[0][-2000:]}\n{outputs[1][-2000:]}"
  saved = [re.search(r"SIGTERM: saved step (\d+)", out) for out in outputs]
  assert all(saved), "each process must report the save:\n" + "\n".join(o[-1500:] for o in outputs)
  steps = {int(found.group(1)) for found in saved}
  assert len(steps) == 1, f"the processes stopped at different steps: {steps}"
  (step,) = steps
  assert 5 <= step < runner.STEPS and runner.checkpoint_steps(workdir)[-1] == step

  _rerun_both_and_check(workdir, prepared_dir, tmp_path, resumed_from=step)
