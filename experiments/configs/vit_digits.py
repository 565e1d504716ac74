"""A ViT classifying scikit-learn's 8×8 handwritten digits: images as 2×2-pixel patch tokens.

  python -m transformer_jax.train --config=experiments/configs/vit_digits.py --workdir=runs/vit_digits
  python experiments/vit_attention.py --workdir=runs/vit_digits --out=results/vit_digits

The 1,797 digits ship inside scikit-learn (no download): 1,197 train, 300 validation,
300 test images. Each image is 16 patches of 2×2 pixels and a [CLS] token, through 4
pre-LN encoder layers of model/layers.py (d_model 64, 4 heads, d_ff 128, GELU) with
learned positions; a linear head reads the [CLS] output. Adam on a linear warm-up and
cosine decay, 1,500 steps of 128 images.

Test accuracy 97.67 % (293 of 300) after 184 s of training on 2 cores of an Intel Xeon
@ 2.80GHz (AVX2), 2026-12-07; results/vit_digits/README.md has its curve and the
attention of the [CLS] token to the patches.
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.task = "image_classification"
  config.image.update(dict(dataset="digits", patch_size=2, pooling="cls", batch_size=128))
  config.model.update(dict(
      num_layers=4, d_model=64, d_ff=128, num_heads=4, norm="pre", activation="gelu",
      positions="learned", dropout_rate=0.1, attention_dropout_rate=0.0,
      relu_dropout_rate=0.0, max_len=17))
  config.num_train_steps = 1_500
  config.label_smoothing = 0.0
  config.schedule = "linear_cosine"
  config.learning_rate = 1e-3
  config.warmup_steps = 100
  config.grad_clip_norm = 1.0
  config.log_every_steps = 100
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 2
  config.eval_bleu_sentences = 0
  config.average_last_checkpoints = 1
  config.final_eval_split = "test"
  return config
