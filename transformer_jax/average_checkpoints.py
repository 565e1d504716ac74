"""Averages the parameters of the last K checkpoints (§6.1: 5 for base, 20 for big).

  python -m transformer_jax.average_checkpoints --workdir=DIR [--last=K]

Writes <workdir>/checkpoints_averaged/<newest step>/, which translate and
evaluate select with --checkpoint=averaged. K defaults to the run's
`average_last_checkpoints` (what training's final report averages). The
training checkpoints are only read, never changed.
"""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
from absl import app, flags

from transformer_jax import checkpoints
from transformer_jax.errors import UserError, exit_on_user_error

FLAGS = flags.FLAGS


def average_checkpoints(workdir: str, last: int) -> tuple[int, list[int]]:
  """Writes the average of the newest `last` checkpoints; returns (step, steps averaged)."""
  from transformer_jax.inference import AVERAGED_DIR, abstract_train_state, read_config
  from transformer_jax import parallel
  from transformer_jax.model import Transformer

  if last < 1:
    raise UserError(f"--last={last} must be at least 1")
  workdir = os.path.abspath(workdir)
  config = read_config(workdir)
  mesh = parallel.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  abstract = abstract_train_state(config, Transformer(config.model), mesh)
  source = checkpoints.make_manager(checkpoints.checkpoint_dir(workdir), None, False, read_only=True)
  steps = sorted(source.all_steps())[-last:]
  if not steps:
    raise UserError(f"no checkpoint in {workdir}; train first")
  if len(steps) < last:
    print(f"warning: only {len(steps)} checkpoints exist; averaging {steps}")
  total, meta, newest = None, None, None
  for step in steps:
    try:
      state, _, meta = checkpoints.restore_step(source, step, abstract, with_data=False)
    except UserError:
      raise
    except Exception as e:  # Orbax raises many types for damaged files.
      raise UserError(
          f"checkpoint {os.path.join(checkpoints.checkpoint_dir(workdir), str(step))} is unreadable "
          f"({type(e).__name__}); average fewer (--last) or move that folder away; nothing was written"
      ) from None
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), state.params)
    total = params if total is None else jax.tree.map(np.add, total, params)
    newest = state
  averaged = jax.tree.map(
      lambda s, ref: jax.device_put((s / len(steps)).astype(ref.dtype), ref.sharding),
      total, newest.params,
  )
  target_dir = os.path.join(workdir, AVERAGED_DIR)
  if os.path.isdir(target_dir):
    shutil.rmtree(target_dir)  # One averaged checkpoint at a time.
  target = checkpoints.make_manager(target_dir, 1, async_save=False)
  meta = dict(meta, averaged_steps=steps)
  checkpoints.save(target, steps[-1], newest.replace(params=averaged), None, meta)
  target.wait_until_finished()
  return steps[-1], steps


@exit_on_user_error
def main(argv):
  del argv
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the run directory of a training run")
  last = FLAGS.last
  if last is None:
    from transformer_jax.inference import read_config

    last = read_config(FLAGS.workdir).average_last_checkpoints
  step, steps = average_checkpoints(FLAGS.workdir, last)
  print(f"averaged steps {steps} into {os.path.join(FLAGS.workdir, 'checkpoints_averaged', str(step))}")


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "Run directory of a training run.")
  flags.DEFINE_integer("last", None, "How many of the newest checkpoints to average; "
                       "default: the run config's average_last_checkpoints.")
  from transformer_jax import cli

  app.run(main, flags_parser=cli.parse_flags)
