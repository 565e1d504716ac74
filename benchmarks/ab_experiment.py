"""Paired A/B timing of a candidate speed change to the training step (an experiment harness).

  python benchmarks/ab_experiment.py --variant=closed_form_loss --steps=4
  python benchmarks/ab_experiment.py --variant=rbg_prng

On a shared 2-core host, two runs minutes apart see different loads, so their
difference is mostly noise. Here both steps are compiled in one process and
timed alternately (A B B A ...), so each pair sees about the same load; the
median of the per-pair ratios is the estimate. The candidate is patched in at
trace time only; nothing under transformer_jax/ is changed.

Variants:
  closed_form_loss: the label-smoothed loss as lse - (1-ε-ε')·z_target - ε'·Σz
      (ε' = ε/(V-1)), without materialising one-hot or smoothed targets over the vocabulary.
  rbg_prng: dropout keys from the "rbg" PRNG instead of threefry.
  xla_attention: config.model.attention_impl = "xla" (jax.nn.dot_product_attention).
  no_dropout: dropout 0 (an upper bound on what cheaper dropout could save).
  row_chunked_loss: the tied output projection and the smoothed loss computed in a
      lax.scan over chunks of --chunk_rows target tokens, so each [rows, vocab] block
      of logits, softmax and logits gradient stays in cache (same values).
  dropout_16bit: transformer_jax.dropout.Dropout (16 random bits per element) in place of
      flax's nn.Dropout (32).
  eigen_dots: XLA:CPU without YNNPACK (`xla_cpu_experimental_ynn_fusion_type=`):
      every dot through Eigen.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

from absl import app, flags

flags.DEFINE_enum("variant", "closed_form_loss",
                  ["closed_form_loss", "rbg_prng", "xla_attention", "no_dropout",
                   "row_chunked_loss", "eigen_dots", "dropout_16bit"], "The B side.")
flags.DEFINE_integer("chunk_rows", 256, "row_chunked_loss: target tokens per chunk.")
flags.DEFINE_string("config_file", "experiments/configs/wmt14_base.py", "Experiment config file.")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Source tokens per sentence.")
flags.DEFINE_integer("tgt_len", 32, "Target tokens per sentence.")
flags.DEFINE_integer("vocab_size", 32000, "config.model.vocab_size.")
flags.DEFINE_integer("steps", 4, "Timed A/B pairs (after one untimed step each); 0: static costs only.")
FLAGS = flags.FLAGS


def closed_form_token_losses(logits, targets, label_smoothing: float):
  """Same values as transformer_jax.losses.token_losses (to ~1e-6), no [.., vocab] targets."""
  import jax
  import jax.numpy as jnp

  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
  smoothed = lse - (confidence - low) * target_logit - low * jnp.sum(logits, axis=-1)
  return smoothed, lse - target_logit


def row_chunked_token_losses(hidden, embedding, targets, label_smoothing: float, chunk_rows: int):
  """token_losses(hidden @ embedding.T, ...) computed chunk_rows tokens at a time.

  hidden: [batch, length, d_model]; embedding: [vocab, d_model]; targets: int[batch, length].
  """
  import jax

  from transformer_jax.losses import token_losses

  batch, length, d_model = hidden.shape
  rows = batch * length
  if rows % chunk_rows:
    raise ValueError(f"{rows} target tokens are not a multiple of --chunk_rows={chunk_rows}")

  def chunk(_, inputs):
    chunk_hidden, chunk_targets = inputs
    logits = chunk_hidden @ embedding.T.astype(chunk_hidden.dtype)
    return None, token_losses(logits, chunk_targets, label_smoothing)

  _, (smoothed, nll) = jax.lax.scan(
      chunk, None, (hidden.reshape(rows // chunk_rows, chunk_rows, d_model),
                    targets.reshape(rows // chunk_rows, chunk_rows)))
  return smoothed.reshape(batch, length), nll.reshape(batch, length)


def patch_row_chunked_loss(chunk_rows: int) -> None:
  """The model returns its final hidden states; train.loss_sums projects them in chunks."""
  import jax.numpy as jnp

  from transformer_jax import train
  from transformer_jax.special_tokens import PAD_ID
  from transformer_jax.model import Transformer

  Transformer._logits = lambda self, x: x.astype(jnp.float32)

  def loss_sums(params, batch, model, label_smoothing, train, dropout_key):
    rngs = {"dropout": dropout_key} if train else {}
    hidden = model.apply({"params": params}, **_decoder_inputs(batch), train=train, rngs=rngs)
    smoothed, nll = row_chunked_token_losses(
        hidden, params["target_embedding"]["embedding"], batch["target_tokens"],
        label_smoothing, chunk_rows)
    weights = (batch["target_tokens"] != PAD_ID).astype(jnp.float32)
    loss_sum = jnp.sum(smoothed * weights)
    return loss_sum, dict(loss_sum=loss_sum, nll_sum=jnp.sum(nll * weights),
                          tokens=jnp.sum(weights))

  _decoder_inputs = train._decoder_inputs
  train.loss_sums = loss_sums


def synthetic_tokens(rows: int, length: int, vocab_size: int, seed: int):
  """As experiments/benchmark.py: random non-special tokens ending in EOS; no PAD."""
  import numpy as np

  tokens = np.random.default_rng(seed).integers(4, vocab_size, size=(rows, length))
  tokens[:, -1] = 3  # EOS_ID.
  return tokens.astype(np.int32)


def static_costs(compiled) -> dict[str, float]:
  """Deterministic proxies that load on the host cannot blur: XLA's FLOPs, bytes, temporaries."""
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return dict(flops=float(analysis.get("flops", 0.0)),
              bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
              temp_bytes=float(compiled.memory_analysis().temp_size_in_bytes))


def compiled_step(config, batch_np, compiler_options=None) -> tuple[Callable, Any]:
  """(step() -> seconds, holder with the state and static costs), traced with the current patches."""
  import jax
  from flax import linen as nn

  from transformer_jax import parallel, train
  from transformer_jax.model import Transformer
  from transformer_jax.schedules import make_optimizer

  mesh = parallel.make_mesh(config.mesh)
  model = Transformer(config.model)
  optimizer = make_optimizer(config)
  state, shardings = train.create_train_state(model, optimizer, mesh, config.seed)
  train_fn, _ = train.compile_steps(model, optimizer, config, mesh, shardings)
  batch = parallel.global_batch(batch_np, mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
    compiled = train_fn.__wrapped__.lower(state, batch).compile(compiler_options)
  holder = dict(state=state, static=static_costs(compiled))

  def step() -> float:
    start = time.perf_counter()
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready((holder["state"], metrics))
    holder["loss"] = float(metrics["loss"])
    return time.perf_counter() - start

  return step, holder


def main(argv: list[str]) -> None:
  del argv
  import importlib.util

  import jax

  spec = importlib.util.spec_from_file_location("config_module", FLAGS.config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model.vocab_size = FLAGS.vocab_size
  batch = dict(
      src_tokens=synthetic_tokens(FLAGS.batch_size, FLAGS.src_len, FLAGS.vocab_size, 1),
      target_tokens=synthetic_tokens(FLAGS.batch_size, FLAGS.tgt_len, FLAGS.vocab_size, 2),
  )
  step_a, holder_a = compiled_step(config, batch)
  if FLAGS.variant == "closed_form_loss":
    from transformer_jax import train

    train.token_losses = closed_form_token_losses
  elif FLAGS.variant == "rbg_prng":
    jax.config.update("jax_default_prng_impl", "rbg")
  elif FLAGS.variant == "xla_attention":
    config.model.attention_impl = "xla"
  elif FLAGS.variant == "no_dropout":
    config.model.dropout_rate = 0.0
  elif FLAGS.variant == "row_chunked_loss":
    patch_row_chunked_loss(FLAGS.chunk_rows)
  elif FLAGS.variant == "dropout_16bit":
    from flax import linen as nn

    from transformer_jax.dropout import Dropout

    nn.Dropout = Dropout
  compiler_options = None
  if FLAGS.variant == "eigen_dots":
    compiler_options = {"xla_cpu_experimental_ynn_fusion_type": ""}
  step_b, holder_b = compiled_step(config, batch, compiler_options)
  static = dict(a=holder_a["static"], b=holder_b["static"])
  static["b_over_a"] = {k: static["b"][k] / static["a"][k] for k in static["a"] if static["a"][k]}
  print("static (XLA cost analysis):", json.dumps(static), flush=True)
  if FLAGS.steps == 0:
    print(json.dumps(dict(variant=FLAGS.variant, static=static)), flush=True)
    return
  step_a(), step_b()  # Warm-up.
  times_a, times_b = [], []
  load = [round(x, 2) for x in os.getloadavg()]
  for i in range(FLAGS.steps):
    first, second = (step_a, step_b) if i % 2 == 0 else (step_b, step_a)
    t_first, t_second = first(), second()
    a, b = (t_first, t_second) if i % 2 == 0 else (t_second, t_first)
    times_a.append(a)
    times_b.append(b)
    print(f"pair {i}: A {a:.2f} s  B {b:.2f} s  B/A {b / a:.3f}", flush=True)
  ratios = [b / a for a, b in zip(times_a, times_b)]
  result = dict(variant=FLAGS.variant, static=static, median_a_s=statistics.median(times_a),
                median_b_s=statistics.median(times_b), b_over_a_median_pair=statistics.median(ratios),
                ratios=ratios, times_a=times_a, times_b=times_b, loss_a=holder_a["loss"],
                loss_b=holder_b["loss"], load_average=load,
                load_average_end=[round(x, 2) for x in os.getloadavg()],
                shape=f"{FLAGS.batch_size}x({FLAGS.src_len}+{FLAGS.tgt_len}) vocab {FLAGS.vocab_size}")
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
