"""Reading line-aligned files: every bad input is a one-line UserError."""

from __future__ import annotations

import pytest

from transformer_jax.data import text_files
from transformer_jax.errors import UserError


def _one_line(e: pytest.ExceptionInfo) -> str:
  message = str(e.value)
  assert "\n" not in message, f"UserError must be one line: {message!r}"
  return message


def test_reads_lines_exactly(tmp_path):
  (tmp_path / "a.en").write_bytes(b"one\r\ntwo \xe2\x80\xa8 still two\n\nfour")
  (tmp_path / "a.de").write_text("eins\nzwei\n\nvier\n", encoding="utf-8")
  src, tgt = text_files.read_parallel(tmp_path / "a.en", tmp_path / "a.de")
  assert src == ["one", "two \u2028 still two", "", "four"]
  assert tgt == ["eins", "zwei", "", "vier"]


def test_differing_line_counts_name_both_counts(tmp_path):
  (tmp_path / "a.en").write_text("1\n2\n3\n")
  (tmp_path / "a.de").write_text("1\n2\n")
  with pytest.raises(UserError) as e:
    text_files.read_parallel(tmp_path / "a.en", tmp_path / "a.de")
  message = _one_line(e)
  assert "3 lines" in message and "has 2" in message and "a.en" in message


def test_invalid_utf8_names_file_and_line_or_is_replaced(tmp_path):
  (tmp_path / "a.en").write_bytes(b"fine\nstill fine\nbad \xff byte\n")
  with pytest.raises(UserError) as e:
    text_files.read_lines(tmp_path / "a.en")
  message = _one_line(e)
  assert "a.en line 3" in message and "replace_invalid_utf8" in message
  lines = text_files.read_lines(tmp_path / "a.en", errors="replace")
  assert lines[2] == "bad \ufffd byte"


def test_missing_files(tmp_path):
  with pytest.raises(UserError) as e:
    text_files.read_parallel(tmp_path / "x.en", tmp_path / "x.de")
  assert "x.en does not exist" in _one_line(e)


def test_missing_data_dir_and_multi30k_files(tmp_path, monkeypatch):
  monkeypatch.delenv(text_files.DATA_DIR_ENV, raising=False)
  with pytest.raises(UserError) as e:
    text_files.multi30k_dir(None)
  assert text_files.DATA_DIR_ENV in _one_line(e)
  with pytest.raises(UserError) as e:
    text_files.multi30k_dir(str(tmp_path / "nowhere"))
  assert "does not exist" in _one_line(e)
  (tmp_path / "multi30k").mkdir()
  (tmp_path / "multi30k" / "train.en").write_text("x\n")
  with pytest.raises(UserError) as e:
    text_files.multi30k_dir(str(tmp_path))
  message = _one_line(e)
  for name in ("train.en", "train.de", "val.en", "test2016.de"):
    assert name in message
  assert "missing train.de" in message and "github.com/multi30k/dataset" in message
  assert "TRANSFORMER_JAX_DATA_DIR" in message


def test_data_dir_from_environment(tmp_path, monkeypatch):
  monkeypatch.setenv(text_files.DATA_DIR_ENV, str(tmp_path))
  assert text_files.resolve_data_dir(None) == tmp_path


def test_prepared_dir_resolution(tmp_path, monkeypatch):
  monkeypatch.setenv(text_files.CACHE_DIR_ENV, str(tmp_path / "env"))
  assert text_files.resolve_prepared_dir(None) == tmp_path / "env"
  assert text_files.resolve_prepared_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
