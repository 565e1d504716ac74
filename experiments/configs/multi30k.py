"""A CPU recipe for Multi30k English→German (task 1, flickr test2016).

  TRANSFORMER_JAX_DATA_DIR=../shared/data \
  python -m transformer_jax.train --config=experiments/configs/multi30k.py --workdir=runs/multi30k

TRANSFORMER_JAX_DATA_DIR (or --config.data.data_dir) names the folder holding
multi30k/; without it the files are downloaded from github.com/multi30k.

Trains on the raw, cased text and writes cased, detokenized German, scored in
<workdir>/final_test2016.json: sacreBLEU against the raw references (its
signature printed), the Multi30k literature's tokenized-lowercase BLEU
(`tok_bleu`: the output lowercased and Moses-tokenized, against the official
`tok/` references where multi30k/tok/ is in the data folder), chrF, and the
paper's cased compound-split BLEU.
`--config.data.variant=tok` trains on the lowercased tokenized files instead;
its references are then tokenized too, so only tok_bleu and chrF are reported.

Recipe v20: Wu et al. (2021)'s Transformer-Tiny shape (4+4 layers, d_model 128,
d_ff 256, 4 heads, P_drop 0.3 on the residual paths only, ε_ls 0.1) and schedule (linear
warm-up over 1,000 steps to 5e-3, then 5e-3 · sqrt(1000 / step)) on cased text with a
shared 8k BPE vocabulary, 8,192 tokens a batch packed into rows of 64 tokens, gradients
clipped at norm 1; bf16 matmul operands with float32 accumulation where the CPU has native
bf16 (float32 elsewhere); the batch split over two JAX CPU devices (`cpu_devices`: this
small model's many small ops leave one device's cores idle; GPUs and TPUs ignore it);
training for 57 minutes (`train_minutes`: the step count that fits is fixed from the run's
own speed at step 500, at most 8,000, the baseline's; the schedule does not depend on it);
the average of the last 10 checkpoints (one every 50 steps), beam 8, α 1.5 (checkpoint
average and beam settings chosen on val). Then

  TRANSFORMER_JAX_DATA_DIR=../shared/data python experiments/report_run.py \
      --workdir=runs/multi30k --out=results/multi30k/v20_rsqrt --average=3,5,10 \
      --alphas=0.6,1.0,1.5 --beam_sizes=4,8

chooses the checkpoint average, beam size and α on val and decodes test2016 once.

v20 (2026-12-06, 2 cores of an Intel Xeon with AMX): 4,788 steps in 54 min 55 s; val
tok-lc BLEU 41.80; test2016 sacreBLEU 39.97, tokenized-lowercase BLEU 40.40. Wu et al.'s
own recipe (multi30k_wu2021_tiny.py: 8,000 steps on lowercased text, 1 h 59 min on the
same host) scores 41.40. The result and its files: results/multi30k/README.md; every run,
host and earlier recipe: results/multi30k/HISTORY.md.
"""

import ml_collections

from transformer_jax.configs import default_config


def get_config() -> ml_collections.ConfigDict:
  config = default_config()
  config.model.update(dict(
      vocab_size=8_000,  # Follows the tokenizer (data.vocab_size) when training.
      num_layers=4, d_model=128, d_ff=256, num_heads=4,
      # Small data overfits fast: Wu et al.'s 0.3 rather than the paper's 0.1.
      dropout_rate=0.3, attention_dropout_rate=0.0, relu_dropout_rate=0.0,
      max_len=128,
      # bf16 matmul operands, float32 everywhere else (model/precision.py): v7's shape
      # took 1.44x the steps per minute of float32 on an AVX512-BF16 CPU, 1.2x with AMX;
      # without either, bf16 ran 1.46x slower than float32, so "auto" takes float32 there.
      matmul_dtype="auto",
  ))
  config.data.update(dict(
      dataset="multi30k", variant="raw", source_lang="en", target_lang="de",
      vocab_size=8_000, max_len=64, tokens_per_batch=8_192,
      # Packed rows of 64 tokens: 7% padding (24% with length buckets) and one
      # batch shape, so one compile.
      pack=True,
      bucket_boundaries=(16, 24, 32, 48, 64),  # Eval batches: few shapes, few compiles.
  ))
  # Trains for 57 minutes of the loop (the final test2016 decode follows), at most 8,000
  # steps; on two JAX devices where the backend is a CPU.
  config.train_minutes = 57.0
  config.num_train_steps = 8_000
  config.cpu_devices = 2
  config.label_smoothing = 0.1
  # The paper's warm-up of 4000 steps is as long as this whole run; the baseline's inverse
  # square root keeps the last checkpoints apart, so averaging 10 of them pays (v20).
  config.schedule = "linear_rsqrt"
  config.learning_rate = 5e-3
  config.warmup_steps = 1_000
  config.grad_clip_norm = 1.0
  config.log_every_steps = 50
  config.eval_every_steps = 500
  # Dev BLEU takes minutes per evaluation on 2 cores; test2016 is scored at the end.
  config.eval_bleu_sentences = 0
  config.checkpoint_every_steps = 50
  config.checkpoint_every_minutes = 10.0
  config.keep_checkpoints = 10
  config.average_last_checkpoints = 10  # 20 or 30 of v20's lost on val (v25).
  config.final_eval_split = "test2016"
  config.final_eval_examples = 3
  # Chosen on val by report_run's grid (beam 4, 8 × α 0.6, 1.0, 1.5).
  config.beam_size = 8
  config.length_penalty = 1.5
  return config
