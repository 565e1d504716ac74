"""TFDS builders that prepare the corpora as array_record text pairs.

No TensorFlow is needed: the builders write `file_format="array_record"`
and records are read back through `tfds.data_source` or straight from the
array_record files (`read_split`, ~20x faster than per-record decoding).

Builders (registered with TFDS under these names):
- `generated_translation`: the toy grammar of `generated.py`;
- `multi30k` (configs `raw`, `tok`): from the manual dir
  `<data_dir>/multi30k[/tok]`, or downloaded from github.com/multi30k/dataset
  (sha256-checked) where the internet is reachable;
- `plain_text`: any line-aligned file pairs named in the config (also used
  for `newstest`, from `<data_dir>/wmt-newstest-en-de`).
`wmt14` is TFDS's own `wmt14_translate/de-en`, prepared by TFDS's own WMT
code (no TensorFlow needed; tests/test_wmt14.py runs it on files in the real
formats); preparing it downloads ~1.5 GB from statmt.org. `tfds_text` is any TFDS text dataset (lm1b, c4/en), its text
field read as both sides, prepared on first use (a download).

Every record is {<lang>: bytes} with both languages ('en', 'de'), so one
prepared copy serves both translation directions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from absl import logging
import tensorflow_datasets as tfds
from array_record.python import array_record_module
from tensorflow_datasets.proto import tf_example_pb2

from transformer_jax.data import generated
from transformer_jax.data.corpus import Corpus
from transformer_jax.data import text_files
from transformer_jax.errors import UserError

_FEATURES = {"en": tfds.features.Text(), "de": tfds.features.Text()}
_DOWNLOAD_CONFIG = dict(try_download_gcs=False)

# Multi30k: canonical files and their sha256 (after gunzip), from the
# repository snapshot described in the data folder's SOURCE.md.
_M30K_RAW = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/"
_M30K_REMOTE = {"raw": {"train": "raw/train.{l}.gz", "val": "raw/val.{l}.gz",
                        "test2016": "raw/test_2016_flickr.{l}.gz"},
                "tok": {"train": "tok/train.lc.norm.tok.{l}",
                        "val": "tok/val.lc.norm.tok.{l}",
                        "test2016": "tok/test_2016_flickr.lc.norm.tok.{l}"}}
_M30K_SHA256 = {
    "raw/train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "raw/train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "raw/val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "raw/val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "raw/test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "raw/test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "tok/train.en": "08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
    "tok/train.de": "cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
    "tok/val.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "tok/val.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "tok/test2016.en": "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "tok/test2016.de": "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
}


class GeneratedConfig(tfds.core.BuilderConfig):
  """Seed and sizes of the toy corpus."""

  def __init__(self, *, seed: int = 0, num_train: int = 200_000,
               num_eval: int = 1_000):
    super().__init__(name=f"seed{seed}_train{num_train}_eval{num_eval}",
                     description="Deterministic toy English-German grammar.")
    self.seed, self.num_train, self.num_eval = seed, num_train, num_eval


class GeneratedTranslation(tfds.core.GeneratorBasedBuilder):
  """The built-in toy corpus (no download)."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [GeneratedConfig()]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(_FEATURES),
        supervised_keys=("en", "de"), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    c = self.builder_config
    splits = generated.generate_splits(c.seed, c.num_train, c.num_eval)
    return {name: self._generate_examples(pairs) for name, pairs in splits.items()}

  def _generate_examples(self, pairs):
    for i, (en, de) in enumerate(pairs):
      yield i, {"en": en, "de": de}


class Multi30k(tfds.core.GeneratorBasedBuilder):
  """Multi30k task 1 (WMT16 multimodal), English-German, 29k/1,014/1,000."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name="raw", description="Cased, untokenized."),
      tfds.core.BuilderConfig(name="tok", description="Lowercased, tokenized."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f"Put {', '.join(text_files.multi30k_file_names())} (from "
      f"{text_files.MULTI30K_URL}, data/task1/raw gunzipped) in "
      "<data_dir>/multi30k and the lc.norm.tok files, renamed the same way, "
      "in <data_dir>/multi30k/tok.")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(_FEATURES),
        supervised_keys=("en", "de"), homepage=text_files.MULTI30K_URL,
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    variant = self.builder_config.name
    folder = self._manual_folder(dl_manager, variant)
    if folder is not None:
      files = {s: {l: folder / f"{s}.{l}" for l in text_files.LANGUAGES}
               for s in text_files.MULTI30K_SPLITS}
    else:
      files = self._download(dl_manager, variant)
    return {s: self._generate_examples(f) for s, f in files.items()}

  @staticmethod
  def _manual_folder(dl_manager, variant: str) -> Path | None:
    try:
      manual = dl_manager.manual_dir
    except (AssertionError, ValueError):  # No manual dir, or an empty one.
      return None
    folder = Path(os.fspath(manual)) / ("tok" if variant == "tok" else "")
    names = text_files.multi30k_file_names()
    return folder if all((folder / n).is_file() for n in names) else None

  @staticmethod
  def _download(dl_manager, variant: str) -> dict[str, dict[str, Path]]:
    urls = {f"{s}.{l}": _M30K_RAW + path.format(l=l)
            for s, path in _M30K_REMOTE[variant].items() for l in text_files.LANGUAGES}
    try:
      paths = dl_manager.download_and_extract(urls)
    except Exception as e:  # No internet, or the repository moved.
      raise UserError(
          f"multi30k ({variant}) is not in the data directory and downloading "
          f"it failed ({type(e).__name__}); put "
          f"{', '.join(text_files.multi30k_file_names())} in "
          f"<data_dir>/multi30k{'/tok' if variant == 'tok' else ''} and set "
          f"--config.data.data_dir or {text_files.DATA_DIR_ENV}") from None
    files = {}
    for name, path in paths.items():
      path = Path(os.fspath(path))
      digest = hashlib.sha256(path.read_bytes()).hexdigest()
      if digest != _M30K_SHA256[f"{variant}/{name}"]:
        raise UserError(f"downloaded multi30k file {name} has sha256 {digest}, "
                        "not the expected one; put the files in the data "
                        "directory by hand")
      split, lang = name.split(".")
      files.setdefault(split, {})[lang] = path
    return files

  def _generate_examples(self, files: dict[str, Path]):
    # `errors` is set by prepare(): 'replace' turns bad bytes into U+FFFD.
    en, de = text_files.read_parallel(files["en"], files["de"],
                                      getattr(self, "errors", "strict"))
    for i, (e, d) in enumerate(zip(en, de)):
      yield i, {"en": e, "de": d}


class PlainTextConfig(tfds.core.BuilderConfig):
  """Splits given as {split: (en_or_source_path, de_or_target_path)}.

  The config name hashes the paths, sizes and modification times, so edited
  files are prepared again instead of read from a stale cache.
  """

  def __init__(self, *, files: dict[str, tuple[str, str]], errors: str = "strict",
               prefix: str = "files"):
    files = {s: tuple(str(Path(p).expanduser().resolve()) for p in pair)
             for s, pair in files.items()}
    stats = []
    for split, pair in sorted(files.items()):
      for p in pair:
        if not Path(p).is_file():
          raise UserError(f"{split} file {p} does not exist; give an existing "
                          "pair of line-aligned UTF-8 files")
        st = os.stat(p)
        stats.append((split, p, st.st_size, st.st_mtime_ns))
    digest = hashlib.sha256(json.dumps([stats, errors]).encode()).hexdigest()[:16]
    super().__init__(name=f"{prefix}_{digest}", description=json.dumps(files))
    self.files, self.errors = files, errors


class PlainText(tfds.core.GeneratorBasedBuilder):
  """Any line-aligned source/target files; records are {'en', 'de'}.

  For a language pair other than English-German, 'en' holds the source
  file's line and 'de' the target's.
  """

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = []

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(_FEATURES),
        supervised_keys=("en", "de"), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    c = self.builder_config
    return {s: self._generate_examples(pair, c.errors) for s, pair in c.files.items()}

  def _generate_examples(self, pair, errors):
    src, tgt = text_files.read_parallel(pair[0], pair[1], errors)
    for i, (s, t) in enumerate(zip(src, tgt)):
      yield i, {"en": s, "de": t}


@dataclasses.dataclass
class PreparedDataset:
  """A prepared corpus: names, split sizes and a fast reader.

  `key` names this exact data in cache file names (dataset, config, version).
  `source_feature`/`target_feature` pick the record fields of the direction.
  """

  key: str
  splits: dict[str, int]
  source_feature: str
  target_feature: str
  builder: tfds.core.DatasetBuilder

  def read(self, split: str) -> tuple[list[str], list[str]]:
    """(source_texts, target_texts) of every record of `split`, in order."""
    if split not in self.splits:
      raise UserError(f"split {split!r} does not exist; this dataset has "
                      f"{sorted(self.splits)}")
    records = read_split(self.builder, split)
    return ([r[self.source_feature] for r in records],
            [r[self.target_feature] for r in records])


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict[str, str]]:
  """All records of a split as {feature: str}, in file order."""
  try:
    return _read_array_record(builder, split)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("fast array_record read failed (%s); using tfds.data_source", e)
  source = builder.as_data_source()[split]
  out = []
  for start in range(0, len(source), 10_000):
    batch = source.__getitems__(list(range(start, min(start + 10_000, len(source)))))
    out.extend({k: v.decode("utf-8") for k, v in r.items()} for r in batch)
  return out


def _read_array_record(builder, split: str) -> list[dict[str, str]]:
  # Records are tf.train.Example protos; parsing them with upb directly
  # avoids TFDS's per-record Python decoding (~50 us each).
  parse = tf_example_pb2.Example.FromString
  info = builder.info.splits[split]
  out = []
  for path in info.filepaths:
    reader = array_record_module.ArrayRecordReader(os.fspath(path))
    try:
      for rec in reader.read_all():
        feats = parse(rec).features.feature
        out.append({k: feats[k].bytes_list.value[0].decode("utf-8")
                    for k in ("en", "de")})
    finally:
      reader.close()
  if len(out) != info.num_examples:
    raise ValueError(f"read {len(out)} records, expected {info.num_examples}")
  return out


def prepare_builder(builder: tfds.core.DatasetBuilder, **download_config) -> None:
  """Writes `builder`'s splits as array_record files, unless they are there already."""
  if not builder.is_prepared():
    logging.info("preparing %s/%s in %s", builder.name,
                 builder.builder_config.name if builder.builder_config else "",
                 builder.data_dir)
    builder.download_and_prepare(
        file_format="array_record",
        download_config=tfds.download.DownloadConfig(**_DOWNLOAD_CONFIG,
                                                     **download_config))


@contextlib.contextmanager
def one_preparer(tfds_dir: Path) -> Iterator[None]:
  """Holds an exclusive lock on `tfds_dir` (a `.prepare.lock` file in it) for the body.

  Two processes that start at once on a new cache (a sweep's workers, the hosts of a
  pod sharing a disk) would otherwise both write a dataset and one would fail on
  renaming its finished copy; with the lock the second waits, then finds it prepared.
  A cache folder that cannot be written is used as it is, without a lock.
  """
  try:
    tfds_dir.mkdir(parents=True, exist_ok=True)
    handle = open(tfds_dir / ".prepare.lock", "a")
  except OSError:
    yield
    return
  with handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info("waiting for another process preparing datasets in %s", tfds_dir)
      fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as e:  # A file system without locks (some network mounts).
      logging.warning("cannot lock %s (%s); preparing without a lock", tfds_dir, e.strerror)
      yield
      return
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(corpus: Corpus, tfds_dir: Path) -> PreparedDataset:
  """Prepares (once, one process at a time) the resolved `corpus` in `tfds_dir` as
  array_record files."""
  with one_preparer(tfds_dir):
    return _prepare_corpus(corpus, tfds_dir)


def _prepare_corpus(corpus: Corpus, tfds_dir: Path) -> PreparedDataset:
  if corpus.name == "generated_translation":
    config = GeneratedConfig(seed=corpus.seed, num_train=corpus.num_generated_train,
                             num_eval=corpus.num_generated_eval)
    if config.name == GeneratedTranslation.BUILDER_CONFIGS[0].name:
      config = config.name  # TFDS refuses a new object named like a listed one.
    builder = GeneratedTranslation(config=config, data_dir=os.fspath(tfds_dir),
                                   file_format="array_record")
    prepare_builder(builder)
  elif corpus.name == "multi30k":
    builder = Multi30k(config=corpus.variant, data_dir=os.fspath(tfds_dir),
                       file_format="array_record")
    builder.errors = corpus.errors
    if not builder.is_prepared():
      prepare_builder(builder, manual_dir=corpus.manual_dir)
  elif corpus.name == "wmt14":
    builder = _wmt14_builder(tfds_dir)
  elif corpus.name == "tfds_text":
    builder = _tfds_text_builder(corpus.tfds_name, corpus.target_feature, tfds_dir)
  else:  # newstest, plain_text: the files the corpus names.
    builder = PlainText(config=PlainTextConfig(files=corpus.files, errors=corpus.errors,
                                               prefix=corpus.name),
                        data_dir=os.fspath(tfds_dir), file_format="array_record")
    prepare_builder(builder)
  splits = {s: info.num_examples for s, info in builder.info.splits.items()}
  key = f"{builder.name}-{builder.builder_config.name}-{builder.version}"
  if corpus.name == "tfds_text":  # Which text field: another field is other data.
    key += f"-{corpus.target_feature}"
  return PreparedDataset(key=key, splits=splits, source_feature=corpus.source_feature,
                         target_feature=corpus.target_feature, builder=builder)


def _tfds_text_builder(name: str, feature: str, tfds_dir: Path) -> tfds.core.DatasetBuilder:
  """A TFDS text dataset (e.g. lm1b), prepared once as array_record; `feature` is its text."""
  try:
    builder = tfds.builder(name, data_dir=os.fspath(tfds_dir), file_format="array_record")
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"data.tfds_name={name!r} is not a TFDS dataset ({type(e).__name__}); "
                    "name one such as lm1b or c4/en") from None
  if feature not in builder.info.features:
    raise UserError(f"{name} has no feature {feature!r}; set data.tfds_text_feature to one of "
                    f"{', '.join(builder.info.features)}")
  if not builder.is_prepared():
    try:
      prepare_builder(builder)
    except Exception as e:  # pylint: disable=broad-except
      first = (str(e).strip().splitlines() or [""])[0][:200]
      raise UserError(f"preparing {name} failed ({type(e).__name__}: {first}); it downloads, "
                      "so it needs the internet (and some datasets TensorFlow); offline, use "
                      "dataset='plain_text' with only plain_text.train_target") from None
  return builder


def _wmt14_builder(tfds_dir: Path) -> tfds.core.DatasetBuilder:
  # TFDS's translate package pulls in much more, needed only here.
  from tensorflow_datasets.translate import wmt14  # pylint: disable=g-import-not-at-top
  builder = wmt14.Wmt14Translate(config="de-en", data_dir=os.fspath(tfds_dir),
                                 file_format="array_record")
  if builder.is_prepared():
    return builder
  try:
    prepare_builder(builder)
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise UserError(f"preparing wmt14_translate/de-en failed ({type(e).__name__}: "
                    f"{first}); it downloads from statmt.org, so it needs the "
                    "internet; use dataset='multi30k' or 'plain_text' offline") from None
  return builder
