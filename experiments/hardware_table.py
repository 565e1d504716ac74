"""Every shipped recipe's train step compiled for every target: the table to pick hardware from.

  python experiments/hardware_table.py [--recipes=quickstart,wmt14_base] [--targets=v5e-8,h100x8]
      [--out=results/hardware] [--jobs=2]

Each cell is one `python -m transformer_jax.precompile` process whose report goes to
OUT/cells/<recipe>__<target>.json (and its printout to .txt); a rerun skips the cells
already there, so the runner resumes. Then OUT/README.md is written from every cell found.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
REMATERIALIZATION = "Involuntary full rematerialization"
# Recipe name -> (config file, extra overrides).
RECIPES = {
    "quickstart": ("quickstart.py", ()),
    "multi30k": ("multi30k.py", ()),
    "wmt14_base": ("wmt14_base.py", ()),
    "wmt14_big": ("wmt14_big.py", ()),
    "lm_multi30k": ("lm_multi30k.py", ()),
    "mlm_multi30k": ("mlm_multi30k.py", ()),
    "lm_long_multi30k": ("lm_long_multi30k.py", ()),
    "vit_digits": ("vit_digits.py", ()),
}
# One accelerator each: what the base recipe can grow to there (--limits).
SINGLE = ("v5e-1", "v6e-1", "h100x1")
# The sizes tried, each alone from the base recipe: rows of 256 tokens a batch; d_model
# (d_ff 4x, heads of 64); layers of the encoder and the decoder.
LIMIT_SIZES = {
    "rows": [64, 128, 256, 512, 1024, 2048],
    "d_model": [512, 1024, 2048, 4096, 8192],
    "layers": [6, 12, 24, 48, 96],
}
TARGETS = ("v5e-1", "v5e-8", "v5e-256", "v5p-8", "v5p-128", "2xv5p-128", "v6e-1", "v6e-8",
           "h100x8", "h200x8", "2xh100x8", "b200x8")
GiB = 2**30


def cell_path(out: pathlib.Path, recipe: str, target: str, suffix: str) -> pathlib.Path:
  """OUT/cells/<recipe>__<target><suffix>; a grown recipe 'wmt14_base:rows=64' is written
  'wmt14_base+rows-64' (file names every system accepts)."""
  return out / "cells" / f"{recipe.replace(':', '+').replace('=', '-')}__{target}{suffix}"


def cell_of(path: pathlib.Path) -> tuple[str, str]:
  """(recipe, target) of a cell's file: `cell_path` read backwards."""
  recipe, target = path.stem.split("__")
  if "+" in recipe:
    base, grown = recipe.split("+")
    dimension, size = grown.rsplit("-", 1)
    recipe = f"{base}:{dimension}={size}"
  return recipe, target


def limit_overrides(dimension: str, size: int) -> tuple[str, ...]:
  """The flags that grow wmt14_base along one dimension."""
  if dimension == "rows":
    return (f"--batch={size}",)
  if dimension == "d_model":
    return (f"--config.model.d_model={size}", f"--config.model.d_ff={4 * size}",
            f"--config.model.num_heads={size // 64}")
  return (f"--config.model.num_layers={size}",)


def compile_cell(out: pathlib.Path, recipe: str, target: str) -> str:
  """Runs precompile for one cell; returns a one-line outcome. A recipe named
  'wmt14_base:<dimension>=<size>' is the base recipe grown (`limit_overrides`)."""
  base, _, grown = recipe.partition(":")
  config, overrides = RECIPES[base]
  if grown:
    dimension, size = grown.split("=")
    overrides = overrides + limit_overrides(dimension, int(size))
  json_path = cell_path(out, recipe, target, ".json")
  command = [sys.executable, "-m", "transformer_jax.precompile",
             f"--config=experiments/configs/{config}", f"--target={target}", "--nodecode",
             f"--json={json_path}", *overrides]
  started = time.time()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  text = cell_path(out, recipe, target, ".txt")
  shown = " ".join(command[1:]).replace(f"{REPO}/", "")
  text.write_text(f"$ python {shown}\n(exit {result.returncode}, "
                  f"{time.time() - started:.0f} s wall)\n{result.stdout}\n"
                  + "\n".join(line for line in result.stderr.splitlines()
                              if line.startswith("error") or REMATERIALIZATION in line))
  if not json_path.exists():  # The command failed before any report.
    json_path.write_text(json.dumps(dict(config=config, target=target, reports=[],
                                         error=result.stderr.strip().splitlines()[-1:])))
  return f"{recipe} on {target}: exit {result.returncode}, {time.time() - started:.0f} s"


def _cell_text(cell: dict) -> str:
  """'mesh 4·2·1 ✓ fits · 3.49 GiB · 180 s · 1.2 GiB moved · ≥ 12 ms' for one cell."""
  reports = [r for r in cell.get("reports", []) if r["program"] == "train step"]
  if not reports:
    return "error: " + " ".join(cell.get("error", ["no report"]))[:120]
  fitting = [r for r in reports if r["fits"]]
  report = fitting[0] if fitting else reports[0]
  mesh = "·".join(str(report["mesh"][axis]) for axis in ("data", "fsdp", "tensor"))
  if report["error"]:
    return f"{mesh} ✗ compiler: out of memory"
  peak = report["memory"]["peak"] / GiB
  moved = sum(c["bytes"] for c in report["collectives"].values()) / GiB
  parts = [f"{mesh} {'✓' if report['fits'] else '✗'}", f"{peak:.2f} GiB",
           f"{report['compile_seconds']:.0f} s", f"{moved:.2f} GiB moved"]
  if report["step_time_bound_s"]:
    parts.append(f"≥ {report['step_time_bound_s'] * 1e3:.1f} ms")
  if report["rematerializations"]:
    parts.append(f"**{len(report['rematerializations'])} full remat.**")
  if len(reports) > 1 and fitting:
    parts.append(f"({len(reports) - 1} split(s) tried first)")
  if any("batch shards" in note for note in report["notes"]):
    parts.append(f"{report['rows']} rows†")
  if any("triton_gemm" in note for note in report["notes"]):
    parts.append("cuBLAS‡")
  return " · ".join(parts)


def host() -> str:
  from transformer_jax.model.precision import cpu_model  # Reads /proc/cpuinfo; imports JAX.

  return f"{cpu_model()}, {os.cpu_count()} cores"


def _fits(cell: dict) -> bool:
  return any(r["fits"] for r in cell.get("reports", []) if r["program"] == "train step")


def limits_table(cells: dict) -> str:
  """The largest of the sizes tried that fits one device, per dimension and target."""
  lines = ["| wmt14_base grown along | " + " | ".join(SINGLE) + " |",
           "|" + " --- |" * (len(SINGLE) + 1)]
  labels = {"rows": "batch rows of 256 tokens (recipe: 97)",
            "d_model": "d_model, d_ff 4x, heads of 64 (recipe: 512)",
            "layers": "encoder and decoder layers (recipe: 6)"}
  for dimension, sizes in LIMIT_SIZES.items():
    row = []
    for target in SINGLE:
      tried = [(size, cells.get((f"wmt14_base:{dimension}={size}", target))) for size in sizes]
      done = [(size, cell) for size, cell in tried if cell is not None]
      if not done:
        row.append("not compiled yet")
        continue
      fitting = [size for size, cell in done if _fits(cell)]
      first_over = next((size for size, cell in done if not _fits(cell)), None)
      text = f"{max(fitting):,}" if fitting else f"< {sizes[0]:,}"
      text += f" ({first_over:,} does not fit)" if first_over else " (all tried fit)"
      if len(done) < len(sizes) and not first_over:
        text += f", {len(done)} of {len(sizes)} sizes compiled"
      row.append(text)
    lines.append(f"| {labels[dimension]} | " + " | ".join(row) + " |")
  return "\n".join(lines)


def meshes_section(out: pathlib.Path) -> str:
  """One line per compile of a recipe on a mesh split all three ways (OUT/meshes/*.json)."""
  lines = []
  for path in sorted((out / "meshes").glob("*.json")):
    cell = json.loads(path.read_text())
    config = pathlib.Path(cell["config"]).stem
    for report in cell["reports"]:
      mesh = "·".join(str(report["mesh"][axis]) for axis in ("data", "fsdp", "tensor"))
      remats = len(report["rematerializations"])
      lines.append(f"- `{config}` on {cell['target']}, {report['program']}, mesh {mesh}: "
                   f"{'fits' if report['fits'] else 'does not fit'}, "
                   f"{report['memory'].get('peak', 0) / GiB:.2f} GiB a device, compiled in "
                   f"{report['compile_seconds']:.0f} s, "
                   f"{remats or 'no'} full rematerialization{'s' if remats != 1 else ''} "
                   f"([`{path.with_suffix('.txt').name}`](meshes/{path.with_suffix('.txt').name}))")
  return "\n".join(lines) or "None compiled yet."


DECODING_TASKS = ("translation", "prefix_lm", "causal_lm")
GQA_RECIPE, GQA_KV_HEADS = "wmt14_big", (16, 8, 4, 2, 1)


def kv_cache_table() -> str:
  """Bytes of the decoding cache a token a row, per decoding recipe, and for wmt14_big with
  fewer key/value heads (grouped-query attention, config.model.num_kv_heads)."""
  from transformer_jax.configs import load_module  # Imports JAX: only when writing.
  from transformer_jax.model.config import ModelConfig
  from transformer_jax.model.info import kv_cache_bytes_per_token

  lines = ["| recipe | decoder layers | key/value heads of heads | KV cache a token a row | "
           "tokens a row in 1 GiB |", "|" + " --- |" * 5]

  def row(name: str, model: ModelConfig) -> str:
    per_token = kv_cache_bytes_per_token(model)
    return (f"| {name} | {model.num_decoder_layers} | {model.num_kv_heads} of "
            f"{model.num_heads} | {per_token / 1024:,.1f} KiB | {GiB // per_token:,} |")

  for recipe, (file, _) in RECIPES.items():
    config = load_module(REPO / "experiments" / "configs" / file, f"config_{recipe}").get_config()
    if config.task not in DECODING_TASKS:
      continue
    model = ModelConfig.from_config(config.model)
    lines.append(row(f"`{recipe}`", model))
    if recipe == GQA_RECIPE:
      for kv_heads in GQA_KV_HEADS:
        if kv_heads != model.num_heads:
          lines.append(row(f"`{recipe}`, num_kv_heads={kv_heads}",
                           ModelConfig.from_config(dict(config.model, num_kv_heads=kv_heads))))
  return "\n".join(lines)


def write_readme(out: pathlib.Path) -> None:
  cells = {}
  for path in sorted((out / "cells").glob("*.json")):
    cells[cell_of(path)] = json.loads(path.read_text())
  header = "| recipe | " + " | ".join(TARGETS) + " |"
  lines = [header, "|" + " --- |" * (len(TARGETS) + 1)]
  for recipe in RECIPES:
    row = [_cell_text(cells[recipe, t]) if (recipe, t) in cells else "not compiled yet"
           for t in TARGETS]
    lines.append(f"| `{recipe}` | " + " | ".join(row) + " |")
  table = "\n".join(lines)
  limits = limits_table(cells)
  (out / "README.md").write_text(README.format(date=datetime.date.today(), host=host(),
                                               table=table, limits=limits,
                                               meshes=meshes_section(out),
                                               kv_cache=kv_cache_table()))


README = """# Which hardware each recipe fits

Every shipped recipe's real train step, compiled ahead of time for each target from a CPU
host (`python -m transformer_jax.precompile`), {date}, on {host}: jax/jaxlib 0.10.2 with
libtpu 0.0.42.1 and jax-cuda12-plugin 0.10.2. **Cross-compiled, not run**: no figure here
was measured on the hardware; the GPU compiler does no autotuning without a GPU and
reports no FLOPs; the TPU compiler refuses a program that overflows HBM.

Rerun: `python experiments/hardware_table.py` (one precompile process a cell; a rerun
resumes; each cell's command and printout are in `cells/<recipe>__<target>.txt`).

## The table

Each cell: the mesh `data·fsdp·tensor` (every device on data unless that did not fit;
then more fsdp, then tensor), ✓ fits / ✗ does not, peak bytes per device (arguments,
undonated outputs, temporaries and code, from XLA's memory analysis), the compile time on
this host (two cells compiled at once on its 2 cores, at times beside the test suite: about
one core each, so an upper figure), the bytes the step's collectives return per device (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute), and on TPUs a lower bound on the step
time from the compiler's FLOPs and bytes against the chip's peak bf16 FLOP/s and HBM
bandwidth (a roofline, not a measurement). † the recipe's batch has fewer rows than the
mesh has batch shards, so one row a shard was compiled instead (the recipes are sized for
2 CPU cores; on a pod, raise `config.data.tokens_per_batch`). ‡ without autotuning, XLA's
Triton GEMM found no tiling for one of the step's dots (the ViT's 17-token rows), so the step
was compiled with `xla_gpu_enable_triton_gemm=false`, cuBLAS taking every dot. Recipes compile as shipped:
float32 compute, but multi30k's `matmul_dtype='auto'`, which resolves to bfloat16 operands
on every TPU and GPU target.

{table}

## Split three ways

Every cell above fits with every device on the data axis. The sharding rules were also
compiled on meshes that split data, fsdp and tensor at once, train step and decoding
(`precompile --mesh=data=2,fsdp=2,tensor=2`; in CI, `tests/hardware/` compiles tiny models
of every family for v5e-4 on fsdp 2 x tensor 2 and for 8 H100s on 2 x 2 x 2, and
`tests/hardware/test_precompile.py` six meshes of 8 CPU devices):

{meshes}

## How far the base recipe grows on one accelerator

`wmt14_base` grown along one dimension at a time, everything else as shipped (float32, a
batch of the recipe's 97 rows of 256 tokens), on a Colab TPU (v5e-1, v6e-1) and one H100:
the largest of the sizes tried whose train step fits (on the TPUs the compiler accepted
it; on the H100 its peak is below 79.1 GiB). Doubling steps: the true limit lies between
the two figures. `experiments/hardware_table.py --limits`.

{limits}

## Decoding memory: the KV cache

What the decoding cache holds for each token of each row (beam hypotheses count as rows):
every decoder layer's keys and values, in the matmul operand dtype
(`model.info.kv_cache_bytes_per_token`, also printed by `model_info`; an encoder-decoder's
cross-attention holds as much again for each source token). Grouped-query attention
(`config.model.num_kv_heads`) divides it by num_heads / num_kv_heads; the `wmt14_big` rows
below are that recipe with fewer key/value heads (computed from shapes, not compiled).
`multi30k`'s `matmul_dtype='auto'` is resolved on the host writing this table (float32 on a
CPU without native bfloat16; bfloat16, half the bytes, on TPUs and GPUs).

{kv_cache}
"""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--recipes", default=",".join(RECIPES))
  parser.add_argument("--targets", default="", help="Default: every column (with --limits: "
                      + ", ".join(SINGLE) + ").")
  parser.add_argument("--out", default=str(REPO / "results" / "hardware"))
  parser.add_argument("--jobs", type=int, default=1, help="Cells compiled at once.")
  parser.add_argument("--limits", action="store_true",
                      help="Grow wmt14_base on one accelerator instead (the second table).")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  (out / "cells").mkdir(parents=True, exist_ok=True)
  if args.limits:  # Sizes in order, each group stopping at the first that does not fit.
    targets = args.targets.split(",") if args.targets else SINGLE
    groups = [[(f"wmt14_base:{dimension}={size}", target) for size in sizes]
              for target in targets for dimension, sizes in LIMIT_SIZES.items()]
  else:
    targets = args.targets.split(",") if args.targets else TARGETS
    groups = [[(r, t)] for r in args.recipes.split(",") for t in targets]

  writing = threading.Lock()

  def run_group(group: list[tuple[str, str]]) -> None:
    for cell in group:
      path = cell_path(out, *cell, ".json")
      if not path.exists():
        print(compile_cell(out, *cell), flush=True)
        with writing:
          write_readme(out)
      if not _fits(json.loads(path.read_text())):
        break

  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    list(pool.map(run_group, groups))
  write_readme(out)


if __name__ == "__main__":
  main()
