"""Labelled images for classification: scikit-learn's digits, or a folder of a user's own.

- `digits`: the 1,797 8×8 grey handwritten digits that scikit-learn ships inside its
  package (UCI's optdigits test set; no download), split once by a fixed permutation
  into 1,197 train, 300 validation and 300 test images. The TFDS builder `Digits`
  prepares them once as array_record files in the cache (beside the text corpora's,
  `data.prepared_dir`), read back through `tfds.data_source` (no TensorFlow);
- `image_folder`: `<root>/<split>/<class name>/<image>` (PNG, JPEG, ... as Pillow reads
  them), resized to `image_size`, classes sorted by name. Read with Pillow: TFDS's own
  `ImageFolder` decodes through TensorFlow, which the project does not install.

Pixels are float32 in [0, 1], [count, height, width, channels]; labels int32.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from transformer_jax.data import builders, text_files
from transformer_jax.errors import UserError

DATASETS = ("digits", "image_folder")
SPLITS = ("train", "validation", "test")
DIGITS_SPLIT = (1_197, 300, 300)  # train, validation, test.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


@dataclasses.dataclass(frozen=True)
class ImageSplits:
  """Every split's images float32[n, h, w, c] and labels int32[n], and the class names."""

  images: dict[str, np.ndarray]
  labels: dict[str, np.ndarray]
  class_names: tuple[str, ...]

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.images["train"].shape[1:])


def load_images(dataset: str, folder: str = "", image_size: int = 0,
                prepared_dir: str | None = None) -> ImageSplits:
  """The splits of `dataset`; a one-line UserError for a bad name or folder. The digits are
  prepared in the data cache, `prepared_dir` (`data.prepared_dir`; None: the default)."""
  if dataset == "digits":
    return _digits(text_files.resolve_prepared_dir(prepared_dir) / "tfds")
  if dataset == "image_folder":
    return _image_folder(folder, image_size)
  raise UserError(f"image.dataset={dataset!r} is not one of {', '.join(DATASETS)}")


class Digits(tfds.core.GeneratorBasedBuilder):
  """scikit-learn's 8×8 digits (pixel values 0..16), split by a fixed permutation."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
            "label": tfds.features.ClassLabel(names=[str(d) for d in range(10)])}),
        supervised_keys=("image", "label"), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    # Imported here: sklearn.datasets takes 2.6 s to import, and every command imports the
    # tasks. load_digits reads the package's own copy: no download.
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    bounds = np.cumsum((0,) + DIGITS_SPLIT)
    return {split: self._generate_examples(digits.images[order[lo:hi]], digits.target[order[lo:hi]])
            for split, lo, hi in zip(SPLITS, bounds[:-1], bounds[1:])}

  def _generate_examples(self, pixels: np.ndarray, labels: np.ndarray):
    for i, (image, label) in enumerate(zip(pixels, labels)):
      yield i, {"image": image.astype(np.uint8)[..., None], "label": int(label)}


def _digits(tfds_dir: Path) -> ImageSplits:
  builder = Digits(data_dir=str(tfds_dir), file_format="array_record")
  with builders.one_preparer(tfds_dir):
    builders.prepare_builder(builder)
  sources = builder.as_data_source()
  images, labels = {}, {}
  for split in SPLITS:
    source = sources[split]
    records = source.__getitems__(list(range(len(source))))
    images[split] = np.stack([r["image"] for r in records]).astype(np.float32) / 16.0
    labels[split] = np.array([r["label"] for r in records], np.int32)
  return ImageSplits(images, labels, tuple(builder.info.features["label"].names))


def _image_folder(folder: str, image_size: int) -> ImageSplits:
  if not folder or not os.path.isdir(folder):
    raise UserError(f"image.folder={folder!r} is not a folder; point it at <root> holding "
                    "train/<class>/*.png (and validation/, test/)")
  if image_size < 1:
    raise UserError(f"image.image_size={image_size} must be set for an image folder (pixels "
                    "a side, e.g. 32)")
  train_dir = os.path.join(folder, "train")
  if not os.path.isdir(train_dir):
    raise UserError(f"{folder} has no train/ folder; lay it out as <root>/<split>/<class>/*.png")
  class_names = tuple(sorted(d for d in os.listdir(train_dir)
                             if os.path.isdir(os.path.join(train_dir, d))))
  if len(class_names) < 2:
    raise UserError(f"{train_dir} holds {len(class_names)} class folder(s); it needs at least 2")
  images, labels = {}, {}
  for split in SPLITS:
    pixels, classes = [], []
    for label, name in enumerate(class_names):
      class_dir = os.path.join(folder, split, name)
      if not os.path.isdir(class_dir):
        continue
      for file in sorted(os.listdir(class_dir)):
        if file.lower().endswith(IMAGE_SUFFIXES):
          with Image.open(os.path.join(class_dir, file)) as image:
            image = image.convert("RGB").resize((image_size, image_size))
            pixels.append(np.asarray(image, np.float32) / 255.0)
          classes.append(label)
    if not pixels and split == "train":
      raise UserError(f"{train_dir}'s class folders hold no image ({', '.join(IMAGE_SUFFIXES)})")
    images[split] = np.stack(pixels) if pixels else np.zeros((0, image_size, image_size, 3),
                                                             np.float32)
    labels[split] = np.asarray(classes, np.int32)
  return ImageSplits(images, labels, class_names)
