"""Masked-LM pre-training (BERT): an encoder-only model restores chosen tokens.

Each ordinary token is chosen with probability `config.mask_rate` (0.15); a
chosen token becomes <mask> 80% of the time, a random piece 10% and stays
itself 10% (Devlin et al., 2019, §3.1). The loss falls on the chosen tokens
only; the dev row reports their loss, perplexity and accuracy (argmax equals
the original token). The masks are drawn on the device: in training from the
step's key, in evaluation from a key fixed by the batch's content, so every
evaluation of a split scores the same masks.

`config.text_side` chooses the rows: one side of the corpus, or "pair" (source
and target in one row: translation language modelling, Lample & Conneau, 2019).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.model.encoder_only import EncoderOnly
from transformer_jax.special_tokens import FIRST_PIECE_ID, PAD_ID
from transformer_jax.tasks.corpus import CorpusTask
from transformer_jax.tasks.rows import check_text_side, text_rows
from transformer_jax.training.losses import loss_sums
from transformer_jax.training.step import averages

Array = jax.Array
REPLACE_WITH_MASK = 0.8  # Of the chosen tokens; then 10% random, 10% unchanged.
REPLACE_WITH_RANDOM = 0.1


def mask_tokens(key: Array, tokens: Array, rate: float, mask_id: int) -> tuple[Array, Array]:
  """(inputs, chosen) for int[batch, len] `tokens`.

  Ordinary pieces (ids FIRST_PIECE_ID .. mask_id - 1) are chosen with
  probability `rate`; chosen ones become `mask_id` (80%), a random ordinary
  piece (10%) or stay (10%). PAD, BOS and EOS are never chosen.
  """
  choose_key, how_key, random_key = jax.random.split(key, 3)
  ordinary = (tokens >= FIRST_PIECE_ID) & (tokens < mask_id)
  chosen = jax.random.bernoulli(choose_key, rate, tokens.shape) & ordinary
  how = jax.random.uniform(how_key, tokens.shape)
  random_tokens = jax.random.randint(random_key, tokens.shape, FIRST_PIECE_ID, mask_id)
  inputs = jnp.where(chosen & (how < REPLACE_WITH_MASK), mask_id, tokens)
  inputs = jnp.where(
      chosen & (how >= REPLACE_WITH_MASK) & (how < REPLACE_WITH_MASK + REPLACE_WITH_RANDOM),
      random_tokens, inputs)
  return inputs.astype(tokens.dtype), chosen


def eval_key(seed: int, tokens: Array) -> Array:
  """A key fixed by a batch's content: evaluations of a split draw the same masks."""
  weights = jnp.arange(1, tokens.shape[-1] + 1, dtype=jnp.uint32)
  fingerprint = jnp.sum(tokens.astype(jnp.uint32) * weights, dtype=jnp.uint32)
  return jax.random.fold_in(jax.random.key(seed), fingerprint)


def step_keys(seed: int, tokens: Array, train: bool, dropout_key: Array | None
              ) -> tuple[Array, dict]:
  """(the key a task's on-device sampling uses, the model's rngs) for one batch."""
  if train:
    sample_key, model_key = jax.random.split(dropout_key)
    return sample_key, {"dropout": model_key}
  return eval_key(seed, tokens), {}


class MaskedLMTask(CorpusTask):
  """A BERT-style encoder pre-trained to restore masked tokens."""

  name = "masked_lm"
  extra_tokens = ("<mask>",)
  count_unit = "masked tok"

  @classmethod
  def holds_pairs(cls, config: ml_collections.ConfigDict) -> bool:
    return config.text_side == "pair"

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    check_text_side(config.text_side)
    super().check_config(config)

  @property
  def mask_id(self) -> int:
    return self.model_config.vocab_size - 1  # The one extra token, after the pieces.

  def build_model(self) -> EncoderOnly:
    return EncoderOnly(self.model_config, head="mlm")

  def loss_sums(self, model, params, batch, train, dropout_key):
    rows = text_rows(batch, self.config.text_side)
    key, rngs = step_keys(self.config.seed, rows.tokens, train, dropout_key)
    inputs, chosen = mask_tokens(key, rows.tokens, self.config.mask_rate, self.mask_id)
    logits = model.apply({"params": params}, inputs, train=train, segment_ids=rows.segment_ids,
                         positions=rows.positions, rngs=rngs)
    targets = jnp.where(chosen, rows.tokens, PAD_ID)
    loss_sum, sums = loss_sums(logits, targets, self.config.label_smoothing)
    correct = (jnp.argmax(logits, axis=-1) == rows.tokens) & chosen
    return loss_sum, dict(sums, accuracy_sum=jnp.sum(correct.astype(jnp.float32)))

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    dev = super().dev_metrics(model, params, sums, mesh)
    dev["accuracy"] = float(averages(sums, np)["accuracy"])
    return dev
