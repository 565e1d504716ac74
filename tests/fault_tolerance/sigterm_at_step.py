"""The real train command, sent SIGTERM just before the loop's bookkeeping of step STEP,
so that the loop reads the signal at exactly that step.

  python tests/fault_tolerance/sigterm_at_step.py STEP [train flags...]
"""

import os
import signal
import sys

from transformer_jax.cli import train
from transformer_jax.training import loop

SIGNAL_STEP = int(sys.argv.pop(1))
_real_after_step = loop.Bookkeeping.after_step


def _after_step(self, step, *args, **kwargs):
  if step == SIGNAL_STEP:
    os.kill(os.getpid(), signal.SIGTERM)
  return _real_after_step(self, step, *args, **kwargs)


if __name__ == "__main__":
  loop.Bookkeeping.after_step = _after_step
  train.run()
