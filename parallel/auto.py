"""``mesh_shape: "auto"`` and ``layout: "auto"``: a mesh and layout chosen by a few stated rules, with the reason.

The rules, in order (``STATE_SHARE`` of each device's memory is the training state's budget, the rest is left to
activations; the state is parameters + gradients + optimizer state, in bytes from the optimizer itself):

| case | choice |
|---|---|
| the state fits the budget on every device and the batch splits over all devices | data parallel: ``batch:data`` |
| the state does not fit whole but fits split over all devices | FSDP (ZeRO-3): ``batch:data,embd:data`` |
| ... and n_embd does not split over all of them | FSDP over the most that divide it: ``data:3,fsdp:8`` |
| the batch does not split over all devices | + tensor parallelism (Megatron), as below |
| the model has experts | + expert parallelism over the data axis (``experts:data``) when num_experts divides it |
| the state does not fit even split over all devices | a one-line error with the numbers |
| FSDP with ``accumulate_unreduced`` over the budget | a one-line error with the numbers |

(``accumulate_unreduced`` holds the parameters and their gradient sums whole during a step, split only over the
tensor axis, beside FSDP's split state.)

Tensor parallelism runs over the fewest devices of one host that make the batch split and divide the heads:
``heads:tensor,intermediate_expanded:tensor`` with the residual stream whole (``activation_embd:none``).

With ``layout: "auto"`` on a given ``mesh_shape`` (GPT-Neo's ``auto_layout``) the same rules run on its axes: the
batch goes over every axis it divides (``batch:x+y``), FSDP over those axes, and the last axis becomes the tensor
axis when the batch does not divide the whole mesh. The rules are deterministic and read from the config and the
device count only, never from a search or a measurement.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

from config import ConfigError

STATE_SHARE = 0.5  # of a device's memory for parameters, gradients and optimizer state
MAX_TENSOR = 8  # tensor parallelism over at most one host's devices (8 GPUs on NVLink, 4-8 TPU chips)
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Job:
    """What the choice depends on."""

    devices: int
    devices_per_host: int  # tensor parallelism stays inside one host (NVLink, one TPU host's chips)
    parameters: int
    state_bytes: float  # parameters + gradients + optimizer state, whole
    memory: float  # bytes per device
    batch: int  # train_batch_size
    heads: int
    experts: int  # 0 without mixture-of-experts layers
    embd: int = 0  # n_embd, the dimension FSDP splits (0: any split divides it)
    parameter_bytes: float = 0.0  # the parameters alone, whole
    unreduced: bool = False  # accumulate_unreduced: FSDP's parameters and gradient sums held whole during a step


@dataclasses.dataclass(frozen=True)
class Choice:
    mesh_shape: str
    layout: str
    reason: str


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def _experts_rule(job: Job, axes: dict[str, int], data_axes: list[str]) -> tuple[str, str]:
    ways = math.prod(axes[a] for a in data_axes)
    if job.experts and data_axes and job.experts % ways == 0:
        over = "+".join(data_axes)
        return f"experts:{over}", f"; experts over {over} ({job.experts // ways} per device)"
    return "", ""


def _tensor_size(job: Job, devices: int) -> int | None:
    """The fewest devices (inside one host) to split heads over so that the batch splits over the rest."""
    for t in range(2, job.devices_per_host + 1):
        if devices % t == 0 and job.heads % t == 0 and job.batch % (devices // t) == 0:
            return t
    return None


def _fsdp_axes(job: Job, mesh: dict[str, int], data_axes: list[str]) -> list[str]:
    """The data axes FSDP splits ``embd`` over: all of them when their product divides n_embd, else the
    subset with the largest product that does (fewer ways, more state per device)."""
    subsets = (list(c) for k in range(len(data_axes), 0, -1) for c in itertools.combinations(data_axes, k))
    dividing = [axes for axes in subsets if not job.embd or job.embd % math.prod(mesh[a] for a in axes) == 0]
    return max(dividing, key=lambda axes: math.prod(mesh[a] for a in axes), default=[])


def choose(job: Job, mesh: dict[str, int] | None = None) -> Choice:
    """The mesh and layout for ``job``; on ``mesh`` (axis -> size) when given, else a mesh chosen too."""
    budget = STATE_SHARE * job.memory
    split_state = job.state_bytes / job.devices
    if split_state > budget:
        raise ConfigError(f"layout: auto: the training state ({_gb(job.state_bytes)}: parameters, gradients, "
                          f"optimizer) is {_gb(split_state)} per device even split over all {job.devices} devices, "
                          f"above the {STATE_SHARE:.0%} of {_gb(job.memory)} it may use; add devices")
    if mesh is None:
        t = 1 if job.batch % job.devices == 0 else _tensor_size(job, job.devices)
        if t is None:
            raise ConfigError(f"train_batch_size: {job.batch} does not split over {job.devices} devices, nor over "
                              f"{job.devices} / t with t <= {job.devices_per_host} dividing n_head {job.heads}; "
                              f"choose a batch that does, or set mesh_shape and layout")
        data_ways = job.devices // t
        # FSDP splits n_embd over the data axis; where they do not divide, over an 'fsdp' axis that does
        f = math.gcd(job.embd, data_ways) if job.embd and job.state_bytes > budget else data_ways
        mesh = {"data": data_ways // f, "fsdp": f} if 1 < f < data_ways else {"data": data_ways}
        mesh.update({"tensor": t} if t > 1 else {})
        data_axes, tensor_axis = [a for a in mesh if a != "tensor"], ("tensor" if t > 1 else None)
    else:
        names = list(mesh)
        if job.batch % job.devices == 0 or len(names) == 1:
            data_axes, tensor_axis = names, None
        elif job.heads % mesh[names[-1]] == 0 and job.batch % (job.devices // mesh[names[-1]]) == 0:
            data_axes, tensor_axis = names[:-1], names[-1]
        else:
            raise ConfigError(f"layout: auto: train_batch_size {job.batch} splits neither over mesh_shape "
                              f"{_shape(mesh)} nor over its axes but the last with n_head {job.heads} over the last")
    data = "+".join(data_axes)
    data_ways = math.prod(mesh[a] for a in data_axes)
    fits_whole = job.state_bytes <= budget
    if job.batch % data_ways:
        raise ConfigError(f"layout: auto: train_batch_size {job.batch} does not split over {data} ({data_ways} ways)")
    # experts right after batch: named after embd (FSDP's rule) they would lose the data axis to it, and every
    # device would hold a slice of every expert instead of whole experts of its own
    experts, experts_reason = _experts_rule(job, mesh, data_axes)
    rules = [f"batch:{data}"] + ([experts] if experts else [])
    fsdp = "+".join(_fsdp_axes(job, mesh, data_axes)) if not fits_whole else data
    fsdp_ways = math.prod(mesh[a] for a in fsdp.split("+")) if fsdp else 1
    tensor_ways = mesh[tensor_axis] if tensor_axis else 1
    if not fits_whole and job.state_bytes / (fsdp_ways * tensor_ways) > budget:
        raise ConfigError(f"layout: auto: FSDP splits n_embd {job.embd}, and the most of the {data_ways} data-"
                          f"parallel ways that divide it is {fsdp_ways}: the training state "
                          f"({_gb(job.state_bytes)}) is {_gb(job.state_bytes / (fsdp_ways * tensor_ways))} per "
                          f"device, above {STATE_SHARE:.0%} of {_gb(job.memory)}; set mesh_shape and layout")
    if fits_whole and tensor_axis is None:
        reason = (f"data parallel over {data} ({data_ways}): the training state ({_gb(job.state_bytes)}) fits in "
                  f"{STATE_SHARE:.0%} of a device's {_gb(job.memory)}")
    else:
        if not fits_whole:
            rules.append(f"embd:{fsdp}")
        state_per_device = job.state_bytes / ((fsdp_ways if not fits_whole else 1) * tensor_ways)
        what = f"FSDP over {data} ({data_ways})" if not fits_whole else f"data parallel over {data} ({data_ways})"
        if not fits_whole and fsdp != data:
            what = (f"data parallel over {data} ({data_ways}), FSDP over {fsdp} ({fsdp_ways}: n_embd {job.embd} "
                    f"does not split {data_ways} ways)")
        why = (f"the training state ({_gb(job.state_bytes)}) is above {STATE_SHARE:.0%} of a device's "
               f"{_gb(job.memory)}" if not fits_whole else f"the state ({_gb(job.state_bytes)}) fits whole")
        reason = f"{what}: {why}, {_gb(state_per_device)} per device"
        if job.unreduced and not fits_whole:
            held = 2 * job.parameter_bytes / tensor_ways
            if state_per_device + held > budget:
                raise ConfigError(f"accumulate_unreduced: with it each device holds the parameters and their "
                                  f"gradient sums whole during a step ({_gb(held)}) beside its "
                                  f"{_gb(state_per_device)} of FSDP's split state, above {STATE_SHARE:.0%} of "
                                  f"{_gb(job.memory)}; set accumulate_unreduced false (or mesh_shape and layout)")
            reason += (f", and {_gb(held)} held whole during a step (accumulate_unreduced: the parameters and their "
                       f"gradient sums)")
        if tensor_axis is not None:
            rules += [f"heads:{tensor_axis}", f"intermediate_expanded:{tensor_axis}", "activation_embd:none"]
            reason += (f"; tensor parallel over {tensor_axis} ({mesh[tensor_axis]}): batch {job.batch} does not "
                       f"split over all {job.devices} devices")
    return Choice(_shape(mesh), ",".join(rules), reason + experts_reason)


def _shape(mesh: dict[str, int]) -> str:
    return ",".join(f"{name}:{size}" for name, size in mesh.items())


def device_memory(device) -> float:
    """Bytes of memory per device: what the accelerator reports, or on CPUs the host's memory shared by its
    devices."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - a device of a compile-only topology, a backend without the call
        stats = None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    import jax
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / jax.local_device_count()


def job_for(cfg, params, tx, devices: int, memory: float, devices_per_host: int) -> Job:
    """The ``Job`` of a config: parameter count and state bytes from its abstract parameters and optimizer."""
    import jax

    opt_state = jax.eval_shape(tx.init, params)
    nbytes = lambda tree: sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(tree))  # noqa: E731
    return Job(devices=devices, devices_per_host=devices_per_host,
               parameters=sum(math.prod(p.shape) for p in jax.tree.leaves(params)), parameter_bytes=nbytes(params),
               state_bytes=2 * nbytes(params) + nbytes(opt_state),  # parameters, gradients, optimizer state
               memory=memory, batch=cfg.train_batch_size, heads=cfg.n_head,
               experts=cfg.moe["num_experts"] if cfg.moe_layers else 0, embd=cfg.n_embd,
               unreduced=bool(cfg.accumulate_unreduced))


def resolve(cfg, make_model, tx, devices=None, memory: float | None = None):
    """(Layout, note): ``cfg``'s mesh and layout over ``devices`` (default: all), with any ``auto`` part chosen
    for a device ``memory`` (default: what the devices report); the note explains an automatic choice."""
    import jax

    from parallel.layout import Layout
    from parallel.mesh import make_mesh, parse_mesh_shape
    from parallel.topologies import devices_per_host
    from parallel.state import abstract_model

    devices = jax.devices() if devices is None else list(devices)
    if cfg.layout != AUTO:
        return Layout.from_config(make_mesh(cfg.mesh_shape, devices), cfg.layout), None
    job = job_for(cfg, abstract_model(make_model)[1], tx, len(devices), memory or device_memory(devices[0]),
                  min(devices_per_host(devices), MAX_TENSOR))
    given = None if cfg.mesh_shape == AUTO else parse_mesh_shape(cfg.mesh_shape, len(devices),
                                                                  platform=devices[0].platform)
    choice = choose(job, given)
    layout = Layout.from_config(make_mesh(choice.mesh_shape, devices), choice.layout)
    return layout, f"auto: mesh_shape {choice.mesh_shape}, layout {choice.layout}\n  because {choice.reason}"
