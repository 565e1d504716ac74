"""Where a compiled step's time goes: a jax.profiler trace read per XLA op.

`profile_steps` traces a few steps, reads each op's time from the Perfetto
trace and attributes it through the optimized HLO: a category from the opcodes
inside each fusion (a fusion holding a dot is `matmul`), a component from the
op's Python stack and Flax name stack (`self_attention/`, `feed_forward/`,
loss, Adam, ...), and the pass (forward / backward). Used by
`benchmarks/train_step.py --profile_dir` and `benchmarks/decoding.py --profile_dir`.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Any, Callable

from portable_paths import portable_path  # benchmarks/portable_paths.py

Result = dict[str, Any]


def profile_steps(compiled, step: Callable[[], None], profile_dir: str, steps: int = 2,
                  name: str = "train_step") -> Result:
  """Traces `steps` steps and attributes each XLA op's time to a category and a component.

  Categories come from the optimized HLO (an op, or a fusion, holding a dot is
  'matmul'); components and forward/backward from the op's JAX name stack
  (Flax module paths, `transpose(jvp(...))` for the backward pass).
  """
  import jax

  hlo_text = compiled.as_text()
  os.makedirs(profile_dir, exist_ok=True)
  with open(os.path.join(profile_dir, f"{name}.hlo.txt"), "w") as f:
    f.write(hlo_text)  # For a closer look, with the trace.
  ops = hlo_op_table(hlo_text)
  with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
    for _ in range(steps):
      step()
  traces = sorted(glob.glob(os.path.join(profile_dir, "**", "perfetto_trace.json.gz"),
                            recursive=True), key=os.path.getmtime)
  if not traces:
    return dict(error=f"no perfetto trace under {profile_dir}")
  with gzip.open(traces[-1]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  spans = [e for e in events if e.get("ph") == "X"]
  # The CPU runtime tags each op's span with args.hlo_op; elsewhere (GPU) fall back
  # to spans named like an HLO instruction.
  tagged = [(e["args"]["hlo_op"], e) for e in spans if (e.get("args") or {}).get("hlo_op")]
  if not tagged:
    tagged = [(e["name"], e) for e in spans if e.get("name") in ops]
  per_op: collections.Counter = collections.Counter()
  for name, event in tagged:
    per_op[name] += event.get("dur", 0.0) / 1e6 / steps  # µs -> s per step.
  total = sum(per_op.values()) or 1.0
  by = {key: collections.Counter() for key in ("category", "component", "pass")}
  top = []
  for name, seconds in per_op.most_common():
    info = ops.get(name, dict(category="other", component="other", pass_="forward", shape=""))
    by["category"][info["category"]] += seconds
    by["component"][info["component"]] += seconds
    by["pass"][info["pass_"]] += seconds
    if len(top) < 20:
      top.append(dict(op=name, seconds=seconds, share=seconds / total, shape=info["shape"],
                      category=info["category"], component=info["component"]))
  share = lambda counter: {k: round(v / total, 4) for k, v in counter.most_common()}
  return dict(trace=portable_path(traces[-1]), op_seconds_per_step=total,
              by_category=share(by["category"]), by_component=share(by["component"]),
              by_pass=share(by["pass"]), top_ops=top)


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\(")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_TABLE_ROW = re.compile(r"^\s*(\d+)\s+(.*)$")


def _stack_frames(hlo_text: str) -> dict[int, list[tuple[str, str]]]:
  """{stack_frame_id: [(file, function), ...] innermost first} from the HLO's tables."""
  tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
  section = None
  for line in hlo_text.splitlines():
    if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line.strip()
      continue
    row = _TABLE_ROW.match(line) if section else None
    if row:
      tables[section][int(row.group(1))] = row.group(2)
    elif line.strip():
      section = None
  field = lambda text, name: int(re.search(rf"{name}=(\d+)", text).group(1))
  frames = {}
  for frame_id in tables["StackFrames"]:
    chain, seen, current = [], set(), frame_id
    while current in tables["StackFrames"] and current not in seen:
      seen.add(current)
      entry = tables["StackFrames"][current]
      location = tables["FileLocations"].get(field(entry, "file_location_id"), "")
      if location:
        chain.append((tables["FileNames"].get(field(location, "file_name_id"), "").strip('"'),
                      tables["FunctionNames"].get(field(location, "function_name_id"), "").strip('"')))
      parent = re.search(r"parent_frame_id=(\d+)", entry)
      current = int(parent.group(1)) if parent else -1
    frames[frame_id] = chain
  return frames


def hlo_op_table(hlo_text: str) -> dict[str, dict[str, str]]:
  """{instruction name: category, component, pass_, shape} for every HLO op."""
  frames = _stack_frames(hlo_text)
  computations: dict[str, list[dict[str, Any]]] = {}
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and " = " not in line.split("{")[0]:
      current = header.group(1)
      computations[current] = []
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      op_name = re.search(r'op_name="([^"]*)"', line)
      frame = re.search(r"stack_frame_id=(\d+)", line)
      called = re.search(r"calls=%?([^\s,}]+)", line)
      target = re.search(r'custom_call_target="([^"]*)"', line)  # GPU GEMMs, cuDNN attention.
      computations[current].append(dict(
          name=match.group(1), shape=match.group(2).strip(),
          opcode=match.group(3) + (f":{target.group(1)}" if target else ""),
          origin=(op_name.group(1) if op_name else "",
                  frames.get(int(frame.group(1)), []) if frame else []),
          called=called.group(1) if called else ""))

  def body(name: str, depth: int = 0) -> list[dict[str, Any]]:
    found = []
    for instruction in computations.get(name, []):
      found.append(instruction)
      if instruction["called"] and depth < 4:
        found.extend(body(instruction["called"], depth + 1))
    return found

  table = {}
  for instructions in computations.values():
    for instruction in instructions:
      inner = body(instruction["called"]) if instruction["called"] else []
      opcodes = {instruction["opcode"]} | {i["opcode"] for i in inner}
      # A fusion is named after its root; a dot inside says more about where it comes from.
      dots = [i["origin"] for i in [instruction, *inner]
              if _category({i["opcode"]}) == "matmul" and i["origin"][0]]
      named = [i["origin"] for i in inner if i["origin"][0]]
      origin = dots[0] if dots else (instruction["origin"] if instruction["origin"][0]
                                     else (named[0] if named else ("", [])))
      table[instruction["name"]] = dict(
          category=_category(opcodes), component=_component(*origin),
          pass_="backward" if "transpose(" in origin[0] else "forward",
          shape=instruction["shape"][:60])
  return table


def _category(opcodes: set[str]) -> str:
  targets = " ".join(o.lower() for o in opcodes if o.startswith("custom-call:"))
  if "fmha" in targets or "cudnn$f" in targets:
    return "fused attention (cuDNN)"
  if opcodes & {"dot", "convolution"} or any(k in targets for k in ("gemm", "matmul", "cublas")):
    return "matmul"
  if opcodes & {"rng-bit-generator", "rng"} or {"shift-right-logical", "xor"} <= opcodes:
    return "rng (dropout)"
  if opcodes & {"gather", "scatter"}:
    return "gather/scatter"
  if opcodes & {"reduce", "reduce-window"}:
    return "reduce (softmax, norms, sums)"
  if opcodes <= {"copy", "transpose", "bitcast", "reshape", "copy-start", "copy-done", "parameter"}:
    return "copy/transpose"
  if opcodes & {"all-reduce", "all-gather", "reduce-scatter", "collective-permute"}:
    return "collective"
  return "elementwise"


def _component(op_name: str, frames: list[tuple[str, str]]) -> str:
  """The model part an op belongs to: its Python call stack first, then its Flax name stack."""
  files = " ".join(file for file, _ in frames)
  functions = {function for _, function in frames}
  if "optax" in files or "apply_updates" in functions:
    return "optimizer (Adam)"
  if "losses.py" in files or "loss_sums" in functions and "apply" not in functions:
    return "loss (log-softmax, smoothing)"
  if "dropout" in op_name.lower() or "stochastic.py" in files:
    return "dropout"
  for pattern, component in (
      ("_block/norm", "layer norm"), ("self_attention/", "attention"),
      ("cross_attention/", "attention"), ("feed_forward/", "feed-forward"),
      ("embed_source", "embedding + positions"), ("embed_target", "embedding + positions"),
      ("target_embedding", "output logits (tied)"),
  ):
    if pattern in op_name:
      return component
  if "_block" in op_name:
    return "residual"
  if "search.py" in files:
    return "search (top-k, beam/cache reordering)"
  if "train_step" in functions or "grad_fn" in op_name:
    return "step (grad scaling, metrics)"
  return "model (other)" if "Transformer" in op_name else "other"


def profile_table(profile: Result, unit: str = "step") -> str:
  if "error" in profile:
    return f"  profile: {profile['error']}"
  lines = [f"  profile: {profile['op_seconds_per_step'] * 1e3:.0f} ms of op time per {unit} "
           "(summed over threads)"]
  for key in ("by_category", "by_component", "by_pass"):
    parts = ", ".join(f"{k} {v * 100:.0f}%" for k, v in profile[key].items())
    lines.append(f"    {key[3:]}: {parts}")
  lines.append("    top ops:")
  for op in profile["top_ops"][:12]:
    lines.append(f"      {op['share'] * 100:5.1f}% {op['seconds'] * 1e3:8.1f} ms  {op['op'][:28]:<28} "
                 f"{op['category']:<22} {op['component']:<22} {op['shape']}")
  return "\n".join(lines)
