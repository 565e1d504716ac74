"""A generated algorithmic problem, trained on 1..8 items and tested on 1..32.

  python -m transformer_jax.train --config=experiments/configs/length_generalisation.py \\
      --workdir=runs/copy --config.algorithmic.problem=copy --config.model.positions=none
  python -m transformer_jax.train \\
      --config=experiments/configs/length_generalisation.py:encoder_decoder --workdir=runs/copy_ed

The length-generalisation study of results/length_generalisation/README.md runs
this config for every problem, architecture, position scheme and seed
(experiments/length_generalisation.py). The argument picks the architecture:
`decoder_only` (the default: 4 causal layers over `source <BOS> target`) or
`encoder_decoder` (2 + 2 layers); both have d_model 64, 4 heads and d_ff 256,
no dropout and no label smoothing, and train 1,000 steps of 64 rows. At the end
of training the final report measures exact match (teacher-forced, which equals
greedy decoding's) at every length 1..32 and writes final_test.json.
"""

import ml_collections

from transformer_jax.configs import default_config
from transformer_jax.tasks.algorithmic import position_span

TRAIN_MAX_ITEMS = 8


def get_config(architecture: str = "decoder_only") -> ml_collections.ConfigDict:
  config = default_config()
  config.task = "algorithmic"
  config.algorithmic.update(dict(architecture=architecture or "decoder_only",
                                 train_max_items=TRAIN_MAX_ITEMS,
                                 test_max_items=4 * TRAIN_MAX_ITEMS))
  layers = dict(num_layers=4) if config.algorithmic.architecture == "decoder_only" else dict(
      num_layers=2)
  config.model.update(dict(d_model=64, d_ff=256, num_heads=4, dropout_rate=0.0,
                           attention_dropout_rate=0.0, relu_dropout_rate=0.0, **layers))
  # The widest side at 8 items: addition's "a + b" or duplicate's output, with EOS.
  config.data.update(dict(max_len=2 * TRAIN_MAX_ITEMS + 2, tokens_per_batch=64 * 18,
                          pack=False))
  # Positions the longest test row needs (every problem's, so one value serves a sweep).
  config.model.max_len = max(position_span(_with(config, problem))
                             for problem in ("duplicate", "addition"))
  config.num_train_steps = 1_000
  config.label_smoothing = 0.0
  config.schedule = "linear_cosine"
  config.learning_rate = 1e-3
  config.warmup_steps = 100
  config.grad_clip_norm = 1.0
  config.log_every_steps = 250
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 1
  config.eval_bleu_sentences = 0
  config.average_last_checkpoints = 1
  config.final_eval_split = "test"
  return config


def _with(config: ml_collections.ConfigDict, problem: str) -> ml_collections.ConfigDict:
  copy = ml_collections.ConfigDict(config.to_dict())
  copy.algorithmic.problem = problem
  return copy
