"""Loading a trained run for translation: config, tokenizer, model and parameters.

Everything comes from the run directory alone (config.json, tokenizer.model,
checkpoints/), so translating needs no dataset.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from transformer_jax import checkpoints, parallel
from transformer_jax.errors import UserError
from transformer_jax.model import Transformer
from transformer_jax.schedules import make_optimizer

AVERAGED_DIR = "checkpoints_averaged"


@dataclasses.dataclass
class LoadedRun:
  config: ml_collections.ConfigDict
  model: Transformer
  params: Any
  tokenizer: Any
  mesh: Any
  step: int


def read_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise UserError(
        f"{workdir} is not a training run (no config.json); pass the --workdir of a "
        "python -m transformer_jax.train run"
    )
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def abstract_train_state(config, model: Transformer, mesh) -> Any:
  """ShapeDtypeStructs (with shardings on `mesh`) of the run's TrainState."""
  from flax import linen as nn

  from transformer_jax.train import initial_state_fn

  boxed = jax.eval_shape(initial_state_fn(model, make_optimizer(config)), jax.random.key(0))
  shardings = parallel.logical_shardings(boxed, mesh)
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.unbox(boxed), shardings
  )


def load_run(workdir: str, checkpoint: str = "latest", mesh=None) -> LoadedRun:
  """Loads `checkpoint` ("latest", "averaged" or a step number) of the run in `workdir`."""
  from transformer_jax.data.tokenizer import load_tokenizer

  workdir = os.path.abspath(workdir)
  config = read_config(workdir)
  tokenizer_path = os.path.join(workdir, "tokenizer.model")
  if not os.path.exists(tokenizer_path):
    raise UserError(f"{tokenizer_path} is missing; the run directory is incomplete")
  tokenizer = load_tokenizer(tokenizer_path)
  mesh = mesh or parallel.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  model = Transformer(config.model)
  abstract = abstract_train_state(config, model, mesh)

  directory = checkpoints.checkpoint_dir(workdir)
  if checkpoint == "averaged":
    directory = os.path.join(workdir, AVERAGED_DIR)
  if not os.path.isdir(directory):
    hint = ("run python -m transformer_jax.average_checkpoints first"
            if checkpoint == "averaged" else "train first")
    raise UserError(f"no checkpoint in {workdir} ({directory} does not exist); {hint}")
  manager = checkpoints.make_manager(directory, None, async_save=False, read_only=True)
  if checkpoint in ("latest", "averaged"):
    restored = checkpoints.restore_latest(manager, abstract, with_data=False)
    if restored is None:
      raise UserError(f"no checkpoint in {directory}; train first")
  else:
    try:
      step = int(checkpoint)
    except ValueError:
      raise UserError(f"--checkpoint={checkpoint!r} is not latest, averaged or a step number") from None
    if step not in manager.all_steps():
      raise UserError(f"no checkpoint at step {step} in {directory}; have {sorted(manager.all_steps())}")
    restored = checkpoints.restore_step(manager, step, abstract, with_data=False)
  state, _, meta = restored
  if meta.get("tokenizer_sha256") != tokenizer.sha256:
    raise UserError(
        f"{tokenizer_path} does not match the checkpoint (sha256 {tokenizer.sha256[:12]} vs "
        f"{str(meta.get('tokenizer_sha256'))[:12]}); restore the run's own tokenizer.model"
    )
  logging.info("loaded %s checkpoint step %d from %s", checkpoint, int(state.step), directory)
  return LoadedRun(config, model, state.params, tokenizer, mesh, int(np.asarray(state.step)))
