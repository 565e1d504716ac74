"""What attention costs against sequence length: time and measured peak memory per implementation.

  python experiments/attention_scaling.py --mode=attention   # the kernel alone
  python experiments/attention_scaling.py --mode=decode      # time per generated token
  python experiments/attention_scaling.py --mode=plot        # the figures from the rows

attention: `dot_product_attention` at batch 1, 8 heads, d_k 64, lengths 256 ... 32,768, for
every implementation that runs on this backend; forward, and forward plus the gradients of
q, k and v. Each point runs in its own process, so its peak memory is that process's peak
RSS (or the device's peak_bytes_in_use where the backend reports one), measured, not
computed; "delta" subtracts the peak before compiling. A point whose compiled buffers would
exceed --max_gib is not run (the machine would swap or kill it) and is recorded as refused
with the size XLA asked for; an implementation stops growing after a refusal or a point
slower than --max_seconds.

decode: a decoder-only model (`--layers` x d_model 512, 8 heads) generating one token after
a context of 256 ... 8,192 tokens: with the KV cache (one step over the cache) and without
it (the whole context recomputed), per implementation.

ratio: chunked against plain, forward plus backward, both compiled in one process and
called alternately --ratio_rounds times per length: the speed claim's paired ratio.

Rows append to results/attention_scaling/rows.jsonl with the host's CPU model, and a
rerun skips the points already there, so an interrupted sweep resumes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "attention", ["attention", "decode", "ratio", "plot", "point"],
                  "What to run.")
flags.DEFINE_list("ratio_lengths", "256,512,1024,2048,4096,8192",
                  "Lengths of the ratio mode (where plain fits).")
flags.DEFINE_integer("ratio_rounds", 7, "Alternating rounds per length in the ratio mode.")
flags.DEFINE_list("impls", "plain,xla,chunked", "Implementations to measure.")
flags.DEFINE_list("lengths", ",".join(str(256 << i) for i in range(8)), "Sequence lengths.")
flags.DEFINE_list("decode_lengths", ",".join(str(256 << i) for i in range(6)),
                  "Context lengths of the decode mode.")
flags.DEFINE_string("out_dir", "results/attention_scaling", "Where rows and figures go.")
flags.DEFINE_float("max_gib", 16.0, "Refuse points whose compiled buffers exceed this.")
flags.DEFINE_float("max_seconds", 240.0, "Stop an implementation after a slower point.")
flags.DEFINE_integer("layers", 2, "Decoder layers of the decode mode's model.")
flags.DEFINE_integer("block_size", 512, "The chunked path's block.")
flags.DEFINE_boolean("causal", False, "Causal mask in the attention mode (default: none).")
flags.DEFINE_string("point", "", "Internal: one point, as JSON, run in this process.")

HEADS, DEPTH, D_MODEL = 8, 64, 512


def _peak_bytes() -> tuple[int, str]:
  import jax

  stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def _median_seconds(call, budget_s: float = 10.0, most: int = 5) -> tuple[float, int]:
  """(median wall time of `call`, runs): at least one run, more while within the budget."""
  times = []
  while len(times) < most and (not times or sum(times) < budget_s):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2], len(times)


def _compile_or_refuse(fn, *args) -> tuple[object | None, dict]:
  compiled = fn.lower(*args).compile()
  try:
    analysis = compiled.memory_analysis()
    needed = int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
  except Exception:  # Not every backend reports it.
    return compiled, {}
  row = dict(compiled_bytes=needed)
  if needed > FLAGS.max_gib * 2**30:
    row["refused"] = f"compiled buffers need {needed / 2**30:.1f} GiB > --max_gib={FLAGS.max_gib:g}"
    return None, row
  return compiled, row


def run_attention_point(point: dict) -> dict:
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.attention import dot_product_attention
  from transformer_jax.model.masking import AttentionMask

  length, impl = point["length"], point["impl"]
  keys = jax.random.split(jax.random.key(length), 3)
  query, key, value = (jax.random.normal(k, (1, length, HEADS, DEPTH)) for k in keys)
  mask = AttentionMask(causal=True) if point["causal"] else None
  attend = lambda q, k, v: dot_product_attention(q, k, v, mask, impl, block_size=point["block"])
  if point["pass"] == "forward":
    fn = jax.jit(attend)
  else:
    loss = lambda q, k, v: jnp.sum(attend(q, k, v))
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  jax.block_until_ready((query, key, value))
  before, _ = _peak_bytes()
  compiled, row = _compile_or_refuse(fn, query, key, value)
  if compiled is None:
    return row
  jax.block_until_ready(compiled(query, key, value))
  seconds, runs = _median_seconds(lambda: jax.block_until_ready(compiled(query, key, value)))
  peak, source = _peak_bytes()
  return dict(row, seconds=seconds, runs=runs, peak_bytes=peak, peak_delta_bytes=peak - before,
              peak_source=source)


def run_ratio(cpu: str) -> None:
  """Paired chunked / plain forward+backward times, one process, alternating calls."""
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.attention import dot_product_attention

  out = _rows_path()
  out.parent.mkdir(parents=True, exist_ok=True)
  for length in (int(n) for n in FLAGS.ratio_lengths):
    keys = jax.random.split(jax.random.key(length), 3)
    query, key, value = (jax.random.normal(k, (1, length, HEADS, DEPTH)) for k in keys)
    compiled = {}
    for impl in ("plain", "chunked"):
      loss = lambda q, k, v, impl=impl: jnp.sum(dot_product_attention(
          q, k, v, None, impl, block_size=FLAGS.block_size))
      compiled[impl] = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(query, key, value).compile()
      jax.block_until_ready(compiled[impl](query, key, value))
    times = {impl: [] for impl in compiled}
    for _ in range(FLAGS.ratio_rounds):
      for impl, fn in compiled.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(query, key, value))
        times[impl].append(time.perf_counter() - start)
    median = {impl: sorted(t)[len(t) // 2] for impl, t in times.items()}
    row = dict(mode="ratio", length=length, block=FLAGS.block_size, cpu=cpu,
               rounds=FLAGS.ratio_rounds, date=time.strftime("%Y-%m-%d"),
               plain_s=median["plain"], chunked_s=median["chunked"],
               chunked_over_plain=median["chunked"] / median["plain"])
    with out.open("a") as f:
      f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def run_decode_point(point: dict) -> dict:
  """ms per generated token after `length` tokens of context, cached or recomputed."""
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.config import default_model_config
  from transformer_jax.model.decoder_only import DecoderOnly

  length, steps = point["length"], 8
  config = default_model_config()
  config.update(dict(vocab_size=8000, d_model=D_MODEL, d_ff=4 * D_MODEL, num_heads=HEADS,
                     num_layers=point["layers"], attention_impl=point["impl"],
                     attention_block_size=point["block"]))
  model = DecoderOnly(config)
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  context = jax.random.randint(jax.random.key(1), (1, length), 3, 8000)
  before, _ = _peak_bytes()
  if point["cached"]:
    cache_len = length + steps
    cache = jax.jit(lambda: model.apply({"params": params}, jnp.zeros((1, cache_len), jnp.int32),
                                        decode=True, mutable=["cache"])[1]["cache"])()

    @jax.jit
    def prefill(cache):
      return model.apply({"params": params, "cache": cache}, context, decode=True,
                         positions=jnp.arange(length)[None], mutable=["cache"])[1]["cache"]

    @jax.jit
    def step(cache, token, position):
      logits, variables = model.apply({"params": params, "cache": cache}, token, decode=True,
                                      positions=position[None, None], mutable=["cache"])
      return jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32), variables["cache"]

    cache = jax.block_until_ready(prefill(cache))
    token = context[:, -1:]
    token, cache = jax.block_until_ready(step(cache, token, jnp.int32(length)))  # Compile.

    def generate():
      nonlocal token, cache
      for i in range(1, steps):
        token, cache = step(cache, token, jnp.int32(length + i))
      jax.block_until_ready(token)

    seconds, runs = _median_seconds(generate)
    per_token = seconds / (steps - 1)
  else:
    forward = jax.jit(lambda tokens: jnp.argmax(model.apply({"params": params}, tokens)[:, -1], -1))
    jax.block_until_ready(forward(context))
    per_token, runs = _median_seconds(lambda: jax.block_until_ready(forward(context)))
  peak, source = _peak_bytes()
  return dict(seconds_per_token=per_token, runs=runs, peak_bytes=peak,
              peak_delta_bytes=peak - before, peak_source=source)


def _rows_path() -> Path:
  return Path(FLAGS.out_dir) / "rows.jsonl"


def _done_points() -> list[dict]:
  path = _rows_path()
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _key(point: dict) -> tuple:
  return tuple(sorted((k, v) for k, v in point.items() if k in _POINT_FIELDS))


_POINT_FIELDS = ("mode", "impl", "length", "pass", "causal", "block", "cached", "layers", "cpu")


def _run_point(point: dict) -> dict:
  """Runs one point in a fresh process; its row (with `error` when the process failed)."""
  command = [sys.executable, __file__, "--mode=point", f"--point={json.dumps(point)}",
             f"--max_gib={FLAGS.max_gib}"]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True)
  row = dict(point, date=time.strftime("%Y-%m-%d"), wall_s=round(time.perf_counter() - start, 1))
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode == 0 and lines:
    row.update(json.loads(lines[-1]))
  else:
    row["error"] = f"exit {done.returncode}: " + " ".join(done.stderr.split()[-30:])
  return row


def sweep(points: list[dict], time_key: str) -> None:
  out = _rows_path()
  out.parent.mkdir(parents=True, exist_ok=True)
  done = {_key(row): row for row in _done_points()}
  stopped: set[tuple] = set()
  for point in points:
    series = tuple(v for k, v in sorted(point.items()) if k not in ("length",))
    if series in stopped:
      continue
    row = done.get(_key(point))
    if row is None:
      row = _run_point(point)
      with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    summary = {k: row[k] for k in (time_key, "peak_bytes", "peak_delta_bytes", "refused", "error")
               if k in row}
    print(json.dumps(dict(point, **summary)), flush=True)
    if "refused" in row or "error" in row or row.get(time_key, 0) * row.get("runs", 1) > FLAGS.max_seconds:
      stopped.add(series)


def _reference_slopes(axis, lengths: list[int], anchor: float) -> None:
  """Dotted n and n² lines through (lengths[0], anchor)."""
  first = lengths[0]
  for power, label in ((1, "∝ n"), (2, "∝ n²")):
    axis.plot(lengths, [anchor * (n / first) ** power for n in lengths], ":", color="grey",
              linewidth=1)
    axis.annotate(label, (lengths[-1], anchor * (lengths[-1] / first) ** power), fontsize=8,
                  color="grey")


def _dates(rows: list[dict]) -> str:
  """The measurement dates of `rows`: "2026-12-05" or "2026-12-05 to 2026-12-06"."""
  dates = sorted({r["date"] for r in rows if r.get("date")})
  return " to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else "date not recorded"


def plot(rows: list[dict], out_dir: Path) -> None:
  """attention.png (time and memory against n), decode.png and table.md, from the rows."""
  (out_dir / "table.md").write_text(table(rows))
  attention_rows = [r for r in rows if r["mode"] == "attention" and "seconds" in r
                    and not r["causal"]]
  if attention_rows:
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths = sorted({r["length"] for r in attention_rows})
    for (impl, pass_), style in _series(attention_rows, ("impl", "pass")):
      series = sorted((r for r in attention_rows if r["impl"] == impl and r["pass"] == pass_),
                      key=lambda r: r["length"])
      label = f"{impl} {pass_.replace('_', '+')}"
      time_axis.plot([r["length"] for r in series], [r["seconds"] for r in series], style,
                     label=label)
      memory_axis.plot([r["length"] for r in series],
                       [r["peak_delta_bytes"] / 2**20 for r in series], style, label=label)
    fastest = min(r["seconds"] for r in attention_rows if r["length"] == lengths[0])
    _reference_slopes(time_axis, lengths, fastest)
    smallest = min(r["peak_delta_bytes"] for r in attention_rows if r["length"] == lengths[0])
    _reference_slopes(memory_axis, lengths, max(smallest / 2**20, 1.0))
    for axis, name in ((time_axis, "seconds per call"), (memory_axis, "peak memory above start, MiB")):
      axis.set_xscale("log", base=2)
      axis.set_yscale("log")
      axis.set_xlabel("sequence length n (batch 1, 8 heads, d_k 64)")
      axis.set_ylabel(name)
      axis.grid(True, which="both", alpha=0.3)
    time_axis.legend(fontsize=7)
    figure.suptitle(f"attention, float32, {attention_rows[0]['cpu']}, "
                    f"{_dates(attention_rows)}", fontsize=9)
    figure.tight_layout()
    figure.savefig(out_dir / "attention.png", dpi=120)
  decode_rows = [r for r in rows if r["mode"] == "decode" and "seconds_per_token" in r]
  if decode_rows:
    figure, axis = plt.subplots(figsize=(6, 4.2))
    for (impl, cached), style in _series(decode_rows, ("impl", "cached")):
      series = sorted((r for r in decode_rows if r["impl"] == impl and r["cached"] == cached),
                      key=lambda r: r["length"])
      axis.plot([r["length"] for r in series], [r["seconds_per_token"] * 1e3 for r in series],
                style, label=f"{impl}, {'KV cache' if cached else 'recomputed'}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("context length (tokens)")
    axis.set_ylabel("ms per generated token")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(f"decoder-only, {decode_rows[0]['layers']} layers, d_model {D_MODEL}, "
                   f"float32, {decode_rows[0]['cpu']}, {_dates(decode_rows)}", fontsize=8)
    figure.tight_layout()
    figure.savefig(out_dir / "decode.png", dpi=120)


def table(rows: list[dict]) -> str:
  """Markdown tables of every point: attention (seconds, MiB) and decoding (ms per token)."""
  def cell(row: dict | None, seconds_key: str, scale: float, digits: int) -> str:
    if row is None:
      return ""
    if "refused" in row:
      return f"refused: {row['compiled_bytes'] / 2**30:.1f} GiB"
    if "error" in row:
      return "failed"
    return f"{row[seconds_key] * scale:.{digits}f} / {row['peak_delta_bytes'] / 2**20:,.0f}"

  lines = []
  attention_rows = [r for r in rows if r["mode"] == "attention"]
  lengths = sorted({r["length"] for r in attention_rows})
  series = sorted({(r["impl"], r["causal"], r["pass"]) for r in attention_rows},
                  key=lambda s: (s[2], s[1], ATTENTION_ORDER.index(s[0])))
  if attention_rows:
    lines += ["Attention, batch 1, 8 heads, d_k 64: seconds per call / peak MiB above the "
              "start of the process.", "",
              "| pass | mask | impl | " + " | ".join(f"n={n:,}" for n in lengths) + " |",
              "| --- | --- | --- | " + " | ".join("---" for _ in lengths) + " |"]
    for impl, causal, pass_ in series:
      by_length = {r["length"]: r for r in attention_rows
                   if (r["impl"], r["causal"], r["pass"]) == (impl, causal, pass_)}
      cells = [cell(by_length.get(n), "seconds", 1, 3) for n in lengths]
      lines.append(f"| {pass_.replace('_', '+')} | {'causal' if causal else 'none'} | {impl} | "
                   + " | ".join(cells) + " |")
  decode_rows = [r for r in rows if r["mode"] == "decode"]
  if decode_rows:
    lengths = sorted({r["length"] for r in decode_rows})
    lines += ["", "Decoding one token after n tokens of context: ms per token / peak MiB above "
              "the start (prefill included).", "",
              "| impl | context | " + " | ".join(f"n={n:,}" for n in lengths) + " |",
              "| --- | --- | " + " | ".join("---" for _ in lengths) + " |"]
    for impl in sorted({r["impl"] for r in decode_rows}, key=ATTENTION_ORDER.index):
      for cached in (True, False):
        by_length = {r["length"]: r for r in decode_rows
                     if r["impl"] == impl and r["cached"] == cached}
        cells = [cell(by_length.get(n), "seconds_per_token", 1e3, 1) for n in lengths]
        lines.append(f"| {impl} | {'KV cache' if cached else 'recomputed'} | "
                     + " | ".join(cells) + " |")
  ratio_rows = [r for r in rows if r["mode"] == "ratio"]
  if ratio_rows:
    lines += ["", "Forward+backward, chunked against plain in one process, alternating calls "
              "(median of each):", "",
              "| n | plain s | chunked s | chunked / plain |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['length']:,} | {r['plain_s']:.4f} | {r['chunked_s']:.4f} | "
              f"{r['chunked_over_plain']:.2f} |" for r in sorted(ratio_rows, key=lambda r: r["length"])]
  return "\n".join(lines) + "\n"


ATTENTION_ORDER = ["plain", "xla", "chunked", "pallas", "cudnn"]


def _series(rows: list[dict], fields: tuple[str, str]) -> list[tuple[tuple, str]]:
  """Each (field values) pair with a line style: colour per first field, dash per second."""
  names = sorted({tuple(r[f] for f in fields) for r in rows}, key=str)
  colours = {v: f"C{i}" for i, v in enumerate(sorted({n[0] for n in names}))}
  dashes = {v: d for v, d in zip(sorted({n[1] for n in names}, key=str), ("o-", "s--"))}
  return [(name, f"{colours[name[0]]}{dashes[name[1]]}") for name in names]


def main(argv):
  del argv
  if FLAGS.mode == "point":
    point = json.loads(FLAGS.point)
    run = run_attention_point if point["mode"] == "attention" else run_decode_point
    print(json.dumps(run(point)), flush=True)
    return
  if FLAGS.mode == "plot":
    plot(_done_points(), Path(FLAGS.out_dir))
    return
  from transformer_jax.model.precision import cpu_model

  cpu = cpu_model()
  if FLAGS.mode == "ratio":
    run_ratio(cpu)
  elif FLAGS.mode == "attention":
    points = [dict(mode="attention", impl=impl, pass_=pass_, length=int(length),
                   causal=FLAGS.causal, block=FLAGS.block_size, cpu=cpu)
              for impl in FLAGS.impls for pass_ in ("forward", "forward_backward")
              for length in FLAGS.lengths]
    sweep([{("pass" if k == "pass_" else k): v for k, v in p.items()} for p in points], "seconds")
  else:
    points = [dict(mode="decode", impl=impl, cached=cached, length=int(length),
                   layers=FLAGS.layers, block=FLAGS.block_size, cpu=cpu)
              for impl in FLAGS.impls for cached in (True, False) for length in FLAGS.decode_lengths]
    sweep(points, "seconds_per_token")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  app.run(main)
