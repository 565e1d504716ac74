"""BLEU and chrF on detokenized output, in the conventions papers report.

Every scorer takes ``hypotheses: list[str]`` and ``references: list[str]``,
one detokenized sentence per item, aligned by index, and returns a score on
the 0-100 scale.

* `sacre_bleu`: sacreBLEU (13a tokenizer, cased), the comparable number.
* `paper_bleu`: the paper's number (§6.1): Moses-tokenized, compound-split
  BLEU as in tensor2tensor's ``get_ende_bleu.sh``. It reads about 1 to 1.5
  points higher than sacreBLEU on newstest2014 (tensor2tensor report #317).
* `tok_bleu`: tokenized, lowercased BLEU, the Multi30k literature's number.
* `chrf`: sacreBLEU's chrF2.

Moses tokenization uses ``sacremoses``. Against ``tokenizer.perl -l de``
(Moses master), checked line by line on newstest2013/2014 and Multi30k:

* Perl escapes ``& | < > ' " [ ]`` into XML entities by default; we do not
  (``escape=False``). The entities replace characters inside tokens one for
  one, never add whitespace or ``-``, and are applied to both sides, so n-gram
  matches, lengths and the ``##AT##`` split, hence BLEU, are unchanged.
* Moses master splits the period off a sentence's last word even when it is a
  non-breaking prefix (``usw.``, ``Art.``, ``36.``); sacremoses, like Moses
  before that rule was added, does not. `paper_bleu` adds the rule back,
  after which all 6,003 newstest2013/2014 lines and all Multi30k val and
  test2016 lines tokenize identically; `tok_bleu` leaves it out, because the
  Multi30k ``tok/`` files were made with the older Moses.
* Character classes (``\\p{IsAlnum}`` ...) come from sacremoses' tables of a
  fixed Perl version and could differ for rare Unicode characters.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Sequence

import sacrebleu

from transformer_jax.errors import UserError

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Perl reads
# bytes there, so \S is "not ASCII whitespace"; re.ASCII gives the same class.
# Matches do not overlap in either language: "a-b-c" -> "a ##AT##-##AT## b-c".
_COMPOUND = re.compile(r"(\S)-(\S)", re.ASCII)

# Moses' XML escapes, undone in this order ("&amp;" last, so "&amp;quot;"
# becomes "&quot;", as the escape was applied once).
_MOSES_ENTITIES = (
    ("&#124;", "|"), ("&lt;", "<"), ("&gt;", ">"), ("&apos;", "'"),
    ("&quot;", '"'), ("&#91;", "["), ("&#93;", "]"), ("&amp;", "&"),
)


def _check(hypotheses: Sequence[str], references: Sequence[str],
           what: str = "references") -> None:
  """Raises `UserError` unless both lists are non-empty and aligned."""
  if len(hypotheses) == 0:
    raise UserError(
        f"no hypotheses to score (got 0 hypotheses and {len(references)} "
        f"{what}); decode at least one sentence")
  if len(hypotheses) != len(references):
    raise UserError(
        f"got {len(hypotheses)} hypotheses but {len(references)} {what}; "
        "they must be aligned one to one")


@functools.lru_cache(maxsize=None)
def _moses(lang: str) -> tuple[Any, Any]:
  """Returns (MosesTokenizer, MosesPunctNormalizer) for `lang`, built once."""
  try:
    import sacremoses  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UserError(
        "tokenized BLEU needs the sacremoses package; "
        "run `pip install sacremoses`") from e
  return (sacremoses.MosesTokenizer(lang=lang),
          sacremoses.MosesPunctNormalizer(lang=lang))


def moses_tokenize(line: str, lang: str = "de",
                   split_final_period: bool = True) -> str:
  """``tokenizer.perl -l lang -no-escape`` on one line (see module doc)."""
  tokenizer, _ = _moses(lang)
  text = tokenizer.tokenize(line, return_str=True, escape=False)
  if split_final_period:
    # Moses master: "split last words independently as they are unlikely to
    # be non-breaking prefixes". A run of dots ("...") is Perl's DOTMULTI
    # placeholder at that point, so it is left alone.
    head, _, last = text.rpartition(" ")
    if len(last) > 1 and last.endswith(".") and last.strip("."):
      text = f"{head} {last[:-1]} ." if head else f"{last[:-1]} ."
  return text


def split_compounds(line: str) -> str:
  """The ##AT## compound split of ``get_ende_bleu.sh`` on one tokenized line."""
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def _tokenized_bleu(hypotheses: Sequence[str],
                    references: Sequence[str]) -> float:
  """Corpus BLEU-4 of pre-tokenized text, exactly as multi-bleu.perl computes.

  multi-bleu.perl splits on whitespace, clips n-gram counts, uses the
  closest reference length, and smooths nothing (a zero n-gram precision
  gives BLEU 0); sacreBLEU with these settings computes the same formula.
  """
  metric = sacrebleu.metrics.BLEU(
      tokenize="none", smooth_method="none", force=True)
  return float(metric.corpus_score(list(hypotheses), [list(references)]).score)


def sacre_bleu(hypotheses: Sequence[str],
               references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU (13a, cased) of detokenized output: (score, signature)."""
  _check(hypotheses, references)
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return float(score.score), str(metric.get_signature())


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str],
               lang: str = "de") -> float:
  """The paper's BLEU: tensor2tensor's ``get_ende_bleu.sh`` on both sides.

  Moses-tokenizes hypotheses and references (``tokenizer.perl -l de``),
  splits hyphenated compounds (``rich-text`` -> ``rich ##AT##-##AT## text``)
  and computes cased corpus BLEU-4 like ``multi-bleu.perl``.
  """
  _check(hypotheses, references)

  def prepare(lines: Sequence[str]) -> list[str]:
    return [split_compounds(moses_tokenize(l, lang)) for l in lines]

  return _tokenized_bleu(prepare(hypotheses), prepare(references))


def _tok_lower(line: str, lang: str) -> str:
  """Multi30k ``task1-tokenize.sh`` on one line, without the XML escapes.

  That script runs ``lowercase.perl | normalize-punctuation.perl -l de |
  tokenizer.perl -l de``. Entities are undone first, so a line of the
  ``tok/`` files maps to itself (checked on val, test2016 and train).
  """
  for entity, char in _MOSES_ENTITIES:
    line = line.replace(entity, char)
  tokenizer, normalizer = _moses(lang)
  text = normalizer.normalize(line.lower())
  return tokenizer.tokenize(text, return_str=True, escape=False)


def tok_bleu(hypotheses: Sequence[str], references: Sequence[str],
             lang: str = "de") -> float:
  """Tokenized, lowercased BLEU, as the Multi30k literature reports it.

  `references` may be raw text or the already tokenized, lowercased Multi30k
  ``tok/`` lines: both sides go through the same lowercase, punctuation
  normalization and Moses tokenization, which leaves ``tok/`` lines unchanged.
  """
  _check(hypotheses, references)
  return _tokenized_bleu([_tok_lower(l, lang) for l in hypotheses],
                         [_tok_lower(l, lang) for l in references])


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """sacreBLEU's chrF2 (character 6-grams, beta=2) of detokenized output."""
  _check(hypotheses, references)
  metric = sacrebleu.metrics.CHRF()
  return float(metric.corpus_score(list(hypotheses), [list(references)]).score)


REFERENCES_RAW = "raw"              # Detokenized, cased: every score applies.
REFERENCES_TOKENIZED = "tokenized"  # Tokenized, lowercased (Multi30k tok/): tok_bleu, chrf only.


def all_scores(hypotheses: Sequence[str], references: Sequence[str],
               tok_references: Sequence[str] | None = None,
               references_kind: str = REFERENCES_RAW) -> dict[str, Any]:
  """Every score that applies to the references, in one dict.

  Args:
    hypotheses: model output, one sentence per item.
    references: the references, aligned with `hypotheses`.
    tok_references: optional official tokenized, lowercased references
      (Multi30k ``tok/``) for ``tok_bleu``; without them `references` are
      lowercased and Moses-tokenized.
    references_kind: REFERENCES_RAW, or REFERENCES_TOKENIZED where the
      references (and so the model's output) are already tokenized and
      lowercased: then sacreBLEU and the paper's cased BLEU do not apply and
      are left out rather than computed on the wrong text.

  Returns:
    {"tok_bleu", "chrf", "references", "tok_bleu_references"}, plus
    {"sacrebleu", "sacrebleu_signature", "paper_bleu"} on raw references.
  """
  _check(hypotheses, references)
  if tok_references is not None:
    _check(hypotheses, tok_references, "tok_references")
  if references_kind not in (REFERENCES_RAW, REFERENCES_TOKENIZED):
    raise ValueError(f"references_kind={references_kind!r}")
  scores: dict[str, Any] = {"references": references_kind}
  if references_kind == REFERENCES_RAW:
    score, signature = sacre_bleu(hypotheses, references)
    scores.update(sacrebleu=score, sacrebleu_signature=signature,
                  paper_bleu=paper_bleu(hypotheses, references))
  scores.update(
      tok_bleu=tok_bleu(hypotheses, tok_references if tok_references is not None else references),
      tok_bleu_references=("the official tokenized references" if tok_references is not None
                           else f"the {references_kind} references, lowercased and tokenized"),
      chrf=chrf(hypotheses, references))
  return scores


def summary(scores: dict[str, Any]) -> str:
  """The scores of `all_scores` in one line, each under its own name."""
  if "sacrebleu" in scores:
    return (f"sacreBLEU {scores['sacrebleu']:.2f}, tokenized-lowercase BLEU "
            f"{scores['tok_bleu']:.2f}, paper BLEU (cased, compound-split) "
            f"{scores['paper_bleu']:.2f}, chrF {scores['chrf']:.2f}")
  return (f"tokenized-lowercase BLEU {scores['tok_bleu']:.2f}, chrF {scores['chrf']:.2f} "
          "(the references are tokenized and lowercased: no sacreBLEU)")
