"""Sentence-pair classification: is the target a translation of the source?

An encoder-only model with a pooled head reads [source | target] rows (see
`rows.pair_rows`) of a parallel corpus. Each row keeps its own target (label
1, a true pair) or, with probability 1/2, takes the target of the row before
it in the batch (label 0, a mismatched pair). Batches group sentences of
similar length, so a mismatched target is about as long as the true one and
length alone does not give the answer. The labels are drawn on the device: in
training from the step's key, in evaluation from a key fixed by the batch, so
every evaluation scores the same pairs; half of them are true.

`config.init_from=RUN_DIR` starts the encoder from a masked_lm run (on
config.text_side="pair"); the dev row reports accuracy and the loss.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.errors import UserError
from transformer_jax.model.encoder_only import EncoderOnly
from transformer_jax.special_tokens import PAD_ID
from transformer_jax.tasks.corpus import CorpusTask
from transformer_jax.tasks.masked_lm import step_keys
from transformer_jax.tasks.rows import pair_rows
from transformer_jax.training.step import averages

Array = jax.Array
TRUE_PAIR, MISMATCHED = 1, 0


def mismatch_pairs(key: Array, batch: dict[str, Array]) -> tuple[dict[str, Array], Array, Array]:
  """(batch with some targets swapped, labels int32[rows], valid bool[rows]).

  Row r keeps its target (TRUE_PAIR) or takes row r-1's (MISMATCHED), each
  with probability 1/2. `valid` drops rows that only fill a batch (no source,
  or an empty target after the swap), and MISMATCHED rows whose new target is
  their own: a batch (or micro-batch) of one row, or a sentence the corpus
  repeats ("Thank you.") next to itself.
  """
  src, tgt = batch["src_tokens"], batch["target_tokens"]
  keep = jax.random.bernoulli(key, 0.5, (src.shape[0],))
  other = jnp.roll(tgt, 1, axis=0)
  target = jnp.where(keep[:, None], tgt, other)
  really_mismatched = jnp.any(other != tgt, axis=-1)
  valid = (jnp.any(src != PAD_ID, axis=-1) & jnp.any(target != PAD_ID, axis=-1)
           & (keep | really_mismatched))
  labels = jnp.where(keep, TRUE_PAIR, MISMATCHED).astype(jnp.int32)
  return dict(batch, target_tokens=target), labels, valid


class ClassificationTask(CorpusTask):
  """An encoder with a pooled head telling true translation pairs from mismatched ones."""

  name = "classification"
  extra_tokens = ("<mask>",)  # The masked-LM vocabulary, so its weights load unchanged.
  count_unit = "pairs"
  rows_hold_pairs = True

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    if config.data.pack:
      raise UserError("classification reads one pair per row; set --config.data.pack=False")
    super().check_config(config)

  def build_model(self) -> EncoderOnly:
    return EncoderOnly(self.model_config, head="classify", num_classes=2)

  def loss_sums(self, model, params, batch, train, dropout_key):
    key, rngs = step_keys(self.config.seed, batch["src_tokens"], train, dropout_key)
    batch, labels, valid = mismatch_pairs(key, batch)
    rows = pair_rows(batch)
    logits = model.apply({"params": params}, rows.tokens, train=train,
                         positions=rows.positions, rngs=rngs)
    weights = valid.astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    loss_sum = jnp.sum(losses * weights)
    # "tokens" counts what the loss averages over: here, pairs.
    return loss_sum, dict(loss_sum=loss_sum, accuracy_sum=jnp.sum(correct * weights),
                          tokens=jnp.sum(weights))

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    del model, params, mesh
    means = averages(sums, np)
    return dict(loss=float(means["loss"]), accuracy=float(means["accuracy"]),
                pairs=float(sums["tokens"]))
