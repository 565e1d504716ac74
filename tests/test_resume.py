"""Exact resume: N steps, stop, rerun to 2N == 2N steps uninterrupted, bit for bit.

Runs the real `python -m transformer_jax.train` command. Dropout is on (the
tiny config keeps the paper's 0.1), so equal parameters also show that the
data iterator and the dropout keys continue exactly where they stopped.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import traverse_util

from fault_tolerance import runner
from transformer_jax.training import checkpoints

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
  # Each process start is on record with the config it ran, the resume's override included.
  history = [json.loads(line) for line in (workdir / "config_history.jsonl").read_text().splitlines()]
  assert [(h["step"], h["resumed"], h["config"]["num_train_steps"]) for h in history] == [
      (0, False, HALF), (HALF, True, runner.STEPS)], history
  assert f"--config.num_train_steps={runner.STEPS}" in history[1]["argv"], history[1]["argv"]



def test_keeping_n_checkpoints_deletes_the_oldest_and_averaging_is_their_mean(shared, tmp_path):
  prepared, _ = shared
  workdir = tmp_path / "kept"
  runner.train_ok(workdir, prepared, "--config.checkpoint_every_steps=5",
                  "--config.keep_checkpoints=2")
  assert runner.checkpoint_steps(workdir) == [runner.STEPS - 5, runner.STEPS], (
      "keep_checkpoints=2 must leave only the two newest")
  averaged = runner.run(runner.module_command("average_checkpoints", f"--workdir={workdir}",
                                              "--last=2"), timeout=runner.QUICK_TIMEOUT_S)
  assert averaged.returncode == 0, averaged.describe()
  older = _params(workdir / "checkpoints", runner.STEPS - 5)
  newer = _params(workdir / "checkpoints", runner.STEPS)
  mean = _params(workdir / "checkpoints_averaged", runner.STEPS)
  for path, leaf in traverse_util.flatten_dict(mean).items():
    expected = (traverse_util.flatten_dict(older)[path] + traverse_util.flatten_dict(newer)[path]) / 2
    np.testing.assert_allclose(leaf, expected, rtol=1e-6, atol=1e-7, err_msg="/".join(path))


def _params(directory, step: int) -> dict:
  manager = checkpoints.make_manager(str(directory), None, async_save=False, read_only=True)
  return checkpoints.read_params(manager, step)
