"""Translation: the paper's encoder-decoder on a parallel corpus, scored with BLEU."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.data.pipeline import TranslationData, load_dataset
from transformer_jax.decode.translator import DecodeOptions, Translator, translate_lines, translate_texts
from transformer_jax.errors import UserError
from transformer_jax.metrics.bleu import all_scores, sacre_bleu
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import PAD_ID
from transformer_jax.tasks.base import BatchIterator, Task
from transformer_jax.training.losses import smoothing_entropy, token_losses
from transformer_jax.training.run_dir import LoadedRun
from transformer_jax.training.step import averages


def decoder_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The encoder-decoder's keyword inputs for a (possibly packed) batch."""
  target_positions = batch.get("target_positions")
  return dict(
      src_tokens=batch["src_tokens"],
      target_input_tokens=shift_right(batch["target_tokens"], target_positions),
      src_segment_ids=batch.get("src_segment_ids"),
      target_segment_ids=batch.get("target_segment_ids"),
      src_positions=batch.get("src_positions"),
      target_positions=target_positions,
  )


def translation_loss_sums(
    model: nn.Module, params: Any, batch: dict[str, jax.Array], train: bool,
    dropout_key: jax.Array | None, label_smoothing: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Summed smoothed loss over non-PAD target tokens, plus summed NLL and the count."""
  rngs = {"dropout": dropout_key} if train else {}
  logits = model.apply({"params": params}, **decoder_inputs(batch), train=train, rngs=rngs)
  smoothed, nll = token_losses(logits, batch["target_tokens"], label_smoothing)
  weights = (batch["target_tokens"] != PAD_ID).astype(jnp.float32)
  loss_sum = jnp.sum(smoothed * weights)
  return loss_sum, dict(loss_sum=loss_sum, nll_sum=jnp.sum(nll * weights), tokens=jnp.sum(weights))


def init_transformer(model: Transformer, key: jax.Array) -> Any:
  """The encoder-decoder's boxed parameters (shapes do not depend on the lengths)."""
  tokens = jnp.ones((1, 8), jnp.int32)
  return model.init(key, tokens, tokens, train=False)["params"]


class TranslationTask(Task):
  """Source -> target with the encoder-decoder; dev loss and BLEU; a final test-set report."""

  name = "translation"
  batch_keys = ("src_tokens", "target_tokens", "src_segment_ids", "target_segment_ids",
                "src_positions", "target_positions")

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self._data: TranslationData | None = None
    self._translator: Translator | None = None  # Made at the first dev BLEU.

  @property
  def data(self) -> TranslationData:
    if self._data is None:
      self.prepare_data()
    return self._data

  def prepare_data(self) -> None:
    self._data = load_dataset(self.config.data)
    with self.config.unlocked():
      self.config.model.vocab_size = self._data.tokenizer.vocab_size  # The model follows it.

  def build_model(self) -> Transformer:
    return Transformer(self.config.model)

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    return init_transformer(model, key)

  def loss_sums(self, model, params, batch, train, dropout_key):
    return translation_loss_sums(model, params, batch, train, dropout_key,
                                 self.config.label_smoothing)

  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int
                     ) -> BatchIterator:
    return self.data.train_iterator(batch_multiple, process_index, process_count)

  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]:
    return self.data.eval_batches(self.data.eval_split, batch_multiple, process_index,
                                  process_count)

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    means = averages(sums, np)
    entropy = smoothing_entropy(self.config.model.vocab_size, self.config.label_smoothing)
    dev = dict(loss=float(means["loss"]), loss_above_entropy=float(means["loss"]) - entropy,
               nll=float(means["nll"]), perplexity=float(means["perplexity"]))
    if self.config.eval_bleu_sentences > 0:
      dev["bleu"] = self.dev_bleu(model, params, mesh)
    return dev

  def dev_bleu(self, model: nn.Module, params: Any, mesh: Mesh) -> float:
    """sacreBLEU of the first `config.eval_bleu_sentences` dev sentences."""
    if self._translator is None:
      self._translator = Translator(model, params, mesh, DecodeOptions.from_config(self.config))
    self._translator.params = params  # The jitted search takes params as an argument: no recompile.
    sources, references = self.data.texts(self.data.eval_split)
    count = self.config.eval_bleu_sentences
    hypotheses = translate_texts(self._translator, self.data.tokenizer, sources[:count],
                                 self.config.model.max_len)
    return sacre_bleu(hypotheses, references[:count])[0]

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

  def final_report(self, workdir: str, split: str | None = None) -> dict | None:
    """Decodes a split of the run's dataset with the §6.1 recipe and prints BLEU.

    The recipe includes the checkpoint: the average of the newest
    `config.average_last_checkpoints` (written to checkpoints_averaged/), or the
    latest where that is 1.
    """
    config = self.config
    split = split or config.final_eval_split
    if not split:
      return None
    sources, references = self.data.texts(split)
    averaged_steps = None
    if config.average_last_checkpoints > 1:
      _, averaged_steps = self.average_checkpoints(workdir, config.average_last_checkpoints)
    run = self.load_run(workdir, "averaged" if averaged_steps else "latest")
    checkpoint = (f"the average of steps {', '.join(map(str, averaged_steps))}"
                  if averaged_steps else f"step {run.step}")
    scores, hypotheses = evaluate_texts(run, sources, references, DecodeOptions.from_config(config))
    examples = list(zip(sources, hypotheses, references))[: config.final_eval_examples]
    for source, hypothesis, reference in examples:
      print(f"source:     {source}\ntranslated: {hypothesis}\nreference:  {reference}\n")
    print(f"BLEU on {split} ({len(sources)} sentences, {checkpoint}, beam {config.beam_size}, α "
          f"{config.length_penalty}): sacreBLEU {scores['sacrebleu']:.2f}, tokenized BLEU "
          f"{scores['paper_bleu']:.2f}, chrF {scores['chrf']:.2f}")
    print(f"sacreBLEU signature: {scores['sacrebleu_signature']}")
    scores.update(checkpoint_step=run.step, averaged_steps=averaged_steps)
    with open(os.path.join(workdir, f"final_{split}.json"), "w") as f:
      json.dump(scores, f, indent=2)
    return scores


def evaluate_texts(run: LoadedRun, sources: Sequence[str], references: Sequence[str],
                   options: DecodeOptions, tokens_per_batch: int = 4096,
                   tok_references: Sequence[str] | None = None) -> tuple[dict, list[str]]:
  """Decodes `sources` with a loaded run and scores them: (scores, hypotheses)."""
  started = time.time()
  hypotheses = translate_lines(run, list(sources), options, tokens_per_batch)
  seconds = time.time() - started
  scores = all_scores(hypotheses, list(references), tok_references)
  scores.update(sentences=len(sources), decode_seconds=round(seconds, 3),
                sentences_per_second=round(len(sources) / max(seconds, 1e-9), 3))
  return scores, hypotheses
