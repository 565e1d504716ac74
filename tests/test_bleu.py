"""Tests for transformer_jax.metrics.bleu.

Each scorer is checked against numbers computed here independently, with
sacreBLEU / sacremoses called directly and a plain-Python multi-bleu.perl,
on the real Multi30k files and a perturbed copy of them.
"""

from __future__ import annotations

import collections
import math
import random
import re

import pytest
import sacrebleu

from transformer_jax.errors import UserError
from transformer_jax.metrics import bleu

sacremoses = pytest.importorskip(
    "sacremoses",
    reason="paper_bleu and tok_bleu need `pip install sacremoses`")

DE_TOKENIZER = sacremoses.MosesTokenizer(lang="de")
DE_NORMALIZER = sacremoses.MosesPunctNormalizer(lang="de")


def _read(path) -> list[str]:
  return path.read_text(encoding="utf-8").splitlines()


def _perturb(lines: list[str], seed: int = 0) -> list[str]:
  """A fake system output: words deleted, inserted and moved."""
  rng = random.Random(seed)
  out = []
  for line in lines:
    words = line.split()
    for _ in range(3):
      r = rng.random()
      if not words:
        break
      i = rng.randrange(len(words))
      if r < 0.3:
        del words[i]
      elif r < 0.6:
        words.insert(i, rng.choice(["der", "die", "und", "E-Mail", '"',
                                    "usw."]))
      elif r < 0.8:
        words[i], words[-1] = words[-1], words[i]
    out.append(" ".join(words))
  return out


def _multi_bleu(hypotheses: list[str], references: list[str]) -> float:
  """multi-bleu.perl, one reference, in plain Python (no smoothing)."""
  correct, total = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_ngrams = collections.Counter(zip(*[h[i:] for i in range(n)]))
      r_ngrams = collections.Counter(zip(*[r[i:] for i in range(n)]))
      total[n - 1] += sum(h_ngrams.values())
      correct[n - 1] += sum(min(c, r_ngrams[g]) for g, c in h_ngrams.items())
  if min(correct) == 0:
    return 0.0
  log_precision = sum(math.log(c / t) for c, t in zip(correct, total)) / 4
  brevity = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
  return 100 * brevity * math.exp(log_precision)


def _get_ende_tokenize(line: str) -> str:
  """tokenizer.perl -l de (escaping on, as its default) + the ##AT## split."""
  words = DE_TOKENIZER.tokenize(line, return_str=True, escape=True).split()
  # Moses master splits the period off the last word even after an
  # abbreviation ("usw."); sacremoses does not.
  if words and re.fullmatch(r"\S*[^.\s]\S*\.", words[-1]):
    words[-1:] = [words[-1][:-1], "."]
  return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", " ".join(words))


@pytest.fixture(name="val")
def fixture_val(data_dir):
  references = _read(data_dir / "multi30k" / "val.de")
  return _perturb(references), references


def test_sacre_bleu_matches_sacrebleu(val):
  hypotheses, references = val
  score, signature = bleu.sacre_bleu(hypotheses, references)
  want = sacrebleu.corpus_bleu(hypotheses, [references])
  assert score == pytest.approx(want.score, abs=1e-9)
  assert 20 < score < 90, "the perturbed copy should score in between"
  assert "tok:13a" in signature and "case:mixed" in signature, signature


def test_chrf_matches_sacrebleu(val):
  hypotheses, references = val
  want = sacrebleu.corpus_chrf(hypotheses, [references]).score
  assert bleu.chrf(hypotheses, references) == pytest.approx(want, abs=1e-9)


def test_paper_bleu_matches_get_ende_bleu_pipeline(val):
  hypotheses, references = val
  hyp_tok = [_get_ende_tokenize(l) for l in hypotheses]
  ref_tok = [_get_ende_tokenize(l) for l in references]
  want = _multi_bleu(hyp_tok, ref_tok)
  # sacreBLEU with no tokenization and no smoothing is multi-bleu.perl.
  via_sacrebleu = sacrebleu.corpus_bleu(
      hyp_tok, [ref_tok], tokenize="none", smooth_method="none",
      force=True).score
  assert via_sacrebleu == pytest.approx(want, abs=1e-9)
  got = bleu.paper_bleu(hypotheses, references)
  assert got == pytest.approx(want, abs=1e-9)
  # Measured once with the real tokenizer.perl -l de, perl -ple ##AT## and
  # multi-bleu.perl (Moses master) on these exact files.
  assert got == pytest.approx(62.524332, abs=1e-5)
  assert got != pytest.approx(bleu.sacre_bleu(hypotheses, references)[0])


def test_tokenized_bleu_is_multi_bleu_on_edge_cases():
  cases = [
      (["a b c"], ["a b c d e"]),  # too short for any 4-gram: 0
      (["a b c d e f"], ["a b c d e f g h"]),  # brevity penalty
      (["x a b c d", "e f g h"], ["a b c d y", "e f g h"]),
      (["a a a a a"], ["a a"]),  # clipped counts
  ]
  for hypotheses, references in cases:
    assert bleu._tokenized_bleu(hypotheses, references) == pytest.approx(
        _multi_bleu(hypotheses, references), abs=1e-9), hypotheses


def test_compound_splitting_on_handcrafted_example():
  assert bleu.split_compounds("die E-Mail-Adresse des 3-D-Druckers - gut") == (
      "die E ##AT##-##AT## Mail ##AT##-##AT## Adresse "
      "des 3 ##AT##-##AT## D-Druckers - gut")  # perl: matches do not overlap
  assert bleu.split_compounds("x- -y --") == "x- -y --"
  assert bleu.moses_tokenize("Er kauft Brot, Milch usw.") == (
      "Er kauft Brot , Milch usw .")
  # Hyphenated compounds become three tokens, so a half-right compound
  # earns partial credit and the paper's number differs from plain BLEU.
  hyp = ["Er hat eine neue E-Mail-Adresse für das Büro bekommen ."]
  ref = ["Er hat eine neue E-Mail-Konto für das Büro bekommen ."]
  plain = bleu._tokenized_bleu([bleu.moses_tokenize(l) for l in hyp],
                               [bleu.moses_tokenize(l) for l in ref])
  split = bleu.paper_bleu(hyp, ref)
  assert split == pytest.approx(_multi_bleu(
      [bleu.split_compounds(bleu.moses_tokenize(l)) for l in hyp],
      [bleu.split_compounds(bleu.moses_tokenize(l)) for l in ref]))
  assert split > plain


def test_tok_bleu_matches_multi30k_tokenization(data_dir):
  tok_dir = data_dir / "multi30k" / "tok"
  if not (tok_dir / "test2016.de").exists():
    pytest.skip(f"{tok_dir / 'test2016.de'} not found")
  raw = _read(data_dir / "multi30k" / "test2016.de")
  tok = _read(tok_dir / "test2016.de")
  # Tokenizing the tok/ references again changes nothing: line by line...
  for line in tok:
    assert bleu._tok_lower(line, "de").split() == (
        line.replace("&apos;", "'").replace("&quot;", '"')
        .replace("&amp;", "&").split()), line
  # ...so they score 100 against themselves and against the raw text.
  assert bleu.tok_bleu(tok, tok) == pytest.approx(100)
  assert bleu.tok_bleu(raw, tok) == pytest.approx(100)
  # Independently: the Multi30k script (lowercase | normalize-punctuation |
  # tokenizer.perl, escaping on) applied to the hypotheses, then
  # multi-bleu.perl against the tok/ file as it is.
  hypotheses = _perturb(raw, seed=1)
  hyp_tok = [
      DE_TOKENIZER.tokenize(DE_NORMALIZER.normalize(l.lower()),
                            return_str=True, escape=True) for l in hypotheses
  ]
  want = sacrebleu.corpus_bleu(hyp_tok, [tok], tokenize="none",
                               smooth_method="none", force=True).score
  assert want == pytest.approx(_multi_bleu(hyp_tok, tok), abs=1e-9)
  assert bleu.tok_bleu(hypotheses, tok) == pytest.approx(want, abs=1e-9)


def test_tok_bleu_is_case_insensitive(val):
  hypotheses, references = val
  # str.upper maps "ß" to "SS", which no lowercasing undoes: leave those out.
  keep = [i for i, l in enumerate(references) if "ß" not in hypotheses[i] + l]
  hypotheses = [hypotheses[i] for i in keep]
  references = [references[i] for i in keep]
  base = bleu.tok_bleu(hypotheses, references)
  assert bleu.tok_bleu([l.upper() for l in hypotheses],
                       references) == pytest.approx(base, abs=1e-9)
  assert bleu.tok_bleu(hypotheses, [l.swapcase() for l in references]
                       ) == pytest.approx(base, abs=1e-9)
  assert bleu.paper_bleu([l.upper() for l in hypotheses], references) < base


def test_perfect_output_scores_100():
  sentences = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
               "Ein Boston Terrier läuft über saftig-grünes Gras vor einem "
               "weißen Zaun.",
               'Er sagt: "Das ist z.B. die E-Mail-Adresse usw."']
  scores = bleu.all_scores(sentences, sentences)
  assert set(scores) == {"sacrebleu", "sacrebleu_signature", "paper_bleu", "tok_bleu",
                         "tok_bleu_references", "chrf", "references"}
  for key in ("sacrebleu", "paper_bleu", "tok_bleu", "chrf"):
    assert scores[key] == pytest.approx(100), key
  tok = [bleu._tok_lower(s, "de") for s in sentences]
  assert bleu.all_scores(sentences, sentences, tok_references=tok)[
      "tok_bleu"] == pytest.approx(100)


@pytest.mark.parametrize("scorer", [
    bleu.sacre_bleu, bleu.paper_bleu, bleu.tok_bleu, bleu.chrf,
    bleu.all_scores])
def test_bad_inputs_raise_one_line_user_errors(scorer):
  with pytest.raises(UserError, match="0 hypotheses.* 2 references") as info:
    scorer([], ["a", "b"])
  assert "\n" not in str(info.value)
  with pytest.raises(UserError, match="3 hypotheses but 2 references"):
    scorer(["a", "b", "c"], ["a", "b"])


def test_all_scores_checks_tok_references():
  with pytest.raises(UserError, match="2 hypotheses but 1 tok_references"):
    bleu.all_scores(["a", "b"], ["a", "b"], tok_references=["a"])


def test_tokenized_references_get_no_sacrebleu_label():
  """On lowercased tokenized references a "sacreBLEU" would be mislabelled: none is made."""
  tok = ["ein mann mit einem orangefarbenen hut , der etwas anstarrt .",
         "zwei hunde spielen im schnee ."]
  hypotheses = ["ein mann mit einem hut , der etwas anstarrt .", "zwei hunde spielen ."]
  scores = bleu.all_scores(hypotheses, tok, references_kind=bleu.REFERENCES_TOKENIZED)
  assert set(scores) == {"tok_bleu", "tok_bleu_references", "chrf", "references"}
  assert scores["tok_bleu"] == pytest.approx(bleu.tok_bleu(hypotheses, tok))
  line = bleu.summary(scores)
  assert line.startswith(f"tokenized-lowercase BLEU {scores['tok_bleu']:.2f}")
  assert "sacreBLEU " not in line and "no sacreBLEU" in line
  raw = bleu.summary(bleu.all_scores(hypotheses, tok))
  assert raw.startswith("sacreBLEU ") and "tokenized-lowercase BLEU" in raw


def _write_multi30k(folder, lines_by_lang, lower=False):
  folder.mkdir(parents=True)
  for split in ("train", "val", "test2016"):
    for lang, lines in lines_by_lang.items():
      text = "\n".join(l.lower() if lower else l for l in lines) + "\n"
      (folder / f"{split}.{lang}").write_text(text, encoding="utf-8")


def test_cased_multi30k_scores_tok_bleu_against_the_official_tok_files(tmp_path):
  """A raw (cased) Multi30k run reads tok/ beside it for the literature's BLEU;
  a tok/ run is marked tokenized, so it reports no sacreBLEU."""
  from transformer_jax.data.pipeline import load_dataset

  english = [f"A dog number {i} runs." for i in range(40)]
  german = [f"Ein Hund Nummer {i} läuft." for i in range(40)]
  _write_multi30k(tmp_path / "multi30k", {"en": english, "de": german})
  _write_multi30k(tmp_path / "multi30k" / "tok",
                  {"en": [bleu._tok_lower(l, "en") for l in english],
                   "de": [bleu._tok_lower(l, "de") for l in german]})
  common = dict(dataset="multi30k", data_dir=str(tmp_path), vocab_size=60, max_len=32)
  raw = load_dataset(dict(common, variant="raw", prepared_dir=str(tmp_path / "raw")))
  assert raw.references_kind == bleu.REFERENCES_RAW
  assert raw.texts("test2016")[1][3] == "Ein Hund Nummer 3 läuft."
  assert raw.tok_references("test2016")[3] == "ein hund nummer 3 läuft ."
  from transformer_jax.tasks.translation import reference_sets

  hypotheses = [f"Ein Hund Nummer {i} rennt." for i in range(40)]
  scores = bleu.all_scores(hypotheses, raw.texts("test2016")[1], **reference_sets(raw, "test2016"))
  assert scores["tok_bleu_references"] == "the official tokenized references"
  assert scores["tok_bleu"] == pytest.approx(bleu.tok_bleu(hypotheses, raw.tok_references("test2016")))
  assert "sacrebleu" in scores and scores["references"] == bleu.REFERENCES_RAW
  tok = load_dataset(dict(common, variant="tok", prepared_dir=str(tmp_path / "tok")))
  assert tok.references_kind == bleu.REFERENCES_TOKENIZED and tok.tok_references("val") is None
  scores = bleu.all_scores(tok.texts("val")[1], tok.texts("val")[1], **reference_sets(tok, "val"))
  assert "sacrebleu" not in scores and scores["tok_bleu"] == pytest.approx(100)
