"""Task names (`config.task`) to Task classes, and loading a run of any task."""

from __future__ import annotations

import ml_collections
from jax.sharding import Mesh

from transformer_jax.errors import UserError
from transformer_jax.tasks.algorithmic import AlgorithmicTask
from transformer_jax.tasks.base import Task
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.classification import ClassificationTask
from transformer_jax.tasks.image_classification import ImageClassificationTask
from transformer_jax.tasks.masked_lm import MaskedLMTask
from transformer_jax.tasks.prefix_lm import PrefixLMTask
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training.run_dir import LoadedRun, read_config

TASKS: dict[str, type[Task]] = {
    TranslationTask.name: TranslationTask,
    PrefixLMTask.name: PrefixLMTask,
    CausalLMTask.name: CausalLMTask,
    MaskedLMTask.name: MaskedLMTask,
    ClassificationTask.name: ClassificationTask,
    AlgorithmicTask.name: AlgorithmicTask,
    ImageClassificationTask.name: ImageClassificationTask,
}
# Tasks whose runs `translate` and `evaluate` decode.
TRANSLATION_TASKS = (TranslationTask.name, PrefixLMTask.name)


# What config.task is by default, and in a run written before tasks existed.
DEFAULT_TASK = TranslationTask.name


def task_class(name: str) -> type[Task]:
  """The Task class `config.task` names, or a one-line UserError."""
  if name not in TASKS:
    raise UserError(f"config.task={name!r} is not one of {', '.join(TASKS)}")
  return TASKS[name]


def make_task(config: ml_collections.ConfigDict) -> Task:
  """The Task that `config.task` names."""
  return task_class(config.get("task", DEFAULT_TASK))(config)


def load_run(workdir: str, checkpoint: str = "latest", mesh: Mesh | None = None,
             expected_task: str | tuple[str, ...] | None = None) -> LoadedRun:
  """`checkpoint` ("latest", "averaged" or a step) of the run in `workdir`.

  With `expected_task` (a name or several), a run of another task is a
  one-line UserError naming it.
  """
  config = read_config(workdir)
  task = make_task(config)
  expected = (expected_task,) if isinstance(expected_task, str) else expected_task
  if expected is not None and task.name not in expected:
    raise UserError(f"{workdir} is a run of config.task={task.name!r}; this command needs a "
                    f"{' or '.join(expected)} run")
  return task.load_run(workdir, checkpoint, mesh)
