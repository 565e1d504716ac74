"""Compiling a recipe for hardware this host lacks: the target table, the compile report, the
sharding rules' behaviour on every mesh, and a saved executable that runs like the jitted step.

The TPU and GPU compiles are in tests/hardware/; this file needs no compiler plugin.
"""

from __future__ import annotations

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.configs import default_config, load_module
from transformer_jax.errors import UserError
from transformer_jax.hardware import analysis, precompile, targets
from transformer_jax.tasks.registry import make_task
from transformer_jax.training import compiled_step
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer
from transformer_jax.training.state import create_train_state

REPO = pathlib.Path(__file__).resolve().parents[2]

# Every mesh of 8 devices that splits all three ways, and the single-axis ones.
MESHES = [dict(data=8, fsdp=1, tensor=1), dict(data=1, fsdp=8, tensor=1),
          dict(data=2, fsdp=2, tensor=2), dict(data=4, fsdp=2, tensor=1),
          dict(data=1, fsdp=4, tensor=2), dict(data=2, fsdp=1, tensor=4)]


def tiny_config(task: str = "translation", **model):
  config = default_config()
  config.task = task
  config.model.update(dict(vocab_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                           max_len=64, dropout_rate=0.0))
  config.model.update(model)
  config.data.update(dict(max_len=16, tokens_per_batch=16 * 16))
  return config


@pytest.fixture(autouse=True, scope="module")
def no_compilation_cache():
  """A compile read from the persistent cache skips the partitioner, and its log with it."""
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", True)


def test_an_unknown_target_is_one_line_listing_the_known_ones():
  with pytest.raises(UserError) as error:
    targets.get_target("v5e8")
  message = str(error.value)
  assert "\n" not in message
  for name in ("v5e-1", "v5e-256", "2xv5p-128", "h100x8", "2xh100x8"):
    assert name in message


def test_the_table_follows_the_accelerator_names():
  table = targets.TARGETS
  assert (table["v5e-8"].topology, table["v5e-8"].devices) == ("v5e:2x4", 8)
  assert (table["v5p-8"].topology, table["v5p-8"].devices, table["v5p-8"].megacore) == (
      "v5:2x2x1", 4, True)  # v5p-N counts TensorCores: 8 of them are 4 megacore chips.
  assert (table["2xv5p-128"].num_slices, table["2xv5p-128"].devices) == (2, 128)
  assert (table["2xh100x8"].devices, table["2xh100x8"].hosts) == (16, 2)
  assert table["h100x8"].memory_bytes == 84_929_347_584  # XLA's spec of the 80 GB part.


def test_collectives_are_counted_once_with_their_result_bytes():
  hlo = """
  %all-reduce.1 = f32[512,64]{1,0} all-reduce(%p), replica_groups={}, to_apply=%add
  %ag = (bf16[8,128]{1,0}, bf16[64,128]{1,0}) all-gather-start(%x), dimensions={0}
  %agd = bf16[64,128]{1,0} all-gather-done(%ag)
  %t = (f32[4]{0}, s32[2,2]{1,0}) all-reduce(%a, %b), to_apply=%add
  %rs = f32[16]{0} reduce-scatter(%y), dimensions={0}
  """
  found = analysis.collectives(hlo)
  assert (found["all-reduce"].count, found["all-reduce"].bytes) == (2, 512 * 64 * 4 + 16 + 16)
  assert (found["all-gather"].count, found["all-gather"].bytes) == (1, 64 * 128 * 2)
  assert (found["reduce-scatter"].count, found["reduce-scatter"].bytes) == (1, 64)
  assert found["all-to-all"].count == 0


def test_candidate_meshes_add_fsdp_then_tensor():
  assert precompile.candidate_meshes(dict(data=8, fsdp=1, tensor=1), 8) == [
      dict(data=8, fsdp=1, tensor=1), dict(data=4, fsdp=2, tensor=1),
      dict(data=2, fsdp=4, tensor=1), dict(data=1, fsdp=8, tensor=1),
      dict(data=1, fsdp=4, tensor=2), dict(data=1, fsdp=2, tensor=4),
      dict(data=1, fsdp=1, tensor=8)]


@pytest.mark.parametrize("task", ["translation", "causal_lm", "masked_lm"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m.values())))
def test_no_mesh_makes_the_partitioner_replicate_a_tensor(task, mesh):
  """The embedding lookups once made XLA replicate their output whole on data x fsdp x tensor."""
  report, _ = precompile.compile_train_step(tiny_config(task), targets.get_target("local"), mesh)
  assert not report.rematerializations, (
      f"{task} on {mesh}: the partitioner replicated a tensor in full: "
      f"{report.rematerializations}")
  assert report.fits and report.memory["temporaries"] > 0


def test_the_partitioner_log_is_read():
  """The check above can fail: the lookup as it was (a table split over fsdp, rows split over
  fsdp, one gather) makes XLA replicate the gather's output, and the compile reports it."""
  mesh = sharding.make_mesh(dict(data=2, fsdp=2, tensor=2))
  spec = lambda *axes: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))

  def lookup(table, tokens):
    return jax.lax.with_sharding_constraint(jnp.take(table, tokens, axis=0),
                                            spec(("data", "fsdp"), None, None))

  lowered = jax.jit(lookup, in_shardings=(spec("tensor", "fsdp"), spec(("data", "fsdp")))).lower(
      jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((8, 16), jnp.int32))
  _, _, found, _, _ = precompile.compile_lowered(lowered)
  assert found and "gather" in found[0], found


def test_native_stderr_captures_what_native_code_writes():
  import ctypes  # The C library writes to file descriptor 2 as XLA's logger does.
  libc = ctypes.CDLL(None)
  with analysis.native_stderr() as log:
    libc.write(2, b"W spmd_partitioner.cc] Involuntary full rematerialization. The compiler "
               b"cannot go from A to B for HLO operation %gather = f32[8,48,16]{2,1,0} gather(%a), "
               b'metadata={op_name="jit(step)/embed/gather"}\n', 160 + 40)
  (warning,) = analysis.rematerializations(log[0])
  assert warning.startswith("%gather = f32[8,48,16]{2,1,0} gather")


def test_a_batch_smaller_than_the_mesh_is_compiled_at_one_row_a_shard():
  config = tiny_config()
  config.data.tokens_per_batch = 16 * 3
  mesh = sharding.make_mesh(dict(data=8, fsdp=1, tensor=1))
  rows, note = precompile.batch_rows(make_task(config).recipe_rows(), mesh, None)
  assert rows == 8 and "3 rows" in note
  with pytest.raises(UserError, match="multiple of 8"):
    precompile.batch_rows(3, mesh, 12)


TINY_CONFIG_FILE = """
from transformer_jax.configs import default_config, load_module


def get_config():
  config = default_config()
  config.model.update(dict(vocab_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                           max_len=64, dropout_rate=0.0))
  config.data.update(dict(max_len=16, tokens_per_batch=16 * 16))
  return config
"""


def test_a_saved_step_loads_and_runs_like_the_compiled_one(tmp_path):
  """The precompile command saves the step (a fresh process: XLA:CPU shares kernels between
  the programs one process compiles, and a program that reuses one serializes without it);
  loaded here, it runs as this process's own compile of the step does, bit for bit."""
  config_file = tmp_path / "tiny_config.py"
  config_file.write_text(TINY_CONFIG_FILE)
  saved = subprocess.run(
      [sys.executable, "-m", "transformer_jax.precompile", f"--config={config_file}",
       "--target=local", "--mesh=data=4,fsdp=2,tensor=1", "--nodecode", f"--workdir={tmp_path}"],
      capture_output=True, text=True, cwd=REPO, timeout=600)
  assert saved.returncode == 0, saved.stderr[-2000:]
  config = load_module(config_file).get_config()
  mesh_sizes = dict(data=4, fsdp=2, tensor=1)
  report, compiled = precompile.compile_train_step(config, targets.get_target("local"), mesh_sizes)

  mesh = sharding.make_mesh(mesh_sizes)
  task = make_task(config)
  model = task.build_model()
  init = functools.partial(task.init_params, model)
  rng = np.random.default_rng(0)
  batch = {key: rng.integers(4, 64, (report.rows, report.length)).astype(np.int32)
           for key in ("src_tokens", "target_tokens")}
  batch = sharding.global_batch(batch, mesh)

  def fresh_state():
    optimizer = make_optimizer(OptimizerConfig.from_config(config))
    return create_train_state(init, optimizer, mesh, seed=0)[0]

  expected_state, expected = compiled(fresh_state(), batch)
  run_config = task.run_config()
  loaded = compiled_step.load(str(tmp_path), run_config, mesh)
  assert loaded is not None, "the saved step was not loaded on the devices it was compiled for"
  executable, shapes = loaded
  assert shapes == {"src_tokens": [report.rows, report.length],
                    "target_tokens": [report.rows, report.length]}
  state, metrics = executable(fresh_state(), batch)
  assert float(metrics["loss"]) == float(expected["loss"])
  np.testing.assert_array_equal(
      np.asarray(state.params["target_embedding"]["embedding"]),
      np.asarray(expected_state.params["target_embedding"]["embedding"]))

  # The train loop's step: the saved executable for its batch shape, the jitted step otherwise.
  step = compiled_step.with_saved_step(lambda *args: "jitted", str(tmp_path), run_config, mesh)
  assert float(step(fresh_state(), batch)[1]["loss"]) == float(expected["loss"])
  shorter = {key: value[:, :8] for key, value in batch.items()}
  assert step(fresh_state(), shorter) == "jitted"

  other = tiny_config()
  other.label_smoothing = 0.2
  assert compiled_step.load(str(tmp_path), make_task(other).run_config(), mesh) is None  # Compile.
  # The vocabulary the run's tokenizer decided differs from the config's: another step.
  other_vocabulary = dict(run_config, model=dict(run_config["model"], vocab_size=65))
  assert compiled_step.load(str(tmp_path), other_vocabulary, mesh) is None
  assert compiled_step.load(str(tmp_path), run_config,
                            sharding.make_mesh(dict(data=8, fsdp=1, tensor=1))) is None


def test_out_of_memory_on_a_tpu_is_reported_as_not_fitting():
  config = tiny_config(vocab_size=32_000)
  config.data.update(dict(max_len=512, tokens_per_batch=512 * 2048))
  report, compiled, tried = precompile.fitting_train_step(
      config, targets.get_target("v5e-1"), dict(data=1, fsdp=1, tensor=1))
  assert compiled is None and not report.fits and len(tried) == 1
  assert "exceeds" in report.error, report.error


def test_the_command_compiles_reports_and_saves(tmp_path):
  out = tmp_path / "report.json"
  result = subprocess.run(
      [sys.executable, "-m", "transformer_jax.precompile",
       f"--config={REPO / 'experiments/configs/tiny.py'}",
       "--target=v5e-4", "--mesh=data=2,fsdp=2,tensor=1", f"--json={out}",
       f"--workdir={tmp_path / 'run'}"],
      capture_output=True, text=True, cwd=REPO, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "train step on mesh data=2 fsdp=2 tensor=1" in result.stdout
  assert ": fits" in result.stdout and "beam search on mesh" in result.stdout
  assert "roofline bound" in result.stdout  # TPUs report FLOPs.
  reports = json.loads(out.read_text())["reports"]
  assert [r["program"] for r in reports] == ["train step", "beam search"]
  assert reports[0]["collectives"]["all-reduce"]["count"] >= 1
  assert (tmp_path / "run" / "compiled" / "train_step.bin").stat().st_size > 0

  unknown = subprocess.run(
      [sys.executable, "-m", "transformer_jax.precompile", "--config=experiments/configs/tiny.py",
       "--target=v5e8"], capture_output=True, text=True, cwd=REPO, timeout=300)
  assert unknown.returncode == 2
  assert unknown.stderr.strip().splitlines()[-1].startswith("error: --target='v5e8' is not a known")
