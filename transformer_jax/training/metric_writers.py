"""Where training metrics go: metrics.jsonl, TensorBoard and the console.

Only process 0 writes; the others get a writer that does nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

import jax
from tqdm import tqdm

from transformer_jax.training.tensorboard import EventFileWriter


class MetricsWriter:
  """Appends one JSON object per logging step to `<workdir>/metrics.jsonl`."""

  def __init__(self, workdir: str, total_steps: int, enabled: bool | None = None,
               unit: str = "tok"):
    """`unit`: what the throughput counts (a task's `count_unit`: tokens, masked tokens, pairs)."""
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.unit = unit
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.total_steps = total_steps
    self._tensorboard_dir = os.path.join(workdir, "tensorboard")
    self._tensorboard = None  # Opened at the first write, after `truncate_after`.
    self._purge_step = None
    self._bar = None  # A step bar, only when stderr is a terminal.

  def step_done(self, step: int) -> None:
    """Moves the terminal's step bar to `step` (rate and ETA); nothing off a terminal."""
    if not self.enabled or not sys.stderr.isatty():
      return
    if self._bar is None:
      self._bar = tqdm(total=self.total_steps, initial=step - 1, unit="step", file=sys.stderr,
                       dynamic_ncols=True, leave=False)
    self._bar.update(step - self._bar.n)

  def has_row(self, step: int, split: str) -> bool:
    """Whether metrics.jsonl holds a `split` ("train", "eval") row for `step` (False on
    processes that do not write)."""
    if not self.enabled or not os.path.exists(self.path):
      return False
    with open(self.path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # A half-written last line.
          continue
        if row.get("step") == step and row.get("split") == split:
          return True
    return False

  def truncate_after(self, step: int) -> None:
    """Drops rows logged after `step` (a resumed run writes them again).

    A half-written last line (the process was killed mid-write) is dropped too.
    TensorBoard is told to hide its events after `step` too: the event file
    this process opens starts with a session start at step + 1 (training/tensorboard.py:
    TensorBoard drops the earlier files' events from that step on).
    """
    if step > 0 and os.path.isdir(self._tensorboard_dir):
      self._purge_step = step + 1
    if not self.enabled or not os.path.exists(self.path):
      return
    rows = []
    with open(self.path) as f:
      for line in f:
        try:
          if json.loads(line)["step"] <= step:
            rows.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError, TypeError):
          continue
    with open(self.path + ".tmp", "w") as f:
      f.writelines(rows)
    os.replace(self.path + ".tmp", self.path)

  def write(self, row: dict[str, Any], prefix: str = "train") -> None:
    """Writes `row` (which holds "step") to every sink."""
    if not self.enabled:
      return
    row = {k: (float(v) if k != "step" else int(v)) for k, v in row.items()}
    with open(self.path, "a") as f:
      f.write(json.dumps({"split": prefix, **row}) + "\n")
    if self._tensorboard is None:
      # The suffix keeps a writer restarted within the same second (same file name
      # otherwise) from overwriting the last one's file, and sorts after it.
      self._tensorboard = EventFileWriter(self._tensorboard_dir, purge_step=self._purge_step,
                                          filename_suffix=f".{time.time_ns()}")
    self._tensorboard.add_scalars(
        {f"{prefix}/{key}": value for key, value in row.items() if key != "step"}, row["step"])
    self._tensorboard.flush()

  def console(self, row: dict[str, Any]) -> None:
    """One progress line: step/total, loss, learning rate, tokens/s and ETA."""
    if not self.enabled:
      return
    step = int(row["step"])
    remaining = (self.total_steps - step) * row["elapsed_s"] / max(step - row.get("start_step", 0), 1)
    eta = datetime.timedelta(seconds=int(remaining))
    line = (f"step {step}/{self.total_steps} | loss {row['loss']:.4f}"
            + (f" | ppl {row['perplexity']:.2f}" if "perplexity" in row else "")
            + (f" | acc {row['accuracy']:.3f}" if "accuracy" in row else "")
            + f" | lr {row['learning_rate']:.2e} | {row['tokens_per_s']:,.0f} {self.unit}/s | ETA {eta}")
    if self._bar is not None:
      self._bar.write(line, file=sys.stderr)  # Above the bar, which stays at the bottom.
    else:
      print(line, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
    if self._tensorboard is not None:
      self._tensorboard.close()
