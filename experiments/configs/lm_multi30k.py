"""A causal language model on the German side of Multi30k (cased, untokenized).

  TRANSFORMER_JAX_DATA_DIR=../shared/data \\
  python -m transformer_jax.train --config=experiments/configs/lm_multi30k.py --workdir=runs/lm_multi30k
  python -m transformer_jax.generate --workdir=runs/lm_multi30k --prompt="Ein Hund" --top_k=20

A decoder-only model (4 layers, d_model 256, 4 heads, d_ff 1024) trained on
next-token prediction over sentences packed into rows of 64 tokens, with the
shared 8k BPE vocabulary of the translation recipes; the dev row is the val
split's per-token NLL and perplexity (no label smoothing, so the loss is the NLL).

Reaches val perplexity 26.28 (3.269 nats per BPE token) after 1,200 steps, 25 min
28 s on 2 AVX2-only AMD EPYC cores (2026-12-04); samples and the curve:
results/lm_multi30k/README.md.
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.task = "causal_lm"
  config.model.update(dict(
      vocab_size=8_000,  # Follows the tokenizer (data.vocab_size) when training.
      num_layers=4, d_model=256, d_ff=1024, num_heads=4,
      dropout_rate=0.15, attention_dropout_rate=0.1, relu_dropout_rate=0.1, max_len=128,
  ))
  config.data.update(dict(
      dataset="multi30k", variant="raw", source_lang="en", target_lang="de",  # LM on German.
      vocab_size=8_000, max_len=64, tokens_per_batch=4_096, pack=True,
      bucket_boundaries=(16, 24, 32, 48, 64),
  ))
  config.num_train_steps = 1_200
  config.label_smoothing = 0.0
  config.schedule = "linear_rsqrt"
  config.learning_rate = 2e-3
  config.warmup_steps = 200
  config.grad_clip_norm = 1.0
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 3
  config.eval_bleu_sentences = 0
  return config
