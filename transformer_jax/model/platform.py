"""The platform a computation is built for: that of the mesh in force, else the default backend.

A train step compiled on a CPU host for a TPU topology or a GPU node
(`transformer_jax.precompile`) is traced inside a mesh of that target's
compile-only devices, while `jax.default_backend()` still says "cpu". Code that
picks a kernel by platform (Pallas, cuDNN, a decoding cache's dtype) asks here.
"""

from __future__ import annotations

import jax

# PJRT's names for NVIDIA and AMD devices, as one name.
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def platform_in_force() -> str:
  """'cpu', 'gpu' or 'tpu': the devices of the mesh set by `jax.set_mesh`, else the default
  backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  platform = getattr(device, "platform", None) or jax.default_backend()
  return _ALIASES.get(platform, platform)


def compiling_for_local_devices() -> bool:
  """Whether the platform in force is this process's own (not a cross-compiled target)."""
  return platform_in_force() == _ALIASES.get(jax.default_backend(), jax.default_backend())
