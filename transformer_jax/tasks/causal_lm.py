"""Causal language modelling: a decoder-only model trained on next-token prediction.

It reads one side of any corpus the translation task reads (config.text_side,
"target" by default; plain-text files work too),
through the same pipeline: token-budget batches, packing into rows of
data.max_len with segment ids, the exact-resume data position. Each sentence
starts from BOS and ends in EOS; the dev row reports the per-token loss, NLL and
perplexity.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
from flax import linen as nn

from transformer_jax.errors import UserError
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.transformer import shift_right
from transformer_jax.tasks.corpus import CorpusTask
from transformer_jax.training.losses import loss_sums


def lm_loss_sums(model: nn.Module, params: Any, batch: dict[str, jax.Array], train: bool,
                 dropout_key: jax.Array | None, label_smoothing: float
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Next-token loss summed over the non-PAD tokens of `batch["target_tokens"]`.

  The input is the row shifted right (BOS first, each packed sentence restarting
  at BOS), so position t predicts token t from tokens < t of its own sentence.
  `batch` holds the side to model as `target_*` (see `CausalLMTask.loss_sums`).
  """
  positions = batch.get("target_positions")
  rngs = {"dropout": dropout_key} if train else {}
  logits = model.apply({"params": params}, shift_right(batch["target_tokens"], positions),
                       train=train, segment_ids=batch.get("target_segment_ids"),
                       positions=positions, rngs=rngs)
  return loss_sums(logits, batch["target_tokens"], label_smoothing)


def source_as_target(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The batch's source side under the target's keys."""
  return {key.replace("src_", "target_"): value for key, value in batch.items()
          if key.startswith("src_")}


class CausalLMTask(CorpusTask):
  """A GPT-style decoder-only language model on one side of a corpus."""

  name = "causal_lm"

  @property
  def batch_keys(self) -> tuple[str, ...]:
    side = "src" if self.config.text_side == "source" else "target"
    return tuple(f"{side}_{key}" for key in ("tokens", "segment_ids", "positions"))

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    if config.text_side not in ("source", "target"):
      raise UserError(f"causal_lm reads one side, not config.text_side="
                      f"{config.text_side!r}; set source or target, or use "
                      "config.task=prefix_lm for source-then-target rows")
    super().check_config(config)

  def build_model(self) -> DecoderOnly:
    return DecoderOnly(self.model_config)

  def loss_sums(self, model, params, batch, train, dropout_key):
    if self.config.text_side == "source":
      batch = source_as_target(batch)
    return lm_loss_sums(model, params, batch, train, dropout_key, self.config.label_smoothing)
