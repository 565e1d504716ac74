"""The flash-attention kernels that ship with JAX (Pallas), behind one call.

On a GPU: `jax.experimental.pallas.ops.gpu.attention.mha` (Triton). On a TPU:
`jax.experimental.pallas.ops.tpu.flash_attention`. Both take the mask as
segment ids plus a causal flag, so they serve padding, packing and causal
masks; a prefix LM's two-way prefix and the decoding cache's explicit masks
are not expressible and are refused. The GPU kernel reads one segment-id
vector for queries and keys, so it serves self-attention only; there, PAD
queries see only PAD keys (their outputs, which losses ignore, differ from
the plain path's).

The platform is that of the mesh in force (`platform.platform_in_force`), so
a CPU host compiles either kernel for a TPU or GPU target it does not have.
Elsewhere the call is a one-line error. Tests run both kernels on the CPU
through Pallas's interpreters.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.experimental.pallas.ops.gpu import attention as gpu_attention
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention
from jax.sharding import PartitionSpec

from transformer_jax.errors import UserError
from transformer_jax.model.chunked_attention import round_up
from transformer_jax.model.masking import AttentionMask
from transformer_jax.model.platform import platform_in_force

Array = jax.Array

PLATFORMS = ("gpu", "tpu")
GPU_BLOCK = 128          # Sequence block of the GPU kernel (its default).
TPU_BLOCK = 128          # Sequence block of the TPU kernel: one vreg of lanes.
MIN_BLOCK = 16           # Smallest block a Triton dot takes.
MAX_HEAD_DEPTH = 256     # The GPU kernel holds a whole head row in registers.
_HIDDEN_KEY = -1         # Segment id of PAD (and added) keys: no query has it.
_ADDED_QUERY = -2        # Segment id of queries added to fill a block (the TPU kernel).


def check_supported(platform: str, depth: int, same_length: bool, mask: AttentionMask | None) -> None:
  """Raises a one-line UserError if the kernel cannot run this attention."""
  if platform not in PLATFORMS:
    raise UserError(f"attention_impl='pallas' runs on {' and '.join(PLATFORMS)}, not on "
                     f"{platform}; use attention_impl='chunked' (any backend) or 'plain'")
  if mask is not None and (mask.prefix is not None or mask.explicit is not None):
    raise UserError("attention_impl='pallas' takes padding, packing and causal masks only, "
                     "not a prefix LM's or the decoding cache's; use attention_impl='chunked'")
  if platform == "gpu" and not same_length:
    raise UserError("attention_impl='pallas' on a GPU runs self-attention only (the kernel "
                     "reads one segment-id vector); use attention_impl='cudnn' or 'chunked'")
  if depth > MAX_HEAD_DEPTH:
    raise UserError(f"attention_impl='pallas' takes heads of depth <= {MAX_HEAD_DEPTH}, not "
                     f"{depth}; use more heads or attention_impl='chunked'")


def _segment_ids(mask: AttentionMask | None, batch: int, q_len: int, k_len: int
                 ) -> tuple[Array, Array]:
  """(query ids int32[batch, q_len], key ids int32[batch, k_len]); hidden keys get -1."""
  mask = mask or AttentionMask()
  query_ids = jnp.zeros((batch, q_len), jnp.int32)
  key_ids = jnp.zeros((batch, k_len), jnp.int32)
  if mask.query_segment_ids is not None:
    query_ids = mask.query_segment_ids.astype(jnp.int32)
    key_ids = mask.key_segment_ids.astype(jnp.int32)
  if mask.key_valid is not None:
    key_ids = jnp.where(mask.key_valid, key_ids, _HIDDEN_KEY)
  return query_ids, key_ids


def _pad_length(x: Array, length: int, axis: int, value=0) -> Array:
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def pallas_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: AttentionMask | None,
    platform: str | None = None,
    interpret: bool = False,
) -> Array:
  """Flash attention, [batch, q_len, heads, d_v].

  Args:
    query: [batch, q_len, heads, d_k]; key: [batch, k_len, heads, d_k];
      value: [batch, k_len, heads, d_v] (d_k != d_v is zero-padded).
    mask: padding, segments and causality only.
    platform: "gpu" or "tpu"; None: the mesh's (`platform_in_force`).
    interpret: run the GPU kernel in Pallas's interpreter (any backend; slow).
      The TPU kernel is interpreted inside
      `jax.experimental.pallas.tpu.force_tpu_interpret_mode()`, which must
      also cover the backward pass.
  """
  platform = platform or platform_in_force()
  batch, q_len, _, d_k = query.shape
  k_len, d_v = key.shape[1], value.shape[-1]
  check_supported(platform, max(d_k, d_v), q_len == k_len, mask)
  query_ids, key_ids = _segment_ids(mask, batch, q_len, k_len)
  kernel = functools.partial(_attend, platform=platform, causal=mask is not None and mask.causal,
                             interpret=interpret)
  return _per_shard(kernel)(query, key, value, query_ids, key_ids)


def _per_shard(kernel: Callable[..., Array]) -> Callable[..., Array]:
  """`kernel` run on each device's rows and heads under the mesh in force (`jax.shard_map`):
  XLA cannot partition a Mosaic or Triton kernel itself. Rows split as the logical 'batch'
  axis and heads as 'heads' (the rule table in force); no mesh: `kernel` itself."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return kernel
  heads = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
  ids = PartitionSpec(heads[0], None)
  return jax.shard_map(kernel, mesh=mesh, in_specs=(heads, heads, heads, ids, ids),
                       out_specs=heads, check_vma=False)


def _attend(query: Array, key: Array, value: Array, query_ids: Array, key_ids: Array,
            platform: str, causal: bool, interpret: bool) -> Array:
  """The kernel on one device's share: [batch, q_len, heads, d_v]."""
  q_len, d_k = query.shape[1], query.shape[-1]
  k_len, d_v = key.shape[1], value.shape[-1]
  depth = max(d_k, d_v)
  # Zero-padding Q and K leaves QKᵀ unchanged; the padded V columns are cut below.
  query, key, value = (_pad_length(x, depth, axis=3) for x in (query, key, value))
  scale = float(d_k) ** -0.5
  if platform == "gpu":
    block = min(GPU_BLOCK, round_up(q_len, MIN_BLOCK))
    length = round_up(q_len, block)
    # One id vector: a query's id must equal its own key's. Added positions
    # get the hidden id: they see only each other and are cut.
    segment_ids = jnp.where(query_ids == key_ids, query_ids, _HIDDEN_KEY)
    segment_ids = _pad_length(segment_ids, length, axis=1, value=_HIDDEN_KEY)
    query, key, value = (_pad_length(x, length, axis=1) for x in (query, key, value))
    sizes = gpu_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=block,
                                     block_kv_dkv=block, block_q_dq=block, block_kv_dq=block)
    attended = gpu_attention.mha(query, key, value, segment_ids, sm_scale=scale, causal=causal,
                                 block_sizes=sizes, interpret=interpret)
  else:
    # The kernel's key blocks fill whole 128-lane vregs: lengths round up to them.
    q_padded, k_padded = round_up(q_len, TPU_BLOCK), round_up(k_len, TPU_BLOCK)
    block_q = block_k = TPU_BLOCK
    segment_ids = tpu_attention.SegmentIds(
        q=_pad_length(query_ids, q_padded, axis=1, value=_ADDED_QUERY),
        kv=_pad_length(key_ids, k_padded, axis=1, value=_HIDDEN_KEY))
    heads_first = lambda x, n: _pad_length(x, n, axis=1).transpose(0, 2, 1, 3)
    sizes = tpu_attention.BlockSizes(
        block_q=block_q, block_k_major=block_k, block_k=block_k, block_b=1,
        block_q_major_dkv=block_q, block_k_major_dkv=block_k, block_k_dkv=block_k,
        block_q_dkv=block_q, block_k_major_dq=block_k, block_k_dq=block_k, block_q_dq=block_q)
    attended = tpu_attention.flash_attention(
        heads_first(query, q_padded), heads_first(key, k_padded), heads_first(value, k_padded),
        segment_ids=segment_ids, causal=causal, sm_scale=scale, block_sizes=sizes)
    attended = attended.transpose(0, 2, 1, 3)
  return attended[:, :q_len, :, :d_v]
