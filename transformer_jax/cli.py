"""Flags shared by the command-line entry points (train, translate, evaluate)."""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from transformer_jax.errors import UserError

FLAGS = flags.FLAGS

config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. experiments/configs/quickstart.py.",
    lock_config=True,
)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def quiet_libraries() -> None:
  """Keeps Orbax's and TFDS's INFO chatter off the console (warnings still show)."""
  import logging as python_logging

  from absl import logging

  def keep(record) -> bool:
    noisy = any(name in record.pathname for name in ("orbax", "tensorflow_datasets", "jax/_src"))
    return record.levelno >= python_logging.WARNING or not noisy

  logging.get_absl_handler().addFilter(keep)
  import tensorflow_datasets as tfds

  tfds.disable_progress_bar()


def enable_compilation_cache() -> None:
  """Reuses compiled steps across runs (a resumed run does not compile again).

  $JAX_COMPILATION_CACHE_DIR wins; else ~/.cache/transformer_jax/xla.
  """
  import jax

  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    cache = os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax", "xla")
    jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def config_and_workdir():
  """The --config (validated on use) and --workdir, or a one-line UserError."""
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/quickstart.py")
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the folder for checkpoints and metrics")
  workdir = os.path.abspath(os.path.expanduser(FLAGS.workdir))
  return FLAGS.config, workdir
