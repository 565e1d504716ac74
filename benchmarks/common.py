"""What every benchmark script shares: the common flags, the machine, synthetic batches,
the matmul peak, the PyTorch reference, and writing a run's JSON row.

Each script (`train_step.py`, `decoding.py`, `attention.py`, `input_pipeline.py`) answers
one question; `finish(result, table)` prints its table, appends the row to
`benchmarks/results/<device>_<date>.json`, rebuilds `benchmarks/README.md` and, with
--json, prints the row as the last line.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import resource
import subprocess
import sys
from typing import Any, Callable

from absl import app, flags
from ml_collections import config_flags

from portable_paths import portable_command  # benchmarks/portable_paths.py (on sys.path)
from report import write_summary  # benchmarks/report.py
from timing import median_time  # benchmarks/timing.py

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
Result = dict[str, Any]

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", str(REPO_ROOT / "experiments" / "configs" / "wmt14_base.py"),
    "Experiment config file; its model (and optimizer) are benchmarked.", lock_config=False,
)
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.")
flags.DEFINE_integer("src_len", 32, "Source tokens per sentence (no padding).")
flags.DEFINE_integer("vocab_size", 0, "Overrides config.model.vocab_size; 0 keeps the config's.")
flags.DEFINE_bool("json", False, "Print one JSON object as the last line.")
flags.DEFINE_string("label", "", "Free text stored with the run (e.g. 'bf16').")
flags.DEFINE_string("note", "", "A remark shown in benchmarks/README.md (e.g. what else was running).")
flags.DEFINE_string("results_dir", "benchmarks/results",
                    "Where runs are appended (relative to the repo root); '' saves nothing.")
flags.DEFINE_string("summary", "benchmarks/README.md",
                    "Markdown summary rebuilt from results_dir; '' writes none.")
flags.DEFINE_string("profile_dir", "", "Trace the timed computation here and print where the "
                    "time goes (train_step.py, decoding.py).")
flags.DEFINE_enum("compare_mode", "paired", ["paired", "separate"],
                  "paired: the reference runs in this process and its steps alternate with "
                  "JAX's (A B B A ...), so both see the same load on a shared host; separate: "
                  "a subprocess after the JAX run (its own peak memory, but another moment's load).")
flags.DEFINE_integer("torch_threads", 2, "torch.set_num_threads for the comparison.")
flags.DEFINE_enum("reference_dtype", "auto", ["auto", "float32", "bfloat16"],
                  "The reference's precision. auto: bf16 autocast when JAX's matmuls are bf16, "
                  "else float32 (like for like); float32 compares a mixed JAX run with the "
                  "reference's default.")


# --- The machine ------------------------------------------------------------------------


def load_average() -> list[float]:
  """The 1-, 5- and 15-minute load averages (timings on a shared host are noisy)."""
  return [round(x, 2) for x in os.getloadavg()]


def device_info() -> Result:
  """What the numbers were measured on, the CPU's model name and flags included."""
  import jax

  from transformer_jax.model.precision import cpu_flags

  device = jax.devices()[0]
  return dict(platform=device.platform, device_kind=device.device_kind,
              devices=jax.device_count(), jax=jax.__version__,
              host_cpus=os.cpu_count(), host_cpu=cpu_model(),
              # Hosts sharing a model name differ: the family/model/stepping numbers and the
              # last-level cache tell them apart (CTranslate2's speed moved 20 % between two).
              host_cpu_id=cpu_id(), host_l3_cache=last_level_cache(),
              # The vector and matrix extensions that decide CPU matmul speed.
              host_cpu_flags=sorted(f for f in cpu_flags() if f in SPEED_FLAGS),
              xla_flags=os.environ.get("XLA_FLAGS", ""))


SPEED_FLAGS = {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
               "amx_bf16", "amx_int8", "amx_tile", "amx_fp16"}


def cpu_id() -> str:
  """"family F model M stepping S" of the first CPU in /proc/cpuinfo ("" if unreadable)."""
  fields = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if not line.strip():
          break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
  except OSError:
    return ""
  return " ".join(f"{name} {fields[key]}" for name, key in
                  (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
                  if key in fields)


def last_level_cache() -> str:
  """The size of CPU 0's last cache level as sysfs states it (e.g. "480M"), or ""."""
  folder = "/sys/devices/system/cpu/cpu0/cache"
  try:
    levels = sorted((int(open(f"{folder}/{index}/level").read()), index)
                    for index in os.listdir(folder) if index.startswith("index"))
    return open(f"{folder}/{levels[-1][1]}/size").read().strip()
  except (OSError, ValueError, IndexError):
    return ""


def cpu_model() -> str:
  from transformer_jax.model.precision import cpu_model as first_cpu_model

  return first_cpu_model()


def peak_memory() -> tuple[int, str]:
  """(bytes, source): the device's peak on an accelerator, else this process's peak RSS."""
  import jax

  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host peak RSS"


def measure_matmul_peak(dtype: str, size: int = 0, repeats: int = 8,
                        result_dtype: str = "") -> Result:
  """The best FLOP/s of an n×n×n matmul on device 0, the denominator of MFU.

  `dtype` is the operand dtype; with a different `result_dtype` the product
  accumulates into that dtype, as the model's mixed-precision matmuls do
  (`transformer_jax/model/precision.py`). Best of `repeats`: other jobs on a
  shared host only ever make it slower.
  """
  import jax
  import jax.numpy as jnp

  device = jax.devices()[0]
  size = size or (2048 if device.platform == "cpu" else 8192)
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(k, (size, size), jnp.dtype(dtype)) for k in keys)
  result_dtype = jnp.dtype(result_dtype or dtype)
  matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=result_dtype))
  matmul(a, b).block_until_ready()
  _, times = median_time(lambda: matmul(a, b).block_until_ready(), repeats)
  peak_dtype = str(jnp.dtype(dtype))
  if result_dtype != jnp.dtype(dtype):
    peak_dtype += f" -> {result_dtype}"
  return dict(peak_flops_per_s=2 * size**3 / min(times), peak_matmul_size=size,
              peak_dtype=peak_dtype)


def cost_analysis(compiled: Any, key: str = "flops") -> float | None:
  """XLA's own count ("flops", "bytes accessed") for a compiled executable, or None."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # Not every backend implements it.
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  value = (analysis or {}).get(key)
  return float(value) if value and value > 0 else None


def compiled_temp_bytes(compiled: Any) -> int | None:
  try:
    return int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # Not every backend reports it.
    return None


# --- The model and its inputs -------------------------------------------------------------


def benchmark_config() -> Any:
  """--config with --vocab_size applied."""
  config = FLAGS.config
  if FLAGS.vocab_size:
    config.model.vocab_size = FLAGS.vocab_size
  return config


def config_name() -> str:
  filename = config_flags.get_config_filename(FLAGS["config"])
  return pathlib.Path(filename).stem if filename else "default"


def model_summary(model_config: Any) -> Result:
  m = model_config
  return dict(d_model=m.d_model, d_ff=m.d_ff, num_heads=m.num_heads,
              encoder_layers=m.num_encoder_layers, decoder_layers=m.num_decoder_layers,
              vocab_size=m.vocab_size, dtype=m.dtype, matmul_dtype=m.matmul_dtype,
              attention_impl=m.attention_impl, dropout_rate=m.dropout_rate, norm=m.norm,
              **({"quantize": m.quantize} if getattr(m, "quantize", "") else {}))


def synthetic_tokens(rows: int, length: int, vocab_size: int, seed: int) -> Any:
  """int32[rows, length]: random non-special tokens ending in EOS; no PAD."""
  import numpy as np

  from transformer_jax.special_tokens import EOS_ID

  tokens = np.random.default_rng(seed).integers(4, vocab_size, size=(rows, length))
  tokens[:, -1] = EOS_ID
  return tokens.astype(np.int32)


def check_batch(mesh: Any) -> None:
  from transformer_jax import sharding
  from transformer_jax.errors import UserError

  shards = sharding.batch_shards(mesh)
  if FLAGS.batch_size % shards:
    raise UserError(f"--batch_size={FLAGS.batch_size} does not divide over {shards} batch "
                    f"shards; use a multiple of {shards}")


# --- The PyTorch reference ------------------------------------------------------------------


class Reference:
  """benchmarks/torch_reference.py loaded in this process, with its parsed arguments."""

  def __init__(self, argv: list[str]):
    from transformer_jax.configs import load_module
    from transformer_jax.errors import UserError

    try:
      self.module = load_module(REPO_ROOT / "benchmarks" / "torch_reference.py")
    except ModuleNotFoundError as e:
      raise UserError(f"--compare needs the [bench] extra ({e}): "
                      "pip install torch==2.13.0 transformers") from None
    self.module.torch.set_num_threads(FLAGS.torch_threads)
    self.args = self.module.parse_args(argv)


def run_reference(args: list[str]) -> Result:
  """Runs benchmarks/torch_reference.py in a subprocess and parses its JSON last line."""
  from transformer_jax.errors import UserError

  command = [sys.executable, str(REPO_ROOT / "benchmarks" / "torch_reference.py"), *args,
             f"--threads={FLAGS.torch_threads}", "--json"]
  completed = subprocess.run(command, capture_output=True, text=True)
  lines = completed.stdout.strip().splitlines()
  if completed.returncode != 0 or not lines:
    error = (completed.stderr.strip().splitlines() or ["no output"])[-1]
    if "No module named" in error:
      raise UserError(f"--compare needs the [bench] extra ({error}): "
                      "pip install torch==2.13.0 transformers")
    raise RuntimeError(f"the reference failed: {error}")
  return json.loads(lines[-1])


def reference_args(model_config: Any) -> list[str]:
  """The reference's model and batch flags for the same shapes and precision."""
  m = model_config
  dtype = FLAGS.reference_dtype
  if dtype == "auto":
    dtype = "bfloat16" if "bfloat16" in (m.dtype, m.matmul_dtype) else "float32"
  return [f"--vocab_size={m.vocab_size}", f"--d_model={m.d_model}", f"--d_ff={m.d_ff}",
          f"--num_heads={m.num_heads}", f"--encoder_layers={m.num_encoder_layers}",
          f"--decoder_layers={m.num_decoder_layers}", f"--dropout={m.dropout_rate}",
          f"--dtype={dtype}", f"--batch_size={FLAGS.batch_size}", f"--src_len={FLAGS.src_len}"]


# --- Reporting ------------------------------------------------------------------------------


def mib(num_bytes: int | None) -> str:
  return f"{num_bytes / 2**20:,.0f} MiB" if num_bytes else "?"


def results_path(result: Result) -> pathlib.Path:
  device = re.sub(r"[^a-z0-9]+", "_", result["device"]["device_kind"].lower()).strip("_")
  directory = pathlib.Path(FLAGS.results_dir)
  if not directory.is_absolute():
    directory = REPO_ROOT / directory
  return directory / f"{device}_{result['date']}.json"


def save_result(result: Result) -> pathlib.Path:
  """Appends the run to its device/date file (created on first use)."""
  path = results_path(result)
  path.parent.mkdir(parents=True, exist_ok=True)
  data = json.loads(path.read_text()) if path.exists() else dict(device=result["device"], runs=[])
  data["runs"].append(result)
  path.write_text(json.dumps(data, indent=1) + "\n")
  return path


def finish(result: Result, table: list[tuple[str, str]], start_load: list[float]) -> None:
  """Adds when and where it ran, prints `table`, saves the row, rebuilds the summary."""
  now = datetime.datetime.now()
  result.update(label=FLAGS.label, note=FLAGS.note, device=device_info(),
                date=now.strftime("%Y-%m-%d"), time=now.strftime("%H:%M:%S"),
                load_average=start_load, load_average_end=load_average(),
                command=portable_command(sys.argv[1:]))
  table = table + [("device", f"{result['device']['device_kind']} × {result['device']['devices']}"
                              f" ({result['device']['host_cpu']})"),
                   ("load average", " ".join(map(str, result["load_average"])))]
  width = max(len(name) for name, _ in table)
  print("\n".join(f"  {name:<{width}}  {value}" for name, value in table), flush=True)
  if FLAGS.results_dir:
    path = save_result(result)
    print(f"  saved to {path}", flush=True)
    if FLAGS.summary:
      summary = pathlib.Path(FLAGS.summary)
      write_summary(path.parent, summary if summary.is_absolute() else REPO_ROOT / summary)
  if FLAGS.json:
    print(json.dumps(result, default=str), flush=True)


def main(measure: Callable[[], tuple[Result, list[tuple[str, str]]]]) -> None:
  """Runs `measure` as a command line: one-line errors, then `finish`."""
  from transformer_jax.cli.common import keep_freed_host_memory
  from transformer_jax.errors import exit_on_user_error

  keep_freed_host_memory()  # As the package's commands do; a paired reference shares it.

  def run(argv: list[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    start_load = load_average()
    result, table = exit_on_user_error(measure)()
    finish(result, table, start_load)

  app.run(run)
