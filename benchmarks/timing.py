"""Wall-clock timing shared by the benchmark and its PyTorch reference (which runs alone)."""

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
