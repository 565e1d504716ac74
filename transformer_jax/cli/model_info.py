"""Prints a model's parameter count, in total and by component.

  python -m transformer_jax.model_info --config=experiments/configs/wmt14_base.py
"""

from __future__ import annotations

import functools

from absl import app

from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model.info import abstract_params, format_counts, parameter_counts
from transformer_jax.tasks.registry import make_task


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  config = common.FLAGS.config
  if config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/wmt14_base.py")
  task = make_task(config)
  model = task.build_model()
  print(format_counts(parameter_counts(abstract_params(functools.partial(task.init_params, model)))))


def run() -> None:
  common.define_run_flags()
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
