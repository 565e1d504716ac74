"""Writing a published model as a run directory: config.json, tokenizer.model and an Orbax
checkpoint at step 0, which `translate`, `generate`, `evaluate` and
`train --config.init_from` read like any trained run's."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util
from safetensors.numpy import load_file

from transformer_jax.configs import default_config
from transformer_jax.data import hf_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.training import checkpoints
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer
from transformer_jax.training.state import TrainState


def read_hf_config(model_dir: str, model_type: str, what: str, required: dict[str, Any]
                   ) -> dict:
  """config.json of a Hugging Face directory of `model_type` ("gpt2"; `what` names it in
  errors, e.g. "GPT-2 (GPT2LMHeadModel)"), with every field of `required` at its value."""
  path = os.path.join(model_dir, "config.json")
  if not os.path.isdir(model_dir):
    raise UserError(f"--model_dir={model_dir} is not a directory; pass a downloaded Hugging "
                    f"Face {what} model (save_pretrained's folder)")
  try:
    with open(path, encoding="utf-8") as f:
      hf = json.load(f)
  except FileNotFoundError:
    raise UserError(f"{path} does not exist; --model_dir must be a Hugging Face model "
                    "directory") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not JSON ({e})") from None
  if hf.get("model_type") != model_type:
    raise UserError(f"{model_dir} is not a {what} model (config.json model_type="
                    f"{hf.get('model_type')!r})")
  for field, value in required.items():
    if hf.get(field, value) != value:
      raise UserError(f"config.json {field}={hf[field]!r} is not supported (only {value!r}); "
                      "this model cannot express that checkpoint")
  return hf


def read_weights(model_dir: str) -> dict[str, np.ndarray]:
  """{Hugging Face name: float32 array} from model.safetensors, else pytorch_model.bin."""
  safetensors_path = os.path.join(model_dir, "model.safetensors")
  torch_path = os.path.join(model_dir, "pytorch_model.bin")
  if os.path.exists(safetensors_path):
    try:
      weights = load_file(safetensors_path)
    except Exception as e:  # The package raises its own error types for a bad file.
      raise UserError(f"{safetensors_path} is not a safetensors file ({e})") from None
  elif os.path.exists(torch_path):
    try:
      import torch  # Optional and heavy: only a pytorch_model.bin needs it.
    except ImportError:
      raise UserError(f"{torch_path} is a PyTorch pickle and torch is not installed; "
                      "pip install torch, or save the model as model.safetensors") from None
    state = torch.load(torch_path, map_location="cpu", weights_only=True)
    weights = {name: tensor.float().numpy() for name, tensor in state.items()}
  else:
    raise UserError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")
  return {name: np.asarray(value, np.float32) for name, value in weights.items()}


class HFWeights:
  """A checkpoint's tensors by Hugging Face name, with or without the model's `prefix`
  ("model.", "transformer.", "bert."); a missing one is a one-line error naming it."""

  def __init__(self, weights: dict[str, np.ndarray], model_dir: str, prefix: str,
               architecture: str):
    self.weights, self.model_dir = weights, model_dir
    self.prefix, self.architecture = prefix, architecture

  def get(self, *names: str) -> np.ndarray:
    """The first of `names` the checkpoint holds."""
    for name in names:
      for prefixed in (name, f"{self.prefix}{name}"):
        if prefixed in self.weights:
          return self.weights[prefixed]
    raise UserError(f"{self.model_dir}: the weights lack {names[0]}; not a complete "
                    f"{self.architecture} checkpoint")

  def layer_norm(self, name: str) -> dict[str, np.ndarray]:
    return dict(scale=self.get(f"{name}.weight"), bias=self.get(f"{name}.bias"))

  def dense(self, name: str) -> dict[str, np.ndarray]:
    """A torch Linear ([out, in]) as our Dense ([in, out])."""
    return dict(kernel=self.get(f"{name}.weight").T, bias=self.get(f"{name}.bias"))


def imported_model(run_dir: str, config_file: str, importer: str) -> dict:
  """The model section of an imported run's config.json, for a fine-tune config
  (`experiments/configs/<config_file>:RUN_DIR`); `importer` names the command that writes
  such a run, in the one-line errors."""
  if not run_dir:
    raise UserError(f"name the imported run: --config=experiments/configs/{config_file}:RUN_DIR")
  path = os.path.join(run_dir, "config.json")
  if not os.path.exists(path):
    raise UserError(f"{path} does not exist; run python -m transformer_jax.{importer} first")
  with open(path) as f:
    return json.load(f)["model"]


def check_against_model(params: dict, init: Callable[[], Any]) -> None:
  """Every parameter `init()` makes, with its shape, and nothing else; else a one-line error."""
  expected = traverse_util.flatten_dict(jax.eval_shape(init)["params"])
  got = traverse_util.flatten_dict(params)
  for path, leaf in expected.items():
    name = "/".join(path)
    shape = getattr(leaf, "value", leaf).shape
    if path not in got:
      raise UserError(f"the import left parameter {name} unset; the checkpoint does not fit "
                      "this model")
    if got[path].shape != shape:
      raise UserError(f"parameter {name} has shape {got[path].shape} in the checkpoint and "
                      f"{shape} here; config.json does not describe its weights")
  extra = sorted("/".join(path) for path in set(got) - set(expected))
  if extra:
    raise UserError(f"the import made parameter {extra[0]}, which this model lacks")


def run_config(task: str, model: dict) -> ml_collections.ConfigDict:
  """The config of an imported one-stack model's run: `task` on rows of its positions."""
  config = default_config()
  config.task = task
  config.model.update(model)
  config.data.max_len = model["max_len"]
  config.label_smoothing = 0.0
  config.num_train_steps = 0
  return config


def write_hf_run(workdir: str, config: ml_collections.ConfigDict, params: dict,
                 init: Callable[[], Any], published: dict, their_ids: np.ndarray) -> int:
  """Checks `params` against `init()`, then writes `workdir`: tokenizer.model (the published
  tokenizer with `their_ids`), config.json and the step-0 checkpoint. Returns the parameter
  count; nothing is written where a check fails."""
  check_against_model(params, init)
  workdir = new_workdir(workdir)
  path = hf_tokenizer.write(published, their_ids, os.path.join(workdir, "tokenizer.model"))
  return save_run(workdir, config, params, hf_tokenizer.HFTokenizer(path).sha256)


def new_workdir(workdir: str) -> str:
  """`workdir` made absolute and created; a one-line error if it holds checkpoints."""
  workdir = os.path.abspath(workdir)
  if os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    raise UserError(f"--workdir={workdir} already holds checkpoints; choose a new directory")
  os.makedirs(workdir, exist_ok=True)
  return workdir


def save_run(workdir: str, config: ml_collections.ConfigDict, params: dict,
             tokenizer_sha256: str) -> int:
  """Writes config.json and the step-0 checkpoint of `params` (tokenizer.model is the
  caller's); returns the parameter count."""
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  params = jax.tree.map(jnp.asarray, params)
  state = TrainState(step=jnp.array(0, jnp.int32), params=params,
                     opt_state=make_optimizer(OptimizerConfig.from_config(config)).init(params))
  meta = dict(config=json.loads(config.to_json_best_effort()), tokenizer_sha256=tokenizer_sha256)
  manager = checkpoints.make_manager(checkpoints.checkpoint_dir(workdir), None, async_save=False)
  checkpoints.save(manager, 0, state, None, meta)
  checkpoints.wait_until_finished(manager)
  return sum(x.size for x in jax.tree.leaves(params))
