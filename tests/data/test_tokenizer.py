"""SentencePiece tokenizer: reserved ids, EOS handling, caching, errors."""

from __future__ import annotations

import random

import pytest

from transformer_jax import special_tokens
from transformer_jax.data import generated
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import UserError


@pytest.fixture(scope="module")
def texts():
  rng = random.Random(0)
  pairs = [generated.sample_pair(rng) for _ in range(2_000)]
  return [en for en, _ in pairs] + [de for _, de in pairs]


@pytest.fixture(scope="module")
def tok(texts, tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / "t.model"
  return tokenizer_lib.train_tokenizer(texts, 500, "bpe", path)


def test_reserved_ids_and_roundtrip(tok, texts):
  assert tok.vocab_size == 500
  assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
  ids = tok.encode(texts[0])
  assert ids[-1] == special_tokens.EOS_ID and special_tokens.EOS_ID not in ids[:-1]
  assert tok.decode(ids) == texts[0]
  batch = tok.encode_batch(texts[:5])
  assert batch == [tok.encode(t) for t in texts[:5]]


def test_decode_stops_at_eos_and_ignores_pad_and_bos(tok):
  ids = tok.encode("Der Hund schläft.")
  noisy = [special_tokens.BOS_ID] + ids[:-1] + [special_tokens.PAD_ID, special_tokens.EOS_ID] + ids
  assert tok.decode(noisy) == "Der Hund schläft."
  assert tok.decode([special_tokens.PAD_ID] * 3) == ""


def test_sha256_save_copy_and_load(tok, tmp_path):
  copy = tok.save_copy(tmp_path / "ckpt" / "vocab.model")
  loaded = tokenizer_lib.load_tokenizer(copy)
  assert loaded.sha256 == tok.sha256 and loaded.path == copy
  assert loaded.encode("Ein Hund.") == tok.encode("Ein Hund.")


def test_training_is_deterministic(texts, tok, tmp_path):
  again = tokenizer_lib.train_tokenizer(texts, 500, "bpe", tmp_path / "again.model")
  assert again.sha256 == tok.sha256, "same text and settings must give the same model"


def test_cached_tokenizer_is_not_trained_twice(texts, tmp_path):
  calls = []

  def texts_fn():
    calls.append(1)
    return texts

  a = tokenizer_lib.cached_tokenizer(tmp_path, "toy", 400, "unigram", texts_fn)
  b = tokenizer_lib.cached_tokenizer(tmp_path, "toy", 400, "unigram", texts_fn)
  assert len(calls) == 1 and a.sha256 == b.sha256


def test_vocab_too_large_is_a_one_line_user_error(texts, tmp_path):
  with pytest.raises(UserError, match=r"vocab_size=100000 is too large.*at most \d+") as e:
    tokenizer_lib.train_tokenizer(texts, 100_000, "bpe", tmp_path / "big.model")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "big.model").exists()


def test_bad_model_type_and_missing_file(texts, tmp_path):
  with pytest.raises(UserError, match="tokenizer_type"):
    tokenizer_lib.train_tokenizer(texts, 500, "wordpiece", tmp_path / "x.model")
  with pytest.raises(UserError, match="does not exist"):
    tokenizer_lib.load_tokenizer(tmp_path / "nope.model")


def test_bpe_dropout_resegments_the_same_text_reproducibly(tok, texts):
  sample = texts[:300]
  plain = tok.encode_batch(sample)
  dropped = tok.encode_batch(sample, bpe_dropout=0.2, seed=1)
  # Other pieces, the same text: decoding gives back every sentence exactly.
  assert tok.decode_batch(dropped) == tok.decode_batch(plain) == sample
  assert all(ids[-1] == special_tokens.EOS_ID for ids in dropped)
  changed = sum(a != b for a, b in zip(plain, dropped))
  assert changed > 100, changed
  assert sum(map(len, dropped)) > sum(map(len, plain))  # Skipped merges leave more pieces.
  # A pure function of the seed, whatever was sampled in between.
  tok.encode_batch(sample, bpe_dropout=0.2, seed=2)
  assert tok.encode_batch(sample, bpe_dropout=0.2, seed=1) == dropped
  assert tok.encode_batch(sample, bpe_dropout=0.2, seed=2) != dropped
