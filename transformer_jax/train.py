"""Training: the state, one jitted sharded step, and the resumable loop.

  python -m transformer_jax.train --config=experiments/configs/quickstart.py \
      --workdir=runs/quickstart [--config.num_train_steps=N ...]

Rerunning the same command resumes from the latest complete checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import linen as nn
from flax import struct

from transformer_jax import checkpoints, parallel
from transformer_jax.errors import UserError
from transformer_jax.losses import smoothing_entropy, token_losses
from transformer_jax.model import Transformer, shift_right
from transformer_jax.model_config import ModelConfig
from transformer_jax.schedules import make_optimizer, make_schedule
from transformer_jax.special_tokens import PAD_ID

Batch = dict[str, jax.Array]


class TrainState(struct.PyTreeNode):
  """Everything that changes during training (a pytree; checkpointed whole)."""

  step: jax.Array
  params: Any
  opt_state: Any


class NonFiniteLossError(RuntimeError):
  """The loss became NaN or infinite."""


# --- State ----------------------------------------------------------------------


def initial_state_fn(model: Transformer, optimizer: optax.GradientTransformation) -> Callable:
  """key -> the initial TrainState, its parameters boxed with logical axis names."""
  tokens = jnp.ones((1, 8), jnp.int32)

  def init(key):
    params = model.init(key, tokens, tokens, train=False)["params"]
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=optimizer.init(params))

  return init


def create_train_state(
    model: Transformer, optimizer: optax.GradientTransformation, mesh, seed: int
) -> tuple[TrainState, Any]:
  """Initialises the state directly into its shardings on `mesh`.

  Returns:
    (state, state_shardings).
  """
  init = initial_state_fn(model, optimizer)
  init_key = jax.random.fold_in(jax.random.key(seed), 0)
  shardings = parallel.logical_shardings(jax.eval_shape(init, init_key), mesh)
  state = jax.jit(lambda key: nn.unbox(init(key)), out_shardings=shardings)(init_key)
  return state, shardings


# --- Loss and steps ----------------------------------------------------------------


def _decoder_inputs(batch: Batch) -> dict[str, jax.Array]:
  """The model's keyword inputs for a (possibly packed) batch."""
  target_positions = batch.get("target_positions")
  return dict(
      src_tokens=batch["src_tokens"],
      target_input_tokens=shift_right(batch["target_tokens"], target_positions),
      src_segment_ids=batch.get("src_segment_ids"),
      target_segment_ids=batch.get("target_segment_ids"),
      src_positions=batch.get("src_positions"),
      target_positions=target_positions,
  )


def loss_sums(
    params, batch: Batch, model: Transformer, label_smoothing: float, train: bool, dropout_key
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Summed smoothed loss over non-PAD target tokens, plus summed NLL and the count."""
  rngs = {"dropout": dropout_key} if train else {}
  logits = model.apply({"params": params}, **_decoder_inputs(batch), train=train, rngs=rngs)
  smoothed, nll = token_losses(logits, batch["target_tokens"], label_smoothing)
  weights = (batch["target_tokens"] != PAD_ID).astype(jnp.float32)
  loss_sum = jnp.sum(smoothed * weights)
  return loss_sum, dict(loss_sum=loss_sum, nll_sum=jnp.sum(nll * weights), tokens=jnp.sum(weights))


def _micro_batches(batch: Batch, count: int) -> Batch:
  """[B, ...] -> [count, B/count, ...]; micro-batch j takes rows j, j+count, ...

  Interleaved rows keep every micro-batch spread evenly over the batch shards.
  """
  return jax.tree.map(
      lambda x: x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1), batch
  )


def train_step(
    state: TrainState, batch: Batch, *, model, optimizer, config, schedule
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from `batch` (accumulated over micro-batches if asked).

  Gradients are of the loss summed over all target tokens of the global batch,
  divided by their count once, so k micro-batches equal one batch exactly.
  """
  dropout_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 1), state.step)
  grad_fn = jax.grad(loss_sums, has_aux=True)
  loss_kwargs = dict(model=model, label_smoothing=config.label_smoothing, train=True)
  steps = config.gradient_accumulation_steps
  if steps == 1:
    grads, sums = grad_fn(state.params, batch, dropout_key=dropout_key, **loss_kwargs)
  else:
    def accumulate(carry, micro):
      index, micro_batch = micro
      grads, sums = grad_fn(
          state.params, micro_batch, dropout_key=jax.random.fold_in(dropout_key, index), **loss_kwargs
      )
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    zeros = jax.tree.map(jnp.zeros_like, (state.params, dict(loss_sum=0.0, nll_sum=0.0, tokens=0.0)))
    (grads, sums), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(steps), _micro_batches(batch, steps))
    )
  tokens = jnp.maximum(sums["tokens"], 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  new_state = state.replace(
      step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
  )
  loss = sums["loss_sum"] / tokens
  metrics = dict(
      loss=loss,
      nll=sums["nll_sum"] / tokens,
      perplexity=jnp.exp(sums["nll_sum"] / tokens),
      learning_rate=schedule(state.step),
      grad_norm=optax.tree.norm(grads),
      tokens=sums["tokens"],
  )
  return new_state, metrics


def eval_step(params, batch: Batch, *, model, label_smoothing: float) -> dict[str, jax.Array]:
  """Summed loss, NLL and token count over one evaluation batch."""
  _, sums = loss_sums(params, batch, model, label_smoothing, train=False, dropout_key=None)
  return sums


def compile_steps(model, optimizer, config, mesh, state_shardings) -> tuple[Callable, Callable]:
  """Jitted (train_step, eval_step) with explicit shardings and a donated state."""
  batch_sharding = parallel.batch_sharding(mesh)
  replicated = parallel.replicated(mesh)
  jitted_train = jax.jit(
      functools.partial(
          train_step, model=model, optimizer=optimizer, config=config, schedule=make_schedule(config)
      ),
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, replicated),
      donate_argnums=0,
  )
  jitted_eval = jax.jit(
      functools.partial(eval_step, model=model, label_smoothing=config.label_smoothing),
      in_shardings=(state_shardings.params, batch_sharding),
      out_shardings=replicated,
  )

  def in_mesh(fn):
    @functools.wraps(fn)
    def wrapped(*args):
      with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        return fn(*args)

    return wrapped

  return in_mesh(jitted_train), in_mesh(jitted_eval)


def evaluate_loss(eval_fn, params, batches, mesh, label_smoothing, vocab_size) -> dict[str, float]:
  """Dev-set loss and perplexity, over every pair of the split."""
  totals = dict(loss_sum=0.0, nll_sum=0.0, tokens=0.0)
  for batch in batches:
    sums = jax.device_get(eval_fn(params, parallel.global_batch(batch, mesh)))
    totals = {k: totals[k] + float(sums[k]) for k in totals}
  tokens = max(totals["tokens"], 1.0)
  nll = totals["nll_sum"] / tokens
  return dict(
      loss=totals["loss_sum"] / tokens,
      loss_above_entropy=totals["loss_sum"] / tokens - smoothing_entropy(vocab_size, label_smoothing),
      nll=nll,
      perplexity=float(np.exp(nll)),
  )


def make_translator(config, model, params, mesh):
  """A Translator with the config's §6.1 search settings."""
  from transformer_jax.decode import DecodeOptions, Translator

  options = DecodeOptions(beam_size=config.beam_size, alpha=config.length_penalty,
                          max_extra_len=config.max_decode_extra_len)
  return Translator(model, params, mesh, options)


def dev_bleu(config, translator, params, data) -> float:
  """sacreBLEU of the first `config.eval_bleu_sentences` dev sentences."""
  from transformer_jax.decode import translate_texts
  from transformer_jax.metrics.bleu import sacre_bleu

  sources, references = data.texts(data.eval_split)
  count = config.eval_bleu_sentences
  translator.params = params  # The jitted search takes params as an argument: no recompile.
  hypotheses = translate_texts(translator, data.tokenizer, sources[:count], config.model.max_len)
  return sacre_bleu(hypotheses, references[:count])[0]


# --- Preemption ------------------------------------------------------------------------


class PreemptionWatcher:
  """Turns SIGTERM (Colab / TPU preemption) into a flag the loop checks each step."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def close(self):
    signal.signal(signal.SIGTERM, self._previous)


def model_config_dict(config) -> dict:
  """The resolved model section as a plain dict (saved with checkpoints)."""
  return json.loads(json.dumps(dataclass_dict(ModelConfig.from_config(config.model))))


def dataclass_dict(value) -> dict:
  import dataclasses

  return dataclasses.asdict(value)


# --- The loop --------------------------------------------------------------------------

MODEL_BATCH_KEYS = (
    "src_tokens", "target_tokens", "src_segment_ids", "target_segment_ids",
    "src_positions", "target_positions",
)


def model_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Only the arrays the model reads (drops e.g. eval's example_ids)."""
  return {k: v for k, v in batch.items() if k in MODEL_BATCH_KEYS}


def prepare_run(config, workdir: str):
  """Data, tokenizer, mesh, model and optimizer for `config` (shared by train and decode)."""
  from transformer_jax.configs import validate_config
  from transformer_jax.data.pipeline import load_dataset

  validate_config(config)
  mesh = parallel.make_mesh(config.mesh)
  parallel.log_topology(mesh)
  data = load_dataset(config.data)
  with config.unlocked():
    config.model.vocab_size = data.tokenizer.vocab_size  # The model follows the tokenizer.
  model = Transformer(config.model)
  return mesh, data, model


def train_and_evaluate(config, workdir: str) -> TrainState:
  """Trains (or resumes) to `config.num_train_steps`; returns the final state."""
  from transformer_jax.metric_writers import MetricsWriter
  from transformer_jax.model_info import format_counts, parameter_counts

  is_main = jax.process_index() == 0
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --workdir={workdir} ({e.strerror}); "
                    "choose a writable folder") from None
  mesh, data, model = prepare_run(config, workdir)
  shards = parallel.batch_shards(mesh)
  optimizer = make_optimizer(config)
  state, state_shardings = create_train_state(model, optimizer, mesh, config.seed)
  if is_main:
    print("parameters:\n" + format_counts(parameter_counts(state.params)), flush=True)
    logging.info("pairs per split: %s; filtered from train: %s", data.split_sizes, data.filtered)

  manager = checkpoints.make_manager(
      checkpoints.checkpoint_dir(workdir), config.keep_checkpoints, config.async_checkpoints
  )
  train_iter = data.train_iterator(
      shards * config.gradient_accumulation_steps, jax.process_index(), jax.process_count()
  )
  writer = MetricsWriter(workdir, config.num_train_steps)
  model_dict = model_config_dict(config)

  def check_meta(meta: dict) -> None:  # Before reading the state: a clear error, not Orbax's.
    saved_model = dataclass_dict(ModelConfig.from_config(meta["config"]["model"]))  # Resolved too.
    checkpoints.check_compatible(saved_model, model_dict, workdir)
    if meta.get("tokenizer_sha256") != data.tokenizer.sha256:
      raise UserError(
          f"the tokenizer does not match the checkpoint in {workdir} (sha256 "
          f"{data.tokenizer.sha256[:12]} vs {str(meta.get('tokenizer_sha256'))[:12]}); "
          "use the config the run was started with, or a new --workdir"
      )

  restored = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(state), check_meta=check_meta, set_aside_unreadable=True
  )
  if restored is not None:
    state, data_state, meta = restored
    train_iter.set_state(data_state)
    logging.info("resumed from step %d", int(state.step))
  elif is_main:
    data.tokenizer.save_copy(os.path.join(workdir, "tokenizer.model"))
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  # Rows a killed run logged after its last checkpoint (or before its first) are redone.
  writer.truncate_after(int(state.step))

  meta = dict(config=json.loads(config.to_json_best_effort()), tokenizer_sha256=data.tokenizer.sha256)
  train_fn, eval_fn = compile_steps(model, optimizer, config, mesh, state_shardings)
  start_step = int(state.step)
  preemption = PreemptionWatcher()
  translator = None  # Made at the first dev-BLEU evaluation.
  started = time.time()
  window_start, window_tokens = started, 0.0
  last_saved_step = start_step
  last_save_time = started

  def save(step):
    nonlocal last_saved_step, last_save_time
    checkpoints.save(manager, step, state, train_iter.get_state(), dict(meta, step=step))
    last_saved_step, last_save_time = step, time.time()

  previous_loss = None
  try:
    for step in range(start_step + 1, config.num_train_steps + 1):
      batch = parallel.global_batch(model_batch(next(train_iter)), mesh)
      state, metrics = train_fn(state, batch)
      # Wait for the previous step while this one runs: the device stays busy, and the host
      # is never more than a step ahead of it. Unbounded, the host queued ~20 steps (35 s of
      # the Multi30k recipe on 2 CPU cores) that a SIGTERM's save had to wait for.
      if previous_loss is not None:
        jax.block_until_ready(previous_loss)
      previous_loss = metrics["loss"]
      is_last = step == config.num_train_steps
      # Read once: a SIGTERM from here on waits a step. Every host must take the
      # same decision (a save is collective): a signal or a timer on any host counts.
      preempted, save_timer_due = parallel.any_process(
          preemption.requested, time.time() - last_save_time > 60 * config.checkpoint_every_minutes)
      checkpoint_due = (
          step % config.checkpoint_every_steps == 0 or save_timer_due or preempted or is_last
      )
      log_due = step % config.log_every_steps == 0 or is_last
      window_tokens = window_tokens + metrics["tokens"]  # Stays on device: no sync.
      if log_due or checkpoint_due:
        metrics = jax.device_get(metrics)
        if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])):
          raise NonFiniteLossError(
              f"the loss became {metrics['loss']} at step {step}; the last good checkpoint "
              f"(step {last_saved_step}) is intact; lower the learning rate or enable "
              "config.grad_clip_norm"
          )
      if log_due:
        now = time.time()
        row = dict(
            step=step, loss=metrics["loss"], perplexity=metrics["perplexity"],
            learning_rate=metrics["learning_rate"], grad_norm=metrics["grad_norm"],
            tokens_per_s=float(window_tokens) / max(now - window_start, 1e-9),
            elapsed_s=now - started,
        )
        writer.write(row)
        writer.console(dict(row, start_step=start_step))
        window_start, window_tokens = now, 0.0
      if checkpoint_due:
        save(step)
      if step % config.eval_every_steps == 0 or is_last:
        dev = evaluate_loss(
            eval_fn, state.params,
            (model_batch(b) for b in data.eval_batches(
                data.eval_split, shards, jax.process_index(), jax.process_count())),
            mesh, config.label_smoothing, config.model.vocab_size,
        )
        if config.eval_bleu_sentences > 0:
          translator = translator or make_translator(config, model, state.params, mesh)
          dev["bleu"] = dev_bleu(config, translator, state.params, data)
        writer.write(dict(step=step, **dev), prefix="eval")
        if is_main:
          logging.info("step %d dev: %s", step, dev)
      if preempted:
        logging.warning("SIGTERM: saved step %d; exiting so the job can be resumed", step)
        break
  finally:
    checkpoints.wait_until_finished(manager)
    preemption.close()
    writer.close()
  return state


# --- Command line ------------------------------------------------------------------------


def main(argv):
  from transformer_jax.errors import exit_on_user_error

  del argv
  exit_on_user_error(_main)()


def _main():
  from transformer_jax import cli

  cli.quiet_libraries()
  cli.enable_compilation_cache()
  config, workdir = cli.config_and_workdir()
  parallel.maybe_initialize_distributed(
      cli.FLAGS.coordinator_address, cli.FLAGS.num_processes, cli.FLAGS.process_id
  )
  try:
    state = train_and_evaluate(config, workdir)
  except NonFiniteLossError as e:
    raise UserError(str(e)) from None
  except OSError as e:  # A full disk or a read-only folder (metrics, tokenizer, config).
    raise UserError(f"cannot write {e.filename or workdir} ({e.strerror}); free disk space or "
                    "choose a writable --workdir; the complete checkpoints are intact") from None
  finished = int(state.step) >= config.num_train_steps  # Not after a SIGTERM.
  del state
  if config.final_eval_split and finished and jax.process_index() == 0:
    from transformer_jax.evaluate import final_report

    final_report(config, workdir)


if __name__ == "__main__":
  from absl import app

  from transformer_jax import cli

  cli.keep_freed_host_memory()
  cli.define_run_flags()
  app.run(main, flags_parser=cli.parse_flags)
