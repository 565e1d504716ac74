"""Translates a source file and scores it against references.

  python -m transformer_jax.evaluate --workdir=DIR --source=FILE --reference=FILE \
      [--tok_reference=FILE] [--reference_kind=auto|raw|tokenized] \
      [--checkpoint=latest|averaged|STEP] [--beam_size=4] [--alpha=0.6] \
      [--beam_stop=exact|best_finished] [--quantize=int8] [--matmul_dtype=float32|bfloat16|auto] \
      [--ensemble=OTHER_DIR,...]

Prints one JSON object (sacrebleu, paper_bleu, tok_bleu, chrf, sentences,
decode_seconds, sentences_per_second) and writes the hypotheses beside the
checkpoint folder as <workdir>/hypotheses/<source name>.<checkpoint>.txt
(with --ensemble, <source name>.<checkpoint>.ensemble-<N runs>-<hash of their paths>.txt,
the runs listed under "ensemble" in the JSON).
tok_bleu is scored against --tok_reference (the official tokenized, lowercased
references, e.g. Multi30k tok/test2016.de) where given, else against
--reference lowercased and Moses-tokenized. With --reference_kind=tokenized
(references already tokenized and lowercased; the default for a run trained on
Multi30k tok/) only tok_bleu and chrf apply.
"""

from __future__ import annotations

import hashlib
import json
import os

from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.data.pipeline import references_kind
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.metrics import bleu
from transformer_jax.tasks.translation import evaluate_texts

FLAGS = common.FLAGS


def read_file(path: str | None, flag: str, replace_invalid: bool) -> list[str]:
  """The lines of the file a --`flag` names, or a one-line UserError."""
  if not path or not os.path.exists(path):
    raise UserError(f"--{flag}={path!r} does not exist; give a UTF-8 text file, one sentence a line")
  with open(path, "rb") as f:
    return common.read_lines(f, replace_invalid, name=path)


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  workdir = common.require_workdir()
  sources = read_file(FLAGS.source, "source", FLAGS.replace_invalid_utf8)
  references = read_file(FLAGS.reference, "reference", FLAGS.replace_invalid_utf8)
  if len(sources) != len(references):
    raise UserError(f"--source has {len(sources)} lines but --reference has {len(references)}")
  tok_references = None
  if FLAGS.tok_reference:
    tok_references = read_file(FLAGS.tok_reference, "tok_reference", FLAGS.replace_invalid_utf8)
    if len(tok_references) != len(sources):
      raise UserError(f"--source has {len(sources)} lines but --tok_reference has "
                      f"{len(tok_references)}")
  options = common.decode_options()
  run = common.load_translation_run(workdir)
  reference_kind = FLAGS.reference_kind
  if reference_kind == "auto":  # As the run was trained: Multi30k tok/ is tokenized.
    reference_kind = references_kind(run.config.data)
  scores, hypotheses = evaluate_texts(run, sources, references, options, FLAGS.tokens_per_batch,
                                      tok_references, reference_kind)
  out_dir = os.path.join(os.path.abspath(workdir), "hypotheses")
  os.makedirs(out_dir, exist_ok=True)
  name = f"{os.path.basename(FLAGS.source)}.{FLAGS.checkpoint}"
  if FLAGS.ensemble:
    members = [os.path.abspath(path) for path in [workdir, *FLAGS.ensemble]]
    digest = hashlib.sha256("\n".join(members).encode()).hexdigest()[:8]  # Which runs.
    name += f".ensemble-{len(members)}-{digest}"
    scores.update(ensemble=members)
  out_path = os.path.join(out_dir, name + ".txt")
  with open(out_path, "w") as f:
    f.writelines(h + "\n" for h in hypotheses)
  scores.update(hypotheses_file=out_path, checkpoint_step=run.step)
  print(json.dumps(scores), flush=True)


def run() -> None:
  common.keep_freed_host_memory()
  common.enable_compilation_cache()  # A repeated decode of the same shapes does not compile again.
  common.define_decode_flags()
  flags.DEFINE_string("source", None, "Source sentences, one per line.")
  flags.DEFINE_string("reference", None, "Reference translations, line-aligned.")
  flags.DEFINE_string("tok_reference", None, "Optional official tokenized, lowercased "
                      "references (Multi30k tok/) for tok_bleu, line-aligned.")
  flags.DEFINE_enum("reference_kind", "auto",
                    ["auto", bleu.REFERENCES_RAW, bleu.REFERENCES_TOKENIZED],
                    "raw: detokenized, cased references (every score); tokenized: already "
                    "tokenized and lowercased (tok_bleu and chrf only); auto: tokenized for a "
                    "run trained on Multi30k tok/, else raw.")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
