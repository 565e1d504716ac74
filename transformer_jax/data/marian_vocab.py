"""A Marian (opus-mt) vocabulary as one SentencePiece model with this package's reserved ids.

A Marian model reads text through its `source.spm`, maps each piece to an id
through a `vocab.json` shared by both languages (an unknown piece -> `<unk>`),
and appends `</s>`; its decoder starts from `<pad>`. Here every model is read
through one SentencePiece model whose PAD, UNK, BOS and EOS hold the ids of
`special_tokens`. So the importer rebuilds the source model with vocab.json's
pieces in our order:

  ours 0 PAD  <- Marian's <pad>
  ours 1 UNK  <- Marian's <unk>
  ours 2 BOS  <- Marian's decoder start token (its <pad> again, in every opus-mt model)
  ours 3 EOS  <- Marian's </s>
  ours 4...   <- Marian's other ids, in increasing order

Each piece keeps the source model's score, so the source text is segmented as
Marian segments it. Pieces only the target side uses score far below any
source segmentation, and only single characters of them can be produced:
`encode` takes one only where the source model has no piece for a character,
as Marian then finds that character's surface in vocab.json.
Language tags such as `>>de<<` that begin a multilingual model's source are
matched whole, as Marian's tokenizer matches them (the piece `▁>>de<<`, as
SentencePiece sees a sentence's start).
`marian_ids` says which Marian row each of our ids takes; the importer permutes
the embedding rows and the logits bias with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
from sentencepiece import sentencepiece_model_pb2

from transformer_jax import special_tokens
from transformer_jax.errors import UserError

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED = 1, 2, 3, 4, 5
# Below any segmentation by source pieces (|score| per piece is tens at most).
_TARGET_ONLY_SCORE = -1e4
_LANGUAGE_TAG = re.compile(r">>.+<<")
# Our reserved ids: (id, piece, the role of the Marian id whose row it takes, piece type).
_RESERVED = ((special_tokens.PAD_ID, "<pad>", "pad", _CONTROL),
             (special_tokens.UNK_ID, "<unk>", "unk", _UNKNOWN),
             (special_tokens.BOS_ID, "<s>", "start", _CONTROL),
             (special_tokens.EOS_ID, "</s>", "eos", _CONTROL))
SPECIAL_ROLES = tuple(role for _, _, role, _ in _RESERVED)


@dataclasses.dataclass(frozen=True)
class MarianVocabulary:
  """model_proto: a serialized SentencePiece model in our id layout.

  marian_ids: int[our vocab size]; row i of our embedding is row marian_ids[i]
  of Marian's. missing_source_pieces: source.spm
  pieces vocab.json lacks (Marian maps them to <unk>; here they are dropped
  from the segmentation, which then takes other pieces).
  """

  model_proto: bytes
  marian_ids: np.ndarray
  missing_source_pieces: tuple[str, ...]


def read_vocab_json(path: str) -> dict[str, int]:
  """{piece: Marian id} of a vocab.json, checked to number 0..n-1 once each."""
  try:
    with open(path, encoding="utf-8") as f:
      vocab = json.load(f)
  except FileNotFoundError:
    raise UserError(f"{path} does not exist; a Marian model directory holds vocab.json") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not a JSON vocabulary ({e}); pass a Marian model directory") from None
  if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
    raise UserError(f"{path} does not map pieces to the ids 0..n-1 once each; it is not a "
                    "Marian vocab.json")
  return vocab


def convert(source_spm: str, vocab: dict[str, int], special_ids: dict[str, int]
            ) -> MarianVocabulary:
  """The source SentencePiece model rebuilt over `vocab` in our id layout (module docstring).

  Args:
    source_spm: path of Marian's source.spm.
    vocab: vocab.json's {piece: Marian id}.
    special_ids: Marian's ids of each of SPECIAL_ROLES: "pad", "start" and
      "eos" from its config.json (pad_token_id, decoder_start_token_id,
      eos_token_id), "unk" from vocab.json.
  """
  proto = sentencepiece_model_pb2.ModelProto()
  try:
    with open(source_spm, "rb") as f:
      proto.ParseFromString(f.read())
  except FileNotFoundError:
    raise UserError(f"{source_spm} does not exist; a Marian model directory holds source.spm") from None
  except Exception:
    raise UserError(f"{source_spm} is not a SentencePiece model") from None
  if len(proto.pieces) == 0:
    raise UserError(f"{source_spm} is not a SentencePiece model (it holds no pieces)")
  for role, marian_id in special_ids.items():
    if not 0 <= marian_id < len(vocab):
      raise UserError(f"Marian's {role} id {marian_id} is not one of vocab.json's {len(vocab)} ids; "
                      "check config.json's pad_token_id, decoder_start_token_id and eos_token_id")
  clash = [role for role in ("pad", "unk", "start") if special_ids[role] == special_ids["eos"]]
  if special_ids["unk"] in (special_ids["pad"], special_ids["start"]) or clash:
    raise UserError(f"Marian's special ids {special_ids} reuse one token for two jobs that are "
                    "distinct here; only the decoder start may equal pad (as in opus-mt)")
  source_scores = {p.piece: p.score for p in proto.pieces if p.type == _NORMAL}
  reserved_marian = set(special_ids.values())
  by_id = sorted((i, piece) for piece, i in vocab.items() if i not in reserved_marian)
  marian_ids = np.zeros(len(_RESERVED) + len(by_id), np.int64)
  pieces = []
  for our_id, piece, marian_role, piece_type in _RESERVED:
    marian_ids[our_id] = special_ids[marian_role]
    pieces.append((piece, 0.0, piece_type))
  taken = {piece for piece, _, _ in pieces}
  for our_id, (marian_id, piece) in enumerate(by_id, start=special_tokens.FIRST_PIECE_ID):
    if piece in taken:
      raise UserError(f"vocab.json holds {piece!r} as an ordinary piece (id {marian_id}); it "
                      "collides with a reserved token here and cannot be imported")
    marian_ids[our_id] = marian_id
    if piece in source_scores:
      pieces.append((piece, source_scores[piece], _NORMAL))
    elif _LANGUAGE_TAG.fullmatch(piece):
      pieces.append(("\u2581" + piece, 0.0, _USER_DEFINED))
    else:
      pieces.append((piece, _TARGET_ONLY_SCORE, _NORMAL if len(piece) == 1 else _UNUSED))
  del proto.pieces[:]
  for piece, score, piece_type in pieces:
    proto.pieces.add(piece=piece, score=score, type=piece_type)
  spec = proto.trainer_spec
  spec.pad_id, spec.unk_id = special_tokens.PAD_ID, special_tokens.UNK_ID
  spec.bos_id, spec.eos_id = special_tokens.BOS_ID, special_tokens.EOS_ID
  spec.pad_piece, spec.unk_piece, spec.bos_piece, spec.eos_piece = "<pad>", "<unk>", "<s>", "</s>"
  spec.vocab_size = len(pieces)
  missing = tuple(sorted(set(source_scores) - set(vocab)))
  return MarianVocabulary(proto.SerializeToString(), marian_ids, missing)


def write_model(vocabulary: MarianVocabulary, path: str) -> None:
  """Writes the SentencePiece model file (atomically)."""
  tmp = f"{path}.tmp"
  with open(tmp, "wb") as f:
    f.write(vocabulary.model_proto)
  os.replace(tmp, path)
