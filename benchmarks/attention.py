"""What does attention cost against sequence length? Time and compiled memory per implementation.

  python benchmarks/attention.py --json [--attention_impls=plain,xla] [--attention_lengths=...]

`dot_product_attention` alone, forward and forward+backward, from 128 to 8192 tokens at a
fixed token count per call (batch = --attention_tokens / length): throughput per
implementation. The cost curve at batch 1 with each point's measured peak memory is
experiments/attention_scaling.py. A length is skipped once
one call takes longer than --attention_max_seconds, or, on a CPU, when its compiled
temporaries exceed --attention_max_gib.
"""

from __future__ import annotations

from absl import flags

import common
from timing import median_time

FLAGS = flags.FLAGS
flags.DEFINE_list("attention_lengths", "128,256,512,1024,2048,4096,8192", "Sequence lengths.")
flags.DEFINE_list("attention_impls", "",
                  "Implementations; default plain,xla,chunked (+pallas,cudnn on GPU).")
flags.DEFINE_integer("attention_tokens", 8192, "batch = max(1, attention_tokens / length).")
flags.DEFINE_integer("attention_heads", 8, "Heads.")
flags.DEFINE_integer("attention_depth", 64, "Depth per head.")
flags.DEFINE_string("attention_dtype", "", "Default: float32 on CPU, bfloat16 on GPU.")
flags.DEFINE_float("attention_max_seconds", 10.0,
                   "Longer lengths are skipped once one call takes longer than this.")
flags.DEFINE_float("attention_max_gib", 6.0,
                   "Skip a length whose compiled temporary buffers exceed this (CPU RAM guard).")

Result = common.Result


def measure() -> tuple[Result, list[tuple[str, str]]]:
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.attention import dot_product_attention
  from transformer_jax.model.masking import AttentionMask

  on_cpu = jax.devices()[0].platform == "cpu"
  impls = FLAGS.attention_impls or (["plain", "xla", "chunked"]
                                    + ([] if on_cpu else ["pallas", "cudnn"]))
  dtype = jnp.dtype(FLAGS.attention_dtype or ("float32" if on_cpu else "bfloat16"))
  heads, depth = FLAGS.attention_heads, FLAGS.attention_depth
  rows = []
  for impl in impls:
    too_slow = None
    for length in (int(x) for x in FLAGS.attention_lengths):
      batch = max(1, FLAGS.attention_tokens // length)
      row = dict(impl=impl, length=length, batch=batch, heads=heads, depth=depth,
                 dtype=str(dtype))
      if too_slow:
        rows.append(dict(row, skipped=too_slow))
        continue
      keys = jax.random.split(jax.random.key(length), 3)
      q, k, v = (jax.random.normal(key, (batch, length, heads, depth), dtype) for key in keys)
      mask = AttentionMask(key_valid=jnp.ones((batch, length), bool))  # Key padding.
      attend = lambda q, k, v, mask: dot_product_attention(q, k, v, mask, impl)
      loss = lambda q, k, v, mask: jnp.sum(attend(q, k, v, mask).astype(jnp.float32))
      for name, fn in (("forward", attend),
                       ("forward_backward", jax.grad(loss, argnums=(0, 1, 2)))):
        try:
          compiled = jax.jit(fn).lower(q, k, v, mask).compile()
          temp = common.compiled_temp_bytes(compiled)
          row[f"{name}_temp_bytes"] = temp
          if on_cpu and temp and temp > FLAGS.attention_max_gib * 2**30:
            row[f"{name}_skipped"] = f"needs {temp / 2**30:.1f} GiB > --attention_max_gib"
            too_slow = row[f"{name}_skipped"]
            continue
          jax.block_until_ready(compiled(q, k, v, mask))
          seconds, _ = median_time(lambda: jax.block_until_ready(compiled(q, k, v, mask)), 3)
          row[f"{name}_s"] = seconds
          row[f"{name}_tokens_per_s"] = batch * length / seconds
          if seconds > FLAGS.attention_max_seconds:
            too_slow = f"length {length} took {seconds:.1f} s > --attention_max_seconds"
        except Exception as e:  # e.g. cuDNN's dtype / shape limits: record, go on.
          row[f"{name}_error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
      rows.append(row)
      print(line(row), flush=True)
  memory, memory_source = common.peak_memory()
  result = dict(mode="attention", rows=rows, peak_memory_bytes=memory,
                peak_memory_source=memory_source)
  return result, [("attention rows", str(len(rows)))]


def line(row: Result) -> str:
  """One length of one implementation: forward and forward+backward time and memory."""
  def cell(name: str) -> str:
    if f"{name}_s" in row:
      temp = row.get(f"{name}_temp_bytes")
      memory = f"{temp / 2**20:8.1f} MiB" if temp is not None else "      ? MiB"
      return f"{row[f'{name}_s'] * 1e3:9.2f} ms {memory}"
    return f"{(row.get(f'{name}_error') or row.get(f'{name}_skipped') or row.get('skipped', ''))[:40]:>23}"
  return (f"attention {row['impl']:<6} L={row['length']:<5} batch={row['batch']:<3} "
          f"fwd {cell('forward')}  fwd+bwd {cell('forward_backward')}")


if __name__ == "__main__":
  common.main(measure)
