"""The built-in toy corpus: deterministic, disjoint splits, real grammar."""

from __future__ import annotations

import collections
import hashlib
import random
import re

import pytest

from transformer_jax.data import generated
from transformer_jax.errors import UserError


def _digest(splits) -> str:
  return hashlib.sha256(repr(sorted(splits.items())).encode("utf-8")).hexdigest()


def test_same_seed_gives_same_bytes_and_other_seed_differs():
  a = generated.generate_splits(seed=7, num_train=5_000, num_eval=300)
  b = generated.generate_splits(seed=7, num_train=5_000, num_eval=300)
  c = generated.generate_splits(seed=8, num_train=5_000, num_eval=300)
  assert _digest(a) == _digest(b), "same seed must give byte-identical splits"
  assert _digest(a) != _digest(c), "a different seed should give other data"


@pytest.fixture(scope="module")
def full_corpus():
  return generated.generate_splits()  # Defaults: 200k train, 1k + 1k eval.


def test_default_corpus_size_and_disjoint_splits(full_corpus):
  sizes = {k: len(v) for k, v in full_corpus.items()}
  assert sizes == {"train": 200_000, "validation": 1_000, "test": 1_000}
  for side in (0, 1):
    seen = collections.Counter(p[side] for pairs in full_corpus.values() for p in pairs)
    dupes = [s for s, n in seen.items() if n > 1]
    assert not dupes, f"sentences occur twice (within or across splits): {dupes[:3]}"


def test_vocabulary_and_lengths_are_small(full_corpus):
  train = full_corpus["train"]
  for side, name in ((0, "English"), (1, "German")):
    words = {w for p in train for w in re.findall(r"\w+", p[side].lower())}
    assert 150 <= len(words) <= 700, f"{name} has {len(words)} word types"
  lengths = sorted(len(en.split()) for en, _ in train)
  median, p95 = lengths[len(lengths) // 2], lengths[int(0.95 * len(lengths))]
  assert 4 <= median <= 12 and p95 <= 16 and lengths[-1] <= 20, (median, p95)


def test_word_order_matters(full_corpus):
  """Same English bag of words, different German: position is needed.

  Random draws rarely collide, but every transitive sentence has a twin
  with subject and object swapped ("den Hund" vs "der Hund"), so the few
  collisions in the sample stand for a property of the whole grammar.
  """
  by_bag = collections.defaultdict(set)
  for en, de in full_corpus["train"]:
    by_bag[tuple(sorted(en.lower().rstrip(".?").split()))].add(de)
  ambiguous = sum(1 for des in by_bag.values() if len(des) > 1)
  assert ambiguous > 100, f"only {ambiguous} bags of words have several translations"


def test_grammar_spot_checks():
  rng = random.Random(0)
  pairs = [generated.sample_pair(rng) for _ in range(3_000)]
  joined = "\n".join(de for _, de in pairs)
  # Dative after "mit": dem/der/den/einem/einer/meinem/..., never "mit die/das/den X" acc.
  for m in re.finditer(r"\bmit (\w+)", joined):
    assert m.group(1) in {"dem", "der", "den", "einem", "einer", "meinem", "meiner",
                          "meinen", "keinem", "keiner", "keinen", "diesem", "dieser",
                          "diesen", "vielen", "einigen", "zwei", "drei", "vier", "fünf",
                          "sechs", "sieben", "acht", "neun", "zehn", "elf", "zwölf"}, m.group(0)
  assert "im " in joined, "in + dem must contract to im"
  assert not re.search(r"\bin dem\b", joined)
  # Verb second: a fronted adverb is followed by the finite verb, not the subject.
  for en, de in pairs:
    if en.startswith("Today "):
      assert de.split()[1] not in {"der", "die", "das", "ein", "eine", "ich", "wir"}, de
    if ", weil " in de and "," not in de.split(", weil ")[1]:
      assert de.endswith((" ist.", " hat.", " sind.", " haben.", "t.", "n.", "s.", "e.",
                          " kann.", " muss.", " will.", " wird.", "ß.", "g.")), de
  assert any(en.startswith(("Does ", "Do ", "Has ", "Have ", "Can ", "Will ", "Must "))
             for en, _ in pairs), "expected some yes/no questions"


def test_bad_sizes_are_user_errors():
  with pytest.raises(UserError, match="num_train"):
    generated.generate_splits(num_train=0)
