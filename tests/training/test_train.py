"""The train step: schedule, loss, sharding, accumulation and restoring across meshes."""

import functools
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.configs import default_config, validate_config
from transformer_jax.errors import UserError
from transformer_jax.model.transformer import Transformer
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.classification import ClassificationTask
from transformer_jax.tasks.masked_lm import MaskedLMTask
from transformer_jax.tasks.prefix_lm import PrefixLMTask
from transformer_jax.tasks.translation import TranslationTask, init_transformer
from transformer_jax.training import checkpoints
from transformer_jax.training.losses import smoothing_entropy, token_losses
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer, paper_schedule
from transformer_jax.training.state import create_train_state


REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA_8, MIXED = dict(data=8, fsdp=1, tensor=1), dict(data=2, fsdp=2, tensor=2)


def test_paper_schedule_matches_the_formula():
  schedule = paper_schedule(d_model=512, warmup_steps=4000)
  for step in (1, 100, 4000, 100_000):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-6), step
  assert float(schedule(3999)) == pytest.approx(7.0e-4, rel=0.01)  # §5.3's peak for base.


def test_label_smoothed_loss_equals_hand_computed_value():
  logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]]))
  targets = jnp.array([[0, 2]])
  smoothed, nll = token_losses(logits, targets, label_smoothing=0.1)
  # Target gets 0.9, each of the 2 others 0.05.
  expected_0 = -(0.9 * np.log(0.7) + 0.05 * np.log(0.2) + 0.05 * np.log(0.1))
  expected_1 = -(0.05 * np.log(0.1) + 0.05 * np.log(0.1) + 0.9 * np.log(0.8))
  np.testing.assert_allclose(smoothed[0], [expected_0, expected_1], rtol=1e-6)
  np.testing.assert_allclose(nll[0], [-np.log(0.7), -np.log(0.8)], rtol=1e-6)
  entropy = -(0.9 * np.log(0.9) + 2 * 0.05 * np.log(0.05))
  assert smoothing_entropy(3, 0.1) == pytest.approx(entropy)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_closed_form_loss_and_gradient_equal_explicit_smoothed_targets(label_smoothing):
  vocab_size = 50
  logits = 3.0 * jax.random.normal(jax.random.key(0), (2, 7, vocab_size))
  targets = jax.random.randint(jax.random.key(1), (2, 7), 0, vocab_size)

  def explicit_loss(logits):
    soft = jnp.full(logits.shape, label_smoothing / (vocab_size - 1))
    soft = jnp.where(jax.nn.one_hot(targets, vocab_size) > 0, 1.0 - label_smoothing, soft)
    return -jnp.sum(soft * jax.nn.log_softmax(logits, axis=-1))

  def closed_form_loss(logits):
    return jnp.sum(token_losses(logits, targets, label_smoothing)[0])

  np.testing.assert_allclose(closed_form_loss(logits), explicit_loss(logits), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(closed_form_loss)(logits), jax.grad(explicit_loss)(logits), atol=1e-6)


# Several chunked blocks, heads split by the tensor axis.
CHUNKED = dict(attention_impl="chunked", attention_block_size=4, attention_dropout_rate=0.1)
# The descendants' variants of the blocks (tests/test_variants.py), all at once.
VARIANTS = dict(norm_type="rmsnorm", norm="pre", activation="swiglu", attention_scale=0.3,
                positions="rope", num_kv_heads=2)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
@pytest.mark.parametrize("task_class,mesh_shape,model_overrides", [
    (TranslationTask, DATA_8, {}), (TranslationTask, MIXED, {}),
    (CausalLMTask, DATA_8, {}), (CausalLMTask, MIXED, {}),
    (PrefixLMTask, MIXED, {}), (MaskedLMTask, MIXED, {}),
    (ClassificationTask, MIXED, {}), (TranslationTask, MIXED, CHUNKED),
    (CausalLMTask, MIXED, VARIANTS),
], ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict)
   else None)
def test_sharded_step_equals_single_device_step(mesh_shape, task_class, model_overrides,
                                               tiny_config, synthetic_batch, run_steps):
  config = tiny_config()
  config.model.dropout_rate = 0.1  # Dropout bits must not depend on the sharding either.
  config.model.update(model_overrides)
  config.text_side = "pair"  # masked_lm: both halves (the others read what they need).
  batches = [synthetic_batch(seed=s) for s in range(2)]
  single, single_metrics = run_steps(config, sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1]), batches, task_class)
  sharded, sharded_metrics = run_steps(config, sharding.make_mesh(mesh_shape), batches, task_class)
  # Sharded sums add in another order (~2e-5 relative seen); one dropout mask bit that
  # differed would move whole rows by ~1e-2.
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert single_metrics["loss"] == pytest.approx(sharded_metrics["loss"], rel=1e-5)


def test_gradient_accumulation_equals_one_large_step(tiny_config, synthetic_batch, run_steps):
  config = tiny_config()
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  batches = [synthetic_batch(rows=16, seed=s) for s in range(2)]
  whole, whole_metrics = run_steps(config, mesh, batches)
  config.gradient_accumulation_steps = 4
  accumulated, accumulated_metrics = run_steps(config, mesh, batches)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(accumulated.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert whole_metrics["loss"] == pytest.approx(accumulated_metrics["loss"], rel=1e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 simulated devices")
def test_checkpoint_saved_on_8_devices_restores_onto_1(tmp_path, tiny_config):
  config = tiny_config()
  init_params = functools.partial(init_transformer, Transformer(config.model))
  optimizer = make_optimizer(OptimizerConfig.from_config(config))
  mesh8 = sharding.make_mesh(dict(data=2, fsdp=2, tensor=2))
  state8, _ = create_train_state(init_params, optimizer, mesh8, seed=3)
  manager = checkpoints.make_manager(str(tmp_path), async_save=True)
  checkpoints.save(manager, 7, state8, {"epoch": 0}, {"step": 7})
  manager.wait_until_finished()

  mesh1 = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  state1, _ = create_train_state(init_params, optimizer, mesh1, seed=0)
  restored, data_state, meta = checkpoints.restore_latest(manager, checkpoints.abstract_like(state1))
  assert meta["step"] == 7 and data_state == {"epoch": 0}
  for a, b in zip(jax.tree.leaves(state8), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  leaf = jax.tree.leaves(restored.params)[0]
  assert len(leaf.sharding.device_set) == 1


def test_the_train_command_splits_the_cpu_into_config_cpu_devices(tmp_path):
  """config.cpu_devices=3 gives the run a 3-device data-parallel mesh (over XLA_FLAGS' 8)."""
  command = [sys.executable, "-m", "transformer_jax.train",
             f"--config={REPO_ROOT / 'experiments/configs/tiny.py'}", f"--workdir={tmp_path}",
             "--config.cpu_devices=3", "--config.num_train_steps=2", "--config.eval_every_steps=2",
             "--config.data.bucket_boundaries=(48,)", "--config.final_eval_split="]
  done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "3 local / 3 global devices (cpu); mesh {'data': 3, 'fsdp': 1, 'tensor': 1}" in done.stderr
  assert '"split": "eval", "step": 2' in (tmp_path / "metrics.jsonl").read_text()


def test_cpu_devices_set_after_jax_started_is_a_one_line_error():
  jax.devices()  # This process's JAX has started, with some other count of devices.
  sharding.check_cpu_devices(jax.local_device_count())  # The count it has: fine.
  if jax.local_device_count() == 3:
    pytest.skip("this process already has 3 CPU devices")
  with pytest.raises(UserError, match="comes too late"):
    sharding.use_cpu_devices(3)
  with pytest.raises(UserError, match="config.cpu_devices=3, but this process has"):
    sharding.check_cpu_devices(3)
  sharding.check_cpu_devices(0)  # 0 keeps whatever the process has.
  config = default_config()
  config.cpu_devices = -1
  with pytest.raises(UserError, match="must be >= 0"):
    validate_config(config)
