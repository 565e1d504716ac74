"""Imports a model downloaded from Hugging Face as a run directory, by its config.json model_type.

  python -m transformer_jax.import_hf --model_dir=gpt2 --workdir=runs/gpt2
  python -m transformer_jax.generate --workdir=runs/gpt2 --prompt="Hello" --temperature=0
  python -m transformer_jax.import_hf --model_dir=bert-base-uncased --workdir=runs/bert

--model_dir holds config.json, model.safetensors (or pytorch_model.bin, which needs
torch) and the tokenizer's files. Supported model_types: "gpt2" (GPT2LMHeadModel: a
causal_lm run that `generate` and `train --config.init_from` read), "bert"
(BertForMaskedLM: a masked_lm run, which a classifier's `--config.init_from` reads) and
"marian" (MarianMTModel, opus-mt: a translation run, as `import_marian` writes). GPT-2's
and BERT's tokenizers need `pip install -e '.[hf]'`. Any other model is a one-line
refusal that writes nothing.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.interop.bert import import_bert
from transformer_jax.interop.gpt2 import import_gpt2
from transformer_jax.interop.marian import import_marian

FLAGS = common.FLAGS
SUPPORTED = ("gpt2", "bert", "marian")


def model_type(model_dir: str) -> str:
  """config.json's model_type; a one-line error for a folder without one."""
  path = os.path.join(model_dir, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      kind = json.load(f).get("model_type")
  except FileNotFoundError:
    raise UserError(f"{path} does not exist; --model_dir must be a Hugging Face model "
                    "directory (save_pretrained's folder)") from None
  except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
    raise UserError(f"{path} is not a JSON object ({e})") from None
  if kind not in SUPPORTED:
    raise UserError(f"{path} has model_type={kind!r}; supported: {', '.join(SUPPORTED)}")
  return kind


@exit_on_user_error
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --model_dir=DIR")
  if not FLAGS.model_dir:
    raise UserError("--model_dir is required: a downloaded Hugging Face model directory")
  workdir = common.require_workdir()
  kind = model_type(FLAGS.model_dir)
  if kind == "gpt2":
    report = import_gpt2(FLAGS.model_dir, workdir)
    print(f"imported GPT-2: {report.num_parameters:,} parameters into {report.workdir} "
          f"(vocabulary of {report.vocab_size:,} ids: GPT-2's with PAD and UNK added)")
  elif kind == "bert":
    report = import_bert(FLAGS.model_dir, workdir)
    print(f"imported BERT: {report.num_parameters:,} parameters into {report.workdir} "
          f"(vocabulary of {report.vocab_size:,} ids, [MASK] last)")
  else:
    report = import_marian(FLAGS.model_dir, workdir)
    print(f"imported Marian: {report.num_parameters:,} parameters into {report.workdir}")


def run() -> None:
  flags.DEFINE_string("model_dir", None, "A Hugging Face model directory.")
  flags.DEFINE_string("workdir", None, "The run directory to write (new, or without checkpoints).")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
