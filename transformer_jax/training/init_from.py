"""Starting a fresh run from another run's weights (`config.init_from=RUN_DIR`).

Every parameter of this model whose name and shape the other run's latest
checkpoint has is taken from it; the rest keep their fresh initialisation
(a classifier takes a masked-LM run's encoder and starts its pooled head
from scratch). The optimizer state starts fresh. A resumed run reads its own
checkpoint, never the other run.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import traverse_util

from transformer_jax.errors import UserError
from transformer_jax.training import checkpoints


def read_latest_params(workdir: str) -> tuple[dict, int]:
  """(params as nested dicts of numpy arrays, step) of the latest checkpoint in `workdir`."""
  directory = checkpoints.checkpoint_dir(os.path.abspath(workdir))
  if not os.path.isdir(directory):
    raise UserError(f"config.init_from={workdir} holds no checkpoints ({directory} does not "
                    "exist); name a trained run directory")
  manager = checkpoints.make_manager(directory, None, async_save=False, read_only=True)
  step = manager.latest_step()
  if step is None:
    raise UserError(f"config.init_from={workdir} holds no complete checkpoint; train it first")
  return checkpoints.read_params(manager, step), step


def take_params(params: Any, pretrained: dict, source: str) -> tuple[Any, list[str], list[str]]:
  """(params with every same-named, same-shaped leaf of `pretrained`, names taken, names kept).

  `params` are this run's (possibly sharded) arrays; each taken leaf keeps its
  sharding and dtype. A leaf of the same name but another shape is a UserError.
  """
  flat = traverse_util.flatten_dict(params)
  theirs = traverse_util.flatten_dict(pretrained)
  taken, kept, merged = [], [], {}
  for path, leaf in flat.items():
    name = "/".join(path)
    if path not in theirs:
      kept.append(name)
      merged[path] = leaf
      continue
    value = np.asarray(theirs[path]).astype(leaf.dtype)
    if value.shape != leaf.shape:
      raise UserError(f"config.init_from={source}: parameter {name} has shape {value.shape} "
                      f"there and {leaf.shape} here; start from a run of the same model size")
    merged[path] = jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                                lambda index, value=value: value[index])
    taken.append(name)
  if not taken:
    raise UserError(f"config.init_from={source}: none of its parameters match this model's "
                    "names; start from a run of a related task (e.g. masked_lm for classification)")
  return traverse_util.unflatten_dict(merged), taken, kept


def params_from_run(params: Any, workdir: str) -> Any:
  """`params` with what the run in `workdir` has of them (see `take_params`)."""
  pretrained, step = read_latest_params(workdir)
  merged, taken, kept = take_params(params, pretrained, workdir)
  logging.info("init_from %s step %d: took %d parameter arrays; fresh: %s", workdir, step,
               len(taken), ", ".join(kept) or "none")
  if jax.process_index() == 0:
    print(f"init_from {workdir} (step {step}): took {len(taken)} parameter arrays; "
          f"initialised afresh: {', '.join(kept) or 'none'}", flush=True)
  return merged
