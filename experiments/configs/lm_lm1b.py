"""A causal language model on the One Billion Word benchmark (TFDS `lm1b`), for a machine with a download.

  python -m transformer_jax.train --config=experiments/configs/lm_lm1b.py --workdir=runs/lm_lm1b

`data.dataset="tfds_text"` reads a TFDS text dataset's `text` field as
monolingual text; the first run downloads and prepares lm1b (~30M sentences,
TFDS needs the internet and TensorFlow for it) as array_record under
$TRANSFORMER_JAX_CACHE_DIR, then trains a 32k BPE vocabulary on it. lm1b has
no validation split, so the dev row here is on `test`; set
`--config.data.eval_split` to a held-out slice before tuning anything.
Another TFDS text dataset: `--config.data.tfds_name=c4/en` (long documents:
raise data.max_len, as sentences longer than it are dropped).

Decoder-only, 6 layers, d_model 512, 8 heads, d_ff 2048 (GPT-style, pre-LN),
sentences packed into rows of 128 tokens. Not yet run: no figure to report.
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.task = "causal_lm"
  config.model.update(dict(
      vocab_size=32_000,  # Follows the tokenizer (data.vocab_size) when training.
      num_layers=6, d_model=512, d_ff=2048, num_heads=8, norm="pre",
      dropout_rate=0.1, attention_dropout_rate=0.0, relu_dropout_rate=0.0, max_len=128,
  ))
  config.data.update(dict(
      dataset="tfds_text", tfds_name="lm1b", tfds_text_feature="text",
      vocab_size=32_000, max_len=128, tokens_per_batch=32_768, pack=True,
      bucket_boundaries=(32, 64, 128),
  ))
  config.num_train_steps = 100_000
  config.label_smoothing = 0.0
  config.schedule = "linear_cosine"
  config.learning_rate = 6e-4
  config.warmup_steps = 2_000
  config.grad_clip_norm = 1.0
  config.eval_every_steps = 5_000
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 5_000
  return config
