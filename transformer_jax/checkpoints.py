"""Orbax checkpoints that resume exactly.

Each checkpoint `<workdir>/checkpoints/<step>/` holds:
  state: the TrainState (step, params, optimizer state), restorable onto any mesh;
  data:  the training iterator's position (JSON);
  meta:  the resolved config, the step and the tokenizer's SHA-256 (JSON).
Orbax writes into a temporary folder and renames it when complete, so an
interrupted save is never listed as the latest step.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from transformer_jax.errors import UserError

# Model keys whose change makes a checkpoint unusable for a config.
_SHAPE_KEYS = (
    "vocab_size", "source_vocab_size", "share_embeddings", "tie_output", "num_layers",
    "num_encoder_layers", "num_decoder_layers", "d_model", "d_ff", "num_heads", "d_k",
    "d_v", "positions", "max_len", "norm",
)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def make_manager(
    directory: str, max_to_keep: int | None = 5, async_save: bool = True, read_only: bool = False
) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory` (saves are asynchronous by default)."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      enable_async_checkpointing=async_save,
      create=not read_only,
      read_only=read_only,
  )
  return ocp.CheckpointManager(directory, options=options)


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    data_state: dict | None,
    meta: dict,
) -> None:
  """Starts saving `state` at `step` (returns before the write completes)."""
  items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
  if data_state is not None:
    items["data"] = ocp.args.JsonSave(data_state)
  manager.save(step, args=ocp.args.Composite(**items), force=True)


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict:
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore_latest(
    manager: ocp.CheckpointManager, abstract_state: Any, with_data: bool = True
) -> tuple[Any, dict | None, dict] | None:
  """Restores the newest readable checkpoint onto `abstract_state`'s shardings.

  A checkpoint that fails to read (a truncated or deleted file) is reported
  with a warning naming it, and the previous one is tried.

  Returns:
    (state, data_state, meta), or None if there is no checkpoint.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  for step in steps:
    try:
      return restore_step(manager, step, abstract_state, with_data)
    except UserError:
      raise
    except Exception as e:  # Orbax raises many types for damaged files.
      message = " ".join(str(e).split())[:300]
      logging.warning("checkpoint %s is unreadable (%s); falling back to the previous one",
                      os.path.join(str(manager.directory), str(step)), message)
      print(f"warning: checkpoint step {step} in {manager.directory} is unreadable; "
            "falling back to the previous checkpoint", flush=True)
  if steps:
    raise UserError(
        f"no readable checkpoint in {manager.directory} (tried steps {steps}); "
        "delete the folder to start fresh"
    )
  return None


def restore_step(
    manager: ocp.CheckpointManager, step: int, abstract_state: Any, with_data: bool = True
) -> tuple[Any, dict | None, dict]:
  """Restores checkpoint `step`: (state, data_state or None, meta)."""
  items = dict(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
  has_data = with_data and os.path.isdir(os.path.join(str(manager.directory), str(step), "data"))
  if has_data:
    items["data"] = ocp.args.JsonRestore()
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return restored["state"], restored["data"] if has_data else None, restored["meta"]


def check_compatible(saved_model_config: dict, model_config: dict, workdir: str) -> None:
  """Raises a one-line UserError if the saved model's shapes differ from the config's."""
  for key in _SHAPE_KEYS:
    saved, wanted = saved_model_config.get(key), model_config.get(key)
    if saved != wanted:
      raise UserError(
          f"{workdir} holds a checkpoint of a different model (config.model.{key}: "
          f"checkpoint {saved!r}, config {wanted!r}); use a new --workdir, or delete "
          f"{checkpoint_dir(workdir)} to start fresh"
      )


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the same shardings, for restoring onto a mesh."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
  )
