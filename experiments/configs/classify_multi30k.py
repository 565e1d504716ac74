"""Is the German a translation of the English? A pair classifier on Multi30k, from scratch or pre-trained.

  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train --config=experiments/configs/classify_multi30k.py \\
      --workdir=runs/classify_multi30k --config.init_from=runs/mlm_multi30k
  # The same classifier from scratch:
  python -m transformer_jax.train --config=experiments/configs/classify_multi30k.py \\
      --workdir=runs/classify_multi30k_scratch

The encoder of `mlm_multi30k.py` (same size and vocabulary) with a pooled
head reads [English | German] rows; half the German sides are those of
another pair of similar length from the same batch (tasks/classification.py).
`--config.init_from` takes every encoder weight from the masked-LM run; the
pooler and classifier start fresh. The dev row is val accuracy; the final
report scores test2016.

300 steps (under 5 minutes on 2 AVX2-only AMD EPYC cores, 2026-12-04): test2016
accuracy 0.911 from the masked-LM encoder, 0.561 from scratch (chance: 0.5).
Figures: results/mlm_multi30k/README.md.
"""

import os

import ml_collections

from transformer_jax.configs import load_module

_MLM = load_module(os.path.join(os.path.dirname(__file__), "mlm_multi30k.py"))


def get_config() -> ml_collections.ConfigDict:
  config = _MLM.get_config()
  config.task = "classification"
  config.data.pack = False  # One pair per row.
  config.num_train_steps = 300
  config.learning_rate = 5e-4
  config.warmup_steps = 50
  config.checkpoint_every_steps = 100
  return config
