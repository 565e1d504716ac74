"""What positions buy, measured: an encoder-decoder without them cannot tell a sentence from the
same sentence with two words swapped.

  python -m transformer_jax.train --config=experiments/configs/quickstart.py \
      --workdir=runs/position_pitfall/sinusoidal
  python -m transformer_jax.train --config=experiments/configs/quickstart.py \
      --config.model.positions=none --workdir=runs/position_pitfall/none
  python experiments/position_pitfall.py --runs=runs/position_pitfall/sinusoidal,runs/position_pitfall/none \
      --out=results/position_pitfall

For the first --sentences test sentences of each run's corpus, a twin is made by swapping
two different word pieces (chosen at random among the sentence's pieces, EOS kept last).
For each run it measures
- the encoder's equivariance: the largest |h(twin)[π(i)] − h(sentence)[i]| over every
  piece i, relative to the largest |h(sentence)| (exactly permuted states give 0);
- how often the greedy translations of a sentence and its twin are the same string;
- the test BLEU of its final report (final_test.json, the recipe's beam search).
Writes result.json and README.md into --out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.data.pipeline import load_dataset
from transformer_jax.decode.translator import DecodeOptions, Translator
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model.precision import cpu_model
from transformer_jax.model.transformer import Transformer
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.registry import load_run

FLAGS = flags.FLAGS
flags.DEFINE_list("runs", None, "Translation run directories to compare.")
flags.DEFINE_integer("sentences", 200, "Test sentences (the first of the split).")
flags.DEFINE_string("out", "results/position_pitfall", "Output folder.")


def twins(encoded: list[list[int]], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(sentences, twins: int32[n, len] PAD-padded, π: int[n, len] with twin[π[i]] =
  sentence[i]): each twin swaps two pieces with different ids."""
  rng = np.random.default_rng(seed)
  width = max(map(len, encoded))
  sentences = np.full((len(encoded), width), PAD_ID, np.int32)
  permutations = np.tile(np.arange(width), (len(encoded), 1))
  for row, ids in enumerate(encoded):
    sentences[row, :len(ids)] = ids
    body = len(ids) - 1  # EOS stays last.
    pairs = [(i, j) for i in range(body) for j in range(i + 1, body) if ids[i] != ids[j]]
    if pairs:
      i, j = pairs[rng.integers(len(pairs))]
      permutations[row, [i, j]] = permutations[row, [j, i]]
  rows = np.arange(len(encoded))[:, None]
  twin = np.empty_like(sentences)
  twin[rows, permutations] = sentences
  return sentences, twin, permutations


def measure(workdir: str, sentences_count: int) -> dict:
  run = load_run(workdir, expected_task="translation")
  data = load_dataset(run.config.data)
  sources, _ = data.texts(data.test_split)
  encoded = [run.tokenizer.encode(text) for text in sources[:sentences_count]]
  sentences, twin, permutations = twins(encoded)
  encode = jax.jit(lambda p, x: run.model.apply({"params": p}, x, method=Transformer.encode))
  states, twin_states = (np.asarray(encode(run.params, x)) for x in (sentences, twin))
  rows = np.arange(len(encoded))[:, None]
  real = sentences != PAD_ID
  moved = twin_states[rows, permutations]  # The twin's state of each original piece.
  error = np.max(np.abs(moved - states)[real]) / np.max(np.abs(states[real]))
  swapped = np.any(sentences != twin, axis=1)
  translator = Translator(run.model, run.params, run.mesh, DecodeOptions(method="greedy"))
  outputs = [[run.tokenizer.decode(row) for row in np.asarray(translator(x))]
             for x in (sentences, twin)]
  same = np.mean([a == b for a, b, s in zip(*outputs, swapped) if s])
  final = Path(workdir) / "final_test.json"
  report = json.loads(final.read_text()) if final.exists() else {}
  examples = [dict(source=run.tokenizer.decode(s), twin=run.tokenizer.decode(t), translation=a,
                   twin_translation=b)
              for s, t, a, b, k in zip(sentences, twin, *outputs, swapped) if k][:3]
  return dict(workdir=workdir, positions=run.model.config.positions,
              sentences=int(swapped.sum()), equivariance_error=float(error),
              same_translation=float(same), test=report, examples=examples)


def main(argv: list[str]) -> None:
  del argv
  if not FLAGS.runs:
    raise UserError("--runs is required: translation run directories, e.g. one with "
                    "positions=sinusoidal and one with positions=none")
  common.quiet_libraries()
  out = Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  results = [measure(workdir, FLAGS.sentences) for workdir in FLAGS.runs]
  date = time.strftime("%Y-%m-%d", time.gmtime())
  (out / "result.json").write_text(json.dumps(dict(host=cpu_model(), date=date, runs=results),
                                              indent=2, ensure_ascii=False) + "\n")
  for r in results:
    bleu = {k: v for k, v in r["test"].items() if "bleu" in k.lower()}
    print(f"{r['positions']}: equivariance error {r['equivariance_error']:.2e}, same greedy "
          f"translation for {100 * r['same_translation']:.1f} % of {r['sentences']} twins, "
          f"test {bleu}")


if __name__ == "__main__":
  common.keep_freed_host_memory()
  app.run(exit_on_user_error(main), flags_parser=common.parse_flags)
