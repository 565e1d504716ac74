"""User-facing errors: one line that says what is wrong and how to fix it."""

from __future__ import annotations

import functools
import re
import sys
from typing import Callable

import jax


class UserError(ValueError):
  """A mistake in the user's input (config, flags, files), not a bug.

  Command-line entry points print ``error: <message>`` on one line and exit
  with status 2 instead of showing a traceback.
  """


def out_of_memory_message(error: Exception) -> str | None:
  """The one-line advice for XLA's RESOURCE_EXHAUSTED, or None for any other error."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text:
    return None
  size = re.search(r"allocating (\d+) bytes", text)
  wanted = f" ({int(size.group(1)) / 2**30:.1f} GiB in one buffer)" if size else ""
  return (f"out of memory{wanted}; lower config.data.tokens_per_batch or the model's size, or "
          "for long rows set config.model.attention_impl='chunked' (O(n·block) attention)")


def exit_on_user_error(main: Callable) -> Callable:
  """Wraps an entry point so that a `UserError` (or running out of memory) is one stderr line."""

  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except UserError as e:
      message = " ".join(str(e).split())  # Always exactly one line.
      print(f"error: {message}", file=sys.stderr, flush=True)
      sys.exit(2)
    except jax.errors.JaxRuntimeError as e:
      message = out_of_memory_message(e)
      if message is None:
        raise
      print(f"error: {message}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapped
