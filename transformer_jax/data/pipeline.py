"""The input pipeline: config, one-time preparation, in-memory token ids.

`load_dataset(config.data)` prepares the corpus (TFDS array_record, once),
trains or loads the shared SentencePiece vocabulary (once), tokenizes every
split once (cached as .npz beside the prepared data) and keeps the ids in
memory, so batches never wait for per-record reads. Training and eval batches
are grain `MapDataset`s over precomputed batch plans (`batching.py`): a
deterministic grain shuffle of the batch order and a map that assembles this
host's rows, read by index so a restored iterator continues exactly.

Its throughput: `benchmarks/input_pipeline.py`.
"""

from __future__ import annotations

import os
from pathlib import Path
import tempfile
from typing import Any, Iterator, Mapping

from absl import logging
import ml_collections
from ml_collections import config_dict
import grain
import numpy as np

from transformer_jax.data import batching
from transformer_jax.data import builders
from transformer_jax.data import text_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import UserError

DATASETS = builders.DATASETS
# The toy corpus has ~800 word types: 2k pieces keep every word whole.
DEFAULT_VOCAB_SIZES = {"generated_translation": 2_000, "multi30k": 8_000,
                       "wmt14": 32_000, "newstest": 8_000, "plain_text": 8_000}


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
  # dataset='plain_text': line-aligned UTF-8 files; eval and test optional.
  c.plain_text = ml_collections.ConfigDict(
      {f"{role}_{side}": config_dict.placeholder(str)
       for role in ("train", "eval", "test") for side in ("source", "target")})
  c.num_generated_train = 200_000  # generated_translation: training pairs.
  c.num_generated_eval = 1_000  # generated_translation: validation = test size.
  c.seed = 0  # Corpus generation and the per-epoch shuffle.
  # Shared SentencePiece vocabulary (both languages); None: the dataset's
  # default (DEFAULT_VOCAB_SIZES).
  c.vocab_size = config_dict.placeholder(int)
  c.tokenizer_type = "bpe"  # 'bpe' or 'unigram'.
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


class TranslationData:
  """Tokenized splits in memory, the tokenizer, and batch iterators.

  `split_sizes` counts every pair of each loaded split (what BLEU scores);
  training uses `train`, those of the train split that survived filtering
  (`filtered` counts the dropped: {'empty': n, 'too_long': n}; `train_lines`
  holds their line numbers in the split).
  """

  def __init__(self, config: ml_collections.ConfigDict, tokenizer,
               splits: dict[str, batching.TokenizedSplit],
               train: batching.TokenizedSplit, split_names: tuple,
               split_sizes: dict[str, int], reader, filtered: dict[str, int],
               train_lines: np.ndarray):
    self.config = config
    self.tokenizer = tokenizer
    self._splits = splits  # Unfiltered eval/test splits.
    self.train = train
    self.train_lines = train_lines
    self.train_split, self.eval_split, self.test_split = split_names
    self.split_sizes = split_sizes
    self.filtered = filtered
    self._reader = reader  # split -> (source_texts, target_texts)
    self._texts: dict[str, tuple[list[str], list[str]]] = {}
    self._eval_plans: dict[tuple, list] = {}

  def split(self, name: str) -> batching.TokenizedSplit:
    """Token ids of every pair of an eval/test split (the filtered train one
    if `name` is only the train split)."""
    if name in self._splits:
      return self._splits[name]
    if name == self.train_split:
      return self.train
    raise UserError(f"split {name!r} is not loaded; loaded: {sorted(self.split_sizes)}")

  def texts(self, split: str) -> tuple[list[str], list[str]]:
    """(source, reference) strings of every line of `split`, for BLEU."""
    if split not in self._texts:
      self._texts[split] = self._reader(split)
    return self._texts[split]

  def bpe_dropout_split(self, epoch: int) -> batching.TokenizedSplit:
    """The training pairs with both sides segmented by BPE-dropout for `epoch`.

    A pure function of (data.seed, epoch), the same on every host. A side
    that comes out longer than max_len keeps its deterministic segmentation.
    """
    c = self.config
    sources, targets = self.texts(self.train_split)
    seeds = np.random.default_rng([c.seed, epoch, 0x42504544]).integers(2**31, size=2)
    sides = []
    for texts, seed, flat, offsets in ((sources, seeds[0], self.train.src, self.train.src_offsets),
                                       (targets, seeds[1], self.train.tgt, self.train.tgt_offsets)):
      sampled = self.tokenizer.encode_batch([texts[i] for i in self.train_lines],
                                            bpe_dropout=c.bpe_dropout, seed=int(seed))
      for i, ids in enumerate(sampled):
        if len(ids) > c.max_len:
          sampled[i] = flat[offsets[i]:offsets[i + 1]].tolist()
      sides.append(sampled)
    return batching.TokenizedSplit.from_lists(*sides)

  def train_iterator(self, batch_multiple: int, process_index: int = 0,
                     process_count: int = 1) -> batching.TrainIterator:
    c = self.config
    resample = self.bpe_dropout_split if c.bpe_dropout > 0 else None
    it = batching.TrainIterator(
        self.train, seed=c.seed, tokens_per_batch=c.tokens_per_batch,
        boundaries=c.bucket_boundaries, max_len=c.max_len, pack=c.pack,
        batch_multiple=batch_multiple, process_index=process_index,
        process_count=process_count, resample=resample,
        resample_key=f"bpe_dropout={c.bpe_dropout}" if resample else "")
    logging.info("train batches: %d per epoch, padding fraction %.3f (pack=%s)",
                 it.batches_per_epoch(0), it.padding_fraction(0), c.pack)
    return it

  def eval_batches(self, split: str, batch_multiple: int, process_index: int = 0,
                   process_count: int = 1, tokens_per_batch: int | None = None
                   ) -> Iterator[dict[str, np.ndarray]]:
    """Every pair of `split` exactly once, shortest first, never truncated.

    Yields {'src_tokens', 'target_tokens': int32[rows, len], 'example_ids':
    int32[rows]} (row i holds pair example_ids[i] of `texts(split)`; -1 and
    all-PAD tokens mark rows that only fill the last batch).
    """
    batching.check_sharding(batch_multiple, process_index, process_count)
    data = self.split(split)
    tpb = tokens_per_batch or self.config.tokens_per_batch
    key = (split, batch_multiple, tpb)
    if key not in self._eval_plans:
      self._eval_plans[key] = batching.eval_plan(
          data, self.config.bucket_boundaries, tpb, batch_multiple)
    def host_batch(plan):
      length, idx = plan
      lo, hi = batching.host_slice(len(idx), process_index, process_count)
      return batching.eval_batch(data, length, idx[lo:hi])

    yield from grain.MapDataset.source(self._eval_plans[key]).map(host_batch)


def load_dataset(data_config: Mapping[str, Any] | None = None) -> TranslationData:
  """Prepares (or loads cached) data, tokenizer and token ids."""
  cfg = resolve_data_config(data_config)
  root = text_files.resolve_prepared_dir(cfg.prepared_dir)
  prepared = builders.prepare(cfg, root / "tfds")
  names = list(builders.split_names(cfg))
  for i, (name, key) in enumerate(zip(names, ("train_split", "eval_split", "test_split"))):
    if name not in prepared.splits:
      if i > 0 and cfg[key] is None:  # A default eval/test split may be absent.
        logging.info("%s has no %s split %r; not loaded", cfg.dataset, key[:-6], name)
        names[i] = None
        continue
      raise UserError(f"{cfg.dataset} has no split {name!r}; it has "
                      f"{', '.join(prepared.splits)}; set data.{key}")
  texts: dict[str, tuple[list[str], list[str]]] = {}

  def read(split: str) -> tuple[list[str], list[str]]:
    if split not in texts:
      texts[split] = prepared.read(split)
    return texts[split]

  def training_text():
    src, tgt = read(names[0])
    yield from src
    yield from tgt

  tok = tokenizer_lib.cached_tokenizer(
      root / "tokenizers", prepared.key, cfg.vocab_size, cfg.tokenizer_type,
      training_text)
  splits = {name: _tokenized(root / "tokenized", prepared, tok, name, read)
            for name in dict.fromkeys(names[1:]) if name is not None}
  train, train_lines, filtered = _filter_train(
      splits.get(names[0]) or _tokenized(root / "tokenized", prepared, tok, names[0], read),
      cfg.max_len)
  sizes = {n: prepared.splits[n] for n in names if n is not None}
  logging.info(
      "%s: %s pairs; %d of %s used for training: dropped %d empty, %d longer than "
      "max_len=%d", prepared.key, ", ".join(f"{n} {k}" for n, k in sizes.items()),
      len(train), names[0], filtered["empty"], filtered["too_long"], cfg.max_len)
  if len(train) == 0:
    raise UserError(f"all training pairs were dropped ({filtered['empty']} empty, "
                    f"{filtered['too_long']} longer than max_len={cfg.max_len}); "
                    "raise data.max_len or check the data")
  eval_texts = {n: t for n, t in texts.items() if n in splits}  # Keep small ones.

  def reader(split: str) -> tuple[list[str], list[str]]:
    return eval_texts[split] if split in eval_texts else prepared.read(split)

  return TranslationData(cfg, tok, splits, train, tuple(names), sizes, reader, filtered,
                         train_lines)


def _tokenized(cache_dir: Path, prepared, tok, split: str, read) -> batching.TokenizedSplit:
  """Token ids of a split, from `<cache_dir>/<data>-<tokenizer>-<split>.npz`."""
  path = cache_dir / f"{prepared.key}-{tok.sha256[:16]}-{split}.npz"
  fields = {}
  if path.is_file():
    with np.load(path) as z:
      fields = {k: z[k] for k in z.files}
  else:
    src, tgt = read(split)
    for feat, lines in ((prepared.source_feature, src), (prepared.target_feature, tgt)):
      fields[feat], fields[f"{feat}_offsets"] = batching.ragged(tok.encode_batch(lines))
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **fields)
    os.replace(tmp, path)  # Atomic: readers never see a partial file.
  s, t = prepared.source_feature, prepared.target_feature
  return batching.TokenizedSplit(fields[s], fields[f"{s}_offsets"],
                                 fields[t], fields[f"{t}_offsets"])


def _filter_train(split: batching.TokenizedSplit, max_len: int):
  """(kept pairs, their indices, counts) after dropping pairs with an empty
  side or a side longer than max_len."""
  empty = (split.src_lengths <= 1) | (split.tgt_lengths <= 1)  # Only EOS.
  too_long = ~empty & (np.maximum(split.src_lengths, split.tgt_lengths) > max_len)
  keep = np.flatnonzero(~empty & ~too_long)
  if len(keep) < len(split):
    split = split.subset(keep)
  return split, keep, {"empty": int(empty.sum()), "too_long": int(too_long.sum())}
