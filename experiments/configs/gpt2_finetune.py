"""Fine-tunes an imported GPT-2 as a causal LM on the German side of Multi30k (cased, raw).

  python -m transformer_jax.import_hf --model_dir=gpt2 --workdir=runs/gpt2
  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train \\
      --config=experiments/configs/gpt2_finetune.py:runs/gpt2 --workdir=runs/gpt2-ft
  python -m transformer_jax.generate --workdir=runs/gpt2-ft --prompt="Ein Hund" --top_k=20

The argument after ':' is the imported run directory: its model section, its weights
(`init_from`) and its byte-level BPE (`data.tokenizer_path`) are taken as they are;
sentences are packed into rows of 128 tokens; a small peak learning rate with a short
warm-up, as fine-tuning a trained model wants. The published gpt2 checkpoint needs a
download (Hugging Face's `gpt2`, saved with save_pretrained), which the machines this
project is measured on cannot make: no result to report; tests/interop/test_gpt2.py
runs this config on a small random GPT-2.
"""

import os

import ml_collections

from transformer_jax.configs import default_config
from transformer_jax.interop import imported_run

# test_configs: get_config needs a run directory; tests/interop/test_gpt2.py builds one.
REQUIRES_ARGUMENT = "an imported run directory"


def get_config(run_dir: str = "") -> ml_collections.ConfigDict:
  imported_model = imported_run.imported_model(run_dir, "gpt2_finetune.py", "import_hf")
  config = default_config()
  config.task = "causal_lm"
  config.model.update(imported_model)
  config.init_from = run_dir
  config.data.update(dict(
      dataset="multi30k", variant="raw", source_lang="en", target_lang="de",
      tokenizer_path=os.path.join(run_dir, "tokenizer.model"),
      max_len=min(128, imported_model["max_len"]), tokens_per_batch=2_048, pack=True))
  config.label_smoothing = 0.0
  config.schedule = "linear_rsqrt"
  config.learning_rate = 5e-5
  config.warmup_steps = 100
  config.grad_clip_norm = 1.0
  config.num_train_steps = 1_000
  config.eval_every_steps = 250
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 250
  return config
