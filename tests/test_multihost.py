"""Two processes on 127.0.0.1 (2 simulated devices each) train exactly like one with 4.

Under data parallelism every process holds all parameters; under fsdp=4 each
holds half of them (a quarter per device), so the checkpoint is written by
both processes together and read back whole. Dev BLEU and the final report
(averaging, decoding) are collective too: both processes decode, one writes.
"""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.tasks.registry import make_task
from transformer_jax.training.run_dir import read_config, restore_state

STEPS = 4


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# The fsdp layout also scores dev BLEU and runs the final report (averaging two checkpoints,
# decoding the test split): collective work that every process must take part in.
REPORT_FLAGS = ["--config.eval_bleu_sentences=16", "--config.final_eval_split=test",
                "--config.average_last_checkpoints=2", "--config.checkpoint_every_steps=2"]
MESHES = {"data": [], "fsdp": ["--config.mesh.data=1", "--config.mesh.fsdp=4", *REPORT_FLAGS]}


def _train_command(workdir, prepared_dir, mesh_flags=()):
  return [
      sys.executable, "-m", "transformer_jax.train", "--config=experiments/configs/tiny.py",
      f"--workdir={workdir}", f"--config.num_train_steps={STEPS}",
      f"--config.data.prepared_dir={prepared_dir}", "--config.eval_every_steps=100",
      "--config.checkpoint_every_steps=100",
      # Adam's ε = 1e-9 turns any last-bit difference in a near-zero gradient
      # entry into a full ±lr step (g/√v ≈ sign g); a larger ε keeps the update
      # a smooth function of the gradient, so the comparison is well-posed.
      "--config.adam_eps=1e-3",
      *mesh_flags,
  ]


def _env(devices: int, **extra) -> dict:
  env = dict(os.environ)
  flags = env.get("XLA_FLAGS", "").split()
  flags = [f for f in flags if "device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _final_params(workdir):
  task = make_task(read_config(str(workdir)))
  model = task.build_model()
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  state, _ = restore_state(str(workdir), lambda key: task.init_params(model, key), mesh=mesh)
  assert int(state.step) == STEPS
  return jax.device_get(state.params)


@pytest.mark.parametrize("layout", list(MESHES))
def test_two_processes_equal_one_process_with_four_devices(tmp_path, layout):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  prepared = tmp_path / "prepared"
  single = subprocess.run(
      _train_command(tmp_path / "single", prepared, MESHES[layout]), cwd=repo, env=_env(4),
      capture_output=True, text=True, timeout=600,
  )
  assert single.returncode == 0, single.stderr[-3000:]

  port = _free_port()
  processes = [
      subprocess.Popen(
          _train_command(tmp_path / "multi", prepared, MESHES[layout]), cwd=repo,
          env=_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2,
                   JAX_PROCESS_ID=i),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      )
      for i in range(2)
  ]
  try:
    outputs = [p.communicate(timeout=600) for p in processes]
  finally:
    for p in processes:
      p.kill()
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  assert "process 0 of 2" in outputs[0][1] or "process 0 of 2" in outputs[0][0]
  if layout == "fsdp":
    _assert_reports_agree(tmp_path / "single", tmp_path / "multi", outputs)

  # Gloo's cross-process all-reduce may sum in another order than one process.
  for a, b in zip(jax.tree.leaves(_final_params(tmp_path / "single")),
                  jax.tree.leaves(_final_params(tmp_path / "multi"))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _assert_reports_agree(single, multi, outputs):
  """Both processes decoded; process 0 alone printed and wrote the final report."""
  assert "BLEU on test" in outputs[0][0] and "BLEU on test" not in outputs[1][0]

  def report(workdir):
    scores = json.loads((workdir / "final_test.json").read_text())
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return scores, [row["step"] for row in rows if "bleu" in row]

  (single_scores, single_dev), (multi_scores, multi_dev) = report(single), report(multi)
  assert multi_scores["averaged_steps"] == single_scores["averaged_steps"] == [2, 4]
  assert multi_scores["sentences"] == single_scores["sentences"] == 64
  assert multi_dev == single_dev == [STEPS]
  # The same parameters to ~1e-5 (below): the same translations, unless a near-tie flips.
  assert abs(multi_scores["chrf"] - single_scores["chrf"]) < 1.0
