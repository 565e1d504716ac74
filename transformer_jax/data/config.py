"""The `data` section of an experiment config: every key with its default, and its validation."""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections
from ml_collections import config_dict

from transformer_jax.errors import UserError

DATASETS = ("generated_translation", "multi30k", "wmt14", "newstest", "plain_text", "tfds_text")
DEFAULT_SPLITS = {  # (train, eval, test) split names.
    "generated_translation": ("train", "validation", "test"),
    "multi30k": ("train", "val", "test2016"),
    "wmt14": ("train", "validation", "test"),
    # newstest has no training data: train on it only for smoke tests.
    "newstest": ("newstest2013", "newstest2013", "newstest2014"),
    "plain_text": ("train", "validation", "test"),
    # lm1b has no validation split: set data.eval_split (e.g. a slice of train) to tune.
    "tfds_text": ("train", "test", "test"),
}
# The toy corpus has ~800 word types: 2k pieces keep every word whole.
DEFAULT_VOCAB_SIZES = {"generated_translation": 2_000, "multi30k": 8_000,
                       "wmt14": 32_000, "newstest": 8_000, "plain_text": 8_000,
                       "tfds_text": 32_000}


def default_data_config() -> ml_collections.ConfigDict:
  """The `data` section of an experiment config, with every key."""
  c = ml_collections.ConfigDict()
  # One of DATASETS. newstest = newstest2013/2014 only (no training data).
  c.dataset = "generated_translation"
  # Folder holding multi30k/ and wmt-newstest-en-de/; None: $TRANSFORMER_JAX_DATA_DIR.
  c.data_dir = config_dict.placeholder(str)
  # Writable cache for prepared records, tokenizers and token ids; None:
  # $TRANSFORMER_JAX_CACHE_DIR, else ~/.cache/transformer_jax.
  c.prepared_dir = config_dict.placeholder(str)
  c.variant = "raw"  # multi30k: 'raw' (cased) or 'tok' (lowercased, tokenized).
  c.source_lang = "en"
  c.target_lang = "de"
  # Split names; None: the dataset's own (multi30k: train/val/test2016;
  # generated_translation, wmt14, plain_text: train/validation/test).
  c.train_split = config_dict.placeholder(str)
  c.eval_split = config_dict.placeholder(str)
  c.test_split = config_dict.placeholder(str)
  # dataset="plain_text": line-aligned UTF-8 files; eval and test optional; monolingual
  # text (causal_lm, masked_lm): name only the *_target files.
  c.plain_text = ml_collections.ConfigDict(
      {f"{role}_{side}": config_dict.placeholder(str)
       for role in ("train", "eval", "test") for side in ("source", "target")})
  # dataset="tfds_text": a TFDS text dataset (one text per record, e.g. lm1b, c4), read as
  # monolingual text; preparing it downloads (internet, and TensorFlow for some).
  c.tfds_name = "lm1b"
  c.tfds_text_feature = "text"
  c.num_generated_train = 200_000  # generated_translation: training pairs.
  c.num_generated_eval = 1_000  # generated_translation: validation = test size.
  c.seed = 0  # Corpus generation and the per-epoch shuffle.
  # Shared SentencePiece vocabulary (both languages); None: the dataset's
  # default (DEFAULT_VOCAB_SIZES).
  c.vocab_size = config_dict.placeholder(int)
  c.tokenizer_type = "bpe"  # 'bpe' or 'unigram'.
  # A SentencePiece .model to use instead of training one (vocab_size and tokenizer_type are
  # then unused), e.g. an imported model's RUN_DIR/tokenizer.model, to fine-tune it.
  c.tokenizer_path = config_dict.placeholder(str)
  # Training pairs only: BPE-dropout (Provilkov et al., 2020), each merge skipped with
  # this probability, both sides segmented anew every epoch; 0: off. A BPE tokenizer only.
  c.bpe_dropout = 0.0
  c.max_len = 128  # Tokens incl. EOS; longer training pairs are dropped (counted).
  c.tokens_per_batch = 4_096  # Budget: rows * padded_len <= this, src and target.
  # Padded lengths (shapes); those above max_len are unused in training.
  c.bucket_boundaries = (8, 10, 12, 14, 16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 96,
                         128, 192, 256)
  c.pack = False  # Pack several pairs per row of max_len (adds segment ids).
  c.replace_invalid_utf8 = False  # plain_text/multi30k: U+FFFD instead of an error.
  return c


def resolve_data_config(data_config: Mapping[str, Any] | None) -> ml_collections.ConfigDict:
  """`data_config` over the defaults; unknown keys or datasets are UserErrors."""
  merged = default_data_config().to_dict()
  given = dict(data_config or {})
  for key, value in given.items():
    if key not in merged:
      raise UserError(f"unknown data config key {key!r}; valid keys: "
                      f"{', '.join(sorted(merged))}")
    if key == "plain_text" and value is not None:
      value = dict(value)
      for k in value:
        if k not in merged["plain_text"]:
          raise UserError(f"unknown key plain_text.{k}; valid: "
                          f"{', '.join(merged['plain_text'])}")
      merged["plain_text"].update(value)
    else:
      merged[key] = value
  if merged["dataset"] not in DATASETS:
    raise UserError(f"unknown dataset {merged['dataset']!r}; use one of "
                    f"{', '.join(DATASETS)}")
  merged["bucket_boundaries"] = tuple(int(b) for b in merged["bucket_boundaries"])
  if merged["vocab_size"] is None:
    merged["vocab_size"] = DEFAULT_VOCAB_SIZES[merged["dataset"]]
  for key in ("max_len", "tokens_per_batch", "vocab_size", "num_generated_train"):
    if int(merged[key]) < 1:
      raise UserError(f"data.{key}={merged[key]} must be positive")
  if not 0.0 <= float(merged["bpe_dropout"]) < 1.0:
    raise UserError(f"data.bpe_dropout={merged['bpe_dropout']} must be in [0, 1) "
                    "(Provilkov et al. use 0.1)")
  if merged["bpe_dropout"] > 0 and merged["tokenizer_type"] != "bpe":
    raise UserError(f"data.bpe_dropout needs data.tokenizer_type='bpe', not "
                    f"{merged['tokenizer_type']!r}; set one of them")
  return ml_collections.ConfigDict(merged)


def split_names(cfg) -> tuple[str, str, str]:
  """(train, eval, test) split names: the config's, or the dataset's own."""
  defaults = DEFAULT_SPLITS[check_dataset_name(cfg.dataset)]
  return tuple(cfg.get(k) or d for k, d in
               zip(("train_split", "eval_split", "test_split"), defaults))


def check_dataset_name(name: str) -> str:
  if name not in DATASETS:
    raise UserError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)}")
  return name
