"""Line-aligned parallel text files, and where the data lives.

Data is found through config `data_dir` or the environment variable
`TRANSFORMER_JAX_DATA_DIR` (never a hard-coded path):
- `<data_dir>/multi30k/{train,val,test2016}.{en,de}`: raw Multi30k;
- `<data_dir>/multi30k/tok/...`: the lowercased, tokenized variant;
- `<data_dir>/wmt-newstest-en-de/newstest201{3,4}.{en,de}`.
Prepared data (TFDS records, tokenizers, token ids) goes to config
`prepared_dir`, else `TRANSFORMER_JAX_CACHE_DIR`, else
`~/.cache/transformer_jax`, because the data folder may be read-only.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformer_jax.errors import UserError

DATA_DIR_ENV = "TRANSFORMER_JAX_DATA_DIR"
CACHE_DIR_ENV = "TRANSFORMER_JAX_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/transformer_jax"

MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test2016": 1_000}
MULTI30K_VARIANTS = ("raw", "tok")
MULTI30K_URL = "https://github.com/multi30k/dataset"
NEWSTEST_SPLITS = {"newstest2013": 3_000, "newstest2014": 3_003}
NEWSTEST_URL = "https://github.com/Helsinki-NLP/OPUS-MT-testsets"
LANGUAGES = ("en", "de")
ERRORS_MODES = ("strict", "replace")

_HOW_TO_POINT = (f"set --config.data.data_dir or {DATA_DIR_ENV} to the folder "
                 "holding {folder}/")


def resolve_data_dir(data_dir: str | None, folder: str = "multi30k") -> Path:
  """The data root: `data_dir` if given, else `$TRANSFORMER_JAX_DATA_DIR`."""
  root = data_dir or os.environ.get(DATA_DIR_ENV)
  if not root:
    raise UserError(f"no data directory given; "
                    f"{_HOW_TO_POINT.format(folder=folder)}")
  path = Path(root).expanduser()
  if not path.is_dir():
    raise UserError(f"data directory {path} does not exist; "
                    f"{_HOW_TO_POINT.format(folder=folder)}")
  return path


def resolve_prepared_dir(prepared_dir: str | None) -> Path:
  """Writable cache root: `prepared_dir`, else env, else ~/.cache/..."""
  root = prepared_dir or os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
  path = Path(root).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create the cache directory {path} ({e.strerror}); "
                    f"set --config.data.prepared_dir or {CACHE_DIR_ENV} to a "
                    "writable folder") from None
  if not os.access(path, os.W_OK):
    raise UserError(f"cache directory {path} is not writable; set "
                    f"--config.data.prepared_dir or {CACHE_DIR_ENV} to a "
                    "writable folder")
  return path


def read_lines(path: str | os.PathLike, errors: str = "strict") -> list[str]:
  """All lines of a UTF-8 file, without line terminators.

  Only '\\n' (and a '\\r' before it) ends a line, so that U+2028 and other
  Unicode separators inside a sentence cannot break the line alignment.
  `errors='replace'` turns invalid bytes into U+FFFD instead of failing.
  """
  if errors not in ERRORS_MODES:
    raise UserError(f"errors={errors!r} is not one of {ERRORS_MODES}")
  path = Path(path)
  try:
    data = path.read_bytes()
  except FileNotFoundError:
    raise UserError(f"file {path} does not exist") from None
  except IsADirectoryError:
    raise UserError(f"{path} is a directory, expected a text file") from None
  try:
    text = data.decode("utf-8", errors=errors)
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise UserError(f"{path} line {line} is not valid UTF-8 (byte "
                    f"0x{data[e.start]:02x}); fix the file or set "
                    "--config.data.replace_invalid_utf8=True to replace bad "
                    "bytes with U+FFFD") from None
  if text.startswith("\ufeff"):
    text = text[1:]  # A byte-order mark is not part of the first sentence.
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The terminator of the last line, not an empty line.
  return [l[:-1] if l.endswith("\r") else l for l in lines]


def read_parallel(source_path: str | os.PathLike,
                  target_path: str | os.PathLike,
                  errors: str = "strict") -> tuple[list[str], list[str]]:
  """(source_lines, target_lines) of two line-aligned files.

  Empty pairs are kept here; the pipeline filters and counts them.
  """
  for p in (source_path, target_path):
    if not Path(p).is_file():
      raise UserError(f"file {p} does not exist; give an existing pair of "
                      "line-aligned UTF-8 files")
  src = read_lines(source_path, errors)
  tgt = read_lines(target_path, errors)
  if len(src) != len(tgt):
    raise UserError(f"{source_path} has {len(src)} lines but {target_path} has "
                    f"{len(tgt)}; the files must be line-aligned (one "
                    "translation per line)")
  return src, tgt


def _check_langs(source_lang: str, target_lang: str) -> None:
  if {source_lang, target_lang} != set(LANGUAGES):
    raise UserError(f"source_lang={source_lang!r}, target_lang={target_lang!r}: "
                    "this dataset has English and German; use 'en' and 'de' "
                    "in either order")


def multi30k_dir(data_dir: str | None, variant: str = "raw") -> Path:
  """Folder with the Multi30k files of `variant` ('raw' or 'tok'), checked."""
  if variant not in MULTI30K_VARIANTS:
    raise UserError(f"variant={variant!r} is not one of {MULTI30K_VARIANTS}")
  folder = resolve_data_dir(data_dir, "multi30k") / "multi30k"
  if variant == "tok":
    folder = folder / "tok"
  check_multi30k_dir(folder)
  return folder


def multi30k_file_names() -> list[str]:
  return [f"{s}.{l}" for s in MULTI30K_SPLITS for l in LANGUAGES]


def check_multi30k_dir(folder: Path) -> None:
  """Raises a UserError naming the missing files and where to get them."""
  missing = [n for n in multi30k_file_names() if not (folder / n).is_file()]
  if missing:
    raise UserError(
        f"expected {', '.join(multi30k_file_names())} in {folder} (missing "
        f"{', '.join(missing)}); get them from {MULTI30K_URL} (data/task1/raw, "
        f"gunzipped; tok/ from data/task1/tok) and "
        f"{_HOW_TO_POINT.format(folder='multi30k')}")


def read_multi30k(folder: Path, split: str, source_lang: str = "en",
                  target_lang: str = "de",
                  errors: str = "strict") -> tuple[list[str], list[str]]:
  """(source_lines, target_lines) of one Multi30k split in `folder`."""
  if split not in MULTI30K_SPLITS:
    raise UserError(f"multi30k has no split {split!r}; use one of "
                    f"{list(MULTI30K_SPLITS)}")
  _check_langs(source_lang, target_lang)
  return read_parallel(folder / f"{split}.{source_lang}",
                       folder / f"{split}.{target_lang}", errors)


def newstest_dir(data_dir: str | None) -> Path:
  """`<data_dir>/wmt-newstest-en-de`, checked."""
  folder = resolve_data_dir(data_dir, "wmt-newstest-en-de") / "wmt-newstest-en-de"
  names = [f"{s}.{l}" for s in NEWSTEST_SPLITS for l in LANGUAGES]
  missing = [n for n in names if not (folder / n).is_file()]
  if missing:
    raise UserError(
        f"expected {', '.join(names)} in {folder} (missing {', '.join(missing)}); "
        f"get them from {NEWSTEST_URL} (testsets/en-de) and "
        f"{_HOW_TO_POINT.format(folder='wmt-newstest-en-de')}")
  return folder


def newstest_files(data_dir: str | None, split: str, source_lang: str = "en",
                   target_lang: str = "de") -> tuple[Path, Path]:
  """(source_path, target_path) of newstest2013 or newstest2014."""
  if split not in NEWSTEST_SPLITS:
    raise UserError(f"newstest has no split {split!r}; use one of "
                    f"{list(NEWSTEST_SPLITS)}")
  _check_langs(source_lang, target_lang)
  folder = newstest_dir(data_dir)
  return folder / f"{split}.{source_lang}", folder / f"{split}.{target_lang}"
