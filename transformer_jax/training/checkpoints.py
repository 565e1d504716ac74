"""Orbax checkpoints that resume exactly.

Each checkpoint `<workdir>/checkpoints/<step>/` holds:
  state: the TrainState (step, params, optimizer state), restorable onto any mesh;
  data:  the training iterator's position (JSON);
  meta:  the resolved config, the step and the tokenizer's SHA-256 (JSON).
Orbax writes into a temporary folder and renames it when complete, so an
interrupted save is never listed as the latest step.
"""

from __future__ import annotations

import logging as python_logging
import os
import re
import sys
import time
import traceback
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from absl import logging

from transformer_jax.errors import UserError

# Model keys whose change makes a checkpoint unusable for a config.
_SHAPE_KEYS = (
    "vocab_size", "source_vocab_size", "share_embeddings", "tie_output",
    "num_encoder_layers", "num_decoder_layers", "d_model", "d_ff", "num_heads", "d_k",
    "d_v", "positions", "max_len", "norm", "attention_bias", "logits_bias",
)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def make_manager(
    directory: str, max_to_keep: int | None = 5, async_save: bool = True, read_only: bool = False
) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory` (saves are asynchronous by default)."""
  _drop_closed_loop_callbacks()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      enable_async_checkpointing=async_save,
      create=not read_only,
      read_only=read_only,
  )
  return ocp.CheckpointManager(directory, options=options)


def _drop_closed_loop_callbacks() -> None:
  """Silences tensorstore's 'Event loop is closed' reports after a failed read or write.

  Orbax closes its event loop when one read or write fails; the others finish
  later and tensorstore prints each as an unraisable RuntimeError (dozens of
  tracebacks). The failure itself is raised, and reported, once.
  """
  previous = sys.unraisablehook
  if getattr(previous, "drops_closed_loop_callbacks", False):
    return

  def hook(unraisable) -> None:
    value = unraisable.exc_value
    if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
      previous(unraisable)

  hook.drops_closed_loop_callbacks = True
  sys.unraisablehook = hook


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    data_state: dict | None,
    meta: dict,
) -> None:
  """Starts saving `state` at `step` (returns before the write completes).

  A failed write (a full disk, a read-only folder) of this or the previous
  asynchronous save is a one-line UserError.
  """
  items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
  if data_state is not None:
    items["data"] = ocp.args.JsonSave(data_state)
  try:
    manager.save(step, args=ocp.args.Composite(**items), force=True)
  except Exception as e:  # Orbax re-raises a background write's error as it was.
    raise _write_error(manager, e) from e


def wait_until_finished(manager: ocp.CheckpointManager) -> None:
  """Waits for the asynchronous save in flight; a failed write is a UserError."""
  try:
    manager.wait_until_finished()
  except Exception as e:
    raise _write_error(manager, e) from e


def _write_error(manager: ocp.CheckpointManager, error: Exception) -> UserError:
  os_error = re.search(r": ([^:\[\]]+) \[os_error_code='\d+'\]", str(error))  # Tensorstore's.
  if isinstance(error, OSError):
    message = f"{error.strerror}: {error.filename}"
  elif os_error:
    message = os_error.group(1)
  else:
    message = " ".join(str(error).split())[:300]
  return UserError(
      f"writing a checkpoint in {manager.directory} failed ({message}); "
      f"the complete checkpoints (steps {sorted(manager.all_steps())}) are intact; free disk "
      "space or make the folder writable, then rerun the command to resume"
  )


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict:
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore_latest(
    manager: ocp.CheckpointManager,
    abstract_state: Any,
    with_data: bool = True,
    check_meta: Callable[[dict], None] | None = None,
    set_aside_unreadable: bool = False,
    partial: bool = False,
) -> tuple[Any, dict | None, dict] | None:
  """Restores the newest readable checkpoint onto `abstract_state`'s shardings.

  A checkpoint that fails to read (a truncated or deleted file) is reported on
  stderr with a warning naming it, and the previous one is tried. With
  `set_aside_unreadable` (training), it is moved to `checkpoints_unreadable/`
  beside the checkpoint folder so that its step can be saved again.

  Args:
    check_meta: called with each checkpoint's meta before its state is read;
      raises a UserError if the checkpoint does not fit the run.
    partial: read only the part of the saved state that `abstract_state` names
      (inference: the step and parameters, not the optimizer's moments).

  Returns:
    (state, data_state, meta), or None if there is no checkpoint.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  unreadable = []
  restored = None
  for step in steps:
    try:
      restored = restore_step(manager, step, abstract_state, with_data, check_meta, partial)
      break
    except UserError:
      raise
    except Exception as e:  # Orbax raises many types for damaged files.
      path = os.path.join(str(manager.directory), str(step))
      message = " ".join(str(e).split())[:300]
      logging.warning("checkpoint %s is unreadable (%s)", path, message)
      print(f"warning: checkpoint {path} is unreadable ({type(e).__name__}); falling back to "
            "the previous checkpoint", file=sys.stderr, flush=True)
      unreadable.append(path)
  if restored is None and steps:
    raise UserError(
        f"no readable checkpoint in {manager.directory} (tried steps {steps}); if the config "
        "changed since they were written, resume with the one in config.json; else move the "
        "folder away to start fresh"
    )
  if unreadable and set_aside_unreadable:
    _set_aside(manager, unreadable)
  return restored


def silence_abandoned_reads() -> None:
  """Keeps the failed restore's other array reads from printing tracebacks later.

  When one array of a damaged checkpoint fails, Orbax abandons the coroutines
  reading the others; when they are garbage-collected Python prints each of
  their errors as "Exception ignored in ..." with a traceback. The checkpoint
  has already been reported (one warning line), so those are dropped; every
  other unraisable exception still reaches the previous hook. Installed before
  each read (it is idempotent), so it is in place whenever the abandoned reads
  are freed; in the runs seen here that was at exit.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_drops_abandoned_reads", False):
    return

  def hook(unraisable):
    name = getattr(getattr(unraisable.object, "cr_code", None), "co_name", "")
    if "read" not in name or "orbax" not in getattr(
        getattr(unraisable.object, "cr_code", None), "co_filename", ""):
      previous(unraisable)

  hook._drops_abandoned_reads = True
  sys.unraisablehook = hook
  # Abandoned reads that ran as asyncio Tasks are logged instead, as "Task
  # exception was never retrieved" (when and whether depends on the garbage
  # collector): a filter on the logger itself also holds for logging's
  # last-resort handler at exit.
  python_logging.getLogger("asyncio").addFilter(_drop_abandoned_orbax_tasks)


def _drop_abandoned_orbax_tasks(record) -> bool:
  """False for asyncio's "... exception was never retrieved" about a checkpoint read.

  Those come as Tasks (whose repr names the Orbax coroutine), as gathering
  futures of them, and as TensorStore futures: their messages name Orbax, a
  TensorStore spec or an OCDBT file, or their tracebacks pass through Orbax.
  """
  message = record.getMessage()
  if "never retrieved" not in message:
    return True
  if record.exc_info and record.exc_info[2] is not None:
    message += " ".join(frame.filename for frame in traceback.extract_tb(record.exc_info[2]))
  return not any(marker in message for marker in ("orbax", "TensorStore", "OCDBT"))


def _set_aside(manager: ocp.CheckpointManager, paths: list[str]) -> None:
  """Moves unreadable checkpoints out of the manager's folder (kept for inspection)."""
  target_dir = os.path.join(os.path.dirname(str(manager.directory)), "checkpoints_unreadable")
  if jax.process_index() == 0:
    os.makedirs(target_dir, exist_ok=True)
    for path in paths:
      target = os.path.join(target_dir, f"{os.path.basename(path)}-{int(time.time())}")
      os.rename(path, target)
      print(f"warning: moved unreadable {path} to {target}", file=sys.stderr, flush=True)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("set aside unreadable checkpoints")
  manager.reload()


def restore_step(
    manager: ocp.CheckpointManager,
    step: int,
    abstract_state: Any,
    with_data: bool = True,
    check_meta: Callable[[dict], None] | None = None,
    partial: bool = False,
) -> tuple[Any, dict | None, dict]:
  """Restores checkpoint `step`: (state, data_state or None, meta).

  `check_meta(meta)` runs before the state is read, so a checkpoint of another
  model fails with its UserError instead of an Orbax shape error. `partial` reads
  only the part of the state that `abstract_state` names.
  """
  if check_meta is not None:
    check_meta(read_meta(manager, step))
  silence_abandoned_reads()  # In place before any failed read's tasks are freed.
  if partial:
    state_args = ocp.args.PyTreeRestore(
        item=abstract_state, partial_restore=True,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))
  else:
    state_args = ocp.args.StandardRestore(abstract_state)
  items = dict(state=state_args, meta=ocp.args.JsonRestore())
  has_data = with_data and os.path.isdir(os.path.join(str(manager.directory), str(step), "data"))
  if has_data:
    items["data"] = ocp.args.JsonRestore()
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return restored["state"], restored["data"] if has_data else None, restored["meta"]


def read_params(manager: ocp.CheckpointManager, step: int) -> dict:
  """The parameters of checkpoint `step` as nested dicts of host arrays, whatever the model."""
  silence_abandoned_reads()
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return jax.tree.map(lambda x: jax.device_get(x), restored["state"]["params"])


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


def check_same_train_state(saved_config: dict, config: Any, workdir: str) -> None:
  """Raises a one-line UserError if the config's train state has another structure than the
  saved one's: another task (other parameters), or clipping turned on or off (an optimizer
  state of another shape). Otherwise Orbax fails on every checkpoint alike, which reads as
  damage."""
  saved_task, task = saved_config.get("task"), config.get("task")
  if saved_task is not None and saved_task != task:
    raise UserError(f"{workdir} holds a checkpoint of task {saved_task!r}, not {task!r}; "
                    f"use a new --workdir, or --config.task={saved_task}")
  saved_clip = float(saved_config.get("grad_clip_norm") or 0.0)
  if (saved_clip > 0) != (float(config.get("grad_clip_norm") or 0.0) > 0):
    raise UserError(
        f"{workdir} was trained with config.grad_clip_norm={saved_clip:g}, and turning "
        f"clipping {'off' if saved_clip > 0 else 'on'} changes the optimizer state; resume with "
        f"--config.grad_clip_norm={saved_clip:g} (any value above 0 keeps clipping on), or use "
        "a new --workdir")


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the same shardings, for restoring onto a mesh."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
  )
