"""Wall-clock timing shared by the benchmarks and the PyTorch reference (which also runs alone)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
  """(median, all) wall-clock seconds of `fn()`, which must block until done."""
  times = []
  for _ in range(max(1, repeats)):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


def alternate(first: Callable[[], Any], second: Callable[[], Any],
              pairs: int) -> tuple[list[float], list[float]]:
  """Times `pairs` calls of each, in the order A B B A A B ...; returns both lists of seconds.

  Paired this way, both sides see the same load on a shared host.
  """
  times: tuple[list[float], list[float]] = ([], [])
  for i in range(max(1, pairs)):
    order = (0, 1) if i % 2 == 0 else (1, 0)
    for which in order:
      start = time.perf_counter()
      (first, second)[which]()
      times[which].append(time.perf_counter() - start)
  return times
