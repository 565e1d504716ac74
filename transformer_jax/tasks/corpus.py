"""Tasks that train on a corpus of `data.pipeline`: its loading, batches, tokenizer and dev loss.

Translation and causal LM read the same prepared data: the same token-budget
(optionally packed) batches, the same exact-resume data position, and the run
directory's copy of the tokenizer, checked against every checkpoint.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.data.pipeline import TranslationData, load_dataset
from transformer_jax.errors import UserError
from transformer_jax.tasks.base import BatchIterator, Task
from transformer_jax.training.losses import smoothing_entropy
from transformer_jax.training.step import averages


class CorpusTask(Task):
  """The data half of a task on `load_dataset(config.data)`; subclasses add model and loss."""

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
    with self.config.unlocked():
      self.config.model.vocab_size = self._data.tokenizer.vocab_size  # The model follows it.

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
    entropy = smoothing_entropy(self.config.model.vocab_size, self.config.label_smoothing)
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
