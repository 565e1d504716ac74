"""Scaled dot-product attention against a float64 NumPy reference, and the masks."""
# Every implementation against "plain" lives in test_attention_implementations.py.

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model import attention
from transformer_jax.model.masking import AttentionMask


def _reference_attention(query, key, value, mask):
  """softmax(QKᵀ/√d_k + mask) V in float64; query [b, q, h, d]."""
  query, key, value = (np.asarray(a, np.float64) for a in (query, key, value))
  logits = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  logits = np.where(mask, logits, -np.inf)
  logits -= logits.max(-1, keepdims=True)
  weights = np.exp(logits)
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", weights, value)


def _random_inputs(d_k=8, d_v=8):
  keys = jax.random.split(jax.random.key(0), 3)
  query = jax.random.normal(keys[0], (2, 5, 3, d_k))
  key = jax.random.normal(keys[1], (2, 7, 3, d_k))
  value = jax.random.normal(keys[2], (2, 7, 3, d_v))
  key_tokens = jnp.array([[4, 5, 6, 7, 8, 0, 0], [4, 5, 6, 7, 8, 9, 3]])
  return query, key, value, AttentionMask(key_valid=key_tokens != 0)


@pytest.mark.parametrize("d_k,d_v", [(8, 8), (4, 16)])
def test_attention_matches_float64_reference(d_k, d_v):
  query, key, value, mask = _random_inputs(d_k, d_v)
  got = attention.dot_product_attention(query, key, value, mask, "plain")
  want = _reference_attention(query, key, value, np.asarray(mask.dense(5, 7)))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d_k,d_v", [(8, 8), (4, 16), (16, 4)])
def test_fused_path_equals_plain_path(d_k, d_v):
  query, key, value, mask = _random_inputs(d_k, d_v)
  plain = attention.dot_product_attention(query, key, value, mask, "plain")
  fused = attention.dot_product_attention(query, key, value, mask, "xla")
  np.testing.assert_allclose(fused, plain, atol=1e-5, rtol=1e-5)


def test_mask_parts_expand_to_the_paper_masks():
  tokens = jnp.array([[5, 6, 0]])
  padding = AttentionMask.self_attention(tokens, None, causal=False).dense(3, 3)
  np.testing.assert_array_equal(padding[0, 0, 0], [True, True, False])
  causal = AttentionMask(causal=True).dense(4, 4)
  np.testing.assert_array_equal(causal[0, 0], np.tril(np.ones((4, 4), bool)))
  prefix = AttentionMask(causal=True, prefix=jnp.array([[True, True, False, False]])).dense(4, 4)
  assert bool(prefix[0, 0, 0, 1]), "a prefix token sees the later prefix tokens"
  assert not bool(prefix[0, 0, 2, 3]), "a target token does not see the next one"


def test_a_block_is_the_matching_window_of_the_whole_mask():
  segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
  tokens = jnp.array([[4, 4, 4, 4, 4, 4, 4, 0]])
  mask = AttentionMask.self_attention(tokens, segments, causal=True)
  whole = mask.dense(8, 8)
  np.testing.assert_array_equal(mask.block(4, 4, 2, 3), whole[:, :, 4:8, 2:5])


def test_masked_keys_get_zero_weight():
  query, key, value, mask = _random_inputs()
  weights = attention.dot_product_attention_weights(query, key, mask.dense(5, 7))
  assert float(weights[0, :, :, 5:].max()) == 0.0, "PAD keys must receive no attention"
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
