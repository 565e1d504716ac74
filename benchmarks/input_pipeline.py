"""How fast does the input pipeline feed the step? Batches and tokens a second of one host.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python benchmarks/input_pipeline.py \
      --config=experiments/configs/multi30k.py --seconds=3 --json

Loads the config's data (preparing it once) and times its training iterator alone:
token-budget batch plans, grain's shuffle and the assembly of this host's rows.
Any data key can be overridden (`--config.data.pack=false`).
"""

from __future__ import annotations

import time

from absl import flags

import common

FLAGS = flags.FLAGS
flags.DEFINE_float("seconds", 3.0, "How long to draw batches.")

Result = common.Result


def measure() -> tuple[Result, list[tuple[str, str]]]:
  from transformer_jax.data.pipeline import load_dataset

  config = common.benchmark_config()
  start = time.perf_counter()
  data = load_dataset(config.data)
  load_s = time.perf_counter() - start
  iterator = data.train_iterator(batch_multiple=1)
  next(iterator)  # Plans epoch 0.
  start, batches, real, slots = time.perf_counter(), 0, 0, 0
  while time.perf_counter() - start < FLAGS.seconds:
    batch = next(iterator)
    batches += 1
    real += int((batch["src_tokens"] != 0).sum() + (batch["target_tokens"] != 0).sum())
    slots += batch["src_tokens"].size + batch["target_tokens"].size
  elapsed = time.perf_counter() - start
  result = dict(
      mode="input_pipeline", config=common.config_name(), dataset=config.data.dataset,
      pack=bool(config.data.pack), tokens_per_batch=config.data.tokens_per_batch,
      load_s=load_s, split_sizes=data.split_sizes, batches_per_s=batches / elapsed,
      tokens_per_s=real / elapsed, padded_tokens_per_s=slots / elapsed,
      padding_fraction=iterator.padding_fraction(0), epochs=iterator.epoch)
  table = [("data", f"{result['dataset']} (pack={result['pack']}, "
                    f"{result['tokens_per_batch']:,} tokens a batch), loaded in {load_s:.2f} s"),
           ("batches/s", f"{result['batches_per_s']:,.1f}"),
           ("tokens/s", f"{result['tokens_per_s']:,.0f} non-PAD source+target "
                        f"({result['padded_tokens_per_s']:,.0f} with padding; padding "
                        f"fraction {result['padding_fraction']:.3f})")]
  return result, table


if __name__ == "__main__":
  common.main(measure)
