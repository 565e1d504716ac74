"""A causal language model on rows of 8,192 tokens, with O(n·block) attention.

  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train --config=experiments/configs/lm_long_multi30k.py \\
      --workdir=runs/lm_long_multi30k

The decoder-only model of lm_multi30k.py, wider (6 layers, d_model 512, 8 heads), over
rows of 8,192 tokens: German Multi30k sentences packed back to back, one row a step.
Each token attends within its own sentence (packing segments) and causally.
Trained 100 steps in 29 min 25 s on 2 AVX2-only AMD EPYC cores (2026-12-04), about 18 s
a step; `attention_impl="plain"` runs out of memory at the first step (XLA asked for 40.5
GiB). `attention_impl="chunked"` computes attention in 512-token blocks with an online
softmax and skips the blocks the mask hides; `attention_impl="plain"` would hold an
8,192 x 8,192 score matrix per head and layer. Both, measured on the CPU:
results/attention_scaling/README.md.
"""

from pathlib import Path

import ml_collections

from transformer_jax.configs import load_module


def get_config() -> ml_collections.ConfigDict:
  config = load_module(Path(__file__).with_name("lm_multi30k.py"), "config_lm_multi30k").get_config()
  config.model.update(dict(
      num_layers=6, d_model=512, d_ff=2048, num_heads=8, max_len=8_192,
      attention_impl="chunked", attention_block_size=512,
  ))
  # Training packs rows to max_len; the dev split is scored a sentence a row, in these buckets.
  config.data.update(dict(max_len=8_192, tokens_per_batch=8_192,
                          bucket_boundaries=(16, 24, 32, 48, 64, 8_192)))
  config.num_train_steps = 100
  config.warmup_steps = 50
  config.learning_rate = 7e-4  # lm_multi30k's 2e-3 raised the loss from step 20 at this width.
  config.log_every_steps = 10
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 50
  return config
