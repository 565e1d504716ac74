"""Imports a Marian (opus-mt) model downloaded from Hugging Face as a run directory.

  python -m transformer_jax.import_marian --model_dir=opus-mt-en-de --workdir=runs/opus-mt-en-de

--model_dir holds config.json, model.safetensors (or pytorch_model.bin, which
needs torch), source.spm, target.spm and vocab.json. Then translate, evaluate
and `train --config.init_from=RUN_DIR` use the run directory as they use any
other (interop/marian.py).
"""

from __future__ import annotations

from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.interop.marian import import_marian

FLAGS = common.FLAGS


@exit_on_user_error
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --model_dir=DIR")
  if not FLAGS.model_dir:
    raise UserError("--model_dir is required: a downloaded Hugging Face Marian model directory")
  workdir = common.require_workdir()
  report = import_marian(FLAGS.model_dir, workdir)
  print(f"imported {report.num_parameters:,} parameters into {report.workdir} "
        f"(vocabulary: Marian's {report.marian_vocab_size:,} ids as {report.vocab_size:,} here)")
  if report.missing_source_pieces:
    print(f"warning: {len(report.missing_source_pieces)} source.spm pieces are not in "
          f"vocab.json (Marian reads them as <unk>), e.g. {report.missing_source_pieces[:5]}")


def run() -> None:
  flags.DEFINE_string("model_dir", None, "A Hugging Face MarianMTModel directory.")
  flags.DEFINE_string("workdir", None, "The run directory to write (new, or without checkpoints).")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
