"""A recipe's train step (and its decoding) compiled for a named TPU slice or GPU node, on any host.

`compile_train_step` lowers the real jitted step of the config's task for its
largest batch on a mesh over the target's compile-only devices, compiles it
with the target's compiler, and reads back what each device holds, the
collectives the partitioner inserted, the compiler's FLOP count and any
sharding it could only reach by replicating a whole tensor. `fitting_train_step`
tries the config's mesh, then more fsdp, then tensor parallelism, until one
fits in the device's memory. Nothing runs: figures are the compiler's, with no
autotuning on GPU and no timing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.decode.generate import generate
from transformer_jax.decode.translator import DecodeOptions, Translator
from transformer_jax.errors import UserError
from transformer_jax.hardware import analysis
from transformer_jax.hardware.targets import LOCAL, Target, target_devices
from transformer_jax.model import precision
from transformer_jax.model.info import abstract_params
from transformer_jax.tasks.base import Task
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.registry import make_task
from transformer_jax.tasks.translation import TranslationTask
from transformer_jax.training import footprint

GiB = 2**30
# In order: what lowers a step's memory on the same devices.
FIXES = ("more fsdp (--mesh=data=D,fsdp=F,tensor=T)",
         "a smaller batch (--batch=ROWS or config.data.tokens_per_batch; the same batch in k "
         "steps: config.gradient_accumulation_steps=k)", "config.model.attention_impl='chunked'",
         "rematerialisation (config.model.remat=True)")


def fixes(target: Target) -> tuple[str, ...]:
  """FIXES that apply to `target`: a single device has no fsdp to add."""
  return FIXES if target.devices > 1 else FIXES[1:]


@dataclasses.dataclass
class Report:
  """One program compiled for one target: what each device holds and does."""

  target: Target
  program: str                  # "train step", "beam search" or "sampling".
  mesh: dict[str, int]
  rows: int
  length: int
  params_bytes: int             # Per device (most loaded), from the shardings.
  opt_state_bytes: int
  memory: dict[str, int]        # analysis.memory: arguments, outputs, aliased, temporaries, peak.
  compile_seconds: float
  collectives: dict[str, analysis.Collective]
  cost: dict[str, float]
  rematerializations: list[str]
  custom_calls: dict[str, int] = dataclasses.field(default_factory=dict)
  error: str = ""               # The compiler's refusal (a TPU's out-of-memory), if any.
  notes: list[str] = dataclasses.field(default_factory=list)

  @property
  def peak_bytes(self) -> int:
    return self.memory.get("peak", 0)

  @property
  def fits(self) -> bool:
    """Compiled, and its peak bytes fit the device's memory."""
    return not self.error and self.peak_bytes <= self.target.memory_bytes

  @property
  def step_time_bound(self) -> float:
    """Seconds: the roofline bound from the compiler's FLOPs and bytes (0: not reported)."""
    return analysis.step_time_bound(self.cost.get("flops", 0.0),
                                    self.cost.get("bytes accessed", 0.0),
                                    self.target.peak_flops, self.target.memory_bandwidth)

  def to_json(self) -> dict[str, Any]:
    return dict(
        target=self.target.name, program=self.program, mesh=self.mesh, rows=self.rows,
        length=self.length, params_bytes=self.params_bytes, opt_state_bytes=self.opt_state_bytes,
        memory=self.memory, device_memory_bytes=self.target.memory_bytes, fits=self.fits,
        compile_seconds=round(self.compile_seconds, 1),
        collectives={k: dataclasses.asdict(v) for k, v in self.collectives.items()},
        cost=self.cost, step_time_bound_s=self.step_time_bound,
        rematerializations=self.rematerializations, custom_calls=self.custom_calls,
        error=self.error, notes=self.notes)


def for_target(config: ml_collections.ConfigDict, target: Target) -> ml_collections.ConfigDict:
  """A copy of `config` as it would run on `target`: matmul_dtype='auto' resolved for the
  target's chip (bfloat16 on TPUs and on GPUs from Ampere on), not for this host."""
  config = copy.deepcopy(config)
  if config.model.matmul_dtype == "auto":
    if target.name == LOCAL:
      native = precision.native_bfloat16_here()[0]
    else:
      native = precision.native_bfloat16(target.platform, gpu_capability="9.0")[0]
    config.model.matmul_dtype = "bfloat16" if native else ""
  return config


def mesh_sizes(requested: Any, devices: int) -> dict[str, int]:
  """`requested` (data/fsdp/tensor sizes, one of them may be -1) resolved for `devices`."""
  sizes = {axis: int(requested[axis]) for axis in sharding.MESH_AXES}
  known = math.prod(size for size in sizes.values() if size != -1)
  for axis, size in sizes.items():
    if size == -1:
      sizes[axis] = devices // known if known and devices % known == 0 else 0
  if math.prod(sizes.values()) != devices:
    raise UserError(f"mesh {dict(requested)} does not fit the target's {devices} devices; "
                    "make data x fsdp x tensor equal it, or leave one axis at -1")
  return sizes


def candidate_meshes(first: dict[str, int], devices: int) -> list[dict[str, int]]:
  """`first`, then every device on more fsdp, then on tensor with the rest on fsdp."""
  candidates = [first]
  powers = [2**i for i in range(1, int(math.log2(devices)) + 1) if devices % 2**i == 0]
  for fsdp in powers:
    if fsdp > first["fsdp"]:
      tensor = first["tensor"] if devices % (fsdp * first["tensor"]) == 0 else 1
      candidates.append(dict(data=devices // (fsdp * tensor), fsdp=fsdp, tensor=tensor))
  for tensor in powers:
    if tensor > first["tensor"] and tensor <= 16:
      candidates.append(dict(data=1, fsdp=devices // tensor, tensor=tensor))
  unique = []
  for mesh in candidates:
    if mesh not in unique:
      unique.append(mesh)
  return unique


def batch_rows(recipe_rows: int, mesh: Mesh, rows: int | None) -> tuple[int, str]:
  """(rows of the batch to compile, a note where they differ from the recipe's
  `recipe_rows`)."""
  shards = sharding.batch_shards(mesh)
  if rows is not None:
    if rows % shards:
      raise UserError(f"--batch={rows} rows do not divide into the mesh's {shards} batch "
                      f"shards (data x fsdp); use a multiple of {shards}")
    return rows, ""
  if recipe_rows // shards >= 1:
    return recipe_rows // shards * shards, ""
  return shards, (f"the recipe's batch of {recipe_rows} rows is smaller than the mesh's "
                  f"{shards} batch shards; compiled with one row a shard")


def target_platform(mesh: Mesh) -> Any:
  """A context in which traced code sees `mesh`'s platform (`model.platform`), the abstract
  parameter shapes included, while eager work (a PRNG key) still runs on this host."""
  return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


# Without autotuning, XLA's Triton GEMM emitter can find no tiling for a small dot (seen for
# f32[272,64] on H100 at jax 0.10.2); cuBLAS then takes the dots, as autotuning may too.
NO_TRITON_TILE = "Couldn't find output tile sizes"
WITHOUT_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}


def compile_lowered(lowered: jax.stages.Lowered) -> tuple[Any, float, list[str], str, str]:
  """(compiled or None, seconds, rematerialization warnings, the compiler's refusal, a note
  where it compiled otherwise than by default)."""
  started = time.time()
  compiled, error, note = None, "", ""
  with analysis.native_stderr() as log:
    try:
      try:
        compiled = lowered.compile()
      except Exception as e:  # pylint: disable=broad-except
        if NO_TRITON_TILE not in str(e):
          raise
        compiled = lowered.compile(compiler_options=WITHOUT_TRITON_GEMM)
        note = ("XLA's Triton GEMM found no tiling for a dot without autotuning; compiled "
                "with xla_gpu_enable_triton_gemm=false (cuBLAS for every dot)")
    except Exception as e:  # pylint: disable=broad-except
      if "RESOURCE_EXHAUSTED" not in str(e) and "exceeds" not in str(e):
        raise
      error = next((line.strip() for line in str(e).splitlines() if "exceed" in line),
                   str(e).splitlines()[0])
  return compiled, time.time() - started, analysis.rematerializations(log[0]), error, note


def _report(target: Target, program: str, mesh: Mesh, rows: int, length: int, state_bytes: dict,
            lowered: jax.stages.Lowered, note: str) -> tuple[Report, Any]:
  compiled, seconds, remats, error, compile_note = compile_lowered(lowered)
  hlo = (compiled.as_text() or "") if compiled is not None else ""
  report = Report(
      target=target, program=program, mesh=dict(mesh.shape), rows=rows, length=length,
      params_bytes=state_bytes.get("params", 0), opt_state_bytes=state_bytes.get("opt_state", 0),
      memory=analysis.memory(compiled) if compiled is not None else {},
      compile_seconds=seconds,
      collectives=analysis.collectives(hlo), custom_calls=analysis.custom_calls(hlo),
      cost=analysis.cost(compiled) if compiled is not None else {},
      rematerializations=remats, error=error, notes=[n for n in (note, compile_note) if n])
  return report, compiled


def _task_parts(config: ml_collections.ConfigDict) -> tuple[Task, Any]:
  task = make_task(config)
  return task, task.build_model()


def compile_train_step(config: ml_collections.ConfigDict, target: Target, mesh: dict[str, int],
                       rows: int | None = None) -> tuple[Report, Any]:
  """The config's train step compiled for `target` on `mesh`: (report, compiled or None)."""
  config = for_target(config, target)
  task, model = _task_parts(config)
  init_params = functools.partial(task.init_params, model)
  device_mesh = sharding.make_mesh(mesh, target_devices(target))
  with target_platform(device_mesh):
    held = footprint.state_bytes(config, init_params, device_mesh)
  return _compile_train_step_on(config, target, task, model, device_mesh, held, rows)


def _compile_train_step_on(config: ml_collections.ConfigDict, target: Target, task: Task,
                           model: nn.Module, device_mesh: Mesh, held: dict, rows: int | None
                           ) -> tuple[Report, Any]:
  """`compile_train_step` for a config already resolved `for_target`, its task and model,
  and the bytes per device its state holds on `device_mesh`."""
  rows, note = batch_rows(task.recipe_rows(), device_mesh, rows)
  with target_platform(device_mesh):
    lowered, _ = footprint.lower_train_step(
        config, functools.partial(task.init_params, model),
        functools.partial(task.loss_sums, model), task.batch_shapes(rows), device_mesh)
  return _report(target, "train step", device_mesh, rows, task.row_length(config), held,
                 lowered, note)


def fitting_train_step(config: ml_collections.ConfigDict, target: Target,
                       first: dict[str, int], rows: int | None = None,
                       on_try: Any = None) -> tuple[Report, Any, list[Report]]:
  """The first of `candidate_meshes` whose train step fits: (its report, compiled, every
  report tried, in order). A mesh the model's shapes do not divide, or whose parameters and
  Adam state alone overflow the device, is skipped without compiling. Where none fits, the
  first report is returned."""
  tried: list[Report] = []
  config = for_target(config, target)
  task, model = _task_parts(config)
  init_params = functools.partial(task.init_params, model)
  for mesh in candidate_meshes(first, target.devices):
    try:
      device_mesh = sharding.make_mesh(mesh, target_devices(target))
      with target_platform(device_mesh):
        held = footprint.state_bytes(config, init_params, device_mesh)
      if tried and held["params"] + held["opt_state"] > target.memory_bytes:
        continue
      report, compiled = _compile_train_step_on(config, target, task, model, device_mesh, held,
                                                rows)
    except (ValueError, UserError) as e:  # E.g. tensor=8 does not divide 4 heads.
      if not tried:
        raise
      if on_try is not None:
        on_try(mesh, f"skipped: {' '.join(str(e).split())[:160]}")
      continue
    tried.append(report)
    if on_try is not None:
      on_try(mesh, report)
    if report.fits:
      return report, compiled, tried
  return tried[0], None, tried


def _abstract_params(task: Task, model: nn.Module, mesh: Mesh) -> Any:
  """The model's parameters as ShapeDtypeStructs laid out on `mesh` by the rule table."""
  with target_platform(mesh):
    boxed = abstract_params(functools.partial(task.init_params, model))
  return sharding.sharded_shapes(boxed, mesh)


def compile_decoding(config: ml_collections.ConfigDict, target: Target, mesh: dict[str, int],
                     rows: int, length: int) -> tuple[Report, Any] | None:
  """The task's decoding of a batch compiled for `target`: (report, compiled or None).

  translation: beam search (the config's beam size, α and length margin) of `rows`
  sources of `length` tokens; causal_lm: sampling `length` new tokens after prompts
  of `length` tokens from the KV cache. Other tasks decode nothing: None.
  """
  config = for_target(config, target)
  task, model = _task_parts(config)
  if not isinstance(task, (TranslationTask, CausalLMTask)):
    return None
  device_mesh = sharding.make_mesh(mesh, target_devices(target))
  shards = sharding.batch_shards(device_mesh)
  rows = max(rows // shards, 1) * shards
  params = _abstract_params(task, model, device_mesh)
  with target_platform(device_mesh):
    if isinstance(task, TranslationTask):
      translator = Translator(model, params, device_mesh, DecodeOptions.from_config(config))
      lowered = translator.lower(np.zeros((rows, length), np.int32))
      program = "beam search"
    else:
      rows_sharding = sharding.batch_sharding(device_mesh)
      prompts = jax.ShapeDtypeStruct((rows, length), np.int32, sharding=rows_sharding)
      lengths = jax.ShapeDtypeStruct((rows,), np.int32, sharding=rows_sharding)
      key = jax.eval_shape(lambda: jax.random.key(0))
      key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding.replicated(device_mesh))
      sample = jax.jit(functools.partial(generate, model, max_new_tokens=length),
                       out_shardings=rows_sharding)
      with sharding.mesh_context(device_mesh):
        lowered = sample.lower(params, prompts, lengths, key=key)
      program = "sampling"
  held = dict(params=sharding.bytes_per_device(params))
  return _report(target, program, device_mesh, rows, length, held, lowered, "")
