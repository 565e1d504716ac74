"""The Task interface: what the shared trainer asks of one kind of training run.

The trainer (`training/loop.py`) owns the step, sharding, checkpoints, exact
resume, preemption and logging; a task owns everything that differs between,
say, translation and masked-LM pre-training:

  prepare_data()      load what it trains on (what it decides, e.g. the vocabulary size,
                      enters `model_config` and `run_config()`, never the config);
  build_model()       the Flax module, from `model_config`;
  init_params(m, key) the module's boxed parameters;
  loss_sums(...)      (loss_sum, {'tokens', '<name>_sum', ...}) for one batch;
  batch_keys          the arrays of a batch the loss reads;
  train_iterator(...) this host's rows of each global batch, with get_state/set_state;
  eval_batches(...)   a dev split, each example once;
  dev_metrics(...)    the dev row from the summed quantities (plus BLEU and the like);
  checkpoint_meta() / check_checkpoint_meta(...)  what must match to resume;
  write_run_files(workdir)  files a run directory needs besides checkpoints;
  check_init_from(workdir)  whether a run can seed this one (config.init_from);
  final_report(workdir)     the end-of-training evaluation, if the config asks for one.
"""

from __future__ import annotations

import abc
import functools
import json
from typing import Any, Iterable, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.errors import UserError
from transformer_jax.model.config import DROPOUT_RATES, ModelConfig
from transformer_jax.training import run_dir
from transformer_jax.training.step import averages


class BatchIterator(Protocol):
  """Yields this host's rows of each global batch; its position is checkpointed."""

  def __next__(self) -> dict[str, np.ndarray]: ...
  def get_state(self) -> dict: ...
  def set_state(self, state: dict) -> None: ...


class Task(abc.ABC):
  """One kind of training run. Subclasses set `name` and implement the abstract methods."""

  name: str = ""
  batch_keys: tuple[str, ...] = ()
  count_unit: str = "tok"  # What sums["tokens"] counts, in the progress line's throughput.
  rows_hold_pairs: bool = False  # A training row holds a source and then its target.
  supports_rdrop: bool = False  # config.rdrop_alpha > 0: the loss compares two dropout passes.
  has_tokenizer: bool = True  # Its run directory holds tokenizer.model.
  sweep_split: str = ""  # Besides the dev row, a sweep scores each row's final_report here.

  @classmethod
  def holds_pairs(cls, config: ml_collections.ConfigDict) -> bool:
    """Whether a training row of this config holds a source and its target."""
    del config
    return cls.rows_hold_pairs

  @classmethod
  def row_tokens(cls, config: ml_collections.ConfigDict, side_length: int) -> int:
    """Tokens in a row whose sides hold `side_length` tokens: twice that for pair rows."""
    return side_length * (2 if cls.holds_pairs(config) else 1)

  @classmethod
  def row_length(cls, config: ml_collections.ConfigDict) -> int:
    """Tokens in the longest training row: data.max_len, or twice that for pair rows."""
    return cls.row_tokens(config, int(config.data.max_len))

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    """Raises a one-line UserError for a config this task cannot train with."""
    model = ModelConfig.from_config(config.model)
    row_length = cls.row_length(config)
    if model.positions == "learned" and model.max_len < row_length:
      what = "source and target in one row" if cls.holds_pairs(config) else "data.max_len"
      raise UserError(
          f"config.model.max_len={model.max_len} learned positions cannot cover rows of "
          f"{row_length} tokens ({what}); raise config.model.max_len to {row_length} or use "
          "config.model.positions='sinusoidal'")
    if config.rdrop_alpha > 0 and not cls.supports_rdrop:
      raise UserError(f"config.rdrop_alpha={config.rdrop_alpha!r} is not implemented for the "
                      f"{cls.name} task; set config.rdrop_alpha=0")
    if config.rdrop_alpha > 0 and not any(getattr(model, name) for name in DROPOUT_RATES):
      raise UserError(f"config.rdrop_alpha={config.rdrop_alpha!r} needs dropout to compare two "
                      "passes, but config.model's dropout rates are all 0; set "
                      "config.model.dropout_rate > 0 or config.rdrop_alpha=0")

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self._model_config = ModelConfig.from_config(config.model)

  def prepare_data(self) -> None:
    """Loads the data the task trains on (called once, before `build_model`)."""

  @property
  def model_config(self) -> ModelConfig:
    """config.model, validated, with what the data decides once `prepare_data` ran."""
    return self._model_config

  def run_config(self) -> dict:
    """The config as this run resolves it: what a run's config.json and checkpoints record.

    What the data decides (the vocabulary) and what the host decides (matmul_dtype "auto")
    are written as resolved, so the run means the same wherever it is read.
    """
    values = json.loads(self.config.to_json_best_effort())
    values["model"]["vocab_size"] = self.model_config.vocab_size
    values["model"]["matmul_dtype"] = self.model_config.matmul_dtype
    return values

  @abc.abstractmethod
  def build_model(self) -> nn.Module:
    """The task's model, built from `model_config`."""

  @abc.abstractmethod
  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    """`model`'s parameters, boxed with their logical axis names."""

  @abc.abstractmethod
  def loss_sums(self, model: nn.Module, params: Any, batch: dict[str, jax.Array], train: bool,
                dropout_key: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(summed loss, sums): `sums["tokens"]` counts what the loss averages over."""

  @abc.abstractmethod
  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int
                     ) -> BatchIterator:
    """Training batches whose row count divides by `batch_multiple`."""

  @abc.abstractmethod
  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]:
    """The dev split, each example exactly once."""

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    """The dev row logged at each evaluation; by default the averages of `sums`."""
    del model, params, mesh
    return {name: float(value) for name, value in averages(sums, np).items()}

  def recipe_rows(self) -> int:
    """Rows of the config's training batch (all hosts): rows of data.max_len tokens within
    data.tokens_per_batch."""
    return int(self.config.data.tokens_per_batch) // int(self.config.data.max_len)

  def batch_shapes(self, rows: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{key: (shape, dtype)} of a training batch of `rows` rows, as the loss reads it: what
    compiling the train step from shapes alone (for hardware not at hand) needs. Rows of
    data.max_len tokens; packed data adds its segment ids and positions."""
    length = int(self.config.data.max_len)
    packed = bool(self.config.data.pack)
    return {key: ((rows, length), jnp.int32) for key in self.batch_keys
            if packed or not key.endswith(("segment_ids", "positions"))}

  def describe(self) -> str:
    """One line logged when training starts (e.g. split sizes)."""
    return self.name

  def checkpoint_meta(self) -> dict:
    """Saved with every checkpoint; `check_checkpoint_meta` reads it back on resume."""
    return {}

  def check_checkpoint_meta(self, meta: dict, workdir: str) -> None:
    """Raises a one-line UserError if a checkpoint in `workdir` was saved with other
    `checkpoint_meta` values than this run's (other data, another problem)."""
    ours = self.checkpoint_meta()
    changed = [f"{key} {meta.get(key)!r} (this config: {value!r})"
               for key, value in ours.items() if meta.get(key) != value]
    if changed:
      raise UserError(f"the checkpoint in {workdir} was saved with {', '.join(changed)}; use "
                      "the config the run was started with, or a new --workdir")

  def write_run_files(self, workdir: str) -> None:
    """Writes the files a fresh run directory needs besides config.json and checkpoints."""

  def check_init_from(self, workdir: str) -> None:
    """Raises a one-line UserError if the run `config.init_from` names cannot seed this one."""

  def final_report(self, workdir: str, split: str | None = None) -> dict | None:
    """The evaluation of `split` (default config.final_eval_split) after the last step, or
    None where there is none."""
    return None

  def load_run(self, workdir: str, checkpoint: str = "latest", mesh: Mesh | None = None
               ) -> run_dir.LoadedRun:
    """A checkpoint of a run of this task, with its model, tokenizer and mesh."""
    model = self.build_model()
    return run_dir.load_run(workdir, self.config, model,
                            functools.partial(self.init_params, model), checkpoint, mesh,
                            self.has_tokenizer)

  def average_checkpoints(self, workdir: str, last: int) -> tuple[int, list[int]]:
    """Averages the newest `last` checkpoints of a run of this task (see run_dir)."""
    model = self.build_model()
    return run_dir.average_checkpoints(workdir, last, functools.partial(self.init_params, model))
