"""Tasks that train on a corpus of `data.pipeline`: its loading, batches, tokenizer and dev loss.

Translation and causal LM read the same prepared data: the same token-budget
(optionally packed) batches, the same exact-resume data position, and the run
directory's copy of the tokenizer, checked against every checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.data.pipeline import TranslationData, load_dataset
from transformer_jax.data.tokenizer import load_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.model.config import ModelConfig
from transformer_jax.tasks.base import BatchIterator, Task
from transformer_jax.tasks.rows import CORPUS_BATCH_KEYS
from transformer_jax.training.losses import smoothing_entropy
from transformer_jax.training.step import averages, eval_step, sum_over_batches


def init_one_stack(model: nn.Module, key: jax.Array) -> Any:
  """The boxed parameters of a one-stack model (DecoderOnly, EncoderOnly): shapes do not
  depend on the length."""
  return model.init(key, jnp.ones((1, 8), jnp.int32), train=False)["params"]


class CorpusTask(Task):
  """The data half of a task on `load_dataset(config.data)`; subclasses add model and loss.

  `extra_tokens` are ids a task adds after the tokenizer's pieces (masked LM's
  <mask> is id `tokenizer.vocab_size`); the model's vocabulary counts them.
  """

  extra_tokens: tuple[str, ...] = ()
  batch_keys = CORPUS_BATCH_KEYS

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self._data: TranslationData | None = None

  @property
  def data(self) -> TranslationData:
    if self._data is None:
      self.prepare_data()
    return self._data

  def prepare_data(self) -> None:
    self._data = load_dataset(self.config.data)
    sharding.check_same_everywhere(
        self._data.tokenizer.sha256, "the tokenizer",
        "give every host the same data.prepared_dir (a shared disk) or data.tokenizer_path")
    # The model follows the tokenizer.
    vocab_size = self._data.tokenizer.vocab_size + len(self.extra_tokens)
    self._model_config = ModelConfig.from_config(dict(self.config.model, vocab_size=vocab_size))
    self._check_eval_rows_fit()

  def _check_eval_rows_fit(self) -> None:
    """Learned positions must cover every row evaluated: eval never truncates, so a pair
    longer than data.max_len makes a longer row. A one-line error now, before training."""
    model = self._model_config
    if model.positions != "learned":
      return
    splits = {self._data.eval_split, self.config.final_eval_split} & set(self._data.split_sizes)
    for split in sorted(splits):
      row = self.row_tokens(self.config, self._data.longest_eval_length(split))
      if row > model.max_len:
        raise UserError(
            f"the {split} split has pairs longer than data.max_len={self.config.data.max_len}, "
            f"evaluated in rows of {row} tokens, beyond config.model.max_len={model.max_len} "
            f"learned positions; raise config.model.max_len to {row}, or evaluate another "
            "split (config.data.eval_split, config.final_eval_split)")

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    return init_one_stack(model, key)

  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int
                     ) -> BatchIterator:
    return self.data.train_iterator(batch_multiple, process_index, process_count)

  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]:
    return self.data.eval_batches(self.data.eval_split, batch_multiple, process_index,
                                  process_count)

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    """Loss, loss above the label-smoothing entropy floor, NLL and perplexity."""
    del model, params, mesh
    means = averages(sums, np)
    entropy = smoothing_entropy(self.model_config.vocab_size, self.config.label_smoothing)
    return dict(loss=float(means["loss"]), loss_above_entropy=float(means["loss"]) - entropy,
                nll=float(means["nll"]), perplexity=float(means["perplexity"]))

  def describe(self) -> str:
    return f"pairs per split: {self.data.split_sizes}; filtered from train: {self.data.filtered}"

  def checkpoint_meta(self) -> dict:
    return dict(tokenizer_sha256=self.data.tokenizer.sha256)

  def check_checkpoint_meta(self, meta: dict, workdir: str) -> None:
    sha256 = self.data.tokenizer.sha256
    if meta.get("tokenizer_sha256") != sha256:
      raise UserError(
          f"the tokenizer does not match the checkpoint in {workdir} (sha256 "
          f"{sha256[:12]} vs {str(meta.get('tokenizer_sha256'))[:12]}); "
          "use the config the run was started with, or a new --workdir"
      )

  def write_run_files(self, workdir: str) -> None:
    self.data.tokenizer.save_copy(os.path.join(workdir, "tokenizer.model"))

  def check_init_from(self, workdir: str) -> None:
    """A run to start from must share this run's tokenizer (the embedding rows mean tokens)."""
    path = os.path.join(workdir, "tokenizer.model")
    if not os.path.exists(path):
      raise UserError(f"config.init_from={workdir} has no tokenizer.model; name a run directory")
    theirs, ours = load_tokenizer(path).sha256, self.data.tokenizer.sha256
    if theirs != ours:
      raise UserError(
          f"config.init_from={workdir} has another tokenizer (sha256 {theirs[:12]} vs "
          f"{ours[:12]}); start from a run on the same data config (dataset, variant, "
          "vocab_size, tokenizer_type)")

  def final_report(self, workdir: str, split: str | None = None) -> dict | None:
    split = split or self.config.final_eval_split
    return self.split_report(workdir, split) if split else None

  def split_report(self, workdir: str, split: str) -> dict:
    """The dev metrics of the run's latest checkpoint on every example of `split`.

    Prints them and writes final_<split>.json beside the checkpoints.
    """
    run = self.load_run(workdir)
    step_fn = jax.jit(functools.partial(
        eval_step, loss_fn=functools.partial(self.loss_sums, run.model)))
    batches = self.data.eval_batches(split, sharding.batch_shards(run.mesh),
                                     jax.process_index(), jax.process_count())
    with sharding.mesh_context(run.mesh):
      totals = sum_over_batches(step_fn, run.params, batches, run.mesh, self.batch_keys)
    metrics = self.dev_metrics(run.model, run.params, totals, run.mesh)
    report = dict(split=split, checkpoint_step=run.step, **metrics)
    if jax.process_index() == 0:
      print(f"{self.name} on {split} (step {run.step}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)
      with open(os.path.join(workdir, f"final_{split}.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
