"""load_dataset end to end: real Multi30k, toy corpus, plain files, errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from transformer_jax.data import builders
from transformer_jax.data import pipeline
from transformer_jax.data.config import default_data_config
from transformer_jax.data import text_files
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import UserError
from transformer_jax.special_tokens import EOS_ID, PAD_ID


def test_multi30k_splits_match_the_files(multi30k, data_dir):
  assert multi30k.split_sizes == {"train": 29_000, "val": 1_014, "test2016": 1_000}
  assert multi30k.filtered == {"empty": 0, "too_long": 0}
  folder = data_dir / "multi30k"
  for split in ("train", "val", "test2016"):
    src, ref = multi30k.texts(split)
    assert len(src) == len(ref) == text_files.MULTI30K_SPLITS[split]
    first_en = (folder / f"{split}.en").read_text("utf-8").split("\n")[0]
    first_de = (folder / f"{split}.de").read_text("utf-8").split("\n")[0]
    assert (src[0], ref[0]) == (first_en, first_de), f"{split}: first pair differs"
  val = multi30k.split("val")
  tok = multi30k.tokenizer
  assert list(val.src[:val.src_offsets[1]]) == tok.encode(multi30k.texts("val")[0][0])


def test_multi30k_batches_respect_budget_and_padding(multi30k):
  budget = multi30k.config.tokens_per_batch
  it = multi30k.train_iterator(batch_multiple=8)
  assert it.padding_fraction() < 0.15, f"padding {it.padding_fraction():.3f}"
  for _ in range(it.batches_per_epoch()):
    b = next(it)
    for key in ("src_tokens", "target_tokens"):
      rows, length = b[key].shape
      assert rows % 8 == 0 and rows * length <= budget, (key, rows, length)
    tgt = b["target_tokens"][(b["target_tokens"] != PAD_ID).any(1)]  # Not fill rows.
    last = np.where(tgt != PAD_ID, np.arange(tgt.shape[1]), -1).max(1)
    assert (tgt[np.arange(len(last)), last] == EOS_ID).all(), "rows must end with EOS"


def test_multi30k_eval_batches_cover_each_pair_once(multi30k):
  ids = []
  for b in multi30k.eval_batches("val", batch_multiple=4):
    assert len(b["example_ids"]) % 4 == 0
    pad_rows = b["example_ids"] < 0
    assert (b["src_tokens"][pad_rows] == PAD_ID).all()
    ids.extend(b["example_ids"][~pad_rows])
  assert sorted(ids) == list(range(1_014))
  second = [b["example_ids"] for b in multi30k.eval_batches("val", batch_multiple=4)]
  assert sorted(np.concatenate(second)[np.concatenate(second) >= 0]) == list(range(1_014))


def test_second_load_uses_the_caches(small_generated, cache_dir, monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("the second load must not prepare, read or train again")

  monkeypatch.setattr(builders.GeneratedTranslation, "_split_generators", fail)
  monkeypatch.setattr(builders.PreparedDataset, "read", fail)
  monkeypatch.setattr(tokenizer_lib, "train_tokenizer", fail)
  start = time.perf_counter()
  again = pipeline.load_dataset(small_generated.config.to_dict())
  assert time.perf_counter() - start < 2.0
  assert again.tokenizer.sha256 == small_generated.tokenizer.sha256
  assert again.split_sizes == small_generated.split_sizes == {
      "train": 3_000, "validation": 200, "test": 200}
  a = next(again.train_iterator(2))
  b = next(small_generated.train_iterator(2))
  assert all(np.array_equal(a[k], b[k]) for k in a)


def test_generated_packed_batches(small_generated):
  cfg = small_generated.config.to_dict()
  cfg["pack"] = True
  data = pipeline.load_dataset(cfg)
  b = next(data.train_iterator(batch_multiple=2))
  assert set(b) == {"src_tokens", "target_tokens", "src_segment_ids", "src_positions",
                    "target_segment_ids", "target_positions"}
  assert b["src_tokens"].shape[1] == cfg["max_len"]
  assert b["src_segment_ids"].max() > 1, "rows should hold several pairs"


def _write(path, lines):
  path.write_text("".join(l + "\n" for l in lines), encoding="utf-8")


def test_plain_text_filters_and_counts_empty_and_long_pairs(tmp_path):
  words = "the dog sees a cat and the cat sees a dog today".split()
  src = [" ".join(words[: 3 + i % 8]) for i in range(300)]
  tgt = [" ".join(reversed(words[: 3 + i % 8])) for i in range(300)]
  src[5], tgt[9] = "", "   "  # Two pairs with an empty side.
  src[7] = " ".join(words * 10)  # Too long for max_len=40.
  for name, lines in (("tr.src", src), ("tr.tgt", tgt), ("ev.src", src[:20]),
                      ("ev.tgt", tgt[:20])):
    _write(tmp_path / name, lines)
  data = pipeline.load_dataset({
      "dataset": "plain_text", "prepared_dir": str(tmp_path / "cache"),
      "vocab_size": 40, "max_len": 40, "tokens_per_batch": 400,
      "plain_text": {"train_source": str(tmp_path / "tr.src"),
                     "train_target": str(tmp_path / "tr.tgt"),
                     "eval_source": str(tmp_path / "ev.src"),
                     "eval_target": str(tmp_path / "ev.tgt")}})
  assert data.filtered == {"empty": 2, "too_long": 1}
  assert data.split_sizes == {"train": 300, "validation": 20}
  assert len(data.train) == 297 and len(data.split("validation")) == 20, "eval keeps all"
  assert data.texts("validation")[0][5] == ""
  # The dev loss scores what training could see: not the two pairs with an empty side
  # (decoding and BLEU still translate every line of texts()).
  ids = [i for b in data.eval_batches("validation", 1) for i in b["example_ids"] if i >= 0]
  assert sorted(ids) == [i for i in range(20) if i not in (5, 9)]


def test_plain_text_bad_files_are_user_errors(tmp_path):
  _write(tmp_path / "a.src", ["x y", "y z", "z"])
  _write(tmp_path / "a.tgt", ["x y", "y z"])
  (tmp_path / "b.src").write_bytes(b"ok\nbad \xfe here\n" + b"a b c d\n" * 20)
  _write(tmp_path / "b.tgt", ["ok", "fine"] + ["a b c d"] * 20)
  cfg = {"dataset": "plain_text", "prepared_dir": str(tmp_path / "cache"), "vocab_size": 20}
  with pytest.raises(UserError, match=r"has 3 lines but .* has 2"):
    pipeline.load_dataset({**cfg, "plain_text": {"train_source": str(tmp_path / "a.src"),
                                                 "train_target": str(tmp_path / "a.tgt")}})
  bad = {"train_source": str(tmp_path / "b.src"), "train_target": str(tmp_path / "b.tgt")}
  with pytest.raises(UserError, match=r"b.src line 2 is not valid UTF-8"):
    pipeline.load_dataset({**cfg, "plain_text": bad})
  with pytest.raises(UserError, match="set --config.data.vocab_size to at least 1"):
    pipeline.load_dataset({**cfg, "plain_text": bad, "replace_invalid_utf8": True,
                           "vocab_size": 10})
  data = pipeline.load_dataset({**cfg, "plain_text": bad, "replace_invalid_utf8": True})
  assert data.texts("train")[0][1] == "bad \ufffd here"
  with pytest.raises(UserError, match="does not exist"):
    pipeline.load_dataset({**cfg, "plain_text": {"train_source": str(tmp_path / "nope"),
                                                 "train_target": str(tmp_path / "a.tgt")}})


def test_config_errors(tmp_path, monkeypatch):
  with pytest.raises(UserError, match="unknown dataset 'wmt15'.*multi30k"):
    pipeline.load_dataset({"dataset": "wmt15"})
  with pytest.raises(UserError, match="unknown data config key 'token_per_batch'"):
    pipeline.load_dataset({"token_per_batch": 10})
  monkeypatch.delenv(text_files.DATA_DIR_ENV, raising=False)
  with pytest.raises(UserError, match=r"expected train.en, train.de.*missing"):
    pipeline.load_dataset({"dataset": "multi30k", "data_dir": str(tmp_path),
                           "prepared_dir": str(tmp_path / "cache")})
  with pytest.raises(UserError, match="train_source"):
    pipeline.load_dataset({"dataset": "plain_text", "prepared_dir": str(tmp_path)})
  assert set(default_data_config()) >= {
      "dataset", "data_dir", "prepared_dir", "variant", "source_lang", "target_lang",
      "train_split", "eval_split", "test_split", "plain_text", "num_generated_train",
      "seed", "vocab_size", "tokenizer_type", "max_len", "tokens_per_batch",
      "bucket_boundaries", "pack", "replace_invalid_utf8"}


def test_newstest_as_plain_text(data_dir, cache_dir):
  if not (data_dir / "wmt-newstest-en-de" / "newstest2014.en").is_file():
    pytest.skip("newstest files not in the data folder")
  data = pipeline.load_dataset({"dataset": "newstest", "data_dir": str(data_dir),
                                "prepared_dir": str(cache_dir), "vocab_size": 2_000,
                                "source_lang": "de", "target_lang": "en"})
  assert data.split_sizes == {"newstest2013": 3_000, "newstest2014": 3_003}
  assert len(data.split("newstest2013")) == 3_000, "eval splits are never filtered"
  src, ref = data.texts("newstest2014")
  first_de = (data_dir / "wmt-newstest-en-de" / "newstest2014.de").read_text("utf-8")
  assert src[0] == first_de.split("\n")[0], "source_lang=de must read the .de file"


def test_bpe_dropout_resegments_each_epoch_and_resumes_exactly(small_generated):
  cfg = {**small_generated.config.to_dict(), "bpe_dropout": 0.1, "pack": True}
  data = pipeline.load_dataset(cfg)
  it = data.train_iterator(batch_multiple=2)
  first, second = it.epoch_split(0), it.epoch_split(1)
  decode = lambda split, i: data.tokenizer.decode(split.tgt[split.tgt_offsets[i]:split.tgt_offsets[i + 1]])
  plain = data.train
  # The same sentences in other pieces, and other pieces again the next epoch.
  for i in range(0, len(plain), 97):
    assert decode(first, i) == decode(second, i) == decode(plain, i)
  differs = lambda a, b: sum(not np.array_equal(a.src[a.src_offsets[i]:a.src_offsets[i + 1]],
                                                b.src[b.src_offsets[i]:b.src_offsets[i + 1]])
                             for i in range(len(plain)))
  assert differs(first, plain) > len(plain) // 10 and differs(first, second) > len(plain) // 10
  assert first.tgt_lengths.sum() > plain.tgt_lengths.sum()
  # Resume across an epoch boundary in a fresh load: the same batches.
  per_epoch = it.batches_per_epoch(0)
  for _ in range(per_epoch - 3):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(6)]
  resumed = pipeline.load_dataset(cfg).train_iterator(batch_multiple=2)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
  # A state from the BPE-dropout stream does not restore into the plain one.
  plain_it = pipeline.load_dataset({**cfg, "bpe_dropout": 0.0}).train_iterator(batch_multiple=2)
  with pytest.raises(UserError, match="another data setup"):
    plain_it.set_state(state)


def test_bpe_dropout_config_errors(small_generated):
  cfg = small_generated.config.to_dict()
  with pytest.raises(UserError, match=r"bpe_dropout=1.0 must be in \[0, 1\)"):
    pipeline.load_dataset({**cfg, "bpe_dropout": 1.0})
  with pytest.raises(UserError, match="needs data.tokenizer_type='bpe', not 'unigram'"):
    pipeline.load_dataset({**cfg, "bpe_dropout": 0.1, "tokenizer_type": "unigram"})


def test_chunked_encoding_equals_encoding_all_at_once(tmp_path):
  from transformer_jax.data import batching, tokenized
  from transformer_jax.data.tokenizer import train_tokenizer

  lines = [f"Ein Hund Nummer {i} läuft über die Wiese." for i in range(50)] + [""]
  tok = train_tokenizer(lines * 4, 60, "bpe", tmp_path / "t.model")
  want_flat, want_offsets = batching.ragged(tok.encode_batch(lines))
  for chunk in (1, 7, 50, 51, 1000):
    flat, offsets = tokenized.encode_ragged(tok, lines, chunk=chunk)
    np.testing.assert_array_equal(flat, want_flat)
    np.testing.assert_array_equal(offsets, want_offsets)
    assert flat.dtype == want_flat.dtype and offsets.dtype == want_offsets.dtype
  flat, offsets = tokenized.encode_ragged(tok, [])
  assert flat.shape == (0,) and offsets.tolist() == [0]


def test_a_tokenizer_trained_on_another_split_is_another_cache_entry(small_generated):
  """A smoke run trained on the small validation split caches its tokenizer; a later run on
  train with the same vocab_size must train its own, not find the smoke run's."""
  config = dict(small_generated.config.to_dict(), train_split="validation", vocab_size=200)
  on_validation = pipeline.load_dataset(config)
  on_train = pipeline.load_dataset(dict(config, train_split="train"))
  assert on_validation.tokenizer.sha256 != on_train.tokenizer.sha256
  again = pipeline.load_dataset(config)
  assert again.tokenizer.sha256 == on_validation.tokenizer.sha256
