"""A run directory, read back: its config, tokenizer and checkpoints, for inference and averaging.

Everything comes from the run directory alone (config.json, tokenizer.model,
checkpoints/), so translating needs no dataset. The caller says which model the
run trained (a task's `build_model` and `init_params`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from transformer_jax import sharding
from transformer_jax.data.tokenizer import Tokenizer, load_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.training import checkpoints
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer
from transformer_jax.training.state import InitParams, TrainState, abstract_train_state

AVERAGED_DIR = "checkpoints_averaged"


@dataclasses.dataclass
class LoadedRun:
  config: ml_collections.ConfigDict
  model: nn.Module
  params: Any
  tokenizer: Tokenizer | None  # None for a task without one (a fixed vocabulary).
  mesh: Mesh
  step: int


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config.json a training run wrote into `workdir`."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise UserError(
        f"{workdir} is not a training run (no config.json); pass the --workdir of a "
        "python -m transformer_jax.train run"
    )
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def default_mesh() -> Mesh:
  """Every device on the data axis: how inference lays out a run unless told otherwise."""
  return sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))


def _abstract_state(config: ml_collections.ConfigDict, init_params: InitParams, mesh: Mesh
                    ) -> TrainState:
  return abstract_train_state(init_params, make_optimizer(OptimizerConfig.from_config(config)),
                              mesh)


def _abstract_params(init_params: InitParams, mesh: Mesh) -> dict:
  """The step and the parameters as ShapeDtypeStructs on `mesh`: the part of a saved
  TrainState that inference reads."""
  params = sharding.sharded_shapes(jax.eval_shape(init_params, jax.random.key(0)), mesh)
  step = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
  return dict(step=step, params=params)


def _restore(workdir: str, abstract: Any, checkpoint: str, partial: bool) -> tuple[Any, dict]:
  """(the state `abstract` names, meta) of `checkpoint` ("latest", "averaged" or a step)."""
  workdir = os.path.abspath(workdir)
  directory = checkpoints.checkpoint_dir(workdir)
  if checkpoint == "averaged":
    directory = os.path.join(workdir, AVERAGED_DIR)
  if not os.path.isdir(directory):
    hint = ("run python -m transformer_jax.average_checkpoints first"
            if checkpoint == "averaged" else "train first")
    raise UserError(f"no checkpoint in {workdir} ({directory} does not exist); {hint}")
  manager = checkpoints.make_manager(directory, None, async_save=False, read_only=True)
  if checkpoint in ("latest", "averaged"):
    restored = checkpoints.restore_latest(manager, abstract, with_data=False, partial=partial)
    if restored is None:
      raise UserError(f"no checkpoint in {directory}; train first")
  else:
    try:
      step = int(checkpoint)
    except ValueError:
      raise UserError(f"--checkpoint={checkpoint!r} is not latest, averaged or a step number") from None
    if step not in manager.all_steps():
      raise UserError(f"no checkpoint at step {step} in {directory}; have {sorted(manager.all_steps())}")
    restored = checkpoints.restore_step(manager, step, abstract, with_data=False, partial=partial)
  state, _, meta = restored
  step = state["step"] if isinstance(state, dict) else state.step
  logging.info("loaded %s checkpoint step %d from %s", checkpoint, int(np.asarray(step)), directory)
  return state, meta


def restore_state(workdir: str, init_params: InitParams, checkpoint: str = "latest",
                  mesh: Mesh | None = None) -> tuple[TrainState, dict]:
  """(TrainState, meta) of `checkpoint` ("latest", "averaged" or a step number) on `mesh`."""
  abstract = _abstract_state(read_config(workdir), init_params, mesh or default_mesh())
  return _restore(workdir, abstract, checkpoint, partial=False)


def restore_params(workdir: str, init_params: InitParams, checkpoint: str = "latest",
                   mesh: Mesh | None = None) -> tuple[Any, int, dict]:
  """(params, step, meta) of `checkpoint` on `mesh`; the optimizer's state is not read."""
  restored, meta = _restore(workdir, _abstract_params(init_params, mesh or default_mesh()),
                            checkpoint, partial=True)
  return restored["params"], int(np.asarray(restored["step"])), meta


def load_run(workdir: str, config: ml_collections.ConfigDict, model: nn.Module,
             init_params: InitParams, checkpoint: str = "latest", mesh: Mesh | None = None,
             with_tokenizer: bool = True) -> LoadedRun:
  """Loads the parameters of `checkpoint` ("latest", "averaged" or a step number) of the run
  in `workdir`, whose config.json the caller read (`config`), for inference; with
  `with_tokenizer`, its tokenizer.model too, checked against the checkpoint."""
  workdir = os.path.abspath(workdir)
  tokenizer_path = os.path.join(workdir, "tokenizer.model")
  if with_tokenizer and not os.path.exists(tokenizer_path):
    raise UserError(f"{tokenizer_path} is missing; the run directory is incomplete")
  tokenizer = load_tokenizer(tokenizer_path) if with_tokenizer else None
  mesh = mesh or default_mesh()
  params, step, meta = restore_params(workdir, init_params, checkpoint, mesh)
  if with_tokenizer and meta.get("tokenizer_sha256") != tokenizer.sha256:
    raise UserError(
        f"{tokenizer_path} does not match the checkpoint (sha256 {tokenizer.sha256[:12]} vs "
        f"{str(meta.get('tokenizer_sha256'))[:12]}); restore the run's own tokenizer.model"
    )
  return LoadedRun(config, model, params, tokenizer, mesh, step)


def average_checkpoints(workdir: str, last: int, init_params: InitParams) -> tuple[int, list[int]]:
  """Writes the average of the newest `last` checkpoints to checkpoints_averaged/<newest step>/.

  §6.1 averages the last 5 (base) or 20 (big). The training checkpoints are only
  read, never changed.

  Returns:
    (the newest step, the steps averaged).
  """
  if last < 1:
    raise UserError(f"--last={last} must be at least 1")
  workdir = os.path.abspath(workdir)
  abstract = _abstract_state(read_config(workdir), init_params, default_mesh())
  source = checkpoints.make_manager(checkpoints.checkpoint_dir(workdir), None, False, read_only=True)
  steps = sorted(source.all_steps())[-last:]
  if not steps:
    raise UserError(f"no checkpoint in {workdir}; train first")
  if len(steps) < last:
    print(f"warning: only {len(steps)} checkpoints exist; averaging {steps}")
  total, meta, newest = None, None, None
  for step in tqdm(steps, desc="averaging checkpoints", unit=" checkpoints", disable=None,
                   leave=False):
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
  if jax.process_index() == 0 and os.path.isdir(target_dir):
    shutil.rmtree(target_dir)  # One averaged checkpoint at a time.
  if jax.process_count() > 1:  # No host writes before the old average is gone.
    multihost_utils.sync_global_devices("removed the previous averaged checkpoint")
  target = checkpoints.make_manager(target_dir, 1, async_save=False)
  meta = dict(meta, averaged_steps=steps)
  checkpoints.save(target, steps[-1], newest.replace(params=averaged), None, meta)
  target.wait_until_finished()
  return steps[-1], steps
