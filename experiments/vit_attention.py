"""A trained ViT run, drawn: its accuracy curve, and where its [CLS] token looks.

  python experiments/vit_attention.py --workdir=runs/vit_digits --out=results/vit_digits

Writes to --out:
  accuracy.png  train (each logged step's batch) and validation accuracy against step;
  attention.png for --images test images: the image, the [CLS] token's attention to each
                patch in every layer (the mean over heads), and the rollout of all layers
                (Abnar & Zuidema, 2020: the product of ½·A + ½·I over layers, which
                follows attention through the residual stream);
  result.json   the test accuracy of the latest checkpoint, with host and date.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model.precision import cpu_model
from transformer_jax.tasks.registry import load_run, make_task

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A run of config.task='image_classification'.")
flags.DEFINE_string("out", None, "Folder for accuracy.png, attention.png and result.json.")
flags.DEFINE_integer("images", 4, "Test images drawn (the first of the test split).")


def layer_attention(model, params, images: np.ndarray) -> np.ndarray:
  """float32[layers, batch, tokens, tokens]: every encoder layer's weights, mean over heads."""
  _, state = model.apply({"params": params}, images, mutable=["intermediates"])
  layers = sorted((k for k in state["intermediates"] if k.startswith("encoder_")),
                  key=lambda k: int(k.split("_")[1]))
  weights = []
  for name in layers:
    found = jax.tree.leaves(state["intermediates"][name])
    weights.append(np.asarray(found[0]).mean(axis=1))
  return np.stack(weights)


def rollout(attention: np.ndarray) -> np.ndarray:
  """[layers, batch, t, t] -> [batch, t, t]: Π over layers of ½·A + ½·I, rows renormalised."""
  tokens = attention.shape[-1]
  result = np.broadcast_to(np.eye(tokens), attention.shape[1:]).copy()
  for layer in attention:
    mixed = 0.5 * layer + 0.5 * np.eye(tokens)
    mixed /= mixed.sum(axis=-1, keepdims=True)
    result = mixed @ result
  return result


def plot_accuracy(path: Path, metrics: list[dict], provenance: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.5))
  for split, label in (("train", "train (batch)"), ("eval", "validation")):
    points = sorted((r["step"], r["accuracy"]) for r in metrics
                    if r["split"] == split and "accuracy" in r)
    if points:
      ax.plot(*zip(*points), marker="o" if split == "eval" else None, label=label)
  ax.set_xlabel("step")
  ax.set_ylabel("accuracy")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.text(0.01, 0.01, provenance, fontsize=7, color="grey")
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_attention(path: Path, images: np.ndarray, attention: np.ndarray, grid: int,
                   titles: list[str], provenance: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  layers = attention.shape[0]
  rolled = rollout(attention)
  fig, axes = plt.subplots(len(images), layers + 2, figsize=(1.9 * (layers + 2),
                                                             2.0 * len(images)), squeeze=False)
  for row, image in enumerate(images):
    panels = [(image[..., 0], titles[row], "gray_r")]
    panels += [(attention[l, row, 0, 1:].reshape(grid, grid), f"layer {l + 1}", "viridis")
               for l in range(layers)]
    panels.append((rolled[row, 0, 1:].reshape(grid, grid), "rollout", "magma"))
    for ax, (values, title, cmap) in zip(axes[row], panels):
      ax.imshow(values, cmap=cmap)
      ax.set_title(title, fontsize=8)
      ax.set_xticks([])
      ax.set_yticks([])
  fig.suptitle("[CLS] → patches (mean over heads)", fontsize=9)
  fig.text(0.01, 0.005, provenance, fontsize=7, color="grey")
  fig.tight_layout(rect=(0, 0.02, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: list[str]) -> None:
  del argv
  if not FLAGS.workdir or not FLAGS.out:
    raise UserError("--workdir (an image_classification run) and --out are required")
  common.quiet_libraries()
  run = load_run(FLAGS.workdir, expected_task="image_classification")
  task = make_task(run.config)
  if run.config.image.pooling != "cls":
    raise UserError("the run pools by the mean of its patches: it has no [CLS] token to draw; "
                    "pass a run with config.image.pooling='cls'")
  out = Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  date = time.strftime("%Y-%m-%d", time.gmtime())
  provenance = f"{cpu_model()}; drawn {date}"
  report = task.final_report(FLAGS.workdir, "test")
  images = task.data.images["test"][:FLAGS.images]
  labels = task.data.labels["test"][:FLAGS.images]
  predicted = np.argmax(np.asarray(run.model.apply({"params": run.params}, images)), axis=-1)
  attention = layer_attention(run.model, run.params, images)
  grid = images.shape[1] // run.config.image.patch_size
  titles = [f"label {y}, predicted {p}" for y, p in zip(labels, predicted)]
  plot_attention(out / "attention.png", images, attention, grid, titles, provenance)
  metrics = [json.loads(line) for line in
             (Path(FLAGS.workdir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
  plot_accuracy(out / "accuracy.png", metrics, provenance)
  dev = [r for r in metrics if r["split"] == "eval"][-1]
  result = dict(test_accuracy=report["accuracy"], test_images=int(report["images"]),
                validation_accuracy=dev["accuracy"], step=report["checkpoint_step"],
                host=cpu_model(), date=date, config=json.loads(run.config.to_json_best_effort()))
  (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
  print(f"test accuracy {report['accuracy']:.4f}; wrote {out}/accuracy.png, attention.png, "
        "result.json")


if __name__ == "__main__":
  common.keep_freed_host_memory()
  app.run(exit_on_user_error(main), flags_parser=common.parse_flags)
