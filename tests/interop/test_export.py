"""python -m transformer_jax.export: CTranslate2 decodes the exported run as `translate` does.

Two runs: the tiny trained one (the paper's model: post-LN, ReLU, interleaved
sinusoids, no biases) and an imported random Marian model (swish, concatenated
sinusoids, attention and logits biases), whose outputs vary in length.
"""

from __future__ import annotations

import random
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2", reason="pip install -e '.[test]' (ctranslate2)")

from fault_tolerance import runner  # noqa: E402
from transformer_jax.data.generated import sample_pair  # noqa: E402
from transformer_jax.decode.translator import DecodeOptions, decode_batch  # noqa: E402
from transformer_jax.interop.marian import import_marian  # noqa: E402
from transformer_jax.special_tokens import EOS_ID, PAD_ID  # noqa: E402
from transformer_jax.tasks.registry import load_run  # noqa: E402

SOURCES = [sample_pair(random.Random(10_000 + i))[0] for i in range(16)]
EXTRA = 8


def _export(workdir, out) -> ctranslate2.Translator:
  result = subprocess.run([sys.executable, "-m", "transformer_jax.export", f"--workdir={workdir}",
                           f"--out={out}"], capture_output=True, text=True, timeout=300,
                          cwd=runner.REPO)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "exported step" in result.stdout
  return ctranslate2.Translator(str(out), device="cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(the tiny 20-step run, its CTranslate2 export)."""
  _, workdir = runner.shared_run(tmp_path_factory)
  return load_run(str(workdir)), _export(workdir, tmp_path_factory.mktemp("ct2") / "trained")


@pytest.fixture(scope="module")
def imported_marian(marian_dir, tmp_path_factory):
  """(a random Marian model imported as a run, its CTranslate2 export)."""
  workdir = tmp_path_factory.mktemp("imported")
  import_marian(marian_dir, str(workdir))
  return load_run(str(workdir)), _export(workdir, tmp_path_factory.mktemp("ct2") / "marian")


def _ours(run, options: DecodeOptions) -> list[list[str]]:
  rows = [run.tokenizer.encode(text) for text in SOURCES]
  width = max(map(len, rows))  # One batch; each row stops at its own length + EXTRA.
  src = jnp.asarray([row + [PAD_ID] * (width - len(row)) for row in rows], jnp.int32)
  decoded = np.asarray(decode_batch(run.model, run.params, src, options, width + EXTRA))
  outputs = []
  for row in decoded.tolist():
    row = row[:row.index(EOS_ID)] if EOS_ID in row else row
    outputs.append([run.tokenizer.id_to_piece(i) for i in row if i != PAD_ID])
  return outputs


def _theirs(run, translator, options: DecodeOptions) -> list[list[str]]:
  outputs = []
  for text in SOURCES:  # One at a time: each source's own length limit, as ours.
    pieces = [run.tokenizer.id_to_piece(i) for i in run.tokenizer.encode(text)[:-1]]
    result = translator.translate_batch(
        [pieces], beam_size=options.beam_size if options.method == "beam" else 1,
        length_penalty=options.alpha, max_decoding_length=len(pieces) + 1 + EXTRA,
        min_decoding_length=options.min_length, suppress_sequences=[["<pad>"], ["<s>"]])
    outputs.append(result[0].hypotheses[0])
  return outputs


def _compare(run, translator, options: DecodeOptions) -> list[list[str]]:
  ours, theirs = _ours(run, options), _theirs(run, translator, options)
  for text, mine, engine in zip(SOURCES, ours, theirs):
    assert mine == engine, f"{text!r} ({options}): translate gives {mine}, CTranslate2 {engine}"
  return ours


def test_the_papers_model_decodes_greedily_as_translate_does(trained):
  """Greedy with at least 6 tokens (the 20-step model would otherwise stop at once)."""
  outputs = _compare(*trained, DecodeOptions(method="greedy", min_length=6,
                                             max_extra_len=EXTRA))
  assert min(map(len, outputs)) >= 6


@pytest.mark.parametrize("beam_size", [1, 4])
def test_an_imported_marian_model_decodes_as_translate_does(imported_marian, beam_size):
  """Greedy and beam 4 agree token for token on these settings: no length penalty
  (α = 0, CTranslate2's length_penalty=0), no minimum length, the same length limit
  (the source with its EOS + 8 tokens) and fairseq's finish rule. (At α = 0 the
  best_finished stop rule, CTranslate2's own, returns what the exact one does.)"""
  options = DecodeOptions(method="beam" if beam_size > 1 else "greedy", beam_size=beam_size,
                          alpha=0.0, max_extra_len=EXTRA, min_length=0, finish_rule="fairseq")
  outputs = _compare(*imported_marian, options)
  assert len({len(output) for output in outputs}) > 2, f"outputs too alike to compare: {outputs}"
