"""``mesh_shape`` in GPT-Neo syntax ("x:4,y:2") -> a ``jax.sharding.Mesh``."""

from __future__ import annotations

import math
import re

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh

from config import ConfigError

AXIS_NAME = r"[A-Za-z_]\w*"  # what a mesh axis may be called; a layout's axes are held to it too
_AXIS = re.compile(rf"^({AXIS_NAME})\s*:\s*(-?\d+)$")


def mesh_axes(text: str) -> dict[str, int]:
    """``"x:4,y:-1"`` -> ``{"x": 4, "y": -1}``, the sizes as written (-1: the devices left over); a one-line error
    naming what is wrong with the text, whatever the device count."""
    axes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        match = _AXIS.match(part)
        if not match:
            hint = "; did you mean 'auto'?" if part.lower() == "auto" != part else ""
            raise ConfigError(f"mesh_shape: '{part}' is not axis:size (e.g. 'x:4,y:2'){hint}")
        name, size = match.group(1), int(match.group(2))
        if name == "none":
            raise ConfigError("mesh_shape: 'none' cannot name a mesh axis; a layout uses it for 'not split'")
        if name in axes:
            raise ConfigError(f"mesh_shape: axis '{name}' appears twice")
        if size == 0 or size < -1:
            raise ConfigError(f"mesh_shape: axis '{name}' has size {size}; sizes are positive or -1")
        axes[name] = size
    free = [name for name, size in axes.items() if size == -1]
    if len(free) > 1:
        raise ConfigError(f"mesh_shape: only one axis may be -1, got {', '.join(free)}")
    return axes


def parse_mesh_shape(text: str, device_count: int, platform: str | None = None,
                     processes: int = 1) -> dict[str, int]:
    """``"x:4,y:2"`` -> ``{"x": 4, "y": 2}``; one axis may be -1 and takes the devices left over. With the devices'
    ``platform``, a device-count error also says how to simulate (CPU) or hide (GPU) devices to match, per process
    of the ``processes`` that hold them."""
    axes = mesh_axes(text)
    free = [name for name, size in axes.items() if size == -1]
    fixed = math.prod(size for size in axes.values() if size != -1)
    simulate = simulate_hint(fixed, processes) if platform == "cpu" and fixed > device_count else ""
    if free:
        if device_count % fixed:
            raise ConfigError(f"mesh_shape: '{text}' fixes {fixed} devices, which does not divide the "
                              f"{device_count} devices available{simulate}")
        axes[free[0]] = device_count // fixed
    elif fixed != device_count:
        raise ConfigError(f"mesh_shape: '{text}' needs {fixed} device{'s' * (fixed != 1)} but {device_count} "
                          f"{'is' if device_count == 1 else 'are'} available; "
                          f"{fit_hint(axes, device_count, platform, processes)}")
    return axes


def fit_hint(axes: dict[str, int], device_count: int, platform: str | None, processes: int = 1) -> str:
    """How a mesh of fixed ``axes`` is made to fit ``device_count`` devices: sizes that multiply to it (one axis
    of size -1 sizing itself to fit), or, on CPU or GPU, as many devices as the mesh names."""
    fixed = math.prod(axes.values())
    hint = f"make its sizes multiply to {device_count}"
    sizing = next((name for name in axes if device_count % (fixed // axes[name]) == 0), None)
    if sizing:
        example = ",".join(f"{name}:{-1 if name == sizing else size}" for name, size in axes.items())
        hint += f" ('{example}' sizes {sizing} to fit)"
    if platform == "cpu":
        hint += simulate_hint(fixed, processes)
    elif platform == "gpu" and fixed < device_count and fixed % processes == 0:
        each = fixed // processes
        hint += f"; on GPUs, use {fixed} with CUDA_VISIBLE_DEVICES={','.join(map(str, range(each)))}"
        hint += f" in each of the {processes} processes" if processes > 1 else ""
    return hint


def simulate_hint(fixed: int, processes: int) -> str:
    """How to simulate ``fixed`` CPU devices (the flag must be set before jax starts): the flag counts one
    process's devices, so a run of several processes sets each to its share."""
    if fixed % processes:
        return ""
    each = fixed // processes
    where = f" in each of the {processes} processes" if processes > 1 else ""
    return f"; on CPU, simulate {fixed} devices with XLA_FLAGS=--xla_force_host_platform_device_count={each}{where}"


def fixed_device_count(text: str) -> int | None:
    """The device count ``mesh_shape`` fixes ("x:16,y:16" -> 256), or None when an axis is -1 or it is "auto";
    a one-line error when it is neither (``mesh_axes``)."""
    if text == "auto":
        return None
    sizes = mesh_axes(text).values()
    return None if -1 in sizes else math.prod(sizes)


def make_mesh(text: str, devices=None) -> Mesh:
    """The device mesh for ``mesh_shape``, over all devices of all processes unless ``devices`` is given."""
    devices = jax.devices() if devices is None else list(devices)
    processes = len({device.process_index for device in devices})
    axes = parse_mesh_shape(text, len(devices), platform=devices[0].platform, processes=processes)
    # Auto axes: shardings are chosen by the layout and propagated by XLA (the pjit model).
    return jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes),
                         devices=devices)


def abstract_mesh(text: str, device_count: int) -> AbstractMesh:
    """The mesh of ``mesh_shape`` for ``device_count`` devices that need not exist: enough to resolve a layout
    into PartitionSpecs (golden layout tables, the auto layout's check) without simulating the devices."""
    axes = parse_mesh_shape(text, device_count)
    return AbstractMesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes))
