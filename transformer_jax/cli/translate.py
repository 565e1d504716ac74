"""Translates stdin to stdout, one line out for each line in.

  python -m transformer_jax.translate --workdir=DIR [--checkpoint=latest|averaged|STEP] \
      [--beam_size=4] [--alpha=0.6] [--beam_stop=exact|best_finished] [--quantize=int8] \
      [--matmul_dtype=float32|bfloat16|auto] [--ensemble=OTHER_DIR,...] \
      < source.txt > hypotheses.txt

Sentences are sorted by length internally; empty lines give empty lines; a
line longer than the model's maximum is truncated with a warning. Progress
goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app

from transformer_jax.cli import common
from transformer_jax.decode.translator import translate_lines
from transformer_jax.errors import UserError, exit_on_user_error

FLAGS = common.FLAGS


@exit_on_user_error
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --beam_size=4")
  workdir = common.require_workdir()
  options = common.decode_options()
  lines = common.read_lines(sys.stdin.buffer, FLAGS.replace_invalid_utf8)
  run = common.load_translation_run(workdir)
  for line in translate_lines(run, lines, options, FLAGS.tokens_per_batch):
    sys.stdout.write(line.replace("\n", " ") + "\n")
  sys.stdout.flush()


def run() -> None:
  common.keep_freed_host_memory()
  common.enable_compilation_cache()  # A repeated decode of the same shapes does not compile again.
  common.define_decode_flags()
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
