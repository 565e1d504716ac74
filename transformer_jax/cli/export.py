"""Exports a run for a deployment engine or for Hugging Face.

  python -m transformer_jax.export --workdir=RUN_DIR --format=ctranslate2 --out=DIR \
      [--checkpoint=latest|averaged|STEP] [--quantization=int8]
  python -m transformer_jax.export --workdir=RUN_DIR --format=hf --out=DIR

ctranslate2: a translation run as a CTranslate2 model (interop/ctranslate2_export.py;
pip install -e '.[export]'). Feed it the run's SentencePiece pieces without the final </s>:

  ctranslate2.Translator(DIR).translate_batch([pieces], beam_size=4)

hf: a causal_lm run as GPT-2, a masked_lm run as BERT (interop/hf_export.py), a folder
that transformers' from_pretrained reads, with its tokenizer.json; for runs imported
with import_hf or trained from one.
"""

from __future__ import annotations

from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.interop.ctranslate2_export import export_ctranslate2
from transformer_jax.interop.hf_export import export_hf
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.masked_lm import MaskedLMTask
from transformer_jax.tasks.registry import load_run
from transformer_jax.tasks.translation import TranslationTask

FLAGS = common.FLAGS


@exit_on_user_error
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --out=DIR")
  workdir = common.require_workdir()
  if not FLAGS.out:
    raise UserError("--out is required: the directory to write the exported model to")
  if FLAGS.format == "hf":
    if FLAGS.quantization:
      raise UserError("--quantization is CTranslate2's; --format=hf writes float32 weights")
    run = load_run(workdir, FLAGS.checkpoint,
                   expected_task=(CausalLMTask.name, MaskedLMTask.name))
    kind = export_hf(run, FLAGS.out)
    print(f"exported step {run.step} of {workdir} to {FLAGS.out} (Hugging Face {kind})")
    return
  run = load_run(workdir, FLAGS.checkpoint, expected_task=TranslationTask.name)
  out = export_ctranslate2(run, FLAGS.out, FLAGS.quantization)
  print(f"exported step {run.step} of {workdir} to {out} ({FLAGS.format}"
        f"{', ' + FLAGS.quantization if FLAGS.quantization else ''})")


def run() -> None:
  flags.DEFINE_string("workdir", None, "The run directory to export.")
  flags.DEFINE_string("checkpoint", "latest", "latest, averaged, or a step number.")
  flags.DEFINE_enum("format", "ctranslate2", ["ctranslate2", "hf"],
                    "ctranslate2 (a translation run) or hf (GPT-2 or BERT).")
  flags.DEFINE_string("out", None, "Directory to write (new or empty).")
  flags.DEFINE_string("quantization", "", "Weights' type: '' (float32), int8, int8_float32, "
                      "float16, bfloat16 (CTranslate2's compute types).")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
