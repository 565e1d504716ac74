"""SentencePiece tokenizer: one vocabulary shared by both languages.

The model is trained with the package's reserved ids (`special_tokens`:
PAD 0, UNK 1, BOS 2, EOS 3), so masks (`tokens != PAD_ID`) and the decoder's
BOS/EOS agree with the data. A checkpoint records `Tokenizer.sha256` to
check that it is decoded with the vocabulary it was trained with.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
import re
import shutil
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm

from transformer_jax import special_tokens
from transformer_jax.data.hf_tokenizer import HFTokenizer
from transformer_jax.errors import UserError

MODEL_TYPES = ("bpe", "unigram")
# Enough sentences for a good vocabulary; more only slows training down.
_MAX_TRAINING_SENTENCES = 2_000_000


class Tokenizer:
  """A SentencePiece model loaded from `path` (the `.model` file)."""

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    try:
      self._bytes = self.path.read_bytes()
    except FileNotFoundError:
      raise UserError(f"tokenizer model {self.path} does not exist; give the "
                      "path of a SentencePiece .model file") from None
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(self._bytes)
    except RuntimeError:
      raise UserError(f"{self.path} is not a SentencePiece model file") from None
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
    want = (special_tokens.PAD_ID, special_tokens.UNK_ID, special_tokens.BOS_ID,
            special_tokens.EOS_ID)
    if ids != want:
      raise UserError(f"{self.path} has pad/unk/bos/eos ids {ids}, expected "
                      f"{want}; train it with train_tokenizer()")
    self.sha256 = hashlib.sha256(self._bytes).hexdigest()

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` followed by EOS: int[len + 1]."""
    return self._sp.encode(text) + [special_tokens.EOS_ID]

  def encode_batch(self, texts: Sequence[str], bpe_dropout: float = 0.0,
                   seed: int = 0) -> list[list[int]]:
    """`encode` of every text (runs in SentencePiece's C++ threads).

    With `bpe_dropout` > 0 (a BPE model only), each merge is skipped with that
    probability (BPE-dropout, Provilkov et al., 2020): another segmentation of
    the same text, a pure function of (texts, bpe_dropout, seed). The sampler's
    generator is per thread and seeded from the global seed, so those encode in
    one thread.
    """
    eos = special_tokens.EOS_ID
    if bpe_dropout > 0:
      spm.set_random_generator_seed(int(seed))
      out = self._sp.encode(list(texts), enable_sampling=True, alpha=float(bpe_dropout),
                            nbest_size=-1, num_threads=1)
    else:
      out = self._sp.encode(list(texts), num_threads=os.cpu_count() or 1)
    for ids in out:
      ids.append(eos)
    return out

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; PAD and BOS are ignored."""
    return self._sp.decode(special_tokens.text_ids(ids))

  def decode_batch(self, rows: Iterable[Iterable[int]]) -> list[str]:
    return [self.decode(r) for r in rows]

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def save_copy(self, dest_path: str | os.PathLike) -> Path:
    """Copies the model file to `dest_path` (e.g. next to a checkpoint)."""
    dest = Path(dest_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(self.path, dest)
    return dest

  def __repr__(self) -> str:
    return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | HFTokenizer:
  """The tokenizer in `path`: a SentencePiece model, or a Hugging Face tokenizer that
  `data.hf_tokenizer.write` wrote (JSON)."""
  try:
    with open(path, "rb") as f:
      is_json = f.read(1) == b"{"
  except FileNotFoundError:
    raise UserError(f"tokenizer model {path} does not exist; give the path of a "
                    "SentencePiece .model file") from None
  return HFTokenizer(path) if is_json else Tokenizer(path)


def train_tokenizer(texts: Iterable[str], vocab_size: int, model_type: str,
                    model_path: str | os.PathLike) -> Tokenizer:
  """Trains a SentencePiece model on `texts` and writes it to `model_path`.

  Pass the training split of BOTH languages: the vocabulary (and so the
  embedding matrix) is shared. The file is written atomically, so a
  concurrent reader never sees half a model.
  """
  if model_type not in MODEL_TYPES:
    raise UserError(f"tokenizer_type={model_type!r} is not one of {MODEL_TYPES}")
  if vocab_size < 8:
    raise UserError(f"vocab_size={vocab_size} is too small; use at least a few "
                    "hundred")
  path = Path(model_path)
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = (t for t in texts if t.strip())
  model = io.BytesIO()  # Not model_prefix: the model file would record the path.
  spm.set_random_generator_seed(0)  # Sampling of huge inputs is repeatable.
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model,
        vocab_size=vocab_size, model_type=model_type,
        character_coverage=1.0, pad_id=special_tokens.PAD_ID,
        unk_id=special_tokens.UNK_ID, bos_id=special_tokens.BOS_ID,
        eos_id=special_tokens.EOS_ID, input_sentence_size=_MAX_TRAINING_SENTENCES,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
        minloglevel=2)
  except RuntimeError as e:
    raise _training_error(str(e), vocab_size) from None
  fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
  with os.fdopen(fd, "wb") as f:
    f.write(model.getvalue())
  os.replace(tmp, path)
  return Tokenizer(path)


def _training_error(message: str, vocab_size: int) -> UserError:
  limit = re.search(r"value <= (\d+)", message)
  if limit:
    return UserError(f"vocab_size={vocab_size} is too large for this training "
                     f"data; set --config.data.vocab_size to at most "
                     f"{limit.group(1)}")
  chars = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
  if chars:
    return UserError(f"vocab_size={vocab_size} is smaller than the {chars.group(1)} "
                     "characters and special tokens of the data; set "
                     f"--config.data.vocab_size to at least {chars.group(1)}")
  first = " ".join(message.split())[:300]
  return UserError(f"SentencePiece training failed ({first}); check vocab_size="
                   f"{vocab_size} and the training text")


def cached_tokenizer(cache_dir: str | os.PathLike, dataset_key: str,
                     vocab_size: int, model_type: str,
                     texts_fn) -> Tokenizer:
  """Loads `<cache_dir>/<dataset_key>-<model_type><vocab_size>.model`.

  Trains it first from `texts_fn()` (an iterable of training sentences of
  both languages) if it is not cached yet.
  """
  path = Path(cache_dir) / f"{dataset_key}-{model_type}{vocab_size}.model"
  if path.is_file():
    return Tokenizer(path)
  return train_tokenizer(texts_fn(), vocab_size, model_type, path)
