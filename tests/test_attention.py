"""Scaled dot-product attention against a float64 NumPy reference, and the masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model import attention


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
  return query, key, value, attention.padding_mask(key_tokens)


@pytest.mark.parametrize("d_k,d_v", [(8, 8), (4, 16)])
def test_attention_matches_float64_reference(d_k, d_v):
  query, key, value, mask = _random_inputs(d_k, d_v)
  got = attention.dot_product_attention(query, key, value, mask, "plain")
  want = _reference_attention(query, key, value, np.asarray(mask))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d_k,d_v", [(8, 8), (4, 16), (16, 4)])
def test_fused_path_equals_plain_path(d_k, d_v):
  query, key, value, mask = _random_inputs(d_k, d_v)
  plain = attention.dot_product_attention(query, key, value, mask, "plain")
  fused = attention.dot_product_attention(query, key, value, mask, "xla")
  np.testing.assert_allclose(fused, plain, atol=1e-5, rtol=1e-5)


def test_padding_mask_hides_pad_keys():
  mask = attention.padding_mask(jnp.array([[5, 6, 0]]))
  assert mask.shape == (1, 1, 1, 3)
  np.testing.assert_array_equal(mask[0, 0, 0], [True, True, False])


def test_causal_mask_is_lower_triangular():
  np.testing.assert_array_equal(attention.causal_mask(4)[0, 0], np.tril(np.ones((4, 4), bool)))


def test_masked_keys_get_zero_weight():
  query, key, value, mask = _random_inputs()
  weights = attention.dot_product_attention_weights(query, key, mask)
  assert float(weights[0, :, :, 5:].max()) == 0.0, "PAD keys must receive no attention"
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
