"""What a compiled program says about itself: memory, collectives, FLOPs, and the partitioner's log.

XLA's SPMD partitioner reports a sharding it cannot reach efficiently ("Involuntary
full rematerialization": it replicates the whole tensor on every device, then
slices it) only as a C++ log line on stderr. `native_stderr` captures that
stream while a program compiles, so a compile can be failed on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import Any, Iterator

import numpy as np

REMATERIALIZATION = "Involuntary full rematerialization"
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# `%name = f32[8,512]{1,0} all-gather(...)`, `(f32[..], bf16[..]) all-reduce-start(...)`.
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b(?P<dtype>pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2|"
                    r"bf16|f16|f32|f64|c64|c128)\[(?P<dims>[0-9,]*)\]")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "c64": 64, "c128": 128}


@dataclasses.dataclass
class Collective:
  """How often one kind of collective runs in a step, and the bytes of its results (per device)."""

  count: int = 0
  bytes: int = 0


def _array_bytes(dtype: str, dims: str) -> int:
  bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype) or 8)
  return int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) * bits // 8


def collectives(hlo_text: str) -> dict[str, Collective]:
  """Each collective of a compiled HLO module: {'all-reduce': Collective(count, bytes), ...}.

  Bytes are those of each instruction's result on one device. An asynchronous
  pair counts once, at its start; a start's tuple holds its operands and
  buffers besides the result, so the largest array of it is taken.
  """
  found = {name: Collective() for name in COLLECTIVES}
  for match in _INSTRUCTION.finditer(hlo_text):
    sizes = [_array_bytes(a["dtype"], a["dims"]) for a in _ARRAY.finditer(match["shape"])]
    entry = found[match["op"]]
    entry.count += 1
    entry.bytes += (max(sizes) if match["start"] else sum(sizes)) if sizes else 0
  return found


def custom_calls(hlo_text: str) -> dict[str, int]:
  """How often each custom-call target appears in an HLO module: the kernels a program calls
  (a Pallas TPU kernel is 'tpu_custom_call', cuDNN's attention '__cudnn$fmha...')."""
  found: dict[str, int] = {}
  for target in re.findall(r'custom_call_target="([^"]+)"', hlo_text):
    found[target] = found.get(target, 0) + 1
  return found


def rematerializations(log_text: str) -> list[str]:
  """The partitioner's full-rematerialization warnings in `log_text`, one line each: the HLO
  operation and the JAX op that made it."""
  found = []
  for line in log_text.splitlines():
    if REMATERIALIZATION not in line:
      continue
    operation = re.search(r"for HLO operation (%\S+ = \S+ [\w-]+)", line)
    source = re.search(r'op_name="([^"]+)"', line)
    found.append(" ".join(part for part in (
        operation[1] if operation else line.strip()[:200],
        f"({source[1]})" if source else "") if part))
  return found


@contextlib.contextmanager
def native_stderr() -> Iterator[list[str]]:
  """Captures what native code writes to file descriptor 2 inside the block.

  Yields a list that holds the captured text once the block ends; the text is
  also written on to the real stderr, so nothing is hidden from the user.
  """
  captured: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield captured
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      sink.seek(0)
      text = sink.read().decode(errors="replace")
      captured.append(text)
      os.write(2, text.encode())


def memory(compiled: Any) -> dict[str, int]:
  """XLA's memory analysis of one device's program: arguments, outputs, aliased (donated
  arguments reused as outputs), temporaries and code, in bytes; `peak` sums what is live
  at once: arguments, outputs not aliased to them, temporaries and code."""
  analysis = compiled.memory_analysis()
  sizes = dict(
      arguments=int(analysis.argument_size_in_bytes),
      outputs=int(analysis.output_size_in_bytes),
      aliased=int(analysis.alias_size_in_bytes),
      temporaries=int(analysis.temp_size_in_bytes),
      code=int(analysis.generated_code_size_in_bytes),
  )
  sizes["peak"] = (sizes["arguments"] + sizes["outputs"] - sizes["aliased"]
                   + sizes["temporaries"] + sizes["code"])
  return sizes


def cost(compiled: Any) -> dict[str, float]:
  """{'flops', 'bytes accessed'} of one device's program where the compiler reports them
  (TPU and CPU do; the GPU compiler without a GPU reports nothing: {})."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  return {key: float(analysis[key]) for key in ("flops", "bytes accessed")
          if analysis and key in analysis}


def step_time_bound(flops: float, bytes_accessed: float, peak_flops: float,
                    memory_bandwidth: float) -> float:
  """A lower bound on one step's seconds: the slower of the chip's peak FLOP/s over the
  FLOPs, and its memory bandwidth over the bytes accessed (a roofline; no collective or
  overhead counted). 0 where the figures are unknown."""
  if not (flops and peak_flops and memory_bandwidth):
    return 0.0
  return max(flops / peak_flops, bytes_accessed / memory_bandwidth)
