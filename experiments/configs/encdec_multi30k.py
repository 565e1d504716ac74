"""The encoder-decoder peer of `prefix_lm_multi30k.py`: the same data, size, optimiser and time.

  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train --config=experiments/configs/encdec_multi30k.py --workdir=runs/encdec_multi30k

3+3 layers of the paper's encoder-decoder (d_model 256, 4 heads, d_ff 1024):
5.51M non-embedding parameters, as many as the prefix LM's 7 decoder layers.
The step count gives it about the prefix LM's training time on the same
host (an encoder-decoder step is cheaper: each token passes 3 layers, not 7).
Figures beside the prefix LM's: results/prefix_lm_multi30k/.
"""

import os

import ml_collections

from transformer_jax.configs import load_module

_PREFIX_LM = load_module(os.path.join(os.path.dirname(__file__), "prefix_lm_multi30k.py"))


def get_config() -> ml_collections.ConfigDict:
  config = _PREFIX_LM.get_config()
  config.task = "translation"
  config.model.num_layers = 3
  config.num_train_steps = 1_150  # 2.3x the prefix LM's steps per minute here.
  return config
