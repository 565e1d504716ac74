"""Task names (`config.task`) to Task classes, and loading a run of any task."""

from __future__ import annotations

import ml_collections
from jax.sharding import Mesh

from transformer_jax.errors import UserError
from transformer_jax.tasks.base import Task
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training.run_dir import LoadedRun, read_config

TASKS: dict[str, type[Task]] = {
    TranslationTask.name: TranslationTask,
}


def make_task(config: ml_collections.ConfigDict) -> Task:
  """The Task that `config.task` names (a run written before tasks existed: translation)."""
  name = config.get("task", TranslationTask.name)
  if name not in TASKS:
    raise UserError(f"config.task={name!r} is not one of {', '.join(TASKS)}")
  return TASKS[name](config)


def load_run(workdir: str, checkpoint: str = "latest", mesh: Mesh | None = None) -> LoadedRun:
  """`checkpoint` ("latest", "averaged" or a step) of the run in `workdir`, whatever its task."""
  return make_task(read_config(workdir)).load_run(workdir, checkpoint, mesh)
