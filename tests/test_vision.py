"""Images as patch tokens: the patch embedding is a strided convolution, positions are the only
order a ViT sees, the digits train to a stated accuracy through the one trainer, and a
user's folder of images loads."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from transformer_jax.configs import load_module, validate_config
from transformer_jax.data import images as image_data
from transformer_jax.errors import UserError
from transformer_jax.model.vision import VisionTransformer, patches, sinusoidal_2d
from transformer_jax.tasks.image_classification import EpochStream
from transformer_jax.tasks.registry import make_task
from transformer_jax.training.loop import train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "experiments", "configs", "vit_digits.py")
SMALL = dict(num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout_rate=0.0)


def vit_config(**changes):
  config = load_module(CONFIG, "config_vit_digits").get_config()
  for key, value in changes.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


def test_the_patch_embedding_is_a_convolution_of_stride_p():
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  kernel = jax.random.normal(jax.random.key(1), (2, 2, 3, 5))
  convolved = jax.lax.conv_general_dilated(images, kernel, (2, 2), "VALID",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
  embedded = patches(images, 2) @ kernel.reshape(-1, 5)
  np.testing.assert_allclose(embedded, convolved.reshape(2, 16, 5), rtol=1e-5, atol=1e-5)


def test_2d_sinusoids_encode_the_row_in_one_half_and_the_column_in_the_other():
  encoding = np.asarray(sinusoidal_2d(3, 4, 8)).reshape(3, 4, 8)
  np.testing.assert_array_equal(encoding[:, 0, :4], encoding[:, 3, :4])  # Same row.
  np.testing.assert_array_equal(encoding[0, :, 4:], encoding[2, :, 4:])  # Same column.
  assert not np.array_equal(encoding[0, 0], encoding[1, 0])


def _shuffled_patches(images: jax.Array, order: np.ndarray) -> jax.Array:
  """The image with its 2×2 patches moved to new places in the 4×4 grid."""
  grid = images.reshape(images.shape[0], 4, 2, 4, 2, 1).transpose(0, 1, 3, 2, 4, 5)
  grid = grid.reshape(images.shape[0], 16, 2, 2, 1)[:, order].reshape(-1, 4, 4, 2, 2, 1)
  return grid.transpose(0, 1, 3, 2, 4, 5).reshape(images.shape)


@pytest.mark.parametrize("positions", ["none", "learned", "sinusoidal"])
def test_without_positions_shuffled_patches_give_the_same_logits(positions):
  model = VisionTransformer(dict(SMALL, positions=positions, norm="pre"), patch_size=2,
                            num_classes=10, pooling="mean")
  images = jax.random.uniform(jax.random.key(0), (2, 8, 8, 1))
  params = model.init(jax.random.key(1), images)["params"]
  if positions == "learned":  # Its table starts near zero: give it weight.
    params["position_embedding"] = jax.random.normal(jax.random.key(2), (16, 16))
  shuffled = _shuffled_patches(images, np.random.default_rng(0).permutation(16))
  same = np.allclose(model.apply({"params": params}, images),
                     model.apply({"params": params}, shuffled), atol=1e-5)
  assert same == (positions == "none")


def test_the_stream_visits_every_image_once_an_epoch_and_resumes():
  pixels = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
  stream = EpochStream(pixels, np.arange(10, dtype=np.int32), rows=5, seed=0, process_index=0,
                       process_count=1)
  first_epoch = np.concatenate([next(stream)["labels"] for _ in range(2)])
  assert sorted(first_epoch) == list(range(10))
  state = stream.get_state()
  following = next(stream)["labels"]
  resumed = EpochStream(pixels, np.arange(10, dtype=np.int32), 5, 0, 0, 1)
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["labels"], following)


def test_vit_learns_the_digits_through_the_trainer(tmp_path):
  """100 steps of the recipe's model reach 75% test accuracy (0.857 measured on one host)."""
  config = vit_config(num_train_steps=100, eval_every_steps=50, checkpoint_every_steps=100,
                      log_every_steps=50, **{"data.prepared_dir": os.fspath(tmp_path / "cache")})
  validate_config(config)
  task = make_task(config)
  train_and_evaluate(config, os.fspath(tmp_path), task)
  report = task.final_report(os.fspath(tmp_path))
  assert report["split"] == "test" and report["images"] == 300
  assert report["accuracy"] >= 0.75, report
  assert json.loads((tmp_path / "final_test.json").read_text()) == report


def test_the_digits_are_prepared_once_as_a_tfds_dataset(tmp_path, monkeypatch):
  """The TFDS builder writes array_record files holding scikit-learn's digits, split by the
  fixed permutation; a second load reads them back without building again."""
  from sklearn.datasets import load_digits

  splits = image_data.load_images("digits", prepared_dir=str(tmp_path))
  assert list((tmp_path / "tfds" / "digits" / "1.0.0").glob("digits-train.array_record*"))
  digits = load_digits()
  order = np.random.default_rng(0).permutation(len(digits.target))
  bounds = {"train": (0, 1197), "validation": (1197, 1497), "test": (1497, 1797)}
  for split, (lo, hi) in bounds.items():
    np.testing.assert_array_equal(splits.images[split][..., 0],
                                  digits.images[order[lo:hi]] / 16.0)
    np.testing.assert_array_equal(splits.labels[split], digits.target[order[lo:hi]])
    assert splits.images[split].dtype == np.float32 and splits.labels[split].dtype == np.int32
  assert splits.class_names == tuple("0123456789") and splits.image_shape == (8, 8, 1)

  monkeypatch.setattr(image_data.Digits, "_split_generators", lambda *_: 1 / 0)
  again = image_data.load_images("digits", prepared_dir=str(tmp_path))  # Read, not built.
  np.testing.assert_array_equal(again.images["test"], splits.images["test"])


def test_an_image_folder_loads_sorted_classes_resized(tmp_path):
  for split, count in (("train", 3), ("test", 1)):
    for name, shade in (("cat", 40), ("dog", 200)):
      folder = tmp_path / split / name
      folder.mkdir(parents=True)
      for i in range(count):
        Image.new("L", (10 + i, 12), shade).save(folder / f"{i}.png")
  splits = image_data.load_images("image_folder", os.fspath(tmp_path), image_size=8)
  assert splits.class_names == ("cat", "dog")
  assert splits.images["train"].shape == (6, 8, 8, 3)
  assert splits.labels["train"].tolist() == [0, 0, 0, 1, 1, 1]
  assert splits.images["validation"].shape == (0, 8, 8, 3)
  np.testing.assert_allclose(splits.images["test"][1], 200 / 255, rtol=1e-6)


@pytest.mark.parametrize("changes, message", [
    ({"image.patch_size": 3}, "does not divide the images' 8 pixels"),
    ({"model.positions": "rope"}, "is not one of learned, sinusoidal, none for images"),
    ({"image.pooling": "max"}, "image.pooling='max' is not one of"),
    ({"image.dataset": "mnist"}, "image.dataset='mnist' is not one of"),
    ({"final_eval_split": "dev"}, "is not a split of the images"),
])
def test_a_config_that_cannot_run_is_a_one_line_error(changes, message):
  with pytest.raises(UserError, match=message) as error:
    validate_config(vit_config(**changes))
  assert "\n" not in str(error.value)


def test_a_missing_image_folder_is_a_one_line_error(tmp_path):
  with pytest.raises(UserError, match="is not a folder"):
    image_data.load_images("image_folder", os.fspath(tmp_path / "nowhere"), 8)
  with pytest.raises(UserError, match="has no train/ folder"):
    image_data.load_images("image_folder", os.fspath(tmp_path), 8)
