"""The hardware users rent, by the names they type, and compile-only devices for each.

`jax.experimental.topologies.get_topology_desc` gives devices of a TPU slice
(libtpu: `pip install 'transformer_jax[aot]'`) or of a GPU node (the CUDA
plugin and XLA's target spec of the GPU, `specs/*.txtpb`) on a CPU host: a
`Mesh` over them compiles a sharded program without the hardware. Names
follow Cloud TPU's accelerator types (v5p-N counts TensorCores, two a chip,
which megacore makes one device) and MaxText's `accelerator_to_spec_map.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import pathlib

import jax
from jax.experimental import topologies

from transformer_jax.errors import UserError

GiB = 2**30
SPECS = pathlib.Path(__file__).resolve().parent / "specs"
LOCAL = "local"


@dataclasses.dataclass(frozen=True)
class Target:
  """One machine or slice: how to get its devices and what each device has.

  Attributes:
    name: the name users type ("v5e-8", "h100x8").
    platform: "tpu", "gpu" or "cpu".
    chip: the chip, in words.
    devices: how many devices a mesh over it has.
    topology: the TPU topology ("v5e:2x4"), or the GPU layout "slices x hosts x gpus".
    memory_bytes: memory per device (HBM).
    peak_flops: dense bfloat16 FLOP/s per device, from the vendor's data sheet.
    memory_bandwidth: HBM bytes/s per device, from the vendor's data sheet.
    num_slices: TPU slices joined over the data-centre network (multislice).
    megacore: one device per v4/v5p chip (its two TensorCores as one).
    single_chip: a one-chip TPU host (Colab's v5e-1, v6e-1).
    gpu_spec: the file of `specs/` describing the GPU.
  """

  name: str
  platform: str
  chip: str
  devices: int
  topology: str
  memory_bytes: int
  peak_flops: float
  memory_bandwidth: float
  num_slices: int = 1
  megacore: bool = False
  single_chip: bool = False
  gpu_spec: str = ""

  @property
  def hosts(self) -> int:
    """Hosts of a GPU target (its 'slices x hosts x gpus' layout); TPU slices: 0 (unstated)."""
    if self.platform != "gpu":
      return 0
    slices, hosts, _ = map(int, self.topology.split("x"))
    return slices * hosts


def _tpu(name: str, chip: str, topology: str, chips: int, memory_gib: float, tflops: float,
         gbytes_per_s: float, **kwargs) -> Target:
  slices = kwargs.get("num_slices", 1)
  return Target(name, "tpu", chip, chips * slices, topology, int(memory_gib * GiB),
                tflops * 1e12, gbytes_per_s * 1e9, **kwargs)


def _gpu(name: str, chip: str, spec: str, layout: str, tflops: float) -> Target:
  info = gpu_spec_fields(spec)
  count = 1
  for part in layout.split("x"):
    count *= int(part)
  return Target(name, "gpu", chip, count, layout, int(info["device_memory_size"]),
                tflops * 1e12, float(info["memory_bandwidth"]), gpu_spec=spec)


@functools.cache
def gpu_spec_fields(spec: str) -> dict[str, str]:
  """The scalar fields of a GPU spec file ('device_memory_size', 'memory_bandwidth', ...)."""
  fields = {}
  for line in (SPECS / spec).read_text().splitlines():
    key, colon, value = line.strip().partition(":")
    if colon and not line.lstrip().startswith("#") and "{" not in value:
      fields.setdefault(key.strip(), value.strip().strip('"'))
  return fields


# Data-sheet figures per device: TPU v5e 16 GiB, 197 TFLOP/s, 819 GB/s; v5p 95 GiB,
# 459 TFLOP/s, 2,765 GB/s; v6e 32 GiB, 918 TFLOP/s, 1,640 GB/s; H100 and H200 SXM 989
# TFLOP/s dense bf16 (their memory and bandwidth come from XLA's spec); B200 2,250.
TARGETS: dict[str, Target] = {t.name: t for t in (
    _tpu("v5e-1", "TPU v5e", "v5e:1x1", 1, 16, 197, 819, single_chip=True),
    _tpu("v5e-4", "TPU v5e", "v5e:2x2", 4, 16, 197, 819),
    _tpu("v5e-8", "TPU v5e", "v5e:2x4", 8, 16, 197, 819),
    _tpu("v5e-256", "TPU v5e", "v5e:16x16", 256, 16, 197, 819),
    _tpu("v5p-8", "TPU v5p", "v5:2x2x1", 4, 95, 459, 2765, megacore=True),
    _tpu("v5p-128", "TPU v5p", "v5:4x4x4", 64, 95, 459, 2765, megacore=True),
    _tpu("2xv5p-128", "TPU v5p", "v5:4x4x4", 64, 95, 459, 2765, megacore=True, num_slices=2),
    _tpu("v6e-1", "TPU v6e", "v6e:1x1", 1, 32, 918, 1640, single_chip=True),
    _tpu("v6e-8", "TPU v6e", "v6e:2x4", 8, 32, 918, 1640),
    _gpu("h100x1", "NVIDIA H100 SXM", "h100.txtpb", "1x1x1", 989),
    _gpu("h100x8", "NVIDIA H100 SXM", "h100.txtpb", "1x1x8", 989),
    _gpu("h200x8", "NVIDIA H200 SXM", "h200.txtpb", "1x1x8", 989),
    _gpu("2xh100x8", "NVIDIA H100 SXM", "h100.txtpb", "1x2x8", 989),
    _gpu("b200x8", "NVIDIA B200", "b200.txtpb", "1x1x8", 2250),
)}
# What each platform needs installed, for the error when it is missing.
INSTALL = {
    "tpu": "pip install 'jax[tpu]' (libtpu), or the project's [aot] extra",
    "gpu": "pip install jax-cuda12-plugin jax-cuda12-pjrt (and nvidia-cudnn-cu12 for cuDNN "
           "attention), or the project's [aot] extra",
}


def get_target(name: str) -> Target:
  """The target called `name`; an unknown name is a one-line UserError listing the known."""
  if name == LOCAL:
    return local_target()
  if name not in TARGETS:
    raise UserError(f"--target={name!r} is not a known target; use one of "
                    f"{', '.join(TARGETS)} or {LOCAL} (this process's own devices)")
  return TARGETS[name]


def local_target() -> Target:
  """This process's devices (a Colab TPU, a GPU, or the CPU): their memory as the runtime
  reports it (the CPU's: the host's, shared among its devices), their data-sheet figures
  where a table entry has the same chip."""
  devices = jax.local_devices()
  device = devices[0]
  platform = device.platform
  stats = device.memory_stats() if platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    memory = int(stats["bytes_limit"])
  else:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(devices)
  same_chip = next((t for t in TARGETS.values() if t.platform == platform
                    and _device_kinds.get(t.chip, t.chip) in device.device_kind), None)
  return Target(LOCAL, platform, device.device_kind, len(devices), f"{len(devices)} devices",
                memory, same_chip.peak_flops if same_chip else 0.0,
                same_chip.memory_bandwidth if same_chip else 0.0)


# How JAX names the table's chips (Device.device_kind).
_device_kinds = {"TPU v5e": "TPU v5 lite", "TPU v6e": "TPU v6 lite", "TPU v5p": "TPU v5",
                 "NVIDIA H100 SXM": "H100", "NVIDIA H200 SXM": "H200", "NVIDIA B200": "B200"}


def installed(platform: str) -> bool:
  """Whether the compiler plugin for `platform` is installed in this Python."""
  module = {"tpu": "libtpu", "gpu": "jax_cuda12_plugin"}.get(platform)
  return module is None or importlib.util.find_spec(module) is not None


@functools.cache
def _devices(target: Target) -> tuple[jax.Device, ...]:
  if target.platform == "tpu":
    kwargs = dict(num_slices=target.num_slices)
    if target.megacore:
      kwargs["chip_config_name"] = "megacore"
    if target.single_chip:
      kwargs["chips_per_host_bounds"] = (1, 1, 1)
    topology = topologies.get_topology_desc(
        topology_name=target.topology, platform="tpu", **kwargs)
  else:
    try:
      topology = topologies.get_topology_desc(
          platform="cuda", target_config=(SPECS / target.gpu_spec).read_text(),
          topology=target.topology)
    except NotImplementedError:  # JAX dropped the CUDA plugin when it found no GPU.
      raise UserError(f"--target={target.name}: JAX started without its CUDA compiler; set "
                      "JAX_PLATFORMS=cpu before JAX starts (the precompile command does)") from None
  return tuple(topology.devices)


def target_devices(target: Target) -> list[jax.Device]:
  """The target's devices: compile-only ones for a TPU or GPU target, this process's own for
  the local one.

  Raises a one-line UserError naming the install when the compiler is missing.
  """
  if target.name == LOCAL:
    return list(jax.local_devices())
  if not installed(target.platform):
    raise UserError(f"--target={target.name} compiles with the {target.platform.upper()} "
                    f"compiler, which is not installed; {INSTALL[target.platform]}")
  devices = list(_devices(target))
  if len(devices) != target.devices:
    raise UserError(f"--target={target.name}: the compiler gave {len(devices)} devices, the "
                    f"table says {target.devices}")
  return devices
