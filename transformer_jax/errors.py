"""User-facing errors: one line that says what is wrong and how to fix it."""

from __future__ import annotations

import functools
import sys
from typing import Callable


class UserError(ValueError):
  """A mistake in the user's input (config, flags, files), not a bug.

  Command-line entry points print ``error: <message>`` on one line and exit
  with status 2 instead of showing a traceback.
  """


def exit_on_user_error(main: Callable) -> Callable:
  """Wraps an entry point so that a `UserError` becomes one line on stderr."""

  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except UserError as e:
      message = " ".join(str(e).split())  # Always exactly one line.
      print(f"error: {message}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapped
