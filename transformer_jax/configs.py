"""The full experiment config with every key, and its validation.

Experiment files under `experiments/configs/` start from `default_config()`
and change only what their experiment changes.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import types
from typing import Iterable

import ml_collections

from transformer_jax.data.config import default_data_config
from transformer_jax.errors import UserError
from transformer_jax.model.config import default_model_config
from transformer_jax.tasks import algorithmic, image_classification
from transformer_jax.tasks.registry import DEFAULT_TASK, task_class
from transformer_jax.training.config import LoopConfig
from transformer_jax.training.schedules import OptimizerConfig


def default_config() -> ml_collections.ConfigDict:
  """The paper's base recipe (§5) with small-machine logging defaults."""
  config = ml_collections.ConfigDict()
  config.task = DEFAULT_TASK  # One of tasks/registry.py's TASKS.
  # What a monolingual task reads of the corpus: "source", "target" or "pair" (tasks/rows.py).
  config.text_side = "target"
  config.mask_rate = 0.15  # masked_lm: the share of tokens chosen (of them 80/10/10 %).
  # Start a fresh run from another run's weights: every parameter of the same name and
  # shape (a classifier takes a masked-LM run's encoder); a resume reads its own checkpoint.
  config.init_from = ""
  # task='algorithmic': the generated problem and its lengths (tasks/algorithmic.py).
  config.algorithmic = algorithmic.default_options()
  # task='image_classification': the images, patches and pooling (tasks/image_classification.py).
  config.image = image_classification.default_options()
  config.model = default_model_config()
  config.data = default_data_config()
  # Devices: (data, fsdp, tensor) sizes; -1 takes the remaining devices.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # > 0: the train command runs this many JAX devices on each process's CPU cores, the batch
  # split over them (sharding.use_cpu_devices); 0: JAX's default (one, or XLA_FLAGS' count).
  config.cpu_devices = 0

  # The training loop: steps, time budget, accumulation, logging, evaluation and checkpoint
  # periods (training/config.py's LoopConfig documents each key).
  config.update(LoopConfig.config_defaults())
  config.label_smoothing = 0.1  # ε_ls (§5.4).
  # translation: > 0 trains with R-Drop (Liang et al., 2021) at this weight of the symmetric
  # KL between two dropout passes of each sentence: the model runs on 2× the rows, plus the
  # KL's passes over the logits (the Multi30k recipe on a CPU: 1.29× a plain step of as many
  # rows).
  config.rdrop_alpha = 0.0

  # Optimiser (§5.3): Adam(0.9, 0.98, 1e-9) on the paper's schedule (training/schedules.py's
  # OptimizerConfig documents each key).
  config.update(OptimizerConfig.config_defaults())

  config.eval_bleu_sentences = 256  # Dev sentences decoded at each evaluation; 0: no BLEU.

  # Decoding (§6.1): beam 4, α = 0.6, max length = input length + 50.
  config.beam_size = 4
  config.length_penalty = 0.6
  config.max_decode_extra_len = 50
  # The final report decodes the average of the newest K checkpoints (1: the latest);
  # also average_checkpoints's default --last.
  config.average_last_checkpoints = 5
  # At the end of training: decode this split and print BLEU ("" to skip).
  config.final_eval_split = ""
  config.final_eval_examples = 3  # Translations printed after the final BLEU.
  return config


def load_module(path: str | os.PathLike, name: str | None = None) -> types.ModuleType:
  """A Python file as a module, registered in sys.modules under `name` (default: its stem).

  Experiment configs and scripts are files, not a package; this is how they
  load each other (and how tests and notebooks load them).
  """
  name = name or os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for key, value in config.items():
    name = f"{prefix}{key}"
    keys.append(name)
    if isinstance(value, ml_collections.ConfigDict):
      keys.extend(all_keys(value, name + "."))
  return keys


def check_overrides_apply(config: ml_collections.ConfigDict, overridden: Iterable[str]) -> None:
  """Raises a one-line UserError for a command-line override that the config would ignore.

  `overridden`: the keys set on the command line ("learning_rate", "model.vocab_size").
  """
  overridden = set(overridden)
  if "learning_rate" in overridden and config.schedule == "paper":
    raise UserError("--config.learning_rate is not used by config.schedule='paper' (its peak is "
                    "d_model^-0.5 · warmup^-0.5 × config.learning_rate_scale); set "
                    "--config.learning_rate_scale, or --config.schedule=linear_rsqrt or "
                    "linear_cosine")
  if "learning_rate_scale" in overridden and config.schedule != "paper":
    raise UserError(f"--config.learning_rate_scale is used only by config.schedule='paper', not "
                    f"{config.schedule!r}; set --config.learning_rate (the peak) instead")
  if "model.vocab_size" in overridden:
    raise UserError("--config.model.vocab_size is set from the run's tokenizer; choose the "
                    "vocabulary with --config.data.vocab_size (a new tokenizer is trained)")


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises a one-line UserError for a key the defaults don't have, or a bad value."""
  valid = set(all_keys(default_config()))
  for key in all_keys(config):
    if key not in valid and not key.startswith("data.plain_text."):
      close = difflib.get_close_matches(key, sorted(valid), n=3)
      hint = f"; did you mean {', '.join('config.' + c for c in close)}?" if close else ""
      raise UserError(f"unknown config key config.{key}{hint}")
  task_class(config.task).check_config(config)
  if config.model.get("quantize"):
    raise UserError(f"config.model.quantize={config.model.quantize!r} is for decoding a trained "
                    "run (translate or evaluate --quantize=int8); train with quantize=''")
  LoopConfig.from_config(config)
  OptimizerConfig.from_config(config)
  if int(config.cpu_devices) < 0:
    raise UserError(f"config.cpu_devices={config.cpu_devices!r} must be >= 0 (0: JAX's default)")
  if not 0.0 <= config.label_smoothing < 1.0:
    raise UserError(f"config.label_smoothing={config.label_smoothing!r} must be in [0, 1)")
  if config.rdrop_alpha < 0:
    raise UserError(f"config.rdrop_alpha={config.rdrop_alpha!r} must be >= 0 (0: no R-Drop)")
  if config.beam_size < 1:
    raise UserError(f"config.beam_size={config.beam_size} must be at least 1")
  if config.length_penalty < 0:
    raise UserError(f"config.length_penalty={config.length_penalty} must be >= 0")
