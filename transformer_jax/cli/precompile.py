"""Compiles a config's train step (and beam search) for a TPU slice or GPU node this host lacks.

  python -m transformer_jax.precompile --config=experiments/configs/wmt14_base.py \
      --target=v5e-8 [--mesh=data=4,fsdp=2,tensor=1] [--batch=ROWS] [--json=FILE] \
      [--workdir=RUN]

Targets: v5e-1, v5e-8, v5e-256, v5p-8, v5p-128, 2xv5p-128, v6e-1, v6e-8, h100x8,
h200x8, 2xh100x8, b200x8 (hardware/targets.py), and local (this process's own
devices: a Colab TPU, a GPU, or the CPU with --config.cpu_devices). Prints, per
device, what the step holds against the device's memory, the collectives, the
compiler's FLOPs and the roofline bound they give on TPUs, and the compile
time. Where the config's mesh does not fit it tries more fsdp, then tensor.
Exit status 1 where nothing fits or the partitioner replicated a sharded
tensor in full. --workdir saves the fitting train step's executable into the
run directory, which `train` loads on matching devices instead of compiling.
"""

from __future__ import annotations

import json
import os
import sys

import jax
from absl import app, flags

from transformer_jax import sharding
from transformer_jax.cli import common
from transformer_jax.cli.model_info import parse_mesh
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.hardware import precompile
from transformer_jax.hardware.targets import LOCAL, get_target
from transformer_jax.tasks.registry import make_task
from transformer_jax.training import compiled_step

MiB, GiB = 2**20, 2**30


def _size(n: int) -> str:
  return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


def format_report(report: precompile.Report) -> str:
  """The report as the lines the command prints."""
  target = report.target
  mesh = " ".join(f"{axis}={size}" for axis, size in report.mesh.items())
  unit = "rows" if report.program == "train step" else "sequences"
  lines = [f"{report.program} on mesh {mesh}, a batch of {report.rows} {unit} x "
           f"{report.length} tokens"]
  lines += [f"  note: {note}" for note in report.notes]
  if report.error:
    lines.append(f"  does not fit: the compiler refused it: {report.error}")
    return "\n".join(lines)
  memory = report.memory
  rows = [("parameters", report.params_bytes)]
  if report.opt_state_bytes:
    rows.append(("Adam state", report.opt_state_bytes))
  rows += [("all arguments", memory["arguments"]),
           ("outputs not donated", memory["outputs"] - memory["aliased"]),
           ("temporaries", memory["temporaries"]), ("code", memory["code"])]
  lines += [f"  {label:<22}{_size(value):>14}" for label, value in rows]
  verdict = "fits" if report.fits else "DOES NOT FIT"
  lines.append(f"  {'peak per device':<22}{_size(report.peak_bytes):>14}  of "
               f"{_size(target.memory_bytes)}: {verdict}")
  moved = ", ".join(f"{name} {c.count} ({_size(c.bytes)})"
                    for name, c in report.collectives.items() if c.count)
  lines.append(f"  {'collectives':<22}{moved or 'none'}")
  if report.cost.get("flops"):
    line = f"  {'FLOPs per device':<22}{report.cost['flops']:.3g}"
    if report.step_time_bound:
      what = "step" if report.program == "train step" else "call"
      line += (f"; {what} time >= {report.step_time_bound * 1e3:,.2f} ms (a roofline bound from "
               f"{target.peak_flops / 1e12:g} TFLOP/s bf16 and {target.memory_bandwidth / 1e9:,.0f}"
               " GB/s, not a measurement)")
    lines.append(line)
  lines.append(f"  {'compiled in':<22}{report.compile_seconds:.1f} s")
  kernels = ", ".join(f"{name} x{count}" for name, count in report.custom_calls.items())
  if kernels:
    lines.append(f"  {'custom calls':<22}{kernels}")
  for warning in report.rematerializations:
    lines.append(f"  full rematerialization: {warning}")
  return "\n".join(lines)


def _header(config_path: str, target) -> str:
  memory = _size(target.memory_bytes)
  return (f"{config_path} for {target.name}: {target.devices} x {target.chip} ({memory} each); "
          "cross-compiled: no autotuning on GPU, nothing timed")


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  if common.FLAGS.config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/wmt14_base.py")
  FLAGS = flags.FLAGS
  config = common.FLAGS.config
  if FLAGS.target == LOCAL:
    sharding.use_cpu_devices(config.cpu_devices)  # Before JAX's first operation.
  else:
    # Compile-only devices need no local accelerator; without a GPU, JAX keeps its CUDA
    # compiler only when told to run on the CPU.
    jax.config.update("jax_platforms", "cpu")
  # libtpu holds /tmp/libtpu_lockfile for one process; a compile-only topology drives no chip.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # A compile read back from the persistent cache would skip the partitioner and its log.
  jax.config.update("jax_enable_compilation_cache", False)
  target = get_target(FLAGS.target)
  requested = parse_mesh(FLAGS.mesh) if FLAGS.mesh else config.mesh
  first = precompile.mesh_sizes(requested, target.devices)
  print(_header(FLAGS["config"].config_filename, target), flush=True)

  def on_try(mesh, outcome) -> None:
    if isinstance(outcome, str):
      print(f"mesh {mesh}: {outcome}", flush=True)
    else:
      print(format_report(outcome), flush=True)

  report, compiled, tried = precompile.fitting_train_step(config, target, first, FLAGS.batch,
                                                          on_try=on_try)
  reports = list(tried)
  if report.fits and report is not tried[0]:
    print(f"first split that fits: mesh {report.mesh}", flush=True)
  if not report.fits:
    print("does not fit on any mesh tried; in order, try: "
          + "; ".join(precompile.fixes(target)), flush=True)
  if FLAGS.workdir and compiled is not None:
    path = compiled_step.save(compiled, os.path.expanduser(FLAGS.workdir),
                              make_task(config).run_config())
    print(f"saved the train step's executable: {path}", flush=True)
  decode = (precompile.compile_decoding(config, target, report.mesh, report.rows,
                                        int(config.data.max_len) // 2)
            if report.fits and FLAGS.decode else None)
  if decode is not None:
    print(format_report(decode[0]), flush=True)
    reports.append(decode[0])
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(dict(config=FLAGS["config"].config_filename, target=target.name,
                     reports=[r.to_json() for r in reports]), f, indent=1)
  replicated = [w for r in reports for w in r.rematerializations]
  if replicated:
    print(f"error: the partitioner replicated a sharded tensor in full {len(replicated)} "
          "time(s) (listed above); change the sharding rules (sharding.LOGICAL_AXIS_RULES) or "
          "the mesh", file=sys.stderr, flush=True)
    sys.exit(1)
  if not report.fits:
    sys.exit(1)


def run() -> None:
  common.define_run_flags()
  flags.DEFINE_string("target", None, "The hardware to compile for, e.g. v5e-8 or h100x8.")
  flags.DEFINE_string("mesh", "", "data=D,fsdp=F,tensor=T; default: the config's mesh.")
  flags.DEFINE_integer("batch", None, "Rows of the training batch; default: the recipe's.")
  flags.DEFINE_boolean("decode", True, "Also compile the task's decoding of a batch: beam "
                       "search (translation) or sampling (causal_lm), half data.max_len long.")
  flags.DEFINE_string("json", "", "Also write the reports to this JSON file.")
  flags.mark_flag_as_required("target")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
