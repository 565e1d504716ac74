"""Does the data path hold at WMT size? Time and peak memory of each stage at N pairs.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python benchmarks/data_scale.py \
      --pairs=4500000 --work_dir=/tmp/data_scale --json

The corpus is Multi30k's training pairs repeated to --pairs (4.5M: WMT14 en→de's
size), written as plain text and prepared through the same functions `load_dataset`
calls, one stage per child process so each stage's peak RSS is its own:

  prepare     plain text -> TFDS array_record records (builders.prepare)
  tokenizer   SentencePiece on both sides, sampling 2M of the 2·N sentences
  tokenize    the training split's token ids (cached .npz)
  plan        the first epoch's global batch plan, and one host's first batches
              of a 4-host layout (each host plans the whole epoch, assembles 1/4)
  load        everything again from the caches: what a restart, or another host
              reading a shared cache, pays

Every host runs the same stages on the whole corpus (the plan must be global;
token ids are held whole), so the per-host cost is the single-host cost except
for batch assembly. The row extrapolates each stage linearly to --extrapolate_to
pairs (36M: WMT14 en→fr) on the line through this size and --pairs/10 (run first),
and says how much each stage grew between the two (10x is linear).
"""

from __future__ import annotations

import functools
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time

from absl import flags

import common

FLAGS = flags.FLAGS
flags.DEFINE_integer("pairs", 4_500_000, "Training pairs of the corpus.")
flags.DEFINE_integer("extrapolate_to", 36_000_000, "Pairs to extrapolate to (WMT14 en→fr).")
flags.DEFINE_string("work_dir", "/tmp/transformer_jax_data_scale", "Scratch folder (deleted).")
flags.DEFINE_integer("data_vocab_size", 32_000, "SentencePiece vocabulary.")
flags.DEFINE_integer("data_tokens_per_batch", 25_000, "Tokens a batch (the paper's ~25k).")
flags.DEFINE_integer("hosts", 4, "Hosts of the per-host view.")
flags.DEFINE_string("data_dir", None, "The folder holding multi30k/ (default: "
                    "$TRANSFORMER_JAX_DATA_DIR).")
flags.DEFINE_string("stage", "", "Internal: run one stage in this process.")

STAGES = ("prepare", "tokenizer", "tokenize", "plan", "load")
Result = common.Result


def data_config(work_dir: pathlib.Path, pairs: int) -> dict:
  folder = work_dir / f"corpus{pairs}"
  return dict(dataset="plain_text", prepared_dir=str(folder / "cache"),
              vocab_size=FLAGS.data_vocab_size, max_len=256,
              tokens_per_batch=FLAGS.data_tokens_per_batch,
              plain_text=dict(train_source=str(folder / "train.en"),
                              train_target=str(folder / "train.de"),
                              eval_source=str(folder / "val.en"), eval_target=str(folder / "val.de")))


def write_corpus(work_dir: pathlib.Path, pairs: int) -> float:
  """Multi30k train repeated to `pairs` lines a side, plus its val; returns seconds."""
  from transformer_jax.data import text_files

  start = time.perf_counter()
  source = text_files.multi30k_dir(FLAGS.data_dir, "raw")
  folder = work_dir / f"corpus{pairs}"
  folder.mkdir(parents=True, exist_ok=True)
  for lang in ("en", "de"):
    lines = (source / f"train.{lang}").read_text("utf-8").splitlines(keepends=True)
    with open(folder / f"train.{lang}", "w", encoding="utf-8") as f:
      for i in range(pairs):
        f.write(lines[i % len(lines)])
    shutil.copyfile(source / f"val.{lang}", folder / f"val.{lang}")
  return time.perf_counter() - start


def run_stage(stage: str, work_dir: pathlib.Path, pairs: int) -> Result:
  """One stage in this process: {'seconds', 'peak_rss_bytes', ...}."""
  from transformer_jax.data import builders, tokenized
  from transformer_jax.data.config import resolve_data_config
  from transformer_jax.data.corpus import resolve_corpus
  from transformer_jax.data.pipeline import corpus_tokenizer, load_dataset

  cfg = resolve_data_config(data_config(work_dir, pairs))
  corpus = resolve_corpus(cfg)
  root = corpus.cache_dir
  base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  out: Result = {}
  start = time.perf_counter()
  if stage == "prepare":
    builders.prepare(corpus, root / "tfds")
  elif stage in ("tokenizer", "tokenize"):
    prepared = builders.prepare(corpus, root / "tfds")
    read = functools.cache(prepared.read)  # Each split read once, as load_dataset does.
    tok = corpus_tokenizer(cfg, prepared, root, read, "train")
    if stage == "tokenize":
      start = time.perf_counter()  # The tokenizer is cached by now: time the ids alone.
      split = tokenized.tokenize_split(root / "tokenized", prepared, tok, "train", read)
      out.update(tokens=int(len(split.src) + len(split.tgt)))
  elif stage == "plan":
    data = load_dataset(cfg)
    start = time.perf_counter()
    iterator = data.train_iterator(batch_multiple=8)
    plan = iterator.epoch_plan(0)
    out.update(plan_seconds=time.perf_counter() - start, batches_per_epoch=len(plan))
    host = data.train_iterator(batch_multiple=8, process_index=0, process_count=FLAGS.hosts)
    host.epoch_plan(0)
    assemble = time.perf_counter()
    for _ in range(20):
      next(host)
    out.update(host_batches_per_s=20 / (time.perf_counter() - assemble))
  elif stage == "load":
    load_dataset(cfg)
  else:
    raise ValueError(f"unknown stage {stage!r}")
  out.update(seconds=time.perf_counter() - start,
             peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             rss_before_bytes=base_rss)
  return out


def measure_size(work_dir: pathlib.Path, pairs: int) -> Result:
  """Every stage at `pairs`, each in a child process."""
  row: Result = {"pairs": pairs, "write_seconds": write_corpus(work_dir, pairs)}
  for stage in STAGES:
    command = [sys.executable, __file__, f"--stage={stage}", f"--pairs={pairs}",
               f"--work_dir={work_dir}", f"--data_vocab_size={FLAGS.data_vocab_size}",
               f"--data_tokens_per_batch={FLAGS.data_tokens_per_batch}", f"--hosts={FLAGS.hosts}"]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    row[stage] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {pairs:,} pairs, {stage}: {row[stage]['seconds']:.1f} s, peak RSS "
          f"{row[stage]['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
  return row


def linear(small: Result, full: Result, stage: str, key: str) -> float:
  """`key` at --extrapolate_to pairs on the line through the two measured sizes
  (a fixed cost, such as the interpreter's memory, stays fixed)."""
  slope = (full[stage][key] - small[stage][key]) / (full["pairs"] - small["pairs"])
  return full[stage][key] + slope * (FLAGS.extrapolate_to - full["pairs"])


def measure() -> tuple[Result, list[tuple[str, str]]]:
  work_dir = pathlib.Path(FLAGS.work_dir)
  shutil.rmtree(work_dir, ignore_errors=True)
  try:
    small = measure_size(work_dir, FLAGS.pairs // 10)
    full = measure_size(work_dir, FLAGS.pairs)
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)
  stages = {}
  for stage in STAGES:
    growth = full[stage]["seconds"] / max(small[stage]["seconds"], 1e-9)
    stages[stage] = dict(
        seconds=full[stage]["seconds"], peak_rss_bytes=full[stage]["peak_rss_bytes"],
        seconds_at_tenth=small[stage]["seconds"], growth_for_10x=growth,
        extrapolated_seconds=linear(small, full, stage, "seconds"),
        extrapolated_peak_rss_bytes=linear(small, full, stage, "peak_rss_bytes"))
  result = dict(mode="data_scale", pairs=FLAGS.pairs, extrapolate_to=FLAGS.extrapolate_to,
                vocab_size=FLAGS.data_vocab_size, tokens_per_batch=FLAGS.data_tokens_per_batch,
                hosts=FLAGS.hosts, write_seconds=full["write_seconds"], stages=stages,
                tokens=full["tokenize"]["tokens"],
                batches_per_epoch=full["plan"]["batches_per_epoch"],
                plan_seconds=full["plan"]["plan_seconds"],
                host_batches_per_s=full["plan"]["host_batches_per_s"], small=small, full=full)
  gib = lambda b: f"{b / 2**30:.2f} GiB"
  table = [("corpus", f"{FLAGS.pairs:,} pairs (Multi30k train repeated), {result['tokens']:,} "
                      f"tokens, vocab {FLAGS.data_vocab_size:,}; written in {full['write_seconds']:.0f} s")]
  for stage, s in stages.items():
    table.append((stage, f"{s['seconds']:.1f} s, peak RSS {gib(s['peak_rss_bytes'])} (at "
                         f"{FLAGS.pairs // 10:,}: {s['seconds_at_tenth']:.1f} s, so "
                         f"{s['growth_for_10x']:.1f}x for 10x); at {FLAGS.extrapolate_to:,}: "
                         f"~{s['extrapolated_seconds'] / 60:.0f} min, ~{gib(s['extrapolated_peak_rss_bytes'])}"))
  table.append(("per host", f"{FLAGS.hosts} hosts: each plans the whole epoch "
                            f"({result['plan_seconds']:.1f} s, {result['batches_per_epoch']:,} "
                            f"batches) and assembles 1/{FLAGS.hosts} of each batch "
                            f"({result['host_batches_per_s']:.1f} batches/s)"))
  return result, table


if __name__ == "__main__":
  if any(arg.startswith("--stage=") and arg != "--stage=" for arg in sys.argv):
    FLAGS(sys.argv)
    print(json.dumps(run_stage(FLAGS.stage, pathlib.Path(FLAGS.work_dir), FLAGS.pairs)))
  else:
    common.main(measure)
