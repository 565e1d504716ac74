"""The input pipeline: one data config in, in-memory token ids and batch iterators out.

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

from pathlib import Path
from typing import Any, Iterator, Mapping

from absl import logging
import ml_collections
import grain
import numpy as np

from transformer_jax.data import batching
from transformer_jax.data import text_files
from transformer_jax.data import builders
from transformer_jax.data import tokenized
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.config import resolve_data_config
from transformer_jax.data.corpus import resolve_corpus
from transformer_jax.errors import UserError
from transformer_jax.metrics import bleu


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
               train_lines: np.ndarray, tok_reference_reader=None):
    self.config = config
    self.tokenizer = tokenizer
    self._splits = splits  # Unfiltered eval/test splits.
    self.train = train
    self.train_lines = train_lines
    self.train_split, self.eval_split, self.test_split = split_names
    self.split_sizes = split_sizes
    self.filtered = filtered
    self._reader = reader  # split -> (source_texts, target_texts)
    self._tok_reference_reader = tok_reference_reader  # split -> tokenized target texts
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

  def longest_eval_length(self, split: str) -> int:
    """Tokens a side in the longest batch `eval_batches(split)` yields (0 for no pairs)."""
    plan = batching.eval_plan(self.split(split), self.config.bucket_boundaries,
                              self.config.tokens_per_batch, 1, self.config.max_len)
    return max((length for length, _ in plan), default=0)

  def texts(self, split: str) -> tuple[list[str], list[str]]:
    """(source, reference) strings of every line of `split`, for BLEU."""
    if split not in self._texts:
      self._texts[split] = self._reader(split)
    return self._texts[split]

  @property
  def references_kind(self) -> str:
    """What the references are (`references_kind`)."""
    return references_kind(self.config)

  def tok_references(self, split: str) -> list[str] | None:
    """The official tokenized, lowercased references of `split` (Multi30k raw with its
    `tok/` folder beside it), for the literature's tokenized BLEU; None elsewhere."""
    if self._tok_reference_reader is None:
      return None
    return self._tok_reference_reader(split)

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
    """Every pair of `split` exactly once, shortest first, never truncated; pairs with an
    empty side are left out, as training leaves them out (`batching.eval_plan`).

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
          data, self.config.bucket_boundaries, tpb, batch_multiple, self.config.max_len)
    def host_batch(plan):
      length, idx = plan
      lo, hi = batching.host_slice(len(idx), process_index, process_count)
      return batching.eval_batch(data, length, idx[lo:hi])

    yield from grain.MapDataset.source(self._eval_plans[key]).map(host_batch)


def references_kind(data_config: Mapping[str, Any]) -> str:
  """bleu.REFERENCES_TOKENIZED where a data config names tokenized, lowercased text
  (Multi30k `tok/`), else bleu.REFERENCES_RAW."""
  tokenized_corpus = data_config["dataset"] == "multi30k" and data_config.get("variant") == "tok"
  return bleu.REFERENCES_TOKENIZED if tokenized_corpus else bleu.REFERENCES_RAW


def load_dataset(data_config: Mapping[str, Any] | None = None) -> TranslationData:
  """Prepares (or loads cached) data, tokenizer and token ids, in that order.

  config -> corpus (`corpus.py`) -> prepared records (`builders.py`) -> tokenizer
  (`tokenizer.py`) -> token ids (`tokenized.py`) -> batch plans (`batching.py`).
  """
  cfg = resolve_data_config(data_config)
  corpus = resolve_corpus(cfg)
  root = corpus.cache_dir
  prepared = builders.prepare(corpus, root / "tfds")
  names = list(corpus.split_names)
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

  tok = corpus_tokenizer(cfg, prepared, root, read, names[0])
  splits = {name: tokenized.tokenize_split(root / "tokenized", prepared, tok, name, read)
            for name in dict.fromkeys(names[1:]) if name is not None}
  train, train_lines, filtered = tokenized.filter_train(
      splits.get(names[0]) or tokenized.tokenize_split(root / "tokenized", prepared, tok, names[0], read),
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
                         train_lines, _tok_reference_reader(corpus))


def corpus_tokenizer(cfg: ml_collections.ConfigDict, prepared: builders.PreparedDataset,
                     root: Path, read, train_split: str) -> tokenizer_lib.Tokenizer:
  """The run's SentencePiece model: `data.tokenizer_path`, else the one trained (once,
  then cached under `root`) on both sides of `train_split`; `read(split)` gives its texts."""
  if cfg.tokenizer_path:
    return tokenizer_lib.load_tokenizer(cfg.tokenizer_path)

  def training_text():
    src, tgt = read(train_split)
    yield from src
    yield from tgt

  # Trained on another split, it is another tokenizer (a smoke run's on val must not be
  # found by the full run); the default split keeps the names that caches already have.
  key = prepared.key if train_split == "train" else f"{prepared.key}-from-{train_split}"
  return tokenizer_lib.cached_tokenizer(root / "tokenizers", key, cfg.vocab_size,
                                        cfg.tokenizer_type, training_text)


def _tok_reference_reader(corpus):
  """split -> the Multi30k `tok/` target lines, where a raw corpus has that folder beside it."""
  if corpus.name != "multi30k" or corpus.variant != "raw" or not corpus.manual_dir:
    return None
  folder = Path(corpus.manual_dir) / "tok"
  if not all((folder / name).is_file() for name in text_files.multi30k_file_names()):
    return None
  return lambda split: text_files.read_multi30k(
      folder, split, corpus.source_feature, corpus.target_feature, corpus.errors)[1]
