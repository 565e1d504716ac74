"""The task seam: a second task trains, evaluates and resumes through the shared trainer."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.configs import default_config
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.base import Task
from transformer_jax.tasks.translation import init_transformer, translation_loss_sums
from transformer_jax.training.loop import train_and_evaluate

VOCAB, LENGTH, ROWS = 16, 8, 16


def copy_batch(seed: int, index: int, rows: int) -> dict[str, np.ndarray]:
  """Random sentences of 3-7 tokens (ids 4..VOCAB-1) + EOS; the target is the source."""
  rng = np.random.default_rng([seed, index])
  tokens = rng.integers(4, VOCAB, size=(rows, LENGTH)).astype(np.int32)
  lengths = rng.integers(3, LENGTH, size=rows)
  for row, length in enumerate(lengths):
    tokens[row, length] = EOS_ID
    tokens[row, length + 1:] = PAD_ID
  return dict(src_tokens=tokens, target_tokens=tokens.copy())


class CopyIterator:
  """Batch i is a pure function of (seed, i), so its position is one integer."""

  def __init__(self, seed: int, rows: int):
    self.seed, self.rows, self.index = seed, rows, 0

  def __next__(self) -> dict[str, np.ndarray]:
    self.index += 1
    return copy_batch(self.seed, self.index, self.rows)

  def get_state(self) -> dict:
    return dict(index=self.index)

  def set_state(self, state: dict) -> None:
    self.index = state["index"]


class CopyTask(Task):
  """Copy the source: an encoder-decoder task with no corpus, tokenizer or BLEU."""

  name = "copy"
  batch_keys = ("src_tokens", "target_tokens")

  def build_model(self) -> Transformer:
    return Transformer(self.config.model)

  def init_params(self, model, key):
    return init_transformer(model, key)

  def loss_sums(self, model, params, batch, train, dropout_key):
    return translation_loss_sums(model, params, batch, train, dropout_key, label_smoothing=0.0)

  def train_iterator(self, batch_multiple, process_index, process_count):
    return CopyIterator(self.config.seed, ROWS)

  def eval_batches(self, batch_multiple, process_index, process_count):
    return [copy_batch(seed=10**6, index=i, rows=ROWS) for i in range(2)]

  def dev_metrics(self, model, params, sums, mesh):
    """The averages, plus how often greedy argmax under teacher forcing copies right."""
    dev = super().dev_metrics(model, params, sums, mesh)
    batch = copy_batch(seed=10**6, index=0, rows=ROWS)
    logits = model.apply({"params": params}, batch["src_tokens"],
                         shift_right(jnp.asarray(batch["target_tokens"])))
    mask = batch["target_tokens"] != PAD_ID
    dev["copy_accuracy"] = float(((jnp.argmax(logits, -1) == batch["target_tokens"]) & mask).sum()
                                 / mask.sum())
    return dev


def copy_config(steps: int):
  config = default_config()
  config.model.update(dict(vocab_size=VOCAB, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                           dropout_rate=0.0, max_len=LENGTH))
  config.update(dict(num_train_steps=steps, schedule="linear_rsqrt", learning_rate=1e-2,
                     warmup_steps=10,
                     log_every_steps=10, eval_every_steps=steps, checkpoint_every_steps=10,
                     eval_bleu_sentences=0, async_checkpoints=False))
  return config


def test_a_second_task_trains_through_the_shared_trainer(tmp_path):
  config = copy_config(steps=150)
  state = train_and_evaluate(config, str(tmp_path / "run"), CopyTask(config))

  assert int(state.step) == 150
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  train_rows = [row for row in rows if row["split"] == "train"]
  dev = [row for row in rows if row["split"] == "eval"][-1]
  assert train_rows[-1]["loss"] < 0.5 * train_rows[0]["loss"], train_rows
  assert dev["copy_accuracy"] > 0.5, dev  # Chance is 1/12.
  assert (tmp_path / "run" / "checkpoints" / "150").is_dir()


def test_a_second_task_resumes_exactly(tmp_path):
  whole = train_and_evaluate(copy_config(20), str(tmp_path / "whole"), CopyTask(copy_config(20)))
  train_and_evaluate(copy_config(10), str(tmp_path / "split"), CopyTask(copy_config(10)))
  resumed = train_and_evaluate(copy_config(20), str(tmp_path / "split"), CopyTask(copy_config(20)))

  for a, b in zip(jax.tree.leaves(jax.device_get(whole)), jax.tree.leaves(jax.device_get(resumed))):
    np.testing.assert_array_equal(a, b)
