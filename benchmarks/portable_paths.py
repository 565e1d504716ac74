"""Paths in saved benchmark rows, written as another machine reads them (no flags, no JAX)."""

from __future__ import annotations

import os
import pathlib
import re

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR_VARIABLE = "TRANSFORMER_JAX_DATA_DIR"
# An absolute path: "/" then anything but whitespace (free text such as "/ idle" is left).
_ABSOLUTE_PATH = re.compile(r"^/\S+$")


def _roots() -> list[tuple[pathlib.Path, str]]:
  """(folder, what to write for it), the deepest folder first; each folder both as given
  and resolved, so a link inside the repository keeps the repository's name for it."""
  roots = [(REPO_ROOT, "")]
  data_dir = os.environ.get(DATA_DIR_VARIABLE)
  if data_dir:
    roots.append((pathlib.Path(os.path.abspath(data_dir)), f"${DATA_DIR_VARIABLE}/"))
  roots += [(root.resolve(), prefix) for root, prefix in roots]
  return sorted(roots, key=lambda root: len(root[0].parts), reverse=True)


def portable_path(value: str) -> str:
  """An absolute path under the data folder as $TRANSFORMER_JAX_DATA_DIR/..., under the
  repository relative to its root, anywhere else as .../<name>; other values unchanged."""
  if not _ABSOLUTE_PATH.match(value) or value == "/":
    return value
  given = pathlib.Path(os.path.abspath(value))
  for path in (given, given.resolve()):
    for root, prefix in _roots():
      if path.is_relative_to(root) and path != root:
        return prefix + str(path.relative_to(root))
  return f".../{given.name}"


def portable_command(args: list[str]) -> str:
  """Command-line `args` as one line, each absolute path through `portable_path`: a bare
  argument, or the value of a `--flag=value` (split at its first "=")."""
  words = []
  for arg in args:
    flag, equals, value = arg.partition("=")
    if arg.startswith("-") and equals:
      words.append(flag + equals + portable_path(value))
    else:
      words.append(portable_path(arg))
  return " ".join(words)
