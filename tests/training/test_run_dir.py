"""A run directory read back for inference: the parameters and step of a checkpoint, without
the optimizer's state, and config.json read once."""

from __future__ import annotations

import functools

import jax
import numpy as np

from fault_tolerance import runner
from transformer_jax.tasks import registry
from transformer_jax.training import run_dir, schedules


def test_inference_reads_the_parameters_and_step_only(tmp_path_factory, monkeypatch):
  _, workdir = runner.shared_run(tmp_path_factory)
  task = registry.make_task(run_dir.read_config(str(workdir)))
  init_params = functools.partial(task.init_params, task.build_model())
  state, _ = run_dir.restore_state(str(workdir), init_params)  # The whole TrainState.

  reads = []
  read_config = run_dir.read_config
  counted = lambda path: reads.append(path) or read_config(path)
  monkeypatch.setattr(run_dir, "read_config", counted)
  monkeypatch.setattr(registry, "read_config", counted)

  def no_optimizer(*args, **kwargs):
    raise AssertionError("inference built an optimizer")

  monkeypatch.setattr(run_dir, "make_optimizer", no_optimizer)
  monkeypatch.setattr(schedules, "make_optimizer", no_optimizer)
  run = registry.load_run(str(workdir))
  assert len(reads) == 1, reads
  assert run.step == int(state.step) == runner.STEPS
  saved, loaded = jax.tree.leaves(state.params), jax.tree.leaves(run.params)
  assert len(saved) == len(loaded)
  for a, b in zip(saved, loaded):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
