"""Where each array lives on an 8-device mesh: parameters, Adam state and batches, by layout.

The sharded step is checked elsewhere to give the single-device numbers; here
the layout itself is pinned: every parameter and optimizer-state leaf carries
the sharding the rule table gives its logical axes, each device holds only its
shard (fsdp: about 1/8 of the state), and batches are split along rows.
"""

from __future__ import annotations

import functools
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from transformer_jax import sharding
from transformer_jax.configs import default_config
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training import footprint
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer
from transformer_jax.training.state import create_train_state

REPO = pathlib.Path(__file__).resolve().parents[1]

LAYOUTS = {
    "data": dict(data=8, fsdp=1, tensor=1),
    "fsdp": dict(data=1, fsdp=8, tensor=1),
    "tensor": dict(data=1, fsdp=1, tensor=8),
    "mixed": dict(data=2, fsdp=2, tensor=2),
}
# The rule table written out for the parameters a user shards most: (data, fsdp, tensor)
# sizes -> PartitionSpec, by parameter. Axes of size 1 are dropped from the expected spec.
EXPECTED = {
    "target_embedding/embedding": ("tensor", "fsdp"),      # [vocab, embed]
    "encoder_0/self_attention/query": ("fsdp", "tensor", None),  # [embed, heads, kv]
    "encoder_0/self_attention/out": ("tensor", None, "fsdp"),    # [heads, kv, embed]
    "encoder_0/feed_forward/wi/kernel": ("fsdp", "tensor"),      # [embed, mlp]
    "encoder_0/feed_forward/wi/bias": ("tensor",),               # [mlp]
    "encoder_0/feed_forward/wo/kernel": ("tensor", "fsdp"),      # [mlp, embed]
    "encoder_0/feed_forward_block/norm/scale": ("fsdp",),        # [embed]
    "decoder_0/cross_attention/key": ("fsdp", "tensor", None),
}


def config_for(layout: dict[str, int]):
  config = default_config()
  config.model.update(dict(vocab_size=64, num_layers=1, d_model=64, d_ff=128, num_heads=8,
                           dropout_rate=0.0))
  config.mesh.update(layout)
  return config


def expected_spec(axes: tuple, layout: dict[str, int]) -> P:
  return P(*[axis if axis is not None and layout[axis] > 1 else None for axis in axes])


def normalized(spec: P, ndim: int) -> P:
  """`spec` padded with None to `ndim` entries, size-1 mesh axes shown as None."""
  return P(*(tuple(spec) + (None,) * (ndim - len(spec))))


@pytest.fixture(scope="module", params=list(LAYOUTS), ids=list(LAYOUTS))
def laid_out(request):
  layout = LAYOUTS[request.param]
  config = config_for(layout)
  mesh = sharding.make_mesh(layout)
  task = TranslationTask(config)
  model = task.build_model()
  init_params = functools.partial(task.init_params, model)
  state, _ = create_train_state(init_params, make_optimizer(OptimizerConfig.from_config(config)), mesh, seed=0)
  return layout, config, mesh, init_params, state


def _drop_unit_axes(spec: P, layout: dict[str, int]) -> P:
  return P(*[axis if axis is None or (isinstance(axis, str) and layout[axis] > 1) else None
             for axis in spec])


def test_every_parameter_and_adam_leaf_is_sharded_by_the_rule_table(laid_out):
  layout, _, mesh, _, state = laid_out
  params = traverse_util.flatten_dict(state.params)
  for name, axes in EXPECTED.items():
    leaf = params[tuple(name.split("/"))]
    got = _drop_unit_axes(normalized(leaf.sharding.spec, leaf.ndim), layout)
    assert got == expected_spec(axes, layout), f"{name} on {layout}: {got}"
    shard = leaf.addressable_shards[0].data.shape
    want = tuple(size // (layout[axis] if axis else 1) for size, axis in zip(leaf.shape, axes))
    assert shard == want, f"{name} on {layout}: each device holds {shard}, not {want}"
  # Adam's two moments are laid out exactly as the parameters they follow.
  moments = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
             if hasattr(s, "mu")]
  assert moments, "no Adam state (mu, nu) found in the optimizer state"
  for moment in (moments[0].mu, moments[0].nu):
    for path, leaf in traverse_util.flatten_dict(moment).items():
      param = params[path]
      assert leaf.sharding.is_equivalent_to(param.sharding, leaf.ndim), "/".join(path)


def test_each_device_holds_its_share_of_the_state(laid_out):
  layout, config, mesh, init_params, state = laid_out
  held = {}
  for name in ("params", "opt_state"):
    tree = getattr(state, name)
    per_device = [0] * len(mesh.devices.flat)
    index = {device: i for i, device in enumerate(mesh.devices.flat)}
    for leaf in jax.tree.leaves(tree):
      for shard in leaf.addressable_shards:
        per_device[index[shard.device]] += shard.data.nbytes
    held[name] = max(per_device)
  predicted = footprint.state_bytes(config, init_params, footprint.abstract_mesh(layout))
  assert held["params"] == predicted["params"] and held["opt_state"] == predicted["opt_state"], (
      f"devices hold {held}, footprint.state_bytes says {predicted}")
  if layout["fsdp"] == 8:
    whole = predicted["params_total"] + predicted["opt_state_total"]
    replicated = sum(leaf.nbytes for leaf in jax.tree.leaves((state.params, state.opt_state))
                     if leaf.sharding.is_fully_replicated)
    assert held["params"] + held["opt_state"] <= whole / 8 + replicated, (
        f"fsdp=8: {held} per device of {whole} bytes ({replicated} replicated)")
    assert replicated < 0.05 * whole, f"{replicated} of {whole} bytes replicated under fsdp"


def test_batches_are_split_along_rows(laid_out):
  layout, _, mesh, _, _ = laid_out
  rows = 16
  batch = sharding.global_batch({"src_tokens": np.arange(rows * 6, dtype=np.int32).reshape(rows, 6)},
                                mesh)["src_tokens"]
  shards = layout["data"] * layout["fsdp"]
  assert {s.data.shape for s in batch.addressable_shards} == {(rows // shards, 6)}
  seen = sorted({tuple(np.asarray(s.data)[:, 0]) for s in batch.addressable_shards})
  assert len(seen) == shards, f"{shards} distinct row blocks expected, got {len(seen)}"


def _model_info(*flags: str) -> str:
  result = subprocess.run([sys.executable, "-m", "transformer_jax.model_info", *flags],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


def test_model_info_prints_bytes_per_device_for_a_mesh():
  out = _model_info("--config=experiments/configs/tiny.py", "--mesh=data=2,fsdp=4,tensor=1")
  assert "per device on mesh {'data': 2, 'fsdp': 4, 'tensor': 1} (8 devices)" in out, out
  assert "train step temporaries" in out and "MiB (XLA's memory analysis" in out, out
  # A pod's layout is sized without its devices; its step is not compiled here.
  pod = _model_info("--config=experiments/configs/wmt14_big.py", "--mesh=data=16,fsdp=16,tensor=4")
  assert "1024 devices" in pod and "not estimated" in pod, pod
  # 6 decoder layers x 16 heads x (64 + 64) float32 values.
  assert "KV cache while decoding: 49,152 bytes a token a row" in pod, pod
  assert "--config.cpu_devices=1024" in pod, pod
  # --config.cpu_devices gives this process the mesh's devices, whatever XLA_FLAGS says.
  two = _model_info("--config=experiments/configs/tiny.py", "--config.cpu_devices=2",
                    "--mesh=data=2,fsdp=1,tensor=1")
  assert "(2 devices)" in two and "MiB (XLA's memory analysis" in two, two


def test_processes_holding_different_tokenizers_stop_with_one_line(monkeypatch):
  """Hosts with caches of their own may hold different tokenizers (a stale cache, another
  vocab_size): every process compares its tokenizer's digest with the others' at start."""
  from jax.experimental import multihost_utils

  from transformer_jax import sharding
  from transformer_jax.errors import UserError

  digests = ["ab" * 32, "ab" * 32, "cd" * 32]
  monkeypatch.setattr(jax, "process_count", lambda: len(digests))
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda mine: np.stack(
      [np.frombuffer(bytes.fromhex(d[:32]), np.uint8) for d in digests]))
  with pytest.raises(UserError, match=r"the tokenizer differs between processes \(process 0 "
                     r"has abababababab…; processes 2 another\); share it"):
    sharding.check_same_everywhere(digests[0], "the tokenizer", "share it")
  digests[2] = digests[0]
  sharding.check_same_everywhere(digests[0], "the tokenizer", "share it")
