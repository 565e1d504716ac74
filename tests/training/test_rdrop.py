"""R-Drop (config.rdrop_alpha): two dropout passes of each sentence, pulled together by a KL."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer_jax import sharding
from transformer_jax.configs import default_config, validate_config
from transformer_jax.errors import UserError
from transformer_jax.model.transformer import Transformer
from transformer_jax.tasks.translation import (decoder_inputs, init_transformer,
                                               translation_loss_sums)
from transformer_jax.training.losses import loss_sums, symmetric_kl_sum


@pytest.fixture
def tiny_model(tiny_config):
  """dropout_rate -> (config, its Transformer, initial parameters)."""
  def build(dropout_rate: float):
    config = tiny_config()
    config.model.dropout_rate = dropout_rate
    model = Transformer(config.model)
    return config, model, init_transformer(model, jax.random.key(0))
  return build


@pytest.fixture
def batch(synthetic_batch):
  """(rows, seed) -> a synthetic batch as device arrays."""
  def make(rows: int = 6, seed: int = 0) -> dict[str, jax.Array]:
    return {name: jnp.asarray(array) for name, array in synthetic_batch(rows, seed).items()}
  return make


def test_symmetric_kl_sums_both_directions_over_the_weighted_positions():
  logits_a = 2.0 * jax.random.normal(jax.random.key(0), (2, 3, 11))
  logits_b = 2.0 * jax.random.normal(jax.random.key(1), (2, 3, 11))
  weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
  p = np.asarray(jax.nn.softmax(logits_a, axis=-1), np.float64)
  q = np.asarray(jax.nn.softmax(logits_b, axis=-1), np.float64)
  both = np.sum(p * np.log(p / q), axis=-1) + np.sum(q * np.log(q / p), axis=-1)
  expected = float(np.sum(both * np.asarray(weights)))
  assert float(symmetric_kl_sum(logits_a, logits_b, weights)) == pytest.approx(expected, rel=1e-5)
  assert float(symmetric_kl_sum(logits_a, logits_a, weights)) == pytest.approx(0.0, abs=1e-6)


def test_without_dropout_the_two_passes_agree_and_the_loss_is_the_plain_one(tiny_model, batch):
  _, model, params = tiny_model(dropout_rate=0.0)
  tokens = batch()
  _, plain = translation_loss_sums(model, params, tokens, True, jax.random.key(1), 0.1)
  _, rdrop = translation_loss_sums(model, params, tokens, True, jax.random.key(1), 0.1,
                                   rdrop_alpha=5.0)
  assert float(rdrop["rdrop_kl_sum"]) == pytest.approx(0.0, abs=1e-4)
  for name in ("loss_sum", "nll_sum", "tokens"):
    assert float(rdrop[name]) == pytest.approx(float(plain[name]), rel=1e-5), name


def test_the_passes_draw_different_masks_and_alpha_weighs_their_kl_by_a_quarter(tiny_model, batch):
  _, model, params = tiny_model(dropout_rate=0.3)
  tokens = batch()
  key = jax.random.key(2)
  loss_0, sums_0 = translation_loss_sums(model, params, tokens, True, key, 0.1, rdrop_alpha=1e-9)
  loss_5, sums_5 = translation_loss_sums(model, params, tokens, True, key, 0.1, rdrop_alpha=5.0)
  kl = float(sums_5["rdrop_kl_sum"])
  assert kl > 1e-2 * float(sums_5["tokens"])  # Two copies of a row, two dropout masks.
  assert float(sums_0["rdrop_kl_sum"]) == pytest.approx(kl, rel=1e-5)  # The same masks.
  # The paper's CE₁ + CE₂ + α·½·KLsym, halved: the cross-entropy stays a mean of the passes.
  assert float(loss_5) - float(loss_0) == pytest.approx(5.0 / 4.0 * kl, rel=1e-4)
  assert float(sums_5["tokens"]) == float(np.sum(np.asarray(tokens["target_tokens"]) != 0))
  # Evaluation runs one pass without dropout, whatever the weight.
  _, eval_sums = translation_loss_sums(model, params, tokens, False, None, 0.1, rdrop_alpha=5.0)
  logits = model.apply({"params": params}, **decoder_inputs(tokens), train=False)
  _, plain = loss_sums(logits, tokens["target_tokens"], 0.1)
  assert "rdrop_kl_sum" not in eval_sums
  assert float(eval_sums["nll_sum"]) == pytest.approx(float(plain["nll_sum"]), rel=1e-5)


class DropoutNoise(nn.Module):
  """Logits from the input tokens plus noise from the dropout stream, new for every row."""

  vocab_size: int = 64  # The synthetic batch's ids are below 64.

  @nn.compact
  def __call__(self, src_tokens, target_input_tokens, train, **unused):
    shape = (*target_input_tokens.shape, self.vocab_size)
    noise = jax.random.normal(self.make_rng("dropout"), shape)
    return 3.0 * jax.nn.one_hot(target_input_tokens, self.vocab_size) + noise


def test_the_kl_pairs_each_row_with_its_copy_and_skips_pad(batch):
  tokens = batch()
  model, key = DropoutNoise(), jax.random.key(4)
  _, sums = translation_loss_sums(model, {}, tokens, True, key, 0.1, rdrop_alpha=5.0)
  twice = {name: jnp.repeat(array, 2, axis=0) for name, array in tokens.items()}
  logits = np.asarray(model.apply({"params": {}}, **decoder_inputs(twice), train=True,
                                  rngs={"dropout": key}), np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  first, second = p[0::2], p[1::2]  # Row i's two copies.
  both = np.sum((first - second) * (np.log(first) - np.log(second)), axis=-1)
  not_pad = np.asarray(tokens["target_tokens"]) != 0
  assert not not_pad.all()
  expected = float(np.sum(both * not_pad))
  assert float(sums["rdrop_kl_sum"]) == pytest.approx(expected, rel=1e-4)
  assert float(sums["loss_sum"]) == pytest.approx(
      float(sums["smoothed_ce_sum"]) + 5.0 / 4.0 * expected, rel=1e-4)


def test_the_kl_pulls_the_passes_together(tiny_model, batch):
  _, model, params = tiny_model(dropout_rate=0.3)
  tokens = batch()
  key = jax.random.key(3)

  def kl_of(alpha):
    def loss(params):
      return translation_loss_sums(model, params, tokens, True, key, 0.1, rdrop_alpha=alpha)
    grads = jax.grad(lambda p: loss(p)[0])(params)
    stepped = jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads)
    return float(loss(stepped)[1]["rdrop_kl_sum"])

  assert kl_of(50.0) < kl_of(1e-9)


@pytest.mark.skipif(jax.device_count() < 8,
                    reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
def test_rdrop_sharded_step_equals_single_device_step(tiny_model, synthetic_batch, run_steps):
  config, _, _ = tiny_model(dropout_rate=0.1)
  config.rdrop_alpha = 5.0
  batches = [synthetic_batch(rows=16, seed=s) for s in range(2)]
  single, single_metrics = run_steps(
      config, sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1]), batches)
  sharded, sharded_metrics = run_steps(config, sharding.make_mesh(dict(data=8, fsdp=1, tensor=1)),
                                       batches)
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert single_metrics["rdrop_kl"] == pytest.approx(sharded_metrics["rdrop_kl"], rel=1e-4)
  assert single_metrics["rdrop_kl"] > 0


@pytest.mark.parametrize("task,alpha,dropout_rate,message", [
    ("translation", -1.0, 0.1, "config.rdrop_alpha=-1.0 must be >= 0"),
    ("causal_lm", 5.0, 0.1, "not implemented for the causal_lm task; set config.rdrop_alpha=0"),
    ("prefix_lm", 5.0, 0.1, "not implemented for the prefix_lm task; set config.rdrop_alpha=0"),
    ("translation", 5.0, 0.0, "dropout rates are all 0; set config.model.dropout_rate > 0"),
])
def test_a_bad_weight_another_task_or_no_dropout_is_a_one_line_error(task, alpha, dropout_rate,
                                                                      message):
  config = default_config()
  config.task, config.rdrop_alpha = task, alpha
  config.model.dropout_rate = dropout_rate
  with pytest.raises(UserError, match=message.replace("(", r"\(")) as raised:
    validate_config(config)
  assert "\n" not in str(raised.value)
