"""What the 1/√d_k scale (§3.2.1) prevents, measured: attention entropy and the query/key
gradients with and without it, for d_k from 16 to 1024, at initialisation and over training.

  python experiments/attention_scale_pitfall.py [--d_k=16,64,256,1024] [--steps=300] \
      [--out=results/attention_scale_pitfall]

At initialisation: one attention layer of the model (`layers.multi_head_attention`, one
head of d_k = d_model, Glorot-initialised projections) on unit-variance inputs of 64
tokens, 5 seeds: the mean entropy of each query's attention weights (nats; uniform over 64
keys is ln 64 = 4.16), the mean largest weight, and the norms of the loss gradient with
respect to the query and key projections (loss: the squared error of the layer's output
against a random target).

Over training: the decoder-only model of experiments/configs/length_generalisation.py
with d_model = d_k, one head a layer, 2 layers, d_ff = 2·d_model, on the generated
`reverse` problem (1..8 digits), Adam at 1e-3 with a 50-step warm-up, `--steps` steps of 64
examples; every 25 steps the training loss, the first layer's attention entropy on a fixed
batch and the gradient norms of its query and key projections.

Writes init.json, training.jsonl (one record a logged step) and pitfall.png into --out;
a rerun skips the training runs already in training.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import traverse_util

from transformer_jax.cli import common
from transformer_jax.configs import load_module
from transformer_jax.data import algorithmic
from transformer_jax.errors import exit_on_user_error
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.layers import multi_head_attention
from transformer_jax.model.precision import cpu_model
from transformer_jax.model.transformer import shift_right
from transformer_jax.tasks.algorithmic import AlgorithmicTask
from transformer_jax.tasks.rows import pair_rows

FLAGS = flags.FLAGS
flags.DEFINE_list("d_k", ["16", "64", "256", "1024"], "Query/key depths (one head of d_model = d_k).")
flags.DEFINE_integer("steps", 300, "Training steps a run.")
flags.DEFINE_string("out", "results/attention_scale_pitfall", "Output folder.")
SCALES = {"1/sqrt(d_k)": 0.0, "none": 1.0}  # config.model.attention_scale (0: the paper's).
TOKENS = 64


def entropy_and_peak(weights: jax.Array) -> tuple[float, float]:
  """Mean entropy (nats) and mean largest weight of the rows of float[..., q, k] weights."""
  weights = weights.astype(jnp.float32)
  entropy = -jnp.sum(jnp.where(weights > 0, weights * jnp.log(weights), 0.0), axis=-1)
  return float(jnp.mean(entropy)), float(jnp.mean(jnp.max(weights, axis=-1)))


def at_initialisation(d_k: int, scale: float, seed: int) -> dict:
  config = ModelConfig(vocab_size=8, d_model=d_k, d_ff=d_k, num_heads=1, attention_scale=scale)
  layer = multi_head_attention(config, "attention")
  keys = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(keys[0], (8, TOKENS, d_k))
  target = jax.random.normal(keys[1], (8, TOKENS, d_k))
  params = layer.init(keys[2], x, x, None)["params"]
  _, state = layer.apply({"params": params}, x, x, None, mutable=["intermediates"])
  entropy, peak = entropy_and_peak(jax.tree.leaves(state["intermediates"])[0])

  def loss(p):
    return 0.5 * jnp.mean(jnp.square(layer.apply({"params": p}, x, x, None) - target))

  grads = jax.grad(loss)(params)
  return dict(d_k=d_k, entropy=entropy, peak=peak,
              query_grad=float(optax.tree.norm(grads["query"])),
              key_grad=float(optax.tree.norm(grads["key"])))


def train(d_k: int, scale_name: str, steps: int) -> list[dict]:
  config = load_module(Path(__file__).parent / "configs" / "length_generalisation.py",
                       "config_length_generalisation").get_config("decoder_only")
  config.algorithmic.problem = "reverse"
  config.model.update(dict(d_model=d_k, num_heads=1, num_layers=2, d_ff=2 * d_k,
                           attention_scale=SCALES[scale_name]))
  task = AlgorithmicTask(config)
  model = task.build_model()
  params = task.init_params(model, jax.random.key(0))
  schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, min(50, steps // 5), steps)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule, 0.9, 0.98, 1e-9))
  opt_state = optimizer.init(params)
  width = config.data.max_len
  stream = algorithmic.TrainStream("reverse", 8, 64, width, width, seed=0)
  probe = next(algorithmic.TrainStream("reverse", 8, 64, width, width, seed=1))

  def loss_fn(p, batch):
    loss_sum, sums = task.loss_sums(model, p, batch, False, None)
    return loss_sum / sums["tokens"]

  @jax.jit
  def step(p, state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(p, batch)
    updates, state = optimizer.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss, grads

  probe_rows = pair_rows({k: jnp.asarray(v) for k, v in probe.items()},
                         shift_right(jnp.asarray(probe["target_tokens"])))

  @jax.jit
  def first_layer_weights(p):
    _, state = model.apply({"params": p}, probe_rows.tokens, positions=probe_rows.positions,
                           mutable=["intermediates"])
    found = traverse_util.flatten_dict(state["intermediates"], sep="/")
    return next(v for k, v in sorted(found.items()) if k.startswith("decoder_0/"))[0]

  records = []
  for index in range(1, steps + 1):
    params, opt_state, loss, grads = step(params, opt_state, next(stream))
    if index == 1 or index % 25 == 0:
      attention = grads["decoder_0"]["self_attention"]
      entropy, peak = entropy_and_peak(first_layer_weights(params))
      records.append(dict(d_k=d_k, scale=scale_name, step=index, loss=float(loss),
                          entropy=entropy, peak=peak,
                          query_grad=float(optax.tree.norm(attention["query"])),
                          key_grad=float(optax.tree.norm(attention["key"]))))
  return records


def plot(path: Path, init: list[dict], training: list[dict], provenance: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
  d_ks = sorted({r["d_k"] for r in init})
  for name in SCALES:
    rows = [r for r in init if r["scale"] == name]
    for ax, key, label in ((axes[0], "entropy", "attention entropy at init (nats)"),
                           (axes[1], "query_grad", "|∂L/∂W_q| at init")):
      means = [np.mean([r[key] for r in rows if r["d_k"] == d]) for d in d_ks]
      ax.plot(d_ks, means, marker="o", label=f"scale {name}")
      ax.set_xscale("log", base=2)
      ax.set_xlabel("d_k")
      ax.set_title(label, fontsize=9)
  axes[0].axhline(np.log(TOKENS), color="grey", ls=":", label="uniform (ln 64)")
  axes[1].set_yscale("log")
  for (d_k, name), color in zip(sorted({(r["d_k"], r["scale"]) for r in training}),
                                [f"C{i}" for i in range(20)]):
    rows = [r for r in training if (r["d_k"], r["scale"]) == (d_k, name)]
    style = "-" if name == "1/sqrt(d_k)" else "--"
    axes[2].plot([r["step"] for r in rows], [r["loss"] for r in rows], style, color=color,
                 label=f"d_k {d_k}, {name}")
    axes[3].plot([r["step"] for r in rows], [r["entropy"] for r in rows], style, color=color)
  axes[2].set_yscale("log")
  axes[2].set_title("training loss (reverse, decoder-only)", fontsize=9)
  axes[3].set_title("first layer's attention entropy in training (nats)", fontsize=9)
  for ax in axes[2:]:
    ax.set_xlabel("step")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  axes[2].legend(fontsize=6, ncol=2)
  fig.text(0.01, 0.01, provenance, fontsize=7, color="grey")
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  fig.savefig(path, dpi=90)
  plt.close(fig)


def main(argv: list[str]) -> None:
  del argv
  common.quiet_libraries()
  out = Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  d_ks = [int(d) for d in FLAGS.d_k]
  init = [dict(at_initialisation(d, scale, seed), scale=name, seed=seed)
          for d in d_ks for name, scale in SCALES.items() for seed in range(5)]
  (out / "init.json").write_text(json.dumps(init, indent=1) + "\n")
  log = out / "training.jsonl"
  training = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
  done = {(r["d_k"], r["scale"]) for r in training}
  for d in d_ks:
    for name in SCALES:
      if (d, name) in done:
        continue
      started = time.time()
      records = train(d, name, FLAGS.steps)
      with open(log, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
      training += records
      print(f"d_k {d}, scale {name}: loss {records[-1]['loss']:.4f}, entropy "
            f"{records[-1]['entropy']:.3f} after {FLAGS.steps} steps ({time.time() - started:.0f} s)",
            flush=True)
  provenance = f"{cpu_model()}, {time.strftime('%Y-%m-%d', time.gmtime())}"
  plot(out / "pitfall.png", init, training, provenance)
  print(f"wrote {out}/init.json, training.jsonl, pitfall.png")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  app.run(exit_on_user_error(main), flags_parser=common.parse_flags)
