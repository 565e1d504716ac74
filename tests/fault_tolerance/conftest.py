"""Fixtures for the fault-tolerance tests: one uninterrupted tiny run, copied per test,
and a command's `main` run in this process."""

from __future__ import annotations

import importlib
import io
import pathlib
import sys
import time
from typing import Callable

import pytest
from absl import app, flags

from fault_tolerance import runner
from transformer_jax.cli import common


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(prepared_dir, workdir of an uninterrupted 20-step run); never modify the workdir."""
  return runner.shared_run(tmp_path_factory)


@pytest.fixture
def prepared_dir(shared_run) -> pathlib.Path:
  return shared_run[0]


@pytest.fixture
def uninterrupted(shared_run) -> pathlib.Path:
  return shared_run[1]


@pytest.fixture
def trained_copy(shared_run, tmp_path) -> pathlib.Path:
  """A private copy of the uninterrupted run's workdir, free to damage."""
  return runner.copy_run(shared_run[1], tmp_path / "run")


def pytest_configure(config) -> None:
  config.addinivalue_line("markers", "slow: takes minutes; deselect with -m 'not slow'")


@pytest.fixture
def run_in_process(monkeypatch, capsys) -> Callable[..., runner.Result]:
  """Runs `python -m transformer_jax.<module> FLAGS...` as this process's `main`.

  The command defines its flags and parses them as on the command line; they
  are removed again afterwards, so the next command can define its own. Runs
  from the repository root with this process's devices (8 simulated CPUs).
  """
  defined_before = set(flags.FLAGS)

  def run(module: str, *argv: str, stdin: bytes = b"") -> runner.Result:
    command = importlib.import_module(f"transformer_jax.cli.{module}")
    started = time.time()
    monkeypatch.chdir(runner.REPO)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    monkeypatch.setattr(common, "keep_freed_host_memory", lambda: None)
    monkeypatch.setattr(app, "run", lambda main, flags_parser: main(flags_parser(sys.argv)))
    capsys.readouterr()
    try:
      command.run()
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
      flags.FLAGS.unparse_flags()
      for name in set(flags.FLAGS) - defined_before:
        delattr(flags.FLAGS, name)
    out, err = capsys.readouterr()
    return runner.Result([module, *argv], code, out, err, time.time() - started)

  return run
