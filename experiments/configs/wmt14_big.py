"""The paper's big model on WMT14 English→German (Table 3's last row, Table 2).

  python -m transformer_jax.train --config=experiments/configs/wmt14_big.py --workdir=runs/wmt14_big
  python -m transformer_jax.average_checkpoints --workdir=runs/wmt14_big --last=20
  python -m transformer_jax.evaluate --workdir=runs/wmt14_big --checkpoint=averaged \
      --source=newstest2014.en --reference=newstest2014.de

The base recipe (wmt14_base.py) with d_model 1024, d_ff 4096, h 16 (d_k=d_v=64),
P_drop 0.3 (EN-DE), 300k steps, and the last 20 checkpoints averaged (§6.1).

Paper: 28.4 BLEU on newstest2014, dev PPL 4.33 and 26.4 BLEU on newstest2013,
213M parameters; 8 P100 GPUs, 3.5 days. Here: not yet measured.
"""

from pathlib import Path

import ml_collections

from transformer_jax.configs import load_module


def _sibling(name: str):
  """Another config file of this folder (configs are files, not a package)."""
  return load_module(Path(__file__).with_name(f"{name}.py"), f"config_{name}")


def get_config() -> ml_collections.ConfigDict:
  """wmt14_base with the big row's changes."""
  config = _sibling("wmt14_base").get_config()
  config.model.update(dict(d_model=1024, d_ff=4096, num_heads=16, d_k=64, d_v=64,
                           dropout_rate=0.3))
  config.num_train_steps = 300_000
  config.checkpoint_every_steps = 300_000
  config.keep_checkpoints = 20
  config.average_last_checkpoints = 20
  return config
