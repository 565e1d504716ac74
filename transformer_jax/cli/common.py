"""What the command lines share: flag definitions and parsing, reading input, process set-up.

Importing this module defines no flags; `define_run_flags()` adds the ones
of a training run (train, model_info, the ablation runner) and
`define_decode_flags()` those of translate and evaluate.
"""

from __future__ import annotations

import ctypes
import difflib
import logging as python_logging
import os
import platform
import sys
from typing import BinaryIO

import jax
import ml_collections
import tensorflow_datasets as tfds
from absl import flags
from absl import logging
from ml_collections import config_flags

from transformer_jax.configs import all_keys, check_overrides_apply, default_config
from transformer_jax.data.text_files import CACHE_DIR_ENV, DEFAULT_CACHE_DIR
from transformer_jax.decode import search
from transformer_jax.decode.translator import DecodeOptions
from transformer_jax.errors import UserError
from transformer_jax.model.config import MATMUL_DTYPES
from transformer_jax.tasks.registry import TRANSLATION_TASKS, load_run
from transformer_jax.tasks.translation import combine_runs
from transformer_jax.training.run_dir import LoadedRun

FLAGS = flags.FLAGS


def define_run_flags() -> None:
  """--config (with --config.<key>=value overrides), --workdir and the multi-host flags."""
  config_flags.DEFINE_config_file(
      "config", None, "Experiment config file, e.g. experiments/configs/quickstart.py.",
      lock_config=True,
  )
  flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
  flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
  flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
  flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, but a mistake is one `error: ...` line and exit status 2.

  For `app.run(main, flags_parser=parse_flags)`: absl prints usage for a bad
  flag, and ml_collections a traceback for an unknown --config.<key>.
  """
  try:
    return FLAGS(argv)
  except Exception as e:  # flags.Error; KeyError, AttributeError, ... from --config.
    message = " ".join(str(e).split())
    if not isinstance(e, flags.Error):  # Raised while loading the --config file.
      message = f"{type(e).__name__} in --config: {message}"
    message = _unknown_config_key(argv) or message
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _unknown_config_key(argv: list[str]) -> str | None:
  """'unknown config key ...; did you mean ...?' for the first unknown --config.<key>."""
  if "config" not in FLAGS:
    return None
  try:
    keys = sorted(all_keys(FLAGS["config"].value))
  except Exception:  # No config file loaded (yet): the defaults have every key.
    keys = sorted(all_keys(default_config()))
  for arg in argv[1:]:
    if arg.startswith("--config."):
      key = arg[len("--config."):].split("=", 1)[0]
      if key not in keys:
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join('--config.' + c for c in close)}?" if close else ""
        return f"unknown config key --config.{key}{hint}"
  return None


def quiet_libraries() -> None:
  """Keeps Orbax's and TFDS's INFO chatter off the console (warnings still show)."""
  def keep(record) -> bool:
    noisy = any(name in record.pathname for name in ("orbax", "tensorflow_datasets", "jax/_src"))
    if record.name == "asyncio" and "never retrieved" in str(record.msg):
      return False  # A failed Orbax write's tasks; the error itself is reported once.
    if "orbax" in record.pathname:  # Orbax logs a failed write with tracebacks from each
      record.exc_info = record.exc_text = None  # thread; we raise it as one line.
    return record.levelno >= python_logging.WARNING or not noisy

  logging.get_absl_handler().addFilter(keep)
  if not sys.stderr.isatty():  # On a terminal TFDS shows corpus preparation as progress bars.
    tfds.disable_progress_bar()


def keep_freed_host_memory() -> None:
  """Stops glibc from handing XLA:CPU's freed buffers back to the OS after each step.

  XLA:CPU allocates a step's temporaries on entry and frees them on exit;
  glibc returns large blocks (and the per-thread arenas' heaps) to the OS,
  so every step page-faults its temporaries in again. Measured on the quick
  start (2 CPU cores): 45k minor faults per step, a quarter of the CPU time in
  the kernel; with one arena, no mmap'd blocks and no trimming: ~1.7k faults
  and 1.4x the training tokens/s, for a higher resident peak (freed memory is
  kept for reuse). Call it first thing in a process, before JAX starts its
  threads. Linux/glibc only; TRANSFORMER_JAX_KEEP_FREED_MEMORY=0 turns it off.
  """
  if os.environ.get("TRANSFORMER_JAX_KEEP_FREED_MEMORY", "1") == "0":
    return
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return
  libc = ctypes.CDLL(None)
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # <malloc.h>
  libc.mallopt(m_arena_max, 1)
  libc.mallopt(m_mmap_max, 0)
  libc.mallopt(m_trim_threshold, -1)  # -1: never trim (2^31-1 would still trim > 2 GiB tops).


def enable_compilation_cache() -> None:
  """Reuses compiled programs across runs: a resumed run does not compile its step again,
  and a second translate/evaluate job does not compile its decoding loops again.

  $JAX_COMPILATION_CACHE_DIR wins; else $TRANSFORMER_JAX_CACHE_DIR/xla, else
  ~/.cache/transformer_jax/xla (the root that prepared data uses too).
  """
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    root = os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.expanduser(root), "xla"))
  if not os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def config_and_workdir() -> tuple[ml_collections.ConfigDict, str]:
  """The --config (validated on use) and --workdir, or a one-line UserError."""
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/quickstart.py")
  try:
    FLAGS.config.keys()  # ml_collections defers a config file's load error to first use.
  except OSError as e:
    reason = str(e).strip().splitlines()[-1].strip()
    raise UserError(f"cannot load the --config file: {reason}") from None
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the folder for checkpoints and metrics")
  workdir = os.path.abspath(os.path.expanduser(FLAGS.workdir))
  check_overrides_apply(FLAGS.config, config_flags.get_override_values(FLAGS["config"]))
  return FLAGS.config, workdir


def define_decode_flags() -> None:
  """The flags of translate and evaluate: the run, the checkpoint and the search."""
  flags.DEFINE_string("workdir", None, "Run directory of a training run.")
  flags.DEFINE_string("checkpoint", "latest", "latest, averaged, or a step number.")
  flags.DEFINE_list("ensemble", [], "Other run directories decoded together with --workdir "
                    "(the same --checkpoint of each): every step averages the runs' next-token "
                    "probabilities. They must share --workdir's tokenizer.")
  define_search_flags()
  flags.DEFINE_bool("replace_invalid_utf8", False, "Replace invalid UTF-8 bytes instead of failing.")


def define_search_flags() -> None:
  """The flags of a search (read by `decode_options`), shared by the commands and the
  benchmarks."""
  flags.DEFINE_enum("method", "beam", list(search.METHODS), "Search method.")
  flags.DEFINE_integer("beam_size", 4, "Beam size (§6.1: 4).")
  flags.DEFINE_float("alpha", 0.6, "Length penalty exponent α (§6.1: 0.6).")
  flags.DEFINE_integer("max_extra_len", 50, "Output may be this many tokens longer than the input.")
  flags.DEFINE_integer("min_length", 1, "Tokens before EOS may end an output (1: never empty; "
                       "0: as the model says).")
  flags.DEFINE_enum("beam_finish", "t2t", list(search.FINISH_RULES),
                    "Which beam hypotheses finish: t2t (the paper's code) or fairseq (also "
                    "Hugging Face generate; search.beam_search).")
  flags.DEFINE_enum("beam_stop", "exact", list(search.STOP_RULES),
                    "When beam search stops a sentence: exact (once no alive beam can win; "
                    "the same output as never stopping early) or best_finished (once the "
                    "step's best candidate ends, as OpenNMT-py and CTranslate2 do; faster "
                    "with a large α) or max_length (every sentence to its maximum length).")
  flags.DEFINE_enum("quantize", "", ["", "int8"], "int8: run the weight matmuls in int8, "
                    "one scale per weight column and per token (faster on CPUs with fast int8 "
                    "dot products; speed and BLEU cost: benchmarks/README.md); empty: as trained.")
  flags.DEFINE_enum("matmul_dtype", "", list(MATMUL_DTYPES),
                    "Matmul operands while decoding (accumulated in the compute dtype); auto: "
                    "bfloat16 where this host runs it natively; empty: as the run was trained.")
  flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
  flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens (0: all).")
  flags.DEFINE_bool("growing_cache", None, "Grow the self-attention cache 16, 32, ... "
                    "positions as decoding goes (same outputs); unset: on for beam search, "
                    "off for greedy search and sampling.")
  flags.DEFINE_bool("shrink_batch", False, "Go on in a batch of half the size (a quarter, an "
                    "eighth) once the undecided sentences fit in it: same outputs, 1.2x faster "
                    "beam search once compiled, twice the compiles (pays on large test sets).")
  flags.DEFINE_bool("shared_beam_cache", None, "Beam search: the beams of a sentence share one "
                    "self-attention cache row, nothing reordered (same outputs up to float "
                    "rounding, 1.2x faster on a CPU); unset: on for encoder-decoders on a CPU.")
  flags.DEFINE_integer("tokens_per_batch", None, "Source tokens per decoding batch; unset: "
                       "1,024 on a CPU, 4,096 on an accelerator.")


def decode_options() -> DecodeOptions:
  """The search that the decode flags ask for."""
  return DecodeOptions(
      method=FLAGS.method, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha,
      max_extra_len=FLAGS.max_extra_len, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
      growing_cache=FLAGS.growing_cache, min_length=FLAGS.min_length,
      finish_rule=FLAGS.beam_finish, stop_rule=FLAGS.beam_stop, quantize=FLAGS.quantize,
      matmul_dtype=FLAGS.matmul_dtype, shrink_batch=FLAGS.shrink_batch,
      shared_beam_cache=FLAGS.shared_beam_cache,
  )


def load_translation_run(workdir: str) -> LoadedRun:
  """--checkpoint of the translation (or prefix LM) run in `workdir`, as one Ensemble with
  the runs of --ensemble when it names any (decode.ensemble)."""
  workdirs = [workdir] + list(FLAGS.ensemble)
  runs = [load_run(path, FLAGS.checkpoint, expected_task=TRANSLATION_TASKS) for path in workdirs]
  return runs[0] if len(runs) == 1 else combine_runs(runs, workdirs)


def require_workdir() -> str:
  """--workdir, or a one-line UserError."""
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the run directory of a training run")
  return FLAGS.workdir


def read_lines(stream: BinaryIO, replace_invalid: bool, name: str = "stdin") -> list[str]:
  """Lines of a binary stream, decoded as UTF-8 (invalid bytes: error or U+FFFD)."""
  lines = []
  for number, raw in enumerate(stream.read().splitlines(), start=1):
    try:
      lines.append(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
      if not replace_invalid:
        raise UserError(
            f"{name} line {number} is not valid UTF-8 (byte {e.start}); fix the input or "
            "pass --replace_invalid_utf8"
        ) from None
      lines.append(raw.decode("utf-8", errors="replace"))
  return lines
