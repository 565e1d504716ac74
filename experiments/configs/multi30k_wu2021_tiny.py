"""The Multi30k literature's text-only baseline: Wu et al. (ACL 2021)'s Transformer-Tiny.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.train \
      --config=experiments/configs/multi30k_wu2021_tiny.py --workdir=runs/wu2021_tiny
  TRANSFORMER_JAX_DATA_DIR=../shared/data python experiments/report_run.py \
      --workdir=runs/wu2021_tiny --out=results/multi30k/wu2021_tiny --average=10

"Good for Misconceived Reasons: An Empirical Revisiting on the Need for Visual
Context in Multimodal Machine Translation" (Wu, Kong, Bi, Li, Kao; ACL 2021).
Their released recipe (github.com/LividWo/Revisit-MMT, README-baseline.md)
reports test2016 BLEU 41.02 (fairseq's tokenized BLEU on the lowercased,
tokenized text) for English→German. As published there:

- fairseq `transformer_tiny`: 4+4 layers, d_model 128, d_ff 256, 4 heads,
  post-LN, sinusoidal positions, all embeddings shared (`--share-all-embeddings`
  over a joined dictionary);
- `--dropout 0.3` (fairseq's attention and activation dropout default to 0);
- `--lr 0.005 --warmup-updates 2000` with fairseq's inverse_sqrt schedule
  (linear from 0 to the peak, then peak·sqrt(2000/step): `linear_rsqrt` here);
- `--max-tokens 4096` on each of 2 GPUs: 8,192 tokens an update;
- `--max-update 8000`; the last 10 checkpoints averaged; beam 5.

Not stated in that recipe, so chosen here and named: the Multi30k `tok/` text
(lowercased, tokenized, what their BLEU is computed on) with a joint 10k BPE
vocabulary; Adam(0.9, 0.98, 1e-9) and label smoothing 0.1 (fairseq's
translation examples; the command names neither); fairseq saves a checkpoint
each epoch (~50 updates of 8,192 tokens), so here one every 50 steps; length
penalty α 1.0 (fairseq divides by length; our penalty is GNMT's); no early
stopping (their `--patience 10` stops when the dev loss has not improved for 10
epochs).
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.model.update(dict(
      vocab_size=10_000,  # Follows the tokenizer (data.vocab_size) when training.
      num_layers=4, d_model=128, d_ff=256, num_heads=4,
      dropout_rate=0.3, attention_dropout_rate=0.0, relu_dropout_rate=0.0,
      max_len=128,
      matmul_dtype="auto",
  ))
  config.data.update(dict(
      dataset="multi30k", variant="tok", source_lang="en", target_lang="de",
      vocab_size=10_000, max_len=64, tokens_per_batch=8_192,
      pack=True, bucket_boundaries=(16, 24, 32, 48, 64),
  ))
  config.num_train_steps = 8_000
  config.label_smoothing = 0.1
  config.schedule = "linear_rsqrt"
  config.learning_rate = 5e-3
  config.warmup_steps = 2_000
  config.grad_clip_norm = 0.0  # fairseq's --clip-norm defaults to 0 (none) in that recipe.
  config.log_every_steps = 50
  config.eval_every_steps = 500
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 50
  config.checkpoint_every_minutes = 10.0
  config.keep_checkpoints = 10
  config.average_last_checkpoints = 10
  config.final_eval_split = "test2016"
  config.final_eval_examples = 3
  config.beam_size = 5
  config.length_penalty = 1.0
  return config
