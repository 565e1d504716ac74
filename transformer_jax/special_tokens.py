"""The reserved token ids, defined once for the whole package.

The SentencePiece vocabulary is trained with exactly these ids
(``pad_id=0, unk_id=1, bos_id=2, eos_id=3``), so model masks, the data
pipeline and the decoder all agree.
"""

PAD_ID = 0  # Masks everywhere are derived from ``tokens != PAD_ID``.
UNK_ID = 1
BOS_ID = 2  # Shifted into the decoder input at position 0.
EOS_ID = 3  # Appended to every source and target sentence.
FIRST_PIECE_ID = 4  # Ids from here up are the vocabulary's ordinary pieces.


def text_ids(ids) -> list[int]:
  """The ids a tokenizer turns back into text: those before the first EOS, without PAD and
  BOS (a decoded row, a sampled continuation)."""
  kept = []
  for i in ids:
    i = int(i)
    if i == EOS_ID:
      break
    if i not in (PAD_ID, BOS_ID):
      kept.append(i)
  return kept
