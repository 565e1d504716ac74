"""The paper's base model on WMT14 English→German (§5, §6.1; Table 2 and Table 3's first row).

  python -m transformer_jax.train --config=experiments/configs/wmt14_base.py --workdir=runs/wmt14_base
  python -m transformer_jax.average_checkpoints --workdir=runs/wmt14_base --last=5
  python -m transformer_jax.evaluate --workdir=runs/wmt14_base --checkpoint=averaged \
      --source=newstest2014.en --reference=newstest2014.de

N=6, d_model 512, d_ff 2048, h 8, d_k=d_v=64, P_drop 0.1, ε_ls 0.1; Adam(0.9, 0.98,
1e-9) on the §5.3 schedule with 4000 warm-up steps; 100k steps of ~25k source +
~25k target tokens; a ~37k shared BPE vocabulary; checkpoints every 10 minutes,
the last 5 averaged; beam 4, α 0.6, max length input + 50. Dev = newstest2013
(TFDS wmt14_translate 'validation'), test = newstest2014 ('test').

Paper: 27.3 BLEU on newstest2014 (tokenized, compound-split), dev PPL 4.92 and
25.8 BLEU on newstest2013 without averaging; 8 P100 GPUs, ~12 hours.
Here: not yet trained at full size. Preparing wmt14 downloads ~1.5 GB from
statmt.org and runs TFDS's own wmt14_translate code (no TensorFlow needed);
tests/test_wmt14.py runs this config end to end, at tiny width, on files in
the real formats.
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  """The base recipe; `default_config()` already holds the §5 values, stated here again."""
  config = default_config()
  config.model.update(dict(
      vocab_size=37_000, share_embeddings=True, tie_output=True,  # §3.4.
      num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64, d_v=64,
      dropout_rate=0.1, positions="sinusoidal", norm="post",
  ))
  config.data.update(dict(
      dataset="wmt14", source_lang="en", target_lang="de",
      vocab_size=37_000,  # §5.1: shared BPE of about 37k tokens.
      train_split="train", eval_split="validation", test_split="test",
      max_len=256,  # tensor2tensor's transformer_base max_length.
      tokens_per_batch=25_000,  # §5.1: ~25k source and ~25k target tokens.
  ))
  config.num_train_steps = 100_000
  config.label_smoothing = 0.1
  config.schedule = "paper"
  config.warmup_steps = 4000
  config.learning_rate_scale = 1.0
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  # §6.1: checkpoints at 10-minute intervals; the step trigger is only a fallback.
  config.checkpoint_every_minutes = 10.0
  config.checkpoint_every_steps = 100_000
  config.keep_checkpoints = 5
  config.average_last_checkpoints = 5
  config.beam_size = 4
  config.length_penalty = 0.6
  config.max_decode_extra_len = 50
  config.final_eval_split = "test"  # newstest2014.
  return config
