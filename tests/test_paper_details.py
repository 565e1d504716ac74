"""The paper's details, pinned: each test fails if its detail changes.

√d_model embedding scale (§3.4), where LayerNorm and dropout sit (§3.1, §5.4), Adam's
β1, β2 and ε and the §5.3 learning rate.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from transformer_jax.configs import default_config
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.layers import SublayerConnection
from transformer_jax.model.positions import sinusoidal_encoding
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer, make_schedule

TOKENS = jnp.array([[5, 6, 7, 8]])


def _model_config(**overrides) -> ModelConfig:
  values = dict(vocab_size=32, num_layers=1, d_model=16, d_ff=32, num_heads=2, positions="none",
                dropout_rate=0.0)
  values.update(overrides)
  return ModelConfig(**values)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_embeddings_are_scaled_by_the_square_root_of_d_model(share_embeddings):
  config = _model_config(share_embeddings=share_embeddings)
  model = Transformer(config)
  params = model.init(jax.random.key(0), TOKENS, TOKENS)["params"]
  positions = jnp.zeros_like(TOKENS)
  for side, table in (("embed_source", "source_embedding" if not share_embeddings
                       else "target_embedding"), ("embed_target", "target_embedding")):
    embedded = model.apply({"params": params}, TOKENS, positions, False,
                           method=lambda m, t, p, train, side=side: getattr(m, side)(t, p, train))
    expected = nn.unbox(params[table]["embedding"])[TOKENS] * np.sqrt(16)
    np.testing.assert_allclose(embedded, expected, rtol=1e-6, err_msg=side)
  if not share_embeddings:
    assert "source_embedding" in params, "separate embeddings need a source table"


class _Wrapped(nn.Module):
  """One SublayerConnection around `sublayer`."""

  config: ModelConfig
  sublayer: Callable

  @nn.compact
  def __call__(self, inputs, train):
    return SublayerConnection(self.config, name="block")(inputs, self.sublayer, train)


def _layer_norm(x):
  """LayerNorm with its initial scale 1 and bias 0."""
  mean = x.mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)


def _connection(norm, sublayer, inputs, train=False, rate=0.0):
  config = _model_config(norm=norm, dropout_rate=rate)
  module = _Wrapped(config, sublayer)
  variables = module.init(jax.random.key(0), inputs, False)
  return module.apply(variables, inputs, train, rngs={"dropout": jax.random.key(1)})


def test_post_ln_normalises_after_the_residual_add_and_pre_ln_before_the_sublayer():
  inputs = jax.random.normal(jax.random.key(2), (2, 3, 16)) * 3 + 1
  doubled = lambda h: 2 * h  # Sublayer(h) = 2h makes the two orders differ.
  # post: LayerNorm(x + Sublayer(x)) = LN(3x).
  np.testing.assert_allclose(_connection("post", doubled, inputs), _layer_norm(3 * inputs),
                             atol=1e-5)
  # pre: x + Sublayer(LayerNorm(x)) = x + 2 LN(x).
  np.testing.assert_allclose(_connection("pre", doubled, inputs),
                             inputs + 2 * _layer_norm(inputs), atol=1e-5)


def test_pre_ln_models_end_each_stack_with_a_norm():
  params = Transformer(_model_config(norm="pre")).init(jax.random.key(0), TOKENS, TOKENS)["params"]
  assert {"encoder_norm", "decoder_norm"} <= set(params)
  params = Transformer(_model_config(norm="post")).init(jax.random.key(0), TOKENS, TOKENS)["params"]
  assert not {"encoder_norm", "decoder_norm"} & set(params)


def test_dropout_falls_on_the_sublayer_output_before_the_residual_add():
  inputs = jax.random.normal(jax.random.key(3), (4, 8, 16))
  constant = lambda h: jnp.full_like(h, 2.0)
  added = np.asarray(_connection("pre", constant, inputs, train=True, rate=0.5) - inputs)
  # Each element of Sublayer(x) is dropped (0) or kept and scaled by 1/(1 - rate) (4).
  assert set(np.round(np.unique(added), 4)) == {0.0, 4.0}


def test_dropout_falls_on_the_sum_of_embeddings_and_positions():
  config = _model_config(dropout_rate=0.5, positions="sinusoidal")
  model = Transformer(config)
  params = model.init(jax.random.key(0), TOKENS, TOKENS)["params"]
  positions = jnp.broadcast_to(jnp.arange(4), TOKENS.shape)
  embed = lambda train: model.apply(
      {"params": params}, TOKENS, positions, train, rngs={"dropout": jax.random.key(4)},
      method=lambda m, t, p, train: m.embed_target(t, p, train))
  clean, dropped = np.asarray(embed(False)), np.asarray(embed(True))
  kept = dropped != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(dropped[kept], 2 * clean[kept], rtol=1e-5)


def test_adam_uses_beta1_0_9_beta2_0_98_and_epsilon_1e_9():
  config = OptimizerConfig.from_config(default_config())  # d_model 512.
  optimizer = make_optimizer(config)
  params = jnp.zeros(3)
  gradients = [jnp.array([1.0, -2.0, 1e-9]), jnp.array([3.0, 0.5, 1e-9])]
  state = optimizer.init(params)
  updates = []
  for grad in gradients:
    update, state = optimizer.update(grad, state, params)
    updates.append(update)
  b1, b2, eps = 0.9, 0.98, 1e-9
  schedule = make_schedule(config)
  m = v = 0.0
  for step, (grad, update) in enumerate(zip(gradients, updates), start=1):
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad**2
    expected = -schedule(step - 1) * (m / (1 - b1**step)) / (jnp.sqrt(v / (1 - b2**step)) + eps)
    np.testing.assert_allclose(update, expected, rtol=1e-5)


@pytest.mark.parametrize("step,rate", [
    (1, 512**-0.5 * 4000**-1.5),          # step · warmup^-1.5
    (4000, 512**-0.5 * 4000**-0.5),       # the peak, both terms equal
    (100_000, 512**-0.5 * 100_000**-0.5),  # step^-0.5
])
def test_learning_rate_follows_section_5_3_for_d_model_512(step, rate):
  config = OptimizerConfig.from_config(default_config())
  assert (config.schedule, config.warmup_steps, config.d_model) == ("paper", 4000, 512)
  # optax counts updates already applied: update number `step` sees count step - 1.
  assert float(make_schedule(config)(step - 1)) == pytest.approx(rate, rel=1e-6)


def test_the_papers_options_hold_by_default_and_marians_are_options():
  """ReLU (§3.3), sin/cos interleaved (§3.5), no biases on attention or logits by default."""
  model = Transformer(dict(vocab_size=32, d_model=16, d_ff=32, num_heads=2, num_layers=1))
  tokens = jnp.ones((1, 3), jnp.int32)
  params = model.init(jax.random.key(0), tokens, tokens)["params"]
  names = ["/".join(path) for path in traverse_util.flatten_dict(nn.unbox(params))]
  assert not [n for n in names if "attention/" in n and n.endswith("_bias")], names
  assert not [n for n in names if n.startswith("logits_bias")], names
  config = ModelConfig()
  assert (config.activation, config.sinusoid_layout) == ("relu", "interleaved")
  encoding = np.asarray(sinusoidal_encoding(jnp.arange(3), 8))
  angles = np.arange(3)[:, None] / 10000.0 ** (np.arange(0, 8, 2) / 8)
  np.testing.assert_allclose(encoding[:, 0::2], np.sin(angles), atol=1e-6)
  np.testing.assert_allclose(encoding[:, 1::2], np.cos(angles), atol=1e-6)
  concatenated = np.asarray(sinusoidal_encoding(jnp.arange(3), 8, "concatenated"))
  np.testing.assert_allclose(concatenated, np.concatenate([np.sin(angles), np.cos(angles)], 1),
                             atol=1e-6)
