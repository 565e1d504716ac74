"""Exact resume: N steps, stop, rerun to 2N == 2N steps uninterrupted, bit for bit.

Runs the real `python -m transformer_jax.train` command. Dropout is on (the
tiny config keeps the paper's 0.1), so equal parameters also show that the
data iterator and the dropout keys continue exactly where they stopped.
"""

from __future__ import annotations

import pytest

from fault_tolerance import runner

HALF = runner.STEPS // 2  # A multiple of the log, eval and checkpoint intervals.


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  return runner.shared_run(tmp_path_factory)


def test_stopped_and_rerun_equals_uninterrupted(shared, tmp_path):
  prepared, uninterrupted = shared
  workdir = tmp_path / "resumed"
  runner.train_ok(workdir, prepared, f"--config.num_train_steps={HALF}")
  assert runner.checkpoint_steps(workdir) == [HALF]

  rerun = runner.train_ok(workdir, prepared, f"--config.num_train_steps={runner.STEPS}")
  assert f"resumed from step {HALF}" in rerun.stderr, rerun.describe()

  runner.assert_states_bitwise_equal(workdir, uninterrupted)
  runner.assert_same_metrics(workdir, uninterrupted)

