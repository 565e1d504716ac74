"""Fine-tunes an imported BERT as the pair classifier on Multi30k (does the German match?).

  python -m transformer_jax.import_hf --model_dir=bert-base-multilingual-cased --workdir=runs/bert
  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train \\
      --config=experiments/configs/bert_finetune.py:runs/bert --workdir=runs/bert-ft

The argument after ':' is the imported run directory (a masked_lm run): the classifier
takes its encoder (`init_from`; the pooler and the classifier start fresh), its model
section and its WordPiece (`data.tokenizer_path`), and learns whether a German sentence
is the translation of an English one, as classify_multi30k.py does from a masked LM
trained here. Published BERT checkpoints need a download (Hugging Face's, saved with
save_pretrained), which the machines this project is measured on cannot make: no
result to report; tests/interop/test_bert.py runs this config on a small random BERT.
"""

import os

import ml_collections

from transformer_jax.configs import default_config
from transformer_jax.interop import imported_run

# test_configs: get_config needs a run directory; tests/interop/test_bert.py builds one.
REQUIRES_ARGUMENT = "an imported run directory"


def get_config(run_dir: str = "") -> ml_collections.ConfigDict:
  imported_model = imported_run.imported_model(run_dir, "bert_finetune.py", "import_hf")
  config = default_config()
  config.task = "classification"
  config.text_side = "pair"
  config.model.update(imported_model)
  config.init_from = run_dir
  config.data.update(dict(
      dataset="multi30k", variant="raw", source_lang="en", target_lang="de",
      tokenizer_path=os.path.join(run_dir, "tokenizer.model"),
      max_len=min(64, imported_model["max_len"] // 2), tokens_per_batch=2_048, pack=False))
  config.label_smoothing = 0.0
  config.schedule = "linear_rsqrt"
  config.learning_rate = 3e-5
  config.warmup_steps = 100
  config.grad_clip_norm = 1.0
  config.num_train_steps = 1_000
  config.eval_every_steps = 250
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 250
  return config
