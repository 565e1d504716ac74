"""Trains (or resumes) the config's task, then runs its final report.

  python -m transformer_jax.train --config=experiments/configs/quickstart.py \
      --workdir=runs/quickstart [--config.num_train_steps=N ...]

Rerunning the same command resumes from the latest complete checkpoint.
"""

from __future__ import annotations

from absl import app

from transformer_jax import sharding
from transformer_jax.cli import common
from transformer_jax.configs import validate_config
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.tasks.registry import make_task
from transformer_jax.training.loop import NonFiniteLossError, train_and_evaluate
from transformer_jax.training.preemption import PreemptionWatcher


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  common.quiet_libraries()
  common.enable_compilation_cache()
  config, workdir = common.config_and_workdir()
  validate_config(config)  # Before anything reads it.
  sharding.use_cpu_devices(config.cpu_devices)
  flags = common.FLAGS
  sharding.maybe_initialize_distributed(flags.coordinator_address, flags.num_processes,
                                        flags.process_id)
  task = make_task(config)
  preemption = PreemptionWatcher()  # The loop's own watcher nests in it and passes SIGTERM on.
  try:
    train_and_evaluate(config, workdir, task)  # Its state is dropped: the report reads checkpoints.
  except NonFiniteLossError as e:
    raise UserError(str(e)) from None
  except OSError as e:  # A full disk or a read-only folder (metrics, tokenizer, config).
    raise UserError(f"cannot write {e.filename or workdir} ({e.strerror}); free disk space or "
                    "choose a writable --workdir; the complete checkpoints are intact") from None
  finally:
    preemption.close()
  # The loop returns before its last step (config.num_train_steps, or the fewer steps a time
  # budget chose) only after a SIGTERM, which this watcher saw too. Not after a SIGTERM, even
  # one at the last step: the rerun reports (it resumes there).
  preempted, = sharding.any_process(preemption.requested)
  if not preempted:  # Every process: restoring, averaging and decoding are collective.
    task.final_report(workdir)


def run() -> None:
  common.keep_freed_host_memory()
  common.define_run_flags()
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
