"""Translation: the paper's encoder-decoder on a parallel corpus, scored with BLEU."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax.data.pipeline import TranslationData
from transformer_jax.decode.ensemble import Ensemble
from transformer_jax.decode.translator import (DecodeOptions, Translator, for_decoding,
                                               translate_lines, translate_texts)
from transformer_jax.errors import UserError
from transformer_jax.metrics import bleu
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.tasks.corpus import CorpusTask
from transformer_jax.special_tokens import PAD_ID
from transformer_jax.training.losses import loss_sums, symmetric_kl_sum
from transformer_jax.training.run_dir import LoadedRun


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
    dropout_key: jax.Array | None, label_smoothing: float, rdrop_alpha: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Summed smoothed loss over non-PAD target tokens, plus summed NLL and the count.

  With `rdrop_alpha` > 0 in training (R-Drop, Liang et al., 2021), every sentence passes
  through the model twice under different dropout masks. The paper's loss, CE₁ + CE₂ +
  α · ½ (KL(p₁ ‖ p₂) + KL(p₂ ‖ p₁)), is halved so that its cross-entropy part stays the mean
  of the two passes' smoothed losses, on the scale of a plain step's; the model runs on twice
  the batch's rows. The two copies of a row sit next to each other in that batch, so both
  stay on the row's device under data sharding. `rdrop_kl_sum` sums the symmetric KL and
  `smoothed_ce_sum` the loss without it (logged per token as `rdrop_kl` and `smoothed_ce`,
  the latter comparable with a plain run's `loss`).
  """
  rngs = {"dropout": dropout_key} if train else {}
  targets = batch["target_tokens"]
  if not (train and rdrop_alpha > 0):
    logits = model.apply({"params": params}, **decoder_inputs(batch), train=train, rngs=rngs)
    return loss_sums(logits, targets, label_smoothing)
  twice = jax.tree.map(lambda array: jnp.repeat(array, 2, axis=0), batch)
  logits = model.apply({"params": params}, **decoder_inputs(twice), train=True, rngs=rngs)
  loss_sum, sums = loss_sums(logits, twice["target_tokens"], label_smoothing)
  pairs = logits.reshape(targets.shape[0], 2, *logits.shape[1:])  # Row i's two passes.
  weights = (targets != PAD_ID).astype(jnp.float32)
  kl_sum = symmetric_kl_sum(pairs[:, 0], pairs[:, 1], weights)
  smoothed_ce_sum = 0.5 * loss_sum
  loss_sum = smoothed_ce_sum + 0.25 * rdrop_alpha * kl_sum
  return loss_sum, dict(loss_sum=loss_sum, smoothed_ce_sum=smoothed_ce_sum,
                        nll_sum=0.5 * sums["nll_sum"], rdrop_kl_sum=kl_sum,
                        tokens=sums["tokens"] / 2)


def init_transformer(model: Transformer, key: jax.Array) -> Any:
  """The encoder-decoder's boxed parameters (shapes do not depend on the lengths)."""
  tokens = jnp.ones((1, 8), jnp.int32)
  return model.init(key, tokens, tokens, train=False)["params"]


class TranslationTask(CorpusTask):
  """Source -> target with the encoder-decoder; dev loss and BLEU; a final test-set report."""

  name = "translation"
  supports_rdrop = True

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self._translator: Translator | None = None  # Made at the first dev BLEU.

  def build_model(self) -> Transformer:
    return Transformer(self.model_config)

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    return init_transformer(model, key)

  def loss_sums(self, model, params, batch, train, dropout_key):
    return translation_loss_sums(model, params, batch, train, dropout_key,
                                 self.config.label_smoothing, self.config.rdrop_alpha)

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    dev = super().dev_metrics(model, params, sums, mesh)
    if self.config.eval_bleu_sentences > 0:
      dev["bleu"] = self.dev_bleu(model, params, mesh)
    return dev

  def dev_bleu(self, model: nn.Module, params: Any, mesh: Mesh) -> float:
    """BLEU of the first `config.eval_bleu_sentences` dev sentences: sacreBLEU, or the
    tokenized-lowercase BLEU where the corpus is tokenized and lowercased."""
    if self._translator is None:
      self._translator = Translator(model, params, mesh, DecodeOptions.from_config(self.config))
    self._translator.params = params  # The jitted search takes params as an argument: no recompile.
    sources, references = self.data.texts(self.data.eval_split)
    count = self.config.eval_bleu_sentences
    hypotheses = translate_texts(self._translator, self.data.tokenizer, sources[:count],
                                 self.model_config.max_len)
    if self.data.references_kind == bleu.REFERENCES_TOKENIZED:
      return bleu.tok_bleu(hypotheses, references[:count])
    return bleu.sacre_bleu(hypotheses, references[:count])[0]

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
    scores, hypotheses = evaluate_texts(run, sources, references, DecodeOptions.from_config(config),
                                        **reference_sets(self.data, split))
    scores.update(checkpoint_step=run.step, averaged_steps=averaged_steps)
    if jax.process_index() > 0:  # Every process decoded (collectively); one reports.
      return scores
    examples = list(zip(sources, hypotheses, references))[: config.final_eval_examples]
    for source, hypothesis, reference in examples:
      print(f"source:     {source}\ntranslated: {hypothesis}\nreference:  {reference}\n")
    print(f"BLEU on {split} ({len(sources)} sentences, {checkpoint}, beam {config.beam_size}, α "
          f"{config.length_penalty}): {bleu.summary(scores)}")
    if "sacrebleu_signature" in scores:
      print(f"sacreBLEU signature: {scores['sacrebleu_signature']}")
    with open(os.path.join(workdir, f"final_{split}.json"), "w") as f:
      json.dump(scores, f, indent=2)
    return scores


def reference_sets(data: TranslationData, split: str) -> dict:
  """`evaluate_texts`' keywords saying what `split`'s references are (which scores apply)."""
  return dict(tok_references=data.tok_references(split), references_kind=data.references_kind)


def evaluate_texts(run: LoadedRun, sources: Sequence[str], references: Sequence[str],
                   options: DecodeOptions, tokens_per_batch: int | None = None,
                   tok_references: Sequence[str] | None = None,
                   references_kind: str = bleu.REFERENCES_RAW) -> tuple[dict, list[str]]:
  """Decodes `sources` with a loaded run and scores them: (scores, hypotheses).

  `tok_references` and `references_kind` are `bleu.all_scores`' (which scores apply).
  """
  started = time.time()
  hypotheses = translate_lines(run, list(sources), options, tokens_per_batch)
  seconds = time.time() - started
  scores = bleu.all_scores(hypotheses, list(references), tok_references, references_kind)
  scores.update(sentences=len(sources), decode_seconds=round(seconds, 3),
                sentences_per_second=round(len(sources) / max(seconds, 1e-9), 3),
                decoding=decoding_settings(options, run.model))
  return scores, hypotheses


def decoding_settings(options: DecodeOptions, model: Any = None) -> dict:
  """The search that made a score, written beside it (greedy: no beam or α).

  A `--matmul_dtype` is written as `model` resolved it ("auto" as the dtype it chose).
  """
  settings = dict(method=options.method, max_extra_len=options.max_extra_len,
                  min_length=options.min_length)
  if options.quantize:
    settings.update(quantize=options.quantize)
  if isinstance(model, Ensemble):
    settings.update(ensemble=len(model.members))
  if options.matmul_dtype:
    resolved = None
    if model is not None:  # The flag sets every member's alike.
      decoding = for_decoding(model, options)
      resolved = (decoding.members[0] if isinstance(decoding, Ensemble) else decoding
                  ).config.matmul_dtype
    settings.update(matmul_dtype=resolved or options.matmul_dtype)
  if options.method == "beam":
    settings.update(beam_size=options.beam_size, alpha=options.alpha,
                    finish_rule=options.finish_rule, stop_rule=options.stop_rule)
  if options.method == "sample":
    settings.update(temperature=options.temperature, top_k=options.top_k)
  return settings


def combine_runs(runs: Sequence[LoadedRun], names: Sequence[str]) -> LoadedRun:
  """The runs as one: an Ensemble model with a tuple of params, the first run's tokenizer,
  mesh and config (its model.max_len the smallest of theirs). `names` (e.g. workdirs)
  label the runs in errors. Every run must share the first one's tokenizer."""
  if len(names) != len(runs):
    raise ValueError(f"{len(runs)} runs but {len(names)} names")
  first = runs[0]
  for run, name in zip(runs[1:], names[1:]):
    if run.tokenizer.sha256 != first.tokenizer.sha256:
      raise UserError(
          f"{name} has another tokenizer than {names[0]} (sha256 {run.tokenizer.sha256[:12]} "
          f"vs {first.tokenizer.sha256[:12]}); an ensemble needs runs trained on one "
          "vocabulary")
  config = first.config.copy_and_resolve_references()
  config.model.max_len = min(run.config.model.max_len for run in runs)
  return dataclasses.replace(
      first, config=config, model=Ensemble(tuple(run.model for run in runs)),
      params=tuple(run.params for run in runs))
