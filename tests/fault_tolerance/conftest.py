"""Fixtures for the fault-tolerance tests: one uninterrupted tiny run, copied per test."""

from __future__ import annotations

import pathlib

import pytest

from fault_tolerance import runner


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
