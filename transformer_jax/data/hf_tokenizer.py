"""A Hugging Face `tokenizers` tokenizer (GPT-2's byte-level BPE, BERT's WordPiece) behind the
package's `Tokenizer` interface, with the package's reserved ids.

The model and the data pipeline rely on PAD 0, UNK 1, BOS 2 and EOS 3
(`special_tokens`). A published vocabulary puts its special tokens elsewhere, so
the file this module writes holds, beside Hugging Face's own `tokenizer.json`,
`their_ids`: the published id of each of our ids (-1 where the published model has
no such token, e.g. GPT-2's PAD and UNK). An importer permutes the embedding rows
by the same table, so the model computes exactly what the published one does.

The file is JSON; `data.tokenizer.load_tokenizer` recognises it by its first byte,
so a run directory keeps it under the usual name, tokenizer.model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from transformer_jax import special_tokens
from transformer_jax.errors import UserError

FORMAT = "transformer_jax.hf_tokenizer/1"
NO_ID = -1


def reserved_ids(published_size: int, roles: dict[str, int]) -> np.ndarray:
  """int[our vocabulary]: the published id of each of our ids. Our reserved ids take the
  published ids of `roles` ('pad', 'unk', 'bos', 'eos'; a missing role is NO_ID); the other
  published ids follow in order, each once, those of the roles left out."""
  order = (("pad", special_tokens.PAD_ID), ("unk", special_tokens.UNK_ID),
           ("bos", special_tokens.BOS_ID), ("eos", special_tokens.EOS_ID))
  head = [roles.get(role, NO_ID) for role, _ in order]
  taken = {i for i in head if i != NO_ID}
  return np.array(head + [i for i in range(published_size) if i not in taken], np.int64)


def read_published(tokenizer_json: str | os.PathLike) -> dict:
  """Hugging Face's tokenizer.json as a dict; a one-line error where it is missing."""
  try:
    with open(tokenizer_json, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise UserError(f"{tokenizer_json} does not exist; the model directory needs the fast "
                    "tokenizer's tokenizer.json (save it with save_pretrained)") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{tokenizer_json} is not JSON ({e})") from None


def write(published: dict, their_ids: np.ndarray, dest: str | os.PathLike) -> Path:
  """Writes our tokenizer file: Hugging Face's tokenizer.json (`read_published`) and the id
  table."""
  dest = Path(dest)
  dest.parent.mkdir(parents=True, exist_ok=True)
  dest.write_text(json.dumps(dict(format=FORMAT, their_ids=[int(i) for i in their_ids],
                                  tokenizer=published), ensure_ascii=False))
  return dest


class HFTokenizer:
  """Our tokenizer file (`write`), read back; the interface of `data.tokenizer.Tokenizer`."""

  def __init__(self, path: str | os.PathLike):
    try:
      import tokenizers  # Optional: only runs imported from Hugging Face need it.
    except ImportError:
      raise UserError(f"{path} is a Hugging Face tokenizer and the tokenizers package is not "
                      "installed; pip install -e '.[hf]'") from None
    self.path = Path(path)
    self._bytes = self.path.read_bytes()
    document = json.loads(self._bytes)
    if document.get("format") != FORMAT:
      raise UserError(f"{self.path} is JSON but not a tokenizer this package wrote")
    self.their_ids = np.asarray(document["their_ids"], np.int64)
    self.published = document["tokenizer"]  # Hugging Face's tokenizer.json, as a dict.
    self._hf = tokenizers.Tokenizer.from_str(json.dumps(document["tokenizer"]))
    self._ours = np.full(max(self._hf.get_vocab_size(), int(self.their_ids.max()) + 1),
                         special_tokens.UNK_ID, np.int64)
    # Ordinary ids first, then the roles in order, so a token that is two of them (GPT-2's
    # <|endoftext|>, its BOS and EOS) reads as EOS.
    first = special_tokens.FIRST_PIECE_ID
    self._ours[self.their_ids[first:]] = np.arange(first, len(self.their_ids))
    for ours in range(first):
      if self.their_ids[ours] != NO_ID:
        self._ours[self.their_ids[ours]] = ours
    self.sha256 = hashlib.sha256(self._bytes).hexdigest()

  @property
  def vocab_size(self) -> int:
    return len(self.their_ids)

  def encode(self, text: str) -> list[int]:
    """Our ids of `text` followed by EOS."""
    theirs = self._hf.encode(text, add_special_tokens=False).ids
    return self._ours[theirs].tolist() + [special_tokens.EOS_ID]

  def encode_batch(self, texts: Sequence[str], bpe_dropout: float = 0.0,
                   seed: int = 0) -> list[list[int]]:
    del seed
    if bpe_dropout > 0:
      raise UserError(f"data.bpe_dropout={bpe_dropout} needs a SentencePiece BPE tokenizer, "
                      f"not {self.path.name}; set data.bpe_dropout=0")
    encoded = self._hf.encode_batch(list(texts), add_special_tokens=False)
    return [self._ours[e.ids].tolist() + [special_tokens.EOS_ID] for e in encoded]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; PAD, BOS and ids with no token of theirs are
    ignored."""
    theirs = [int(self.their_ids[i]) for i in special_tokens.text_ids(ids)]
    return self._hf.decode([i for i in theirs if i != NO_ID], skip_special_tokens=False)

  def decode_batch(self, rows: Iterable[Iterable[int]]) -> list[str]:
    return [self.decode(r) for r in rows]

  def id_to_piece(self, i: int) -> str:
    theirs = int(self.their_ids[int(i)])
    return "<pad>" if theirs == NO_ID else self._hf.id_to_token(theirs)

  def save_copy(self, dest_path: str | os.PathLike) -> Path:
    dest = Path(dest_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(self.path, dest)
    return dest

  def __repr__(self) -> str:
    return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"
