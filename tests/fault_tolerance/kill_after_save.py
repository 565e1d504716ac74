"""The real train command, SIGKILLed right after the save of one step starts.

  python tests/fault_tolerance/kill_after_save.py STEP [train flags...]

`checkpoints.save` returns once Orbax has started its asynchronous write, so
the kill lands while that checkpoint may still be in flight (its files in a
`<step>.orbax-checkpoint-tmp-*` folder).
"""

import os
import signal
import sys

from transformer_jax.training import checkpoints
from transformer_jax.cli import train

KILL_STEP = int(sys.argv.pop(1))
_real_save = checkpoints.save


def _save_then_die(manager, step, *args, **kwargs) -> None:
  _real_save(manager, step, *args, **kwargs)
  if step == KILL_STEP:
    print(f"kill_after_save: SIGKILL after starting the save of step {step}", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
  checkpoints.save = _save_then_die
  train.run()
