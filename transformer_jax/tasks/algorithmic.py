"""Algorithmic problems (copy, reverse, sort, duplicate, addition): trained on lengths up
to L, measured by exact match at every length up to 4L.

`config.algorithmic` chooses the problem and the architecture:
- "decoder_only": one causal stack reads `source <BOS> target` as one row (positions run
  on from the source into the target) and the loss falls on the target, as in
  Kazemnejad et al. (2023); nothing attends both ways, so even without positions
  the causal mask tells tokens apart;
- "encoder_decoder": the paper's model, source into the encoder.

Exact match is measured teacher-forced: a sequence counts when the argmax at every
target position, EOS included, equals the target. By induction over positions this
is exactly when greedy decoding returns the target, at the cost of one forward pass
(tests/tasks/test_algorithmic.py checks the two agree).
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
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.data import algorithmic
from transformer_jax.data.batching import host_slice
from transformer_jax.errors import UserError
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import PAD_ID
from transformer_jax.tasks.base import BatchIterator, Task
from transformer_jax.tasks.corpus import init_one_stack
from transformer_jax.tasks.rows import pair_rows
from transformer_jax.tasks.translation import decoder_inputs, init_transformer
from transformer_jax.training.losses import loss_sums
from transformer_jax.training.step import averages

ARCHITECTURES = ("decoder_only", "encoder_decoder")
BATCH_KEYS = ("src_tokens", "target_tokens")
EVAL_ROWS = 256  # Rows of a test batch (rounded to the batch shards).


def default_options() -> ml_collections.ConfigDict:
  """`config.algorithmic`: used when config.task='algorithmic'."""
  return ml_collections.ConfigDict(dict(
      problem="copy",  # One of data.algorithmic.PROBLEMS.
      architecture="decoder_only",  # Or "encoder_decoder".
      train_max_items=8,  # L: training draws 1..L items an example.
      test_max_items=32,  # The final report measures every length 1..this.
      eval_per_length=32,  # Validation examples of each training length.
      test_per_length=100,  # Test examples of each length.
  ))


def exact_matches(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(exact bool[batch], real bool[batch]): every non-PAD target is the argmax; the row
  holds a target at all (all-PAD rows only fill a batch)."""
  not_pad = targets != PAD_ID
  right = (jnp.argmax(logits, axis=-1) == targets) | ~not_pad
  real = jnp.any(not_pad, axis=-1)
  return jnp.all(right, axis=-1) & real, real


class AlgorithmicTask(Task):
  """A generated problem of `config.algorithmic`; dev exact match, a final report by length."""

  name = "algorithmic"
  batch_keys = BATCH_KEYS
  has_tokenizer = False  # Its vocabulary is fixed: data.algorithmic.VOCAB_SIZE ids.
  sweep_split = "test"

  @classmethod
  def holds_pairs(cls, config: ml_collections.ConfigDict) -> bool:
    return config.algorithmic.architecture == "decoder_only"

  @classmethod
  def check_config(cls, config: ml_collections.ConfigDict) -> None:
    options = config.algorithmic
    problem = algorithmic.check_problem(options.problem)
    if options.architecture not in ARCHITECTURES:
      raise UserError(f"algorithmic.architecture={options.architecture!r} is not one of "
                      f"{', '.join(ARCHITECTURES)}")
    if not 1 <= options.train_max_items <= options.test_max_items:
      raise UserError(f"algorithmic.train_max_items={options.train_max_items} must be in 1.."
                      f"algorithmic.test_max_items ({options.test_max_items})")
    if min(options.eval_per_length, options.test_per_length) < 1:
      raise UserError("algorithmic.eval_per_length and test_per_length must be at least 1")
    widest = max(algorithmic.source_length(problem, options.train_max_items),
                 algorithmic.target_length(problem, options.train_max_items))
    if config.data.max_len < widest:
      raise UserError(f"config.data.max_len={config.data.max_len} cannot hold a {problem} "
                      f"example of {options.train_max_items} items ({widest} tokens a side); "
                      f"set --config.data.max_len={widest}")
    needed = position_span(config)
    if config.model.max_len < needed:
      raise UserError(f"config.model.max_len={config.model.max_len} is shorter than the "
                      f"longest test row ({needed} positions at {options.test_max_items} "
                      f"items); set --config.model.max_len={needed}")
    if config.data.pack:
      raise UserError("the algorithmic task makes its own rows; set --config.data.pack=False")
    if config.final_eval_split not in ("", "test"):
      raise UserError(f"config.final_eval_split={config.final_eval_split!r}: the algorithmic "
                      "task reports 'test' (every length up to algorithmic.test_max_items); "
                      "set it to 'test' or ''")
    super().check_config(config)

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    options = config.algorithmic
    self.problem, self.architecture = options.problem, options.architecture
    self._model_config = ModelConfig.from_config(
        dict(config.model, vocab_size=algorithmic.VOCAB_SIZE))

  def build_model(self) -> nn.Module:
    if self.architecture == "decoder_only":
      return DecoderOnly(self.model_config)
    return Transformer(self.model_config)

  def init_params(self, model: nn.Module, key: jax.Array) -> Any:
    if self.architecture == "decoder_only":
      return init_one_stack(model, key)
    return init_transformer(model, key)

  def logits(self, model: nn.Module, params: Any, batch: dict[str, jax.Array], train: bool,
             dropout_key: jax.Array | None) -> jax.Array:
    """float32[batch, target_len, vocab]: the prediction of each target token."""
    rngs = {"dropout": dropout_key} if train else {}
    if self.architecture == "encoder_decoder":
      return model.apply({"params": params}, **decoder_inputs(batch), train=train, rngs=rngs)
    rows = pair_rows(batch, shift_right(batch["target_tokens"]))
    logits = model.apply({"params": params}, rows.tokens, train=train, positions=rows.positions,
                         rngs=rngs)
    return logits[:, batch["src_tokens"].shape[1]:]

  def loss_sums(self, model, params, batch, train, dropout_key):
    logits = self.logits(model, params, batch, train, dropout_key)
    loss_sum, sums = loss_sums(logits, batch["target_tokens"], self.config.label_smoothing)
    exact, real = exact_matches(logits, batch["target_tokens"])
    return loss_sum, dict(sums, exact_matches=jnp.sum(exact.astype(jnp.float32)),
                          sequences=jnp.sum(real.astype(jnp.float32)))

  def _rows(self, batch_multiple: int) -> int:
    rows = self.config.data.tokens_per_batch // self.config.data.max_len
    rows = rows // batch_multiple * batch_multiple
    if rows < 1:
      raise UserError(f"data.tokens_per_batch={self.config.data.tokens_per_batch} holds no row "
                      f"of data.max_len={self.config.data.max_len} per batch shard "
                      f"({batch_multiple}); raise it")
    return rows

  def train_iterator(self, batch_multiple: int, process_index: int, process_count: int
                     ) -> BatchIterator:
    rows = self._rows(batch_multiple)
    width = self.config.data.max_len
    return algorithmic.TrainStream(self.problem, self.config.algorithmic.train_max_items,
                                   rows // process_count, width, width, self.config.data.seed,
                                   process_index)

  def eval_batches(self, batch_multiple: int, process_index: int, process_count: int
                   ) -> Iterable[dict[str, np.ndarray]]:
    options, width = self.config.algorithmic, self.config.data.max_len
    examples = algorithmic.eval_set(self.problem, range(1, options.train_max_items + 1),
                                    options.eval_per_length, self.config.data.seed, width, width)
    yield from _host_batches(examples, self._rows(batch_multiple), process_index, process_count)

  def dev_metrics(self, model: nn.Module, params: Any, sums: dict[str, float], mesh: Mesh
                  ) -> dict[str, float]:
    """Loss, NLL, perplexity (a token) and exact match (a sequence) at training lengths."""
    del model, params, mesh
    means = averages(sums, np)
    return dict(loss=float(means["loss"]), nll=float(means["nll"]),
                perplexity=float(means["perplexity"]),
                exact_match=float(sums["exact_matches"] / max(sums["sequences"], 1.0)))

  def describe(self) -> str:
    options = self.config.algorithmic
    return (f"{self.problem} with a {self.architecture} model: trains on 1..{options.train_max_items}"
            f" items, tests 1..{options.test_max_items}")

  def checkpoint_meta(self) -> dict:
    return dict(problem=self.problem, architecture=self.architecture,
                vocab_size=algorithmic.VOCAB_SIZE)

  def final_report(self, workdir: str, split: str | None = None) -> dict | None:
    """The test lengths' report (`length_report`); "test" is the only split."""
    split = split or self.config.final_eval_split
    return self.length_report(workdir) if split else None

  def length_report(self, workdir: str) -> dict:
    """Exact match of the latest checkpoint at every length 1..test_max_items; prints it and
    writes final_test.json beside the checkpoints."""
    options = self.config.algorithmic
    run = self.load_run(workdir)
    lengths = range(1, options.test_max_items + 1)
    src_len = algorithmic.source_length(self.problem, options.test_max_items)
    target_len = algorithmic.target_length(self.problem, options.test_max_items)
    examples = algorithmic.eval_set(self.problem, lengths, options.test_per_length,
                                    self.config.data.seed + 1, src_len, target_len)
    shards = sharding.batch_shards(run.mesh)
    rows = -(-EVAL_ROWS // shards) * shards
    count_fn = jax.jit(functools.partial(self._count_by_items, run.model,
                                         max_items=options.test_max_items))
    exact = np.zeros(options.test_max_items + 1)
    total = np.zeros(options.test_max_items + 1)
    with sharding.mesh_context(run.mesh):
      for batch in _host_batches(examples, rows, jax.process_index(), jax.process_count()):
        counts = jax.device_get(count_fn(run.params, sharding.global_batch(batch, run.mesh)))
        exact += counts[0]
        total += counts[1]
    by_items = {n: float(exact[n] / total[n]) for n in lengths}
    report = dict(split="test", checkpoint_step=run.step, problem=self.problem,
                  architecture=self.architecture, train_max_items=options.train_max_items,
                  examples_per_length=options.test_per_length,
                  exact_match_by_items={str(n): v for n, v in by_items.items()},
                  exact_match_by_bucket=length_buckets(by_items, options.train_max_items))
    if jax.process_index() == 0:
      print(f"{self.name} {self.problem} ({self.architecture}) exact match on test by items "
            f"(step {run.step}): " + ", ".join(
                f"{k} {v:.3f}" for k, v in report["exact_match_by_bucket"].items()), flush=True)
      with open(os.path.join(workdir, "final_test.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report

  def _count_by_items(self, model: nn.Module, params: Any, batch: dict[str, jax.Array],
                      max_items: int) -> jax.Array:
    """float32[2, max_items + 1]: exact matches and examples, by the rows' item count."""
    logits = self.logits(model, params, batch, False, None)
    exact, real = exact_matches(logits, batch["target_tokens"])
    one_hot = jax.nn.one_hot(batch["items"], max_items + 1) * real[:, None]
    return jnp.stack([jnp.sum(one_hot * exact[:, None], axis=0), jnp.sum(one_hot, axis=0)])


def position_span(config: ml_collections.ConfigDict) -> int:
  """Positions the longest test row needs: source and target in one row for the decoder-only
  model, the longer side for the encoder-decoder."""
  options = config.algorithmic
  problem = algorithmic.check_problem(options.problem)
  src = algorithmic.source_length(problem, options.test_max_items)
  target = algorithmic.target_length(problem, options.test_max_items)
  return src + target if options.architecture == "decoder_only" else max(src, target)


def length_buckets(by_items: dict[int, float], train_max_items: int) -> dict[str, float]:
  """Mean exact match over the lengths of each bucket: 1..L, L+1..2L, 2L+1..3L, ..."""
  buckets: dict[str, list[float]] = {}
  for n, value in sorted(by_items.items()):
    k = (n - 1) // train_max_items
    buckets.setdefault(f"{k * train_max_items + 1}-{(k + 1) * train_max_items}", []).append(value)
  return {name: float(np.mean(values)) for name, values in buckets.items()}


def _host_batches(examples: dict[str, np.ndarray], rows: int, process_index: int,
                  process_count: int) -> Iterable[dict[str, np.ndarray]]:
  """`examples` in batches of `rows` rows (the last filled with all-PAD rows), this host's
  share of each."""
  count = len(examples["items"])
  for start in range(0, count, rows):
    batch = {}
    for key, array in examples.items():
      chunk = array[start:start + rows]
      pad = np.zeros((rows - len(chunk), *chunk.shape[1:]), chunk.dtype)
      batch[key] = np.concatenate([chunk, pad])
    lo, hi = host_slice(rows, process_index, process_count)
    yield {key: array[lo:hi] for key, array in batch.items()}
