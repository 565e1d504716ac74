"""Fine-tunes an imported Marian (opus-mt) model on Multi30k (cased, raw text).

  python -m transformer_jax.import_marian --model_dir=opus-mt-en-de --workdir=runs/opus-mt-en-de
  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train \\
      --config=experiments/configs/marian_finetune.py:runs/opus-mt-en-de --workdir=runs/opus-mt-ft

The argument after ':' is the imported run directory: its model section, its
weights (`init_from`) and its vocabulary (`data.tokenizer_path`) are taken
as they are; a small peak learning rate with a short warmup, as fine-tuning
a trained model wants. Not yet run on a published checkpoint here (none can
be downloaded on the machines this project is measured on): no result to
report.
"""

import os

import ml_collections

from transformer_jax.configs import default_config
from transformer_jax.interop import imported_run

# test_configs: get_config needs a run directory; tests/test_marian.py builds one.
REQUIRES_ARGUMENT = "an imported run directory"


def get_config(run_dir: str = "") -> ml_collections.ConfigDict:
  imported_model = imported_run.imported_model(run_dir, "marian_finetune.py", "import_marian")
  config = default_config()
  config.model.update(imported_model)
  config.init_from = run_dir
  config.data.update(dict(
      dataset="multi30k", variant="raw", source_lang="en", target_lang="de",
      tokenizer_path=os.path.join(run_dir, "tokenizer.model"), max_len=128,
      tokens_per_batch=2_048))
  config.schedule = "linear_rsqrt"
  config.learning_rate = 5e-5
  config.warmup_steps = 100
  config.num_train_steps = 1_000
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 250
  config.final_eval_split = "test2016"
  return config
