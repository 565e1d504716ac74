"""Resolving a corpus and preparing it with the TFDS builders: Multi30k variants, its
checksummed download path, split names and the config's mistakes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import pytest

from transformer_jax.data import builders
from transformer_jax.data.config import resolve_data_config, split_names
from transformer_jax.data.corpus import resolve_corpus
from transformer_jax.errors import UserError


class _FakeDownloads:
  """Stands in for tfds' download manager: 'downloads' are local files."""

  def __init__(self, folder: Path | None, error: Exception | None = None):
    self.folder, self.error, self.urls = folder, error, {}

  def download_and_extract(self, urls):
    self.urls = urls
    if self.error:
      raise self.error
    return {name: self.folder / name for name in urls}


def test_multi30k_download_path_checks_sha256(data_dir, tmp_path):
  fake = _FakeDownloads(data_dir / "multi30k")
  files = builders.Multi30k._download(fake, "raw")
  assert fake.urls["train.en"].startswith("https://raw.githubusercontent.com/multi30k/")
  assert fake.urls["test2016.de"].endswith("test_2016_flickr.de.gz")
  assert files["val"]["de"] == data_dir / "multi30k" / "val.de"
  (tmp_path / "train.en").write_text("tampered\n")
  for name in ("train.de", "val.en", "val.de", "test2016.en", "test2016.de"):
    (tmp_path / name).write_bytes((data_dir / "multi30k" / name).read_bytes())
  with pytest.raises(UserError, match="train.en has sha256"):
    builders.Multi30k._download(_FakeDownloads(tmp_path), "raw")


def test_multi30k_download_failure_is_a_user_error():
  with pytest.raises(UserError, match=r"downloading it failed \(ConnectionError\)") as e:
    builders.Multi30k._download(_FakeDownloads(None, ConnectionError("offline")), "tok")
  assert "multi30k/tok" in str(e.value) and "\n" not in str(e.value)


def test_multi30k_tok_variant(data_dir, cache_dir):
  corpus = resolve_corpus(resolve_data_config({
      "dataset": "multi30k", "variant": "tok", "data_dir": str(data_dir),
      "prepared_dir": str(cache_dir), "source_lang": "de", "target_lang": "en"}))
  prepared = builders.prepare(corpus, cache_dir / "tfds")
  assert prepared.splits == {"train": 29_000, "val": 1_014, "test2016": 1_000}
  src, tgt = prepared.read("test2016")
  tok_dir = data_dir / "multi30k" / "tok"
  assert src[0] == (tok_dir / "test2016.de").read_text("utf-8").split("\n")[0]
  assert tgt[-1] == (tok_dir / "test2016.en").read_text("utf-8").split("\n")[-2]
  assert prepared.key == "multi30k-tok-1.0.0"


def test_language_and_variant_errors():
  with pytest.raises(UserError, match="'en' and 'de'"):
    resolve_corpus(resolve_data_config({"dataset": "multi30k", "source_lang": "fr"}))
  with pytest.raises(UserError, match="variant='bpe'"):
    resolve_corpus(resolve_data_config({"dataset": "multi30k", "variant": "bpe"}))


def test_default_split_names():
  assert split_names(ml_collections.ConfigDict(
      {"dataset": "multi30k", "train_split": None, "eval_split": None,
       "test_split": None})) == ("train", "val", "test2016")
  assert split_names(resolve_data_config(
      {"eval_split": "test"})) == ("train", "test", "test")


_PREPARE_GENERATED = """
import sys
from pathlib import Path
from absl import logging
from transformer_jax.data import builders
from transformer_jax.data.config import resolve_data_config
from transformer_jax.data.corpus import resolve_corpus
logging.set_verbosity(logging.INFO)
corpus = resolve_corpus(resolve_data_config({"prepared_dir": sys.argv[1],
                                             "num_generated_train": 300, "num_generated_eval": 20}))
print(builders.prepare(corpus, Path(sys.argv[1]) / "tfds").splits)
"""


def test_a_run_started_beside_another_waits_for_its_dataset(tmp_path):
  """Two runs started at once on a new cache (a sweep's two workers): the second waits
  while the first prepares, then reads what the first wrote. Unlocked, both wrote the
  dataset and one failed renaming its finished copy over the other's."""
  tfds_dir = tmp_path / "tfds"
  with builders.one_preparer(tfds_dir):
    second = subprocess.Popen([sys.executable, "-c", _PREPARE_GENERATED, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      waited, deadline = False, time.monotonic() + 240
      for line in second.stderr:  # Ends early only if the child gets past the lock.
        if "waiting for another process preparing datasets" in line:
          waited = True
          break
        assert time.monotonic() < deadline, "no wait logged in 240 s"
      assert waited, second.communicate()[1][-2000:]
      time.sleep(1.0)
      assert second.poll() is None and not list(tfds_dir.glob("generated_translation/*"))
    except BaseException:
      second.kill()
      raise
  out, err = second.communicate(timeout=300)
  assert second.returncode == 0, err[-2000:]
  assert "'train': 300" in out
