"""WMT14 end to end through TFDS's own `wmt14_translate/de-en` code, on files in the real formats.

No download: TFDS's download manager is handed local folders laid out like the
statmt.org archives once extracted (Europarl v7, CommonCrawl and News Commentary
v9 as line-aligned text; newstest2013 as text; newstest2014 as the SGML of
dev.tgz), so the builder's own parsers, split generators and array_record writer
prepare the corpus that `wmt14_base.py` then trains on, averages and decodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from transformer_jax.data import generated
from transformer_jax.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]

# The archive each of the builder's URLs names, and the folder that stands for it extracted.
_ARCHIVES = {"training-parallel-europarl-v7.tgz": "europarl",
             "training-parallel-commoncrawl.tgz": "commoncrawl",
             "training-parallel-nc-v9.tgz": "news-commentary", "dev.tgz": "dev"}


def _write(path: Path, lines: list[str]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join(lines), encoding="utf-8")


def _sgm(lines: list[str], set_id: str, lang: str) -> list[str]:
  """newstest2014's SGML: one <seg> a line inside <doc> elements."""
  head = [f'<srcset setid="{set_id}" srclang="any">', f'<doc sysid="ref" docid="d1" origlang="{lang}">']
  return head + [f'<seg id="{i + 1}">{line}</seg>' for i, line in enumerate(lines)] + ["</doc>", "</srcset>"]


def write_wmt14_archives(root: Path, num_train: int = 600, num_dev: int = 24,
                         num_test: int = 20) -> dict[str, list[tuple[str, str]]]:
  """Extracted WMT14 de-en archives under `root`, with toy-grammar pairs; returns the pairs."""
  pairs = generated.generate_splits(seed=3, num_train=num_train, num_eval=num_dev + num_test)
  train, held_out = pairs["train"], pairs["validation"]
  third = num_train // 3
  corpora = {"europarl/training/europarl-v7.de-en": train[:third],
             "commoncrawl/commoncrawl.de-en": train[third:2 * third],
             "news-commentary/training/news-commentary-v9.de-en": train[2 * third:]}
  for stem, part in corpora.items():
    _write(root / f"{stem}.en", [en for en, _ in part])
    _write(root / f"{stem}.de", [de for _, de in part])
  dev, test = held_out[:num_dev], held_out[num_dev:num_dev + num_test]
  _write(root / "dev/dev/newstest2013.en", [en for en, _ in dev])
  _write(root / "dev/dev/newstest2013.de", [de for _, de in dev])
  _write(root / "dev/dev/newstest2014-deen-src.de.sgm", _sgm([de for _, de in test], "newstest2014", "de"))
  _write(root / "dev/dev/newstest2014-deen-ref.en.sgm", _sgm([en for en, _ in test], "newstest2014", "en"))
  return {"train": train, "validation": dev, "test": test}


@pytest.fixture(name="wmt14_archives")
def fixture_wmt14_archives(tmp_path, monkeypatch):
  """The archives on disk, and TFDS's download manager serving them instead of statmt.org."""
  root = tmp_path / "extracted"
  pairs = write_wmt14_archives(root)
  requested = []

  def local(url: str) -> Path:
    requested.append(url)
    return root / _ARCHIVES[url.rsplit("/", 1)[1]]

  def download_and_extract(self, urls):
    del self
    if isinstance(urls, dict):
      return {name: [local(u) for u in value] if isinstance(value, (list, tuple)) else local(value)
              for name, value in urls.items()}
    return [local(u) for u in urls] if isinstance(urls, (list, tuple)) else local(urls)

  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", download_and_extract)
  monkeypatch.setattr(tfds.download.DownloadManager, "extract", lambda self, paths: paths)
  return pairs, requested


def test_wmt14_prepares_through_tfds_own_builder(wmt14_archives, tmp_path):
  from transformer_jax.data.pipeline import load_dataset

  pairs, requested = wmt14_archives
  data = load_dataset(dict(dataset="wmt14", source_lang="en", target_lang="de",
                           train_split="train", eval_split="validation", test_split="test",
                           prepared_dir=str(tmp_path / "cache"), vocab_size=300))
  assert sorted({u.rsplit("/", 1)[1] for u in requested}) == sorted(_ARCHIVES)
  assert data.split_sizes == {"train": 600, "validation": 24, "test": 20}
  # newstest2014 read from its SGML, each source with its reference (TFDS shuffles the order).
  assert sorted(zip(*data.texts("test"))) == sorted(pairs["test"])
  assert sorted(zip(*data.texts("train"))) == sorted(pairs["train"])


def test_wmt14_base_runs_end_to_end(wmt14_archives, tmp_path, capsys):
  """The base recipe at tiny width: trains, saves, averages, decodes newstest2014 with its
  beam settings, and reports the paper's BLEU and sacreBLEU."""
  from transformer_jax.configs import load_module
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.loop import train_and_evaluate

  config = load_module(REPO_ROOT / "experiments" / "configs" / "wmt14_base.py").get_config()
  # Tiny width and 2 layers (6 compile ~3x longer on 2 cores); the rest is the recipe's.
  config.model.update(dict(num_layers=2, d_model=32, d_ff=64, num_heads=2, d_k=16, d_v=16))
  # One length bucket: one train-step shape to compile, not one per bucket of the recipe's 18.
  config.data.update(dict(prepared_dir=str(tmp_path / "cache"), vocab_size=300,
                          tokens_per_batch=2048, bucket_boundaries=(256,)))
  config.num_train_steps = 10
  config.warmup_steps = 5
  config.checkpoint_every_steps = 2
  config.checkpoint_every_minutes = 60.0  # Saves on the step trigger only.
  config.eval_every_steps = 10
  config.eval_bleu_sentences = 0
  config.log_every_steps = 5
  workdir = tmp_path / "run"
  task = make_task(config)
  train_and_evaluate(config, str(workdir), task)
  scores = task.final_report(str(workdir))

  printed = capsys.readouterr().out
  assert "BLEU on test (20 sentences, the average of steps 2, 4, 6, 8, 10, beam 4, α 0.6)" in printed
  assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in printed
  saved = json.loads((workdir / "final_test.json").read_text())
  assert saved["averaged_steps"] == [2, 4, 6, 8, 10] and saved["sentences"] == 20
  assert {"sacrebleu", "paper_bleu", "chrf"} <= set(saved) and saved["references"] == "raw"
  assert saved["decoding"] == dict(method="beam", max_extra_len=50, min_length=1, beam_size=4,
                                   alpha=0.6, finish_rule="t2t", stop_rule="exact")
  assert 0.0 <= saved["paper_bleu"] <= 100.0 and scores["sacrebleu"] == saved["sacrebleu"]


def test_wmt14_offline_is_one_line(tmp_path, monkeypatch):
  from transformer_jax.data.pipeline import load_dataset

  def unreachable(self, urls):
    raise ConnectionError("statmt.org is not reachable")

  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", unreachable)
  with pytest.raises(UserError, match="preparing wmt14_translate/de-en failed.*needs the internet") as e:
    load_dataset(dict(dataset="wmt14", source_lang="en", target_lang="de",
                      train_split="train", eval_split="validation", test_split="test",
                      prepared_dir=str(tmp_path)))
  assert "\n" not in str(e.value)
