"""Generated algorithmic problems for length generalisation, after Kazemnejad et al. (2023).

An example of `n` items is a source and a target of digit tokens, each ended
by EOS:

  copy       3 1 4         -> 3 1 4
  reverse    3 1 4         -> 4 1 3
  sort       3 1 4         -> 1 3 4
  duplicate  3 1 4         -> 3 1 4 3 1 4
  addition   3 1 4 + 2 7 9 -> 5 8 3 1   (two n-digit numbers and their n+1-digit sum,
                                         least significant digit first: 413 + 972 = 1385)

Training draws n uniformly from 1..L; testing measures every n up to 4L. The
vocabulary is fixed (`VOCAB_SIZE` ids: the reserved ones, ten digits and "+"),
so no tokenizer is trained. Batches are numpy int32 arrays laid out as a
translation corpus's (`src_tokens`, `target_tokens`, PAD-padded), so the
encoder-decoder and a decoder-only model read them as they read text. The same
seed and step give the same batch on every machine.
"""

from __future__ import annotations

import numpy as np

from transformer_jax.errors import UserError
from transformer_jax.special_tokens import EOS_ID, FIRST_PIECE_ID, PAD_ID

PROBLEMS = ("copy", "reverse", "sort", "duplicate", "addition")
DIGIT_IDS = tuple(range(FIRST_PIECE_ID, FIRST_PIECE_ID + 10))
PLUS_ID = FIRST_PIECE_ID + 10
VOCAB_SIZE = PLUS_ID + 1


def check_problem(problem: str) -> str:
  if problem not in PROBLEMS:
    raise UserError(f"algorithmic.problem={problem!r} is not one of {', '.join(PROBLEMS)}")
  return problem


def source_length(problem: str, items: int) -> int:
  """Tokens of a source of `items` items, EOS included."""
  return (2 * items + 1 if problem == "addition" else items) + 1


def target_length(problem: str, items: int) -> int:
  """Tokens of a target of `items` items, EOS included."""
  return {"duplicate": 2 * items, "addition": items + 1}.get(problem, items) + 1


def solve(problem: str, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(source, target) digit values (0-9; -1 stands for "+") of one example.

  `digits`: int[n] for copy, reverse, sort and duplicate; int[2, n] (two
  numbers, least significant digit first) for addition.
  """
  if problem == "copy":
    return digits, digits
  if problem == "reverse":
    return digits, digits[::-1]
  if problem == "sort":
    return digits, np.sort(digits)
  if problem == "duplicate":
    return digits, np.concatenate([digits, digits])
  first, second = digits
  total = _as_int(first) + _as_int(second)
  sum_digits = np.array([(total // 10**i) % 10 for i in range(len(first) + 1)])
  return np.concatenate([first, [-1], second]), sum_digits


def _as_int(digits_lsb_first: np.ndarray) -> int:
  return sum(int(d) * 10**i for i, d in enumerate(digits_lsb_first))


def token_ids(values: np.ndarray) -> np.ndarray:
  """Digit values (and -1 for "+") -> token ids, with EOS appended."""
  ids = np.where(values < 0, PLUS_ID, np.asarray(DIGIT_IDS)[np.maximum(values, 0)])
  return np.append(ids, EOS_ID).astype(np.int32)


def to_text(ids: np.ndarray) -> str:
  """Token ids -> "3 1 4 + 2 7 9" (up to EOS; PAD dropped)."""
  symbols = []
  for token in np.asarray(ids).tolist():
    if token == EOS_ID:
      break
    if token in DIGIT_IDS:
      symbols.append(str(token - DIGIT_IDS[0]))
    elif token == PLUS_ID:
      symbols.append("+")
  return " ".join(symbols)


def make_batch(problem: str, items: np.ndarray, rng: np.random.Generator, src_len: int,
               target_len: int) -> dict[str, np.ndarray]:
  """{'src_tokens': int32[rows, src_len], 'target_tokens': int32[rows, target_len],
  'items': int32[rows]}: one random example of items[i] items a row; items 0 is an all-PAD
  filler row."""
  src = np.full((len(items), src_len), PAD_ID, np.int32)
  target = np.full((len(items), target_len), PAD_ID, np.int32)
  for row, n in enumerate(np.asarray(items).tolist()):
    if n == 0:
      continue
    digits = rng.integers(0, 10, size=(2, n) if problem == "addition" else n)
    source_values, target_values = solve(problem, digits)
    source_ids, target_ids = token_ids(source_values), token_ids(target_values)
    src[row, :len(source_ids)] = source_ids
    target[row, :len(target_ids)] = target_ids
  return dict(src_tokens=src, target_tokens=target, items=np.asarray(items, np.int32))


class TrainStream:
  """This host's rows of every training batch: items uniform in 1..max_items, drawn from
  (seed, batch index, host); its position (the batch index) is checkpointed."""

  def __init__(self, problem: str, max_items: int, rows: int, src_len: int, target_len: int,
               seed: int, process_index: int = 0):
    self.problem, self.max_items, self.rows = problem, max_items, rows
    self.src_len, self.target_len = src_len, target_len
    self.seed, self.process_index = seed, process_index
    self.index = 0

  def __iter__(self) -> "TrainStream":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, 0, self.index, self.process_index])
    self.index += 1
    items = rng.integers(1, self.max_items + 1, size=self.rows)
    batch = make_batch(self.problem, items, rng, self.src_len, self.target_len)
    del batch["items"]
    return batch

  def get_state(self) -> dict:
    return dict(index=self.index)

  def set_state(self, state: dict) -> None:
    self.index = int(state["index"])


def eval_items(lengths: range | list[int], per_length: int) -> np.ndarray:
  """int32[len(lengths) * per_length]: each length `per_length` times, in order."""
  return np.repeat(np.asarray(list(lengths), np.int32), per_length)


def eval_set(problem: str, lengths: range | list[int], per_length: int, seed: int,
             src_len: int, target_len: int) -> dict[str, np.ndarray]:
  """A fixed evaluation set: `per_length` examples of each length, drawn from `seed`
  (apart from training's stream, which draws from [seed, 0, ...])."""
  rng = np.random.default_rng([seed, 1, *lengths[:1], len(lengths)])
  return make_batch(problem, eval_items(lengths, per_length), rng, src_len, target_len)
