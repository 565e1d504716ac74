"""A tiny model on a small slice of the built-in corpus: for tests and smoke runs.

  python -m transformer_jax.train --config=experiments/configs/tiny.py --workdir=/tmp/tiny

Trains 20 steps in about a minute on 2 CPU cores (mostly compiling two batch
shapes); the result is noise.
"""

from transformer_jax.configs import default_config


def get_config():
  config = default_config()
  config.model.update(dict(num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64))
  config.data.update(dict(dataset="generated_translation", num_generated_train=2000,
                          num_generated_eval=64, vocab_size=600, max_len=48,
                          tokens_per_batch=512, bucket_boundaries=(24, 48)))
  config.num_train_steps = 20
  config.warmup_steps = 10
  config.learning_rate_scale = 2.0
  config.log_every_steps = 5
  config.eval_every_steps = 10
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 10
  config.keep_checkpoints = 3
  return config
