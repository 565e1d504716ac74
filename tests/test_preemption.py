"""PreemptionWatcher: SIGTERM as a flag, and watchers that nest (a sweep around a trainer)."""

from __future__ import annotations

import os
import signal

from transformer_jax.training.preemption import PreemptionWatcher


def test_nested_watchers_share_a_sigterm_and_restore_the_handler():
  received = []
  previous = signal.signal(signal.SIGTERM, lambda *_: received.append("test"))
  try:
    outer = PreemptionWatcher()
    inner = PreemptionWatcher()
    assert not inner.requested and not outer.requested
    os.kill(os.getpid(), signal.SIGTERM)
    assert inner.requested and outer.requested, "a SIGTERM the inner one took must reach out"
    inner.close()
    outer.requested = False
    os.kill(os.getpid(), signal.SIGTERM)  # Between two inner ones (a row starting).
    late = PreemptionWatcher()
    assert late.requested, "a SIGTERM before the trainer's watcher must still count"
    late.close()
    outer.close()
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == ["test"], "close() must restore the handler it replaced"
  finally:
    signal.signal(signal.SIGTERM, previous)
