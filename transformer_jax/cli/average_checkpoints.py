"""Averages the parameters of the last K checkpoints (§6.1: 5 for base, 20 for big).

  python -m transformer_jax.average_checkpoints --workdir=DIR [--last=K]

Writes <workdir>/checkpoints_averaged/<newest step>/, which translate and
evaluate select with --checkpoint=averaged. K defaults to the run's
`average_last_checkpoints` (what training's final report averages). The
training checkpoints are only read, never changed.
"""

from __future__ import annotations

import os

from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.errors import exit_on_user_error
from transformer_jax.tasks.registry import make_task
from transformer_jax.training.run_dir import AVERAGED_DIR, read_config

FLAGS = common.FLAGS


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  workdir = common.require_workdir()
  config = read_config(workdir)
  last = config.average_last_checkpoints if FLAGS.last is None else FLAGS.last
  step, steps = make_task(config).average_checkpoints(workdir, last)
  print(f"averaged steps {steps} into {os.path.join(workdir, AVERAGED_DIR, str(step))}")


def run() -> None:
  flags.DEFINE_string("workdir", None, "Run directory of a training run.")
  flags.DEFINE_integer("last", None, "How many of the newest checkpoints to average; "
                       "default: the run config's average_last_checkpoints.")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
