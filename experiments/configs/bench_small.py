"""The small benchmark shapes: 3+3 layers, d_model 256, h 4, d_ff 1024, 8k vocabulary.

  python benchmarks/train_step.py --config=experiments/configs/bench_small.py \
      --batch_size=64 --src_len=32 --tgt_len=32 --vocab_size=8000 --steps=10 --json --compare=torch

The "tiny shapes" of the shared environment notes, where a naive Flax port ran at
0.85x torch.nn.Transformer (2,084 vs 2,463 target tokens/s). Until 2026-12-01
these were the Multi30k recipe's shapes (with 8 heads), which is why older
rows of benchmarks/README.md call them `multi30k`. It also trains Multi30k
(defaults otherwise; not a tuned recipe):

  TRANSFORMER_JAX_DATA_DIR=../shared/data \
  python -m transformer_jax.train --config=experiments/configs/bench_small.py --workdir=runs/bench_small
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.model.update(dict(vocab_size=8_000, num_layers=3, d_model=256, d_ff=1024, num_heads=4,
                           max_len=128))
  config.data.update(dict(dataset="multi30k", variant="tok", source_lang="en", target_lang="de",
                          vocab_size=8_000, max_len=64, tokens_per_batch=4_096, pack=True,
                          bucket_boundaries=(16, 24, 32, 48, 64)))
  return config
