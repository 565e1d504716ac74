"""SIGTERM (Colab or TPU preemption) as a flag the training loop reads each step."""

from __future__ import annotations

import signal


class PreemptionWatcher:
  """Turns SIGTERM into `requested = True`; `close()` restores the previous handler."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame) -> None:
    del signum, frame
    self.requested = True

  def close(self) -> None:
    signal.signal(signal.SIGTERM, self._previous)
