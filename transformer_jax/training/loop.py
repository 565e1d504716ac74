"""The resumable training loop, shared by every task.

`train_and_evaluate(config, workdir, task)` trains (or resumes) to
`config.num_train_steps`: a fresh run starts from `create_train_state` (with
`config.init_from`, from another run's weights), a rerun from the latest
complete checkpoint, with the data position it saved. The config is read once,
into `LoopConfig` and `OptimizerConfig`; nothing writes into it.
The loop knows a task only through `Trainable`, which `tasks.base.Task` implements.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import sys
import time
from typing import Any, Callable, Iterable, Protocol

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.errors import UserError
from transformer_jax.model import precision
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.info import format_counts, parameter_counts
from transformer_jax.training import budget, checkpoints, compiled_step, init_from
from transformer_jax.training.config import LoopConfig
from transformer_jax.training.metric_writers import MetricsWriter
from transformer_jax.training.preemption import PreemptionWatcher
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer, make_schedule
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import compile_steps, sum_over_batches


class Trainable(Protocol):
  """What the loop asks of a task (documented in `tasks/base.py`)."""

  batch_keys: tuple[str, ...]
  count_unit: str
  model_config: ModelConfig  # With what the data decides (the vocabulary) once prepared.

  def prepare_data(self) -> None: ...
  def run_config(self) -> dict: ...
  def build_model(self) -> Any: ...
  def init_params(self, model: Any, key: jax.Array) -> Any: ...
  def loss_sums(self, model: Any, params: Any, batch: dict, train: bool,
                dropout_key: jax.Array | None) -> tuple[jax.Array, dict]: ...
  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int) -> Any: ...
  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]: ...
  def dev_metrics(self, model: Any, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]: ...
  def describe(self) -> str: ...
  def checkpoint_meta(self) -> dict: ...
  def check_checkpoint_meta(self, meta: dict, workdir: str) -> None: ...
  def write_run_files(self, workdir: str) -> None: ...
  def check_init_from(self, workdir: str) -> None: ...


class NonFiniteLossError(RuntimeError):
  """The loss became NaN or infinite."""


def model_config_dict(model_config: Any) -> dict:
  """A model section, resolved (defaults filled in), as a plain dict."""
  return json.loads(json.dumps(dataclasses.asdict(ModelConfig.from_config(model_config))))


@dataclasses.dataclass
class Run:
  """What the loop works with, set up once per process.

  `loop` and `optimizer` are replaced (never changed) when a time budget fixes the step count.
  """

  loop: LoopConfig
  optimizer: OptimizerConfig
  init_from: str
  workdir: str
  task: Trainable
  mesh: Mesh
  model: Any
  train_fn: Any
  eval_fn: Any
  manager: Any
  writer: MetricsWriter
  meta: dict  # Saved with every checkpoint.
  restored_meta: dict = dataclasses.field(default_factory=dict)  # The resumed checkpoint's.


def build_steps(loop_config: LoopConfig, optimizer_config: OptimizerConfig, task: Trainable,
                mesh: Mesh) -> tuple[Any, TrainState, Callable, Callable]:
  """The task's model, its initial state on `mesh`, and the compiled (train_step, eval_step)."""
  model = task.build_model()
  optimizer = make_optimizer(optimizer_config)
  state, state_shardings = create_train_state(
      functools.partial(task.init_params, model), optimizer, mesh, loop_config.seed)
  train_fn, eval_fn = compile_steps(
      functools.partial(task.loss_sums, model), optimizer, make_schedule(optimizer_config),
      loop_config, mesh, state_shardings)
  return model, state, train_fn, eval_fn


def set_up(config: ml_collections.ConfigDict, workdir: str, task: Trainable) -> tuple[Run, TrainState, Any]:
  """Builds mesh, data, model, state, compiled steps and writers for a validated config
  (`configs.validate_config`, which the train command runs first).

  Returns:
    (run, the initial state, this host's training batch iterator).
  """
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --workdir={workdir} ({e.strerror}); "
                    "choose a writable folder") from None
  loop_config = LoopConfig.from_config(config)
  sharding.check_cpu_devices(config.cpu_devices)
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_tensor_divides(mesh, num_heads=task.model_config.num_heads,
                                num_kv_heads=task.model_config.num_kv_heads)
  sharding.log_topology(mesh)
  task.prepare_data()
  optimizer_config = OptimizerConfig.from_config(config)
  model, state, train_fn, eval_fn = build_steps(loop_config, optimizer_config, task, mesh)
  meta = dict(config=task.run_config(), **task.checkpoint_meta())
  # An executable `precompile --workdir` saved for these devices serves its batch shape.
  train_fn = compiled_step.with_saved_step(train_fn, workdir, meta["config"], mesh)
  if jax.process_index() == 0:
    print("parameters:\n" + format_counts(parameter_counts(state.params)), flush=True)
    if config.model.matmul_dtype == "auto":
      native, reason = precision.native_bfloat16_here()
      print(f"matmul operands: {'bfloat16' if native else config.model.dtype} "
            f"(matmul_dtype='auto': {reason})", flush=True)
    logging.info("%s", task.describe())
  manager = checkpoints.make_manager(checkpoints.checkpoint_dir(workdir),
                                     loop_config.keep_checkpoints, loop_config.async_checkpoints)
  train_iter = task.train_iterator(
      sharding.batch_shards(mesh) * loop_config.gradient_accumulation_steps,
      jax.process_index(), jax.process_count())
  run = Run(loop_config, optimizer_config, config.init_from, workdir, task, mesh, model,
            train_fn, eval_fn, manager,
            MetricsWriter(workdir, loop_config.num_train_steps, unit=task.count_unit), meta)
  return run, state, train_iter


def restore_or_start(run: Run, state: TrainState, train_iter: Any) -> TrainState:
  """The latest readable checkpoint (state and data position), or a fresh run's files."""
  model_dict = model_config_dict(run.task.model_config)

  def check_meta(meta: dict) -> None:  # Before reading the state: a clear error, not Orbax's.
    checkpoints.check_compatible(model_config_dict(meta["config"]["model"]), model_dict,
                                 run.workdir)
    checkpoints.check_same_train_state(meta["config"], run.meta["config"], run.workdir)
    run.task.check_checkpoint_meta(meta, run.workdir)

  restored = checkpoints.restore_latest(
      run.manager, checkpoints.abstract_like(state), check_meta=check_meta,
      set_aside_unreadable=True)
  if restored is not None:
    state, data_state, run.restored_meta = restored
    train_iter.set_state(data_state)
    logging.info("resumed from step %d", int(state.step))
  else:
    if run.init_from:
      run.task.check_init_from(run.init_from)
      state = state.replace(params=init_from.params_from_run(state.params, run.init_from))
    if jax.process_index() == 0:
      run.task.write_run_files(run.workdir)
      with open(os.path.join(run.workdir, "config.json"), "w") as f:
        json.dump(run.meta["config"], f, indent=2)
  if jax.process_index() == 0:
    record_process_config(run, int(state.step), resumed=restored is not None)
  # Rows a killed run logged after its last checkpoint (or before its first) are redone.
  run.writer.truncate_after(int(state.step))
  return state


CONFIG_HISTORY = "config_history.jsonl"


def record_process_config(run: Run, step: int, resumed: bool) -> None:
  """Appends the config this process runs with to <workdir>/config_history.jsonl.

  config.json is written when a run starts; a resume may change keys (more
  steps, another batch), so each process start is recorded with its command
  line, host and the step it starts from.
  """
  row = dict(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), step=step, resumed=resumed,
             host=platform.node(), argv=sys.argv[1:],
             config=run.meta["config"])
  with open(os.path.join(run.workdir, CONFIG_HISTORY), "a") as f:
    f.write(json.dumps(row) + "\n")


def evaluate(run: Run, params: Any) -> dict[str, float]:
  """The task's dev row: its summed quantities over every dev example, then its metrics."""
  batches = run.task.eval_batches(sharding.batch_shards(run.mesh), jax.process_index(),
                                  jax.process_count())
  totals = sum_over_batches(run.eval_fn, params, batches, run.mesh, run.task.batch_keys)
  return run.task.dev_metrics(run.model, params, totals, run.mesh)


class Bookkeeping:
  """Per-step decisions and records: when to log, save and evaluate, and the throughput window."""

  def __init__(self, run: Run, start_step: int):
    self.run, self.start_step = run, start_step
    self.started = self.window_start = self.last_save_time = time.time()
    self.window_tokens = 0.0
    self.last_saved_step = start_step
    self.preemption = PreemptionWatcher()
    # config.train_minutes: the training time of earlier processes of this run, when steps
    # were reached, and how long each evaluation took.
    self.prior_seconds = float(run.restored_meta.get("train_seconds", 0.0))
    self.step_times: dict[int, float] = {}
    self.eval_seconds: dict[int, float] = {}

  def elapsed(self) -> float:
    """Seconds this run has trained, over every process that resumed it."""
    return self.prior_seconds + time.time() - self.started

  def after_step(self, step: int, state: TrainState, metrics: dict, train_iter: Any) -> bool:
    """Logs, checks, saves and evaluates as due after `step`; True if preempted (saved)."""
    loop = self.run.loop
    self.step_times[step] = time.time()
    # Read once: a SIGTERM from here on waits a step. Every host must take the
    # same decision (a save is collective): a signal or a timer on any host counts.
    preempted, save_timer_due = sharding.any_process(
        self.preemption.requested,
        time.time() - self.last_save_time > 60 * loop.checkpoint_every_minutes)
    evaluated = False
    if not preempted and self.budget_decision_due(step):  # Before this step's save.
      evaluated = self.fix_step_count(step, state)
    is_last = step == loop.num_train_steps
    checkpoint_due = (step % loop.checkpoint_every_steps == 0 or save_timer_due or preempted
                      or is_last)
    log_due = step % loop.log_every_steps == 0 or is_last
    self.window_tokens = self.window_tokens + metrics["tokens"]  # Stays on device: no sync.
    self.run.writer.step_done(step)
    if log_due or checkpoint_due:
      metrics = jax.device_get(metrics)
      if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])):
        kept = (f"the last good checkpoint (step {self.last_saved_step}) is intact"
                if self.last_saved_step > 0 else "no checkpoint was written yet")
        what = (f"the loss became {metrics['loss']}" if not np.isfinite(metrics["loss"]) else
                f"the gradient norm became {metrics['grad_norm']} (loss {metrics['loss']:.4f})")
        raise NonFiniteLossError(
            f"{what} at step {step}; {kept}; lower the learning rate or enable "
            "config.grad_clip_norm")
    if log_due:
      self.log(step, metrics)
    if checkpoint_due:
      checkpoints.save(self.run.manager, step, state, train_iter.get_state(),
                       dict(self.run.meta, step=step, train_seconds=self.elapsed()))
      self.last_saved_step, self.last_save_time = step, time.time()
    # After a SIGTERM the save must finish within the grace period: the resumed run
    # evaluates this step instead (`evaluate_missed`).
    if self.eval_due(step) and not preempted and not evaluated:
      self.evaluate(step, state)
    return preempted

  def budget_decision_due(self, step: int) -> bool:
    """config.train_minutes: the count is fixed at the first step from `decision_step` on
    with a few steps of this process measured after its first (which compiles)."""
    if self.run.loop.train_minutes <= 0 or "budgeted_steps" in self.run.meta:
      return False
    decision = self.decision_step()
    measured = step - self.budget_window_start()
    return step >= decision and measured >= min(10, max(decision - decision // 2, 1))

  def budget_window_start(self) -> int:
    """The first step whose time the budget's speed is measured from: halfway to the decision
    step, or this process's first step (which compiled) if it resumed later."""
    return max(self.decision_step() // 2, self.start_step + 1)

  def decision_step(self) -> int:
    return budget.decision_step(self.run.optimizer.warmup_steps, self.run.loop.num_train_steps)

  def eval_due(self, step: int) -> bool:
    loop = self.run.loop
    return step % loop.eval_every_steps == 0 or step == loop.num_train_steps

  def evaluate(self, step: int, state: TrainState) -> None:
    started = time.time()
    dev = evaluate(self.run, state.params)
    self.eval_seconds[step] = time.time() - started
    self.run.writer.write(dict(step=step, **dev), prefix="eval")
    if jax.process_index() == 0:
      logging.info("step %d dev: %s", step, dev)

  def evaluate_missed(self, state: TrainState) -> None:
    """Evaluates the step a run resumes from if it was due and has no dev row: the run was
    stopped by SIGTERM there (which saves, then skips the evaluation), or killed during it."""
    step = self.start_step
    missing = step > 0 and self.eval_due(step) and not self.run.writer.has_row(step, "eval")
    if sharding.from_process_0(missing):  # Process 0 holds the metrics; all evaluate.
      logging.info("step %d had no dev evaluation; evaluating it now", step)
      self.evaluate(step, state)

  def fix_step_count(self, step: int, state: TrainState) -> bool:
    """config.train_minutes: the most steps that fit, from the speed over the steps measured so
    far (from halfway to here, or from this process's second step; evaluations taken out),
    the evaluations' mean time (this step's evaluation is run now if none was timed yet), and
    the recompile a schedule that depends on the count needs. True if it evaluated `step`."""
    loop = self.run.loop
    evaluated = False
    if not self.eval_seconds:
      if self.eval_due(step):
        self.evaluate(step, state)
        evaluated = True
      else:  # Timed only: a row here would not be in a run told the count.
        started = time.time()
        evaluate(self.run, state.params)
        self.eval_seconds[-1] = time.time() - started
    first = self.budget_window_start()
    window_evals = sum(s for k, s in self.eval_seconds.items() if first <= k < step)
    seconds_per_step = (max(self.step_times[step] - self.step_times[first] - window_evals, 0.0)
                        / (step - first))
    seconds_per_eval = sum(self.eval_seconds.values()) / len(self.eval_seconds)
    # The first step of this process compiled it; a count-dependent schedule compiles again.
    recompile = (self.step_times[self.start_step + 1] - self.started
                 if self.run.optimizer.uses_step_count else 0.0)
    elapsed = self.elapsed()
    count = sharding.from_process_0(budget.steps_that_fit(
        60 * loop.train_minutes, elapsed + recompile, step, seconds_per_step,
        seconds_per_eval, loop.eval_every_steps, loop.num_train_steps))
    decision = dict(step=step, num_train_steps=count, train_minutes=loop.train_minutes,
                    elapsed_s=round(elapsed, 1),
                    seconds_per_step=round(seconds_per_step, 4),
                    seconds_per_eval=round(seconds_per_eval, 2), recompile_s=round(recompile, 1))
    if jax.process_index() == 0:
      print(f"train_minutes={loop.train_minutes:g}: {count} steps fit ({seconds_per_step:.3f} "
            f"s a step, {seconds_per_eval:.1f} s an evaluation, {decision['elapsed_s']:.0f} s "
            f"so far); num_train_steps set to {count}", flush=True)
      with open(os.path.join(self.run.workdir, CONFIG_HISTORY), "a") as f:
        f.write(json.dumps(dict(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), step=step,
                                budget_decision=decision)) + "\n")
    self.set_step_count(count, state)
    return evaluated

  def set_step_count(self, count: int, state: TrainState) -> None:
    """Trains to `count` steps from here on; saved with each checkpoint, kept on resume."""
    run = self.run
    run.loop = run.loop.with_step_count(count)
    run.optimizer = dataclasses.replace(run.optimizer, num_train_steps=count)
    run.meta["budgeted_steps"] = count
    run.meta["config"]["num_train_steps"] = count  # The record saved with each checkpoint.
    run.writer.total_steps = count
    if run.optimizer.uses_step_count:  # The schedule is compiled into the step.
      state_shardings = jax.tree.map(lambda x: x.sharding, state)
      run.train_fn, _ = compile_steps(
          functools.partial(run.task.loss_sums, run.model), make_optimizer(run.optimizer),
          make_schedule(run.optimizer), run.loop, run.mesh, state_shardings)

  def log(self, step: int, metrics: dict) -> None:
    now = time.time()
    averaged = {k: v for k, v in metrics.items()  # loss, and perplexity, accuracy, ...
                if k not in ("learning_rate", "grad_norm", "tokens")}
    row = dict(
        step=step, **averaged,
        learning_rate=metrics["learning_rate"], grad_norm=metrics["grad_norm"],
        tokens_per_s=float(self.window_tokens) / max(now - self.window_start, 1e-9),
        elapsed_s=now - self.started,
    )
    self.run.writer.write(row)
    self.run.writer.console(dict(row, start_step=self.start_step))
    self.window_start, self.window_tokens = now, 0.0


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, task: Trainable) -> TrainState:
  """Trains (or resumes) `task` to `config.num_train_steps`; returns the final state."""
  run, state, train_iter = set_up(config, workdir, task)
  del config  # Read once, in set_up.
  state = restore_or_start(run, state, train_iter)
  books = Bookkeeping(run, start_step=int(state.step))
  previous_loss = None
  try:
    kept = run.restored_meta.get("budgeted_steps")
    if run.loop.train_minutes > 0 and kept:
      logging.info("train_minutes: the step count fixed before, %d, is kept", kept)
      books.set_step_count(int(kept), state)
    books.evaluate_missed(state)
    step = books.start_step
    while step < run.loop.num_train_steps:  # A time budget may lower it (Bookkeeping).
      step += 1
      batch = {k: v for k, v in next(train_iter).items() if k in task.batch_keys}
      state, metrics = run.train_fn(state, sharding.global_batch(batch, run.mesh))
      # Wait for the previous step while this one runs: the device stays busy, and the host
      # is never more than a step ahead of it, so a SIGTERM's save waits for one step only
      # (unbounded, the host queued ~20 steps of the Multi30k recipe on 2 CPU cores).
      if previous_loss is not None:
        jax.block_until_ready(previous_loss)
      previous_loss = metrics["loss"]
      if books.after_step(step, state, metrics, train_iter):
        logging.warning("SIGTERM: saved step %d; exiting so the job can be resumed", step)
        break
  finally:
    checkpoints.wait_until_finished(run.manager)
    books.preemption.close()
    run.writer.close()
  return state
