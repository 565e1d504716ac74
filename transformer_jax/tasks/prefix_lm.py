"""Translation with a decoder-only prefix LM: one stack reads `source <sep> target`.

Each row is [source | BOS target] (see `rows.pair_rows`): the source (ending
in EOS) is the prefix, attended both ways; BOS is the separator; the target is
predicted causally, and the loss falls on it alone (Raffel et al., 2020,
§3.2.1, "prefix LM"). Decoding prefills the source into the KV cache in one
pass and runs the same beam search as the encoder-decoder, so `translate`,
`evaluate`, the dev BLEU and the final report serve both.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import linen as nn

from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.transformer import shift_right
from transformer_jax.tasks.corpus import init_one_stack
from transformer_jax.tasks.rows import pair_rows
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training.losses import loss_sums


def prefix_lm_loss_sums(model: nn.Module, params: Any, batch: dict[str, jax.Array], train: bool,
                        dropout_key: jax.Array | None, label_smoothing: float
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The smoothed loss summed over the non-PAD target tokens, as translation's."""
  target_input = shift_right(batch["target_tokens"], batch.get("target_positions"))
  rows = pair_rows(batch, target_input)
  rngs = {"dropout": dropout_key} if train else {}
  logits = model.apply({"params": params}, rows.tokens, train=train, segment_ids=rows.segment_ids,
                       positions=rows.positions, prefix=rows.prefix, rngs=rngs)
  src_len = batch["src_tokens"].shape[1]
  return loss_sums(logits[:, src_len:], batch["target_tokens"], label_smoothing)


class PrefixLMTask(TranslationTask):
  """Source -> target with a decoder-only model; the encoder-decoder's data, BLEU and report."""

  name = "prefix_lm"
  rows_hold_pairs = True
  supports_rdrop = False

  def build_model(self) -> DecoderOnly:
    return DecoderOnly(self.model_config)

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    return init_one_stack(model, key)

  def loss_sums(self, model, params, batch, train, dropout_key):
    return prefix_lm_loss_sums(model, params, batch, train, dropout_key,
                               self.config.label_smoothing)
