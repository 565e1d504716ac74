"""SIGTERM (Colab or TPU preemption) as a flag the training loop reads each step."""

from __future__ import annotations

import signal


class PreemptionWatcher:
  """Turns SIGTERM into `requested = True`; `close()` restores the previous handler.

  Watchers nest. One installed over another (a sweep that trains its rows in one
  process, then the trainer's own) starts with the outer one's `requested`, so a
  SIGTERM that came while a row was starting still stops it at its first step, and
  passes each SIGTERM outwards, so the sweep learns that its trainer stopped early.
  """

  def __init__(self):
    self._previous = signal.getsignal(signal.SIGTERM)
    outer = getattr(self._previous, "__self__", None)
    self._outer = outer if isinstance(outer, PreemptionWatcher) else None
    self.requested = False
    signal.signal(signal.SIGTERM, self._handle)  # Everything _handle reads is set by now.
    if self._outer is not None:  # Read after installing: one that came meanwhile counts too.
      self.requested = self.requested or self._outer.requested

  def _handle(self, signum, frame) -> None:
    self.requested = True
    if self._outer is not None:
      self._outer._handle(signum, frame)

  def close(self) -> None:
    signal.signal(signal.SIGTERM, self._previous)
