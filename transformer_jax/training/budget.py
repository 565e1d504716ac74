"""Training for a time budget: `config.train_minutes`.

A 60-minute recipe fixed in steps overruns on a slower host and stops short on a faster
one (the same kind of machine varies by a fifth here). With `train_minutes > 0` the loop
measures its own speed and, once, at `decision_step` (halfway through the warm-up), sets
`num_train_steps` to the most steps that fit the budget, never more than the configured
count. Before the end of the warm-up no schedule's values depend on the step count, so the
run equals one started with `--config.num_train_steps=<the count chosen>`. The count is
saved with the checkpoint of the step that fixed it and every later one, and a resumed run
keeps it; a run stopped at or before `decision_step` without it fixes it a few measured
steps after resuming (`Bookkeeping.budget_decision_due`), and the time of earlier
processes counts (`train_seconds` in each checkpoint).

The budget covers the training loop: compiling, steps, evaluations (one is timed at the
decision if none ran yet) and checkpoints; not preparing data before it, nor the final
report after it.
"""

from __future__ import annotations

import math


def decision_step(warmup_steps: int, num_train_steps: int) -> int:
  """The step after which the count is fixed: halfway through the warm-up."""
  return max(2, min(warmup_steps, num_train_steps) // 2)


def evaluations_after(step: int, last: int, eval_every: int) -> int:
  """Dev evaluations the loop runs after `step` up to `last`: every `eval_every`, and `last`."""
  if last <= step:
    return 0
  return last // eval_every - step // eval_every + (1 if last % eval_every else 0)


def steps_that_fit(budget_s: float, elapsed_s: float, step: int, seconds_per_step: float,
                   seconds_per_eval: float, eval_every: int, most: int) -> int:
  """The largest count N in [step, most] whose remaining steps and evaluations end within
  `budget_s`, `elapsed_s` having passed at `step`."""
  left = budget_s - elapsed_s

  def cost(last: int) -> float:
    return ((last - step) * seconds_per_step
            + evaluations_after(step, last, eval_every) * seconds_per_eval)

  per_step = seconds_per_step + seconds_per_eval / eval_every
  guess = step + math.floor(max(left - seconds_per_eval, 0.0) / max(per_step, 1e-9))
  last = min(max(guess, step), most)
  while last > step and cost(last) > left:
    last -= 1
  while last < most and cost(last + 1) <= left:
    last += 1
  return last
