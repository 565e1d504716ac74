"""The real train command with slow train steps, SIGTERMed when the device finishes one.

  python tests/fault_tolerance/sigterm_at_device_step.py STEP [train flags...]

Each step's loss passes through a host callback that sleeps, so the device
runs far behind a host that does not wait for it; the callback of step STEP
sends this process SIGTERM as that step finishes. A trainer that answers
within a step saves STEP or STEP + 1; one whose host had queued more steps
must finish them all first.
"""

import os
import signal
import sys
import time

import jax
import numpy as np
from jax.experimental import io_callback

from transformer_jax.cli import train
from transformer_jax.training import loop

SIGNAL_STEP = int(sys.argv.pop(1))
SECONDS_PER_STEP = 0.3
_real_compile_steps = loop.compile_steps


def _finish_step(loss, step):
  time.sleep(SECONDS_PER_STEP)
  if int(step) == SIGNAL_STEP:
    print(f"sigterm_at_device_step: SIGTERM as step {SIGNAL_STEP} finished", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
  return np.asarray(loss)


@jax.jit
def _slow_loss(loss, step):
  return io_callback(_finish_step, jax.ShapeDtypeStruct(loss.shape, loss.dtype), loss, step,
                     ordered=False)


def _compile_slow_steps(*args, **kwargs):
  train_fn, eval_fn = _real_compile_steps(*args, **kwargs)

  def slow_train_fn(state, batch):
    state, metrics = train_fn(state, batch)
    return state, dict(metrics, loss=_slow_loss(metrics["loss"], state.step))

  return slow_train_fn, eval_fn


if __name__ == "__main__":
  loop.compile_steps = _compile_slow_steps
  train.run()
