"""Which corpus a data config names, and where its files are: resolved once, before preparing.

`resolve_corpus(config.data)` checks the dataset name, the languages, the
Multi30k variant and the plain-text files, finds the data folder
(`--config.data.data_dir` or `$TRANSFORMER_JAX_DATA_DIR`) and the writable cache,
and returns a `Corpus`: everything the builders need, so preparing never goes
back to the config.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_collections

from transformer_jax.data import text_files
from transformer_jax.data.config import check_dataset_name, split_names
from transformer_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A resolved corpus. Records hold both languages; the features pick the direction."""

  name: str                    # One of data.config.DATASETS.
  split_names: tuple[str, str, str]  # (train, eval, test), the config's or the dataset's own.
  source_feature: str          # The record field of the source side ('en' or 'de').
  target_feature: str
  errors: str                  # 'strict', or 'replace' (invalid UTF-8 -> U+FFFD).
  cache_dir: Path              # Writable: prepared records, tokenizers, token ids.
  variant: str = "raw"         # multi30k: 'raw' or 'tok'.
  manual_dir: str | None = None  # multi30k: the files' folder; None downloads them.
  files: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # Plain text.
  seed: int = 0                # generated_translation.
  num_generated_train: int = 0
  num_generated_eval: int = 0
  tfds_name: str = ""          # tfds_text: the TFDS dataset (a monolingual one: both
                               # features name its text field).


def resolve_corpus(cfg: ml_collections.ConfigDict) -> Corpus:
  """The corpus a (resolved) data config names; a one-line UserError for any mistake."""
  name = check_dataset_name(cfg.dataset)
  source, target = cfg.source_lang, cfg.target_lang
  if name not in ("plain_text", "tfds_text") and {source, target} != {"en", "de"}:
    raise UserError(f"source_lang={source!r}, target_lang={target!r}: "
                    f"{name} is English-German; use 'en' and 'de' in either order")
  fields = dict(name=name, split_names=split_names(cfg), source_feature=source,
                target_feature=target, errors="replace" if cfg.replace_invalid_utf8 else "strict",
                cache_dir=text_files.resolve_prepared_dir(cfg.prepared_dir))
  if name == "generated_translation":
    fields.update(seed=cfg.seed, num_generated_train=cfg.num_generated_train,
                  num_generated_eval=cfg.num_generated_eval)
  elif name == "multi30k":
    if cfg.variant not in text_files.MULTI30K_VARIANTS:
      raise UserError(f"variant={cfg.variant!r} is not one of {text_files.MULTI30K_VARIANTS}")
    fields.update(variant=cfg.variant, manual_dir=_multi30k_manual_dir(cfg))
  elif name == "newstest":
    fields.update(files={s: text_files.newstest_files(cfg.data_dir, s, "en", "de")
                         for s in text_files.NEWSTEST_SPLITS})
  elif name == "plain_text":
    # Records hold the source in 'en' and the target in 'de', whatever the languages.
    fields.update(files=_plain_text_files(cfg), source_feature="en", target_feature="de")
  elif name == "tfds_text":
    fields.update(tfds_name=cfg.tfds_name, source_feature=cfg.tfds_text_feature,
                  target_feature=cfg.tfds_text_feature)
  return Corpus(**fields)


def _multi30k_manual_dir(cfg: ml_collections.ConfigDict) -> str | None:
  """The manual dir `<data_dir>/multi30k`, or None (download) if no data_dir."""
  root = cfg.data_dir or os.environ.get(text_files.DATA_DIR_ENV)
  if not root:
    return None
  # Raises a UserError naming the expected files if any is missing.
  folder = text_files.multi30k_dir(root, cfg.variant)
  return os.fspath(folder.parent if cfg.variant == "tok" else folder)


def _plain_text_files(cfg: ml_collections.ConfigDict) -> dict[str, tuple[str, str]]:
  names = dict(zip(("train", "eval", "test"), split_names(cfg)))
  files = {}
  for role in ("train", "eval", "test"):
    src, tgt = cfg.plain_text[f"{role}_source"], cfg.plain_text[f"{role}_target"]
    if src and not tgt:
      raise UserError(f"plain_text.{role}_source needs plain_text.{role}_target (for "
                      "monolingual text, name only the target file)")
    if tgt:  # Monolingual text (no source file) is read as both sides.
      files[names[role]] = (src or tgt, tgt)
  if names["train"] not in files:
    raise UserError("dataset='plain_text' needs --config.data.plain_text.train_target "
                    "(and .train_source, line-aligned, for translation)")
  return files
