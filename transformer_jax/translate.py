"""Translates stdin to stdout, one line out for each line in.

  python -m transformer_jax.translate --workdir=DIR [--checkpoint=latest|averaged|STEP] \
      [--beam_size=4] [--alpha=0.6] < source.txt > hypotheses.txt

Sentences are sorted by length internally; empty lines give empty lines; a
line longer than the model's maximum is truncated with a warning. Progress
goes to stderr.
"""

from __future__ import annotations

import sys

from absl import app, flags

from transformer_jax.errors import UserError, exit_on_user_error

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The flags of translate and evaluate (defined by their `__main__` only)."""
  flags.DEFINE_string("workdir", None, "Run directory of a training run.")
  flags.DEFINE_string("checkpoint", "latest", "latest, averaged, or a step number.")
  flags.DEFINE_enum("method", "beam", ["beam", "greedy", "sample"], "Search method.")
  flags.DEFINE_integer("beam_size", 4, "Beam size (§6.1: 4).")
  flags.DEFINE_float("alpha", 0.6, "Length penalty exponent α (§6.1: 0.6).")
  flags.DEFINE_integer("max_extra_len", 50, "Output may be this many tokens longer than the input.")
  flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
  flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens (0: all).")
  flags.DEFINE_bool("growing_cache", None, "Grow the self-attention cache 16, 32, ... "
                    "positions as decoding goes (same outputs); unset: on for beam search, "
                    "off for greedy search and sampling.")
  flags.DEFINE_integer("tokens_per_batch", 4096, "Source tokens per decoding batch.")
  flags.DEFINE_bool("replace_invalid_utf8", False, "Replace invalid UTF-8 bytes instead of failing.")


def decode_options():
  from transformer_jax.decode import DecodeOptions

  return DecodeOptions(
      method=FLAGS.method, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha,
      max_extra_len=FLAGS.max_extra_len, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
      growing_cache=FLAGS.growing_cache,
  )


def read_lines(stream, replace_invalid: bool, name: str = "stdin") -> list[str]:
  """Lines of a binary stream, decoded as UTF-8 (invalid bytes: error or U+FFFD)."""
  lines = []
  for number, raw in enumerate(stream.read().splitlines(), start=1):
    try:
      lines.append(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
      if not replace_invalid:
        raise UserError(
            f"{name} line {number} is not valid UTF-8 (byte {e.start}); fix the input or "
            "pass --replace_invalid_utf8"
        ) from None
      lines.append(raw.decode("utf-8", errors="replace"))
  return lines


def translate_lines(run, lines: list[str], options, tokens_per_batch: int) -> list[str]:
  """Translations of `lines` by a loaded run, with warnings and progress on stderr."""
  from transformer_jax.decode import Translator, translate_texts

  max_source_len = run.config.model.max_len

  def on_truncate(index, length):
    print(f"warning: line {index + 1} has {length} tokens; truncated to {max_source_len}",
          file=sys.stderr, flush=True)

  def progress(done, total):
    print(f"\rtranslated {done}/{total}", end="" if done < total else "\n",
          file=sys.stderr, flush=True)

  translator = Translator(run.model, run.params, run.mesh, options)
  return translate_texts(translator, run.tokenizer, lines, max_source_len, tokens_per_batch,
                         on_truncate=on_truncate, progress=progress)


@exit_on_user_error
def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --beam_size=4")
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the run directory of a training run")
  options = decode_options()
  from transformer_jax.inference import load_run

  lines = read_lines(sys.stdin.buffer, FLAGS.replace_invalid_utf8)
  run = load_run(FLAGS.workdir, FLAGS.checkpoint)
  for line in translate_lines(run, lines, options, FLAGS.tokens_per_batch):
    sys.stdout.write(line.replace("\n", " ") + "\n")
  sys.stdout.flush()


if __name__ == "__main__":
  from transformer_jax import cli

  cli.keep_freed_host_memory()
  cli.enable_compilation_cache()  # A repeated decode of the same shapes does not compile again.
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
