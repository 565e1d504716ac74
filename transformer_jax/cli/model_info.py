"""Prints a model's parameter count by component and, for a mesh, what each device holds.

  python -m transformer_jax.model_info --config=experiments/configs/wmt14_base.py \
      [--mesh=data=16,fsdp=16,tensor=1]

With --mesh: parameters and Adam state per device (from the sharding rules
alone, for a mesh of any size), and the compiled train step's temporaries for
the config's largest batch when this process has the mesh's devices (on a CPU,
--config.cpu_devices=N runs N).
"""

from __future__ import annotations

import functools
import math

import jax
from absl import app, flags

from transformer_jax import sharding
from transformer_jax.cli import common
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model.info import (abstract_params, format_counts,
                                        kv_cache_bytes_per_token, parameter_counts)
from transformer_jax.tasks.registry import make_task
from transformer_jax.training import footprint

MiB = 2**20


def parse_mesh(text: str) -> dict[str, int]:
  """'data=2,fsdp=4,tensor=1' -> {'data': 2, 'fsdp': 4, 'tensor': 1} (unnamed axes: 1)."""
  sizes = dict.fromkeys(sharding.MESH_AXES, 1)
  for part in text.split(","):
    name, _, value = part.partition("=")
    if name.strip() not in sizes or not value.strip().isdigit() or int(value) < 1:
      raise UserError(f"--mesh={text!r}: write sizes as data=D,fsdp=F,tensor=T (positive "
                      "integers)")
    sizes[name.strip()] = int(value)
  return sizes


@exit_on_user_error
def main(argv: list[str]) -> None:
  del argv
  config = common.FLAGS.config
  if config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/wmt14_base.py")
  sharding.use_cpu_devices(config.cpu_devices)  # Before JAX's first operation.
  task = make_task(config)
  model = task.build_model()
  init_params = functools.partial(task.init_params, model)
  print(format_counts(parameter_counts(abstract_params(init_params))))
  model_config = task.model_config
  print(f"\nKV cache while decoding: {kv_cache_bytes_per_token(model_config):,} bytes a token a row "
        f"({model_config.num_decoder_layers} decoder layers x {model_config.num_kv_heads} key/value "
        f"heads x (d_k + d_v) in {model_config.matmul_dtype}; an encoder-decoder's cross-attention "
        "as much again a source token)")
  if not flags.FLAGS.mesh:
    return
  sizes = parse_mesh(flags.FLAGS.mesh)
  devices = math.prod(sizes.values())
  held = footprint.state_bytes(config, init_params, footprint.abstract_mesh(sizes))
  print(f"\nper device on mesh {sizes} ({devices} devices):")
  for name, label in (("params", "parameters"), ("opt_state", "Adam state")):
    print(f"  {label:<24} {held[name] / MiB:10,.1f} MiB (all of it: {held[name + '_total'] / MiB:,.1f} MiB)")
  if devices != len(jax.devices()):
    print(f"  train step temporaries   not estimated: the mesh needs {devices} devices and this "
          f"process has {len(jax.devices())} (on a CPU: --config.cpu_devices={devices})")
    return
  mesh = sharding.make_mesh(sizes)
  rows = footprint.shard_rows(task.recipe_rows(), mesh)
  step = footprint.step_bytes(config, init_params, functools.partial(task.loss_sums, model),
                              task.batch_shapes(rows), mesh)
  print(f"  train step temporaries   {step['temporaries'] / MiB:10,.1f} MiB (XLA's memory analysis; "
        f"a batch of {step['rows']} rows x {task.row_length(config)} tokens)")
  total = held["params"] + held["opt_state"] + step["temporaries"]
  print(f"  total                    {total / MiB:10,.1f} MiB")


def run() -> None:
  common.define_run_flags()
  flags.DEFINE_string("mesh", "", "Sizes of the mesh to size: data=D,fsdp=F,tensor=T.")
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
