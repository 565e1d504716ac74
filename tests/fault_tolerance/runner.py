"""Runs the real commands as subprocesses, and reads what they leave in a workdir.

Shared by `tests/test_resume.py` and `tests/fault_tolerance/`. Every run uses
the tiny config on 300 generated pairs with one bucket (one train-step shape),
a prepared-data folder shared by the session, and the persistent compilation
cache that `tests/conftest.py` points every process at.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20  # The tiny config: checkpoints at 10 and 20, logs every 5, evals at 10 and 20.
DEVICES = 2  # Simulated CPU devices per run: sharded, and cheaper than 8 on a small machine.
TRAIN_TIMEOUT_S = 240
QUICK_TIMEOUT_S = 120
# Metrics that a resumed run must reproduce exactly (not elapsed_s or tokens_per_s).
DETERMINISTIC_KEYS = ("split", "step", "loss", "perplexity", "learning_rate", "grad_norm", "nll",
                      "loss_above_entropy")


def env(devices: int = DEVICES, **extra: Any) -> dict[str, str]:
  """This process's environment with `devices` simulated CPU devices."""
  result = dict(os.environ)
  flags = [f for f in result.get("XLA_FLAGS", "").split() if "device_count" not in f]
  result["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
  result["PYTHONUNBUFFERED"] = "1"
  result.pop("TRANSFORMER_JAX_DATA_DIR", None)  # Tests name their data folders.
  result.update({k: str(v) for k, v in extra.items()})
  return result


def base_flags(prepared_dir: os.PathLike) -> list[str]:
  return [
      "--config=experiments/configs/tiny.py",
      "--config.data.num_generated_train=300",
      "--config.data.bucket_boundaries=(48,)",
      f"--config.data.prepared_dir={prepared_dir}",
  ]


def train_command(workdir: os.PathLike, prepared_dir: os.PathLike, *flags: str) -> list[str]:
  return [sys.executable, "-m", "transformer_jax.train", *base_flags(prepared_dir),
          f"--workdir={workdir}", *flags]


def module_command(module: str, *flags: str) -> list[str]:
  return [sys.executable, "-m", f"transformer_jax.{module}", *flags]


@dataclasses.dataclass
class Result:
  command: list[str]
  returncode: int
  stdout: str
  stderr: str
  seconds: float

  def describe(self) -> str:
    return (f"command: {' '.join(self.command)}\nexit {self.returncode} after "
            f"{self.seconds:.1f}s\n--- stdout (end)\n{self.stdout[-2000:]}\n--- stderr (end)\n"
            f"{self.stderr[-4000:]}")


def run(command: Sequence[str], timeout: float = TRAIN_TIMEOUT_S, stdin: bytes | None = None,
        environment: dict[str, str] | None = None) -> Result:
  """Runs `command` from the repository root; never hangs past `timeout`."""
  started = time.time()
  completed = subprocess.run(
      list(command), cwd=REPO, env=environment or env(), input=stdin or b"",
      capture_output=True, timeout=timeout,
  )
  return Result(list(command), completed.returncode, completed.stdout.decode(errors="replace"),
                completed.stderr.decode(errors="replace"), time.time() - started)


def train(workdir: os.PathLike, prepared_dir: os.PathLike, *flags: str,
          timeout: float = TRAIN_TIMEOUT_S) -> Result:
  return run(train_command(workdir, prepared_dir, *flags), timeout)


def train_ok(workdir: os.PathLike, prepared_dir: os.PathLike, *flags: str) -> Result:
  result = train(workdir, prepared_dir, *flags)
  assert result.returncode == 0, f"training failed:\n{result.describe()}"
  return result


class Background:
  """A command running in the background, its stderr collected to a file."""

  def __init__(self, command: Sequence[str], log_path: os.PathLike,
               environment: dict[str, str] | None = None):
    self.command = list(command)
    self.log_path = pathlib.Path(log_path)
    self._log = open(self.log_path, "wb")
    self.started = time.time()
    self.process = subprocess.Popen(self.command, cwd=REPO, env=environment or env(),
                                    stdin=subprocess.DEVNULL, stdout=self._log,
                                    stderr=subprocess.STDOUT)

  def output(self) -> str:
    return self.log_path.read_text(errors="replace")

  def wait_for(self, predicate, timeout: float = TRAIN_TIMEOUT_S, what: str = "") -> None:
    """Polls `predicate()` until true; fails if the process ends or time runs out first."""
    deadline = time.time() + timeout
    while not predicate():
      if self.process.poll() is not None:
        raise AssertionError(f"the process ended (exit {self.process.returncode}) before "
                             f"{what}:\n{self.output()[-4000:]}")
      if time.time() > deadline:
        self.kill()
        raise AssertionError(f"no {what} after {timeout}s:\n{self.output()[-4000:]}")
      time.sleep(0.05)

  def wait_for_text(self, text: str, timeout: float = TRAIN_TIMEOUT_S) -> None:
    self.wait_for(lambda: text in self.output(), timeout, repr(text))

  def signal(self, signum: int) -> None:
    self.process.send_signal(signum)

  def kill(self) -> None:
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGKILL)
    self.process.wait()

  def wait(self, timeout: float) -> int | None:
    """The exit status, or None if still running after `timeout` (then killed)."""
    try:
      return self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      return None
    finally:
      self._log.close()


# --- What a run leaves behind ---------------------------------------------------------


def checkpoint_steps(workdir: os.PathLike) -> list[int]:
  """Complete checkpoints (Orbax renames a finished `<step>.orbax-checkpoint-tmp`)."""
  directory = pathlib.Path(workdir) / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def partial_checkpoints(workdir: os.PathLike) -> list[str]:
  directory = pathlib.Path(workdir) / "checkpoints"
  return sorted(p.name for p in directory.glob("*orbax-checkpoint-tmp*"))


def file_hashes(directory: os.PathLike) -> dict[str, str]:
  """sha256 of every file under `directory`, by relative path."""
  root = pathlib.Path(directory)
  return {
      str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
      for p in sorted(root.rglob("*")) if p.is_file()
  }


def checkpoint_hashes(workdir: os.PathLike) -> dict[str, str]:
  return file_hashes(pathlib.Path(workdir) / "checkpoints")


def metrics_rows(workdir: os.PathLike) -> list[dict]:
  """metrics.jsonl rows, only the keys a resumed run must reproduce bitwise."""
  rows = []
  with open(pathlib.Path(workdir) / "metrics.jsonl") as f:
    for line in f:
      row = json.loads(line)
      rows.append({k: row[k] for k in DETERMINISTIC_KEYS if k in row})
  return rows


def final_state(workdir: os.PathLike, step: int | None = None):
  """The newest (or `step`'s) checkpointed TrainState, as numpy arrays on one device."""
  import jax

  from transformer_jax import sharding
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.run_dir import read_config, restore_state

  task = make_task(read_config(str(workdir)))
  model = task.build_model()
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  checkpoint = "latest" if step is None else str(step)
  state, _ = restore_state(str(workdir), lambda key: task.init_params(model, key), checkpoint, mesh)
  return jax.device_get(state)


def assert_states_bitwise_equal(workdir: os.PathLike, reference: os.PathLike) -> None:
  """The final TrainStates (step, parameters, Adam moments) are identical bit for bit."""
  import jax
  import numpy as np

  got, want = final_state(workdir), final_state(reference)
  assert int(got.step) == int(want.step), f"final step {int(got.step)} != {int(want.step)}"
  got_leaves = jax.tree_util.tree_leaves_with_path(got)
  want_leaves = jax.tree.leaves(want)
  assert len(got_leaves) == len(want_leaves)
  for (path, a), b in zip(got_leaves, want_leaves):
    assert a.dtype == b.dtype and np.array_equal(a, b), (
        f"{jax.tree_util.keystr(path)} differs from the uninterrupted run's "
        f"(max |diff| {np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))})")


def assert_same_metrics(workdir: os.PathLike, reference: os.PathLike) -> None:
  got, want = metrics_rows(workdir), metrics_rows(reference)
  assert got == want, (
      "metrics.jsonl differs from the uninterrupted run's on "
      f"{DETERMINISTIC_KEYS}:\ngot  {json.dumps(got, indent=None)}\nwant {json.dumps(want)}")


def copy_run(source: os.PathLike, destination: os.PathLike) -> pathlib.Path:
  shutil.copytree(source, destination, symlinks=True)
  return pathlib.Path(destination)


# --- The shared uninterrupted run -------------------------------------------------------

_SHARED: dict[str, tuple[pathlib.Path, pathlib.Path]] = {}


def shared_run(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(prepared_dir, workdir of an uninterrupted STEPS-step run), made once per test run.

  The pytest-xdist workers share it: the first to come trains it under a lock
  in the run's common temporary folder, the others wait and read it. Tests
  copy the workdir before changing anything in it.
  """
  base = pathlib.Path(tmp_path_factory.getbasetemp())
  if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is <the run's folder>/popen-gwN.
    base = base.parent
  root = base / "fault_tolerance_shared"
  key = str(root)
  if key not in _SHARED:
    root.mkdir(parents=True, exist_ok=True)
    prepared, workdir = root / "prepared", root / "uninterrupted"
    with open(root / "lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not (workdir / "checkpoints" / str(STEPS)).is_dir():
        shutil.rmtree(workdir, ignore_errors=True)
        train_ok(workdir, prepared)
    _SHARED[key] = (prepared, workdir)
  return _SHARED[key]
