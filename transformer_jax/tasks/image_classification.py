"""Image classification with a ViT (model/vision.py) through the one trainer.

`config.image` names the images (data/images.py: scikit-learn's digits, or a folder of a
user's own), the patch size and the pooling; `config.model` is the encoder's. The dev
row is the validation split's loss and accuracy; the final report (config.final_eval_split
"test" or "validation") writes final_<split>.json with the accuracy of the latest checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.data import images
from transformer_jax.data.batching import host_slice
from transformer_jax.errors import UserError
from transformer_jax.model.vision import IMAGE_POSITIONS, POOLINGS, VisionTransformer
from transformer_jax.tasks.base import BatchIterator, Task
from transformer_jax.training.step import averages, eval_step, sum_over_batches

BATCH_KEYS = ("images", "labels")
DIGITS_SIDE = 8


def default_options() -> ml_collections.ConfigDict:
  """`config.image`: used when config.task='image_classification'."""
  return ml_collections.ConfigDict(dict(
      dataset="digits",  # One of data.images.DATASETS.
      folder="",  # image_folder: <folder>/<split>/<class>/<image>.
      image_size=0,  # image_folder: pixels a side after resizing.
      patch_size=2,  # Pixels a side of a patch.
      pooling="cls",  # "cls" (a learned [CLS] token) or "mean" (of the patches).
      batch_size=128,  # Images a training step (all hosts).
  ))


class EpochStream:
  """This host's rows of each training batch: every image once an epoch, in an order drawn
  from (seed, epoch); its position (epoch, batch) is checkpointed."""

  def __init__(self, pixels: np.ndarray, labels: np.ndarray, rows: int, seed: int,
               process_index: int, process_count: int):
    self.pixels, self.labels, self.rows, self.seed = pixels, labels, rows, seed
    self.process_index, self.process_count = process_index, process_count
    self.epoch, self.batch = 0, 0

  def __iter__(self) -> "EpochStream":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    per_epoch = len(self.labels) // self.rows
    if self.batch >= per_epoch:
      self.epoch, self.batch = self.epoch + 1, 0
    order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.labels))
    rows = order[self.batch * self.rows:(self.batch + 1) * self.rows]
    self.batch += 1
    lo, hi = host_slice(self.rows, self.process_index, self.process_count)
    return dict(images=self.pixels[rows[lo:hi]], labels=self.labels[rows[lo:hi]])

  def get_state(self) -> dict:
    return dict(epoch=self.epoch, batch=self.batch)

  def set_state(self, state: dict) -> None:
    self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class ImageClassificationTask(Task):
  """A ViT classifying `config.image`'s images; dev accuracy, a final report."""

  name = "image_classification"
  batch_keys = BATCH_KEYS
  count_unit = "img"
  has_tokenizer = False

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    options = config.image
    if options.dataset not in images.DATASETS:
      raise UserError(f"image.dataset={options.dataset!r} is not one of "
                      f"{', '.join(images.DATASETS)}")
    if options.pooling not in POOLINGS:
      raise UserError(f"image.pooling={options.pooling!r} is not one of {', '.join(POOLINGS)}")
    if config.model.positions not in IMAGE_POSITIONS:
      raise UserError(f"config.model.positions={config.model.positions!r} is not one of "
                      f"{', '.join(IMAGE_POSITIONS)} for images (sinusoidal is 2-D there); "
                      "set one of them")
    side = DIGITS_SIDE if options.dataset == "digits" else options.image_size
    if side and (options.patch_size < 1 or side % options.patch_size):
      raise UserError(f"image.patch_size={options.patch_size} does not divide the images' "
                      f"{side} pixels a side; choose a divisor of {side}")
    if options.batch_size < 1:
      raise UserError(f"image.batch_size={options.batch_size} must be at least 1")
    if config.final_eval_split not in ("", "validation", "test"):
      raise UserError(f"config.final_eval_split={config.final_eval_split!r} is not a split of "
                      "the images; set 'test', 'validation' or ''")
    if config.rdrop_alpha > 0:
      raise UserError(f"config.rdrop_alpha={config.rdrop_alpha!r} is not implemented for "
                      "image_classification; set config.rdrop_alpha=0")

  @classmethod
  def row_length(cls, config: ml_collections.ConfigDict) -> int:
    """Tokens the encoder reads: the patches, and the [CLS] token where it pools by it."""
    side = DIGITS_SIDE if config.image.dataset == "digits" else config.image.image_size
    return (side // config.image.patch_size) ** 2 + (config.image.pooling == "cls")

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    self._data: images.ImageSplits | None = None

  @property
  def data(self) -> images.ImageSplits:
    if self._data is None:
      options = self.config.image
      self._data = images.load_images(options.dataset, options.folder, options.image_size,
                                      self.config.data.prepared_dir)
    return self._data

  def build_model(self) -> VisionTransformer:
    return VisionTransformer(self.model_config, self.config.image.patch_size,
                             len(self.data.class_names), self.config.image.pooling)

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    return model.init(key, jnp.zeros((1, *self.data.image_shape), jnp.float32))["params"]

  def loss_sums(self, model, params, batch, train, dropout_key):
    rngs = {"dropout": dropout_key} if train else {}
    logits = model.apply({"params": params}, batch["images"], train=train, rngs=rngs)
    labels = batch["labels"]
    valid = (labels >= 0).astype(jnp.float32)  # -1: a row that only fills a batch.
    smoothing = self.config.label_smoothing
    targets = optax.smooth_labels(jax.nn.one_hot(jnp.maximum(labels, 0), logits.shape[-1]),
                                  smoothing)
    losses = optax.softmax_cross_entropy(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    loss_sum = jnp.sum(losses * valid)
    # "tokens" counts what the loss averages over: here, images.
    return loss_sum, dict(loss_sum=loss_sum, accuracy_sum=jnp.sum(correct * valid),
                          tokens=jnp.sum(valid))

  def recipe_rows(self) -> int:
    return int(self.config.image.batch_size)

  def batch_shapes(self, rows: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    return dict(images=((rows, *self.data.image_shape), jnp.float32),
                labels=((rows,), jnp.int32))

  def _rows(self, batch_multiple: int) -> int:
    rows = self.config.image.batch_size
    if rows % batch_multiple:
      raise UserError(f"image.batch_size={rows} does not divide over the {batch_multiple} batch "
                      f"shards; use a multiple of {batch_multiple}")
    return rows

  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int
                     ) -> BatchIterator:
    return EpochStream(self.data.images["train"], self.data.labels["train"],
                       self._rows(batch_multiple), self.config.data.seed, process_index,
                       process_count)

  def split_batches(self, split: str, rows: int, process_index: int, process_count: int
                    ) -> Iterable[dict[str, np.ndarray]]:
    """`split` once, in batches of `rows` (the last filled with label -1 rows)."""
    pixels, labels = self.data.images[split], self.data.labels[split]
    for start in range(0, len(labels), rows):
      chunk_pixels, chunk_labels = pixels[start:start + rows], labels[start:start + rows]
      fill = rows - len(chunk_labels)
      chunk_pixels = np.concatenate([chunk_pixels, np.zeros((fill, *pixels.shape[1:]),
                                                            np.float32)])
      chunk_labels = np.concatenate([chunk_labels, np.full(fill, -1, np.int32)])
      lo, hi = host_slice(rows, process_index, process_count)
      yield dict(images=chunk_pixels[lo:hi], labels=chunk_labels[lo:hi])

  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]:
    return self.split_batches("validation", self._rows(batch_multiple), process_index,
                              process_count)

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    del model, params, mesh
    means = averages(sums, np)
    return dict(loss=float(means["loss"]), accuracy=float(means["accuracy"]),
                images=float(sums["tokens"]))

  def describe(self) -> str:
    sizes = {split: len(labels) for split, labels in self.data.labels.items()}
    return (f"{self.config.image.dataset}: images {self.data.image_shape}, "
            f"{len(self.data.class_names)} classes, {sizes}")

  def checkpoint_meta(self) -> dict:
    return dict(image_dataset=self.config.image.dataset,
                image_shape=list(self.data.image_shape), classes=list(self.data.class_names))

  def final_report(self, workdir: str, split: str | None = None) -> dict | None:
    """Loss and accuracy of the latest checkpoint on `split` (default config.final_eval_split);
    printed and written to final_<split>.json."""
    split = split or self.config.final_eval_split
    if not split:
      return None
    run = self.load_run(workdir)
    step_fn = jax.jit(functools.partial(
        eval_step, loss_fn=functools.partial(self.loss_sums, run.model)))
    rows = self._rows(sharding.batch_shards(run.mesh))
    batches = self.split_batches(split, rows, jax.process_index(), jax.process_count())
    with sharding.mesh_context(run.mesh):
      totals = sum_over_batches(step_fn, run.params, batches, run.mesh, self.batch_keys)
    report = dict(split=split, checkpoint_step=run.step,
                  **self.dev_metrics(run.model, run.params, totals, run.mesh))
    if jax.process_index() == 0:
      print(f"{self.name} on {split} (step {run.step}): accuracy {report['accuracy']:.4f} "
            f"over {int(report['images'])} images, loss {report['loss']:.4f}", flush=True)
      with open(os.path.join(workdir, f"final_{split}.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
