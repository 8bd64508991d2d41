"""See a job before paying for it: compile the configured train step for its mesh and report what it needs.

``python train.py --config C --dry-run [--devices N]`` builds the model abstractly (nothing allocated), lowers
and compiles the real train step (``make_train_step`` on ``abstract_train_state``) for the mesh, and prints:
parameters, FLOPs per step, bytes per device (parameters and optimizer state from their shardings; temporaries
from the compiled program's ``memory_analysis()``), the collectives of the step and their bytes (read off the
compiled HLO), and an estimated step time on H100, H200 and TPU v4, v5e, v5p and v6e (``parallel/estimate.py`` states
the model).

``--topology v5e:4x4`` compiles for a TPU slice instead, and ``--topology h100:8`` for GPUs, each with its own
compiler, on a machine without them (``parallel/topologies.py``). Then every figure is that program's own: its
memory plan, its attention kernels (splash's Pallas kernels on TPUs, cuDNN's flash attention on GPUs, chosen
because the layout's devices are those: ``models.axes.target_platform``), its FLOPs and collectives, and the
estimate is for that accelerator alone.

Without it, the devices are simulated CPU devices (``--xla_force_host_platform_device_count``): XLA's SPMD
partitioner runs as it would for accelerators, so the per-device shapes, the memory of parameters and optimizer
state, the FLOPs and the collectives are the partitioned program's own (the CPU pipeline's all-reduce + slice of
FSDP gradients is counted as the reduce-scatter GPUs and TPUs run). GPT-Neo's 13B on 256 devices compiles in 2 to
3.5 minutes on a loaded 2-core machine in 1.4 GB. An abstract mesh (``jax.sharding.AbstractMesh``) is enough to
lower but not to compile, and compiling is what gives the per-device program. Temporaries are the CPU compiler's
figure, with its memory-minimising scheduler: an upper one, since the CPU has no flash attention, holds FSDP
gradients whole before slicing them (reported) and keeps gathered weights alive longer than a memory-limited
accelerator schedule would. Nothing is timed: the step time is a stated model (``parallel/estimate.py``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from neomesh.units import human_bytes
from parallel.estimate import ACCELERATORS, DEVICE_KINDS, UTILISATION, Accelerator, StepEstimate, estimate, on_hosts
from parallel.hlo_stats import HloStats, parse_hlo
from parallel.layout import Layout
from parallel.mesh import mesh_axes
from parallel.state import abstract_train_state
from parallel.topologies import topology_devices
from parallel.steps import batch_shapes, batch_shardings, make_train_step, microbatch_count
from training.flops import attention_flops_per_token, train_flops_per_token
from training.objectives import loss_chunk, objective_for
from training.optimizer import learning_rate_schedule, make_optimizer

GB = 1e9


def human_count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def human_seconds(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


@dataclasses.dataclass(frozen=True)
class DryRun:
    """What compiling one train step showed, per device unless said otherwise."""

    parameters: int  # whole model
    parameter_bytes: int
    optimizer_bytes: int
    batch_bytes: int
    argument_bytes: int  # compiled: the state and the batch the step takes
    output_bytes: int
    alias_bytes: int  # outputs written in place of donated arguments
    temp_bytes: int  # compiled: activations, gradients and workspace
    model_flops: float  # whole step
    microbatches: int
    compile_seconds: float
    hlo: HloStats
    estimates: tuple[StepEstimate, ...]
    kernel_flops: float = 0.0  # per device: attention inside Pallas kernels, at the model's count
    loss_chunk: int = 0  # positions per chunk of the planned causal LM loss (0: whole)

    @property
    def peak_bytes(self) -> int:
        """Live at once, at most: the arguments, the temporaries and the outputs not written in place."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes


def shard_bytes(tree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard, as devices hold)."""
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def dry_run(cfg, layout: Layout, make_model: Callable[[nnx.Rngs], nnx.Module],
            accelerators: tuple[Accelerator, ...] = tuple(ACCELERATORS.values()), memory: float | None = None
            ) -> DryRun:
    """Compiles ``cfg``'s train step for ``layout``'s mesh without allocating the model and reports it, with a
    step-time estimate for each of ``accelerators``; ``memory``: the bytes per device it is planned for (a causal
    LM's loss is chunked by it: training/objectives.loss_chunk)."""
    tx, schedule, objective = make_optimizer(cfg), learning_rate_schedule(cfg), objective_for(cfg, layout, memory)
    from training.peft import trainable_filter

    def make_for_mesh(rngs):  # built for the mesh's devices: their kernels, even where this process runs none
        with layout.active():
            return make_model(rngs)

    trainable = trainable_filter(cfg.peft_settings)  # frozen parameters have no optimizer state
    graphdef, abstract, shardings = abstract_train_state(make_for_mesh, tx, layout, trainable)
    shapes = batch_shapes(objective, cfg, cfg.train_batch_size)
    data = batch_shardings(layout, objective, shapes)
    microbatches = microbatch_count(cfg, layout)
    step = make_train_step(graphdef, objective, tx, schedule, layout, shardings, data, precision=cfg.precision,
                           microbatches=microbatches, accumulate_unreduced=cfg.accumulate_unreduced, seed=cfg.seed,
                           trainable=trainable)
    batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=data[name]) for name, shape in shapes.items()}
    start = time.perf_counter()
    try:
        compiled = step.lower(abstract, batch).compile()
    except jax.errors.JaxRuntimeError as e:
        device = layout.mesh.devices.flat[0]
        if device.platform == "cpu" or "RESOURCE_EXHAUSTED" in str(e):
            raise  # a bug here; out of memory: the one line of neomesh/errors.py
        # The accelerator's compiler, run without its device, has failed on a pass of its own: one line.
        hint = ("; without a GPU XLA cannot autotune its Triton matmuls: XLA_FLAGS=--xla_gpu_enable_triton_gemm=false "
                "compiles them with cuBLAS" if device.platform == "gpu" and "tile" in str(e) else "")
        raise ConfigError(f"--topology: the {device.device_kind} compiler could not compile this step: "
                          f"{str(e).splitlines()[0][:300]}{hint}") from None
    seconds = time.perf_counter() - start
    planned = compiled.memory_analysis()
    devices = layout.mesh.size
    hlo = parse_hlo(compiled.as_text(), devices)
    model_flops = train_flops_per_token(cfg) * cfg.train_batch_size * cfg.n_ctx
    # Attention kernels' FLOPs (splash's Pallas kernels, cuDNN's) are out of the HLO's sight: the model's count
    # stands in.
    kernel_flops = (attention_flops_per_token(cfg) * cfg.train_batch_size * cfg.n_ctx / devices
                    if hlo.attention_kernel_calls else 0.0)
    live = planned.argument_size_in_bytes + planned.output_size_in_bytes + planned.temp_size_in_bytes
    return DryRun(
        parameters=sum(math.prod(p.shape) for p in jax.tree.leaves(abstract.params)),
        parameter_bytes=shard_bytes(abstract.params), optimizer_bytes=shard_bytes(abstract.opt_state),
        batch_bytes=shard_bytes(batch), argument_bytes=planned.argument_size_in_bytes,
        output_bytes=planned.output_size_in_bytes, alias_bytes=planned.alias_size_in_bytes,
        temp_bytes=planned.temp_size_in_bytes, model_flops=model_flops, microbatches=microbatches,
        compile_seconds=seconds, hlo=hlo, kernel_flops=kernel_flops,
        loss_chunk=objective.loss_chunk,
        estimates=tuple(estimate(hlo, live, model_flops, devices, a, kernel_flops) for a in accelerators))


def memory_advice(run: DryRun, cfg, layout: Layout) -> str | None:
    """One line for a plan that does not fit some accelerator: which, and the keys of this config that would need
    less memory per device; None where it fits them all."""
    low = run.peak_bytes - run.hlo.whole_before_scatter
    short = [e.accelerator for e in run.estimates if low > e.accelerator.memory]
    if not short:
        return None
    tightest = min(short, key=lambda a: a.memory)
    smallest = tightest.memory
    state = run.parameter_bytes + run.optimizer_bytes
    ways = []
    if state > smallest / 2 and "embd" not in layout.text:
        ways.append(f"split the parameters and optimizer state ({human_bytes(state)} per device) over the data "
                    "axis too (FSDP: layout embd:AXIS) or more devices")
    elif state > smallest / 2:
        ways.append(f"more devices (the parameters and optimizer state alone take {human_bytes(state)} per device)")
    if cfg.remat_policy == "none":
        ways.append("--set recompute_grad=full")
    if not cfg.scan_layers:
        ways.append("--set scan_layers=true")
    there = loss_chunk(cfg, layout, smallest) if cfg.task == "causal_lm" and not run.loss_chunk else 0
    if there:  # planned for a device with more memory, the loss was whole; a run on the smallest chunks it
        flag = next(key for key, a in ACCELERATORS.items() if a.name == tightest.name)
        ways.insert(0, f"a plan for the {tightest.name}'s memory (--accelerator {flag}), where the loss "
                       f"is computed {there} positions at a time (loss_chunk), as a run there does")
    per_mb = cfg.tokens_per_mb_per_replica
    ways.append(f"a smaller train_batch_size (now {cfg.train_batch_size}) or microbatches "
                f"(tokens_per_mb_per_replica{f', now {per_mb}' if per_mb else ''})")
    return (f"does not fit {', '.join(a.name for a in short)} (peak {human_bytes(low)} per device); to need less: "
            + "; ".join(ways))


def report(run: DryRun, cfg, layout: Layout) -> str:
    """The dry run as Markdown tables (they read in a terminal and paste into a README)."""
    devices = layout.mesh.size
    device = layout.mesh.devices.flat[0]
    platform = device.platform  # "cpu": simulated devices; "tpu", "gpu": compiled for, none attached
    compiler = "CPU compiler" if platform == "cpu" else f"{device.device_kind} compiler"
    tokens = cfg.train_batch_size * cfg.n_ctx
    remat = f", recompute_grad {cfg.remat_policy}" if cfg.remat_policy != "none" else ""
    plural = "s" if devices > 1 else ""
    where = (f"{devices} simulated device{plural}" if platform == "cpu"
             else f"{devices} {device.device_kind} device{plural}, compiled ahead of time, none attached")
    kernel = "Pallas" if platform == "tpu" else "cuDNN flash attention"
    kernels = (f"; attention in {run.hlo.attention_kernel_calls} {kernel} kernel calls, counted as the model's "
               f"{run.kernel_flops:.3g} per device" if run.hlo.attention_kernel_calls else "")
    lines = [
        f"mesh {dict(layout.mesh.shape)} ({where}), layout {layout.text}",
        f"{human_count(run.parameters)} parameters; batch {cfg.train_batch_size} x {cfg.n_ctx} tokens"
        f"{f' in {run.microbatches} microbatches' if run.microbatches > 1 else ''}"
        f"{' (gradients reduced once per step)' if run.microbatches > 1 and cfg.accumulate_unreduced else ''}; "
        f"{cfg.precision}"
        f"{remat}; compiled in {run.compile_seconds:.0f} s",
        f"FLOPs per step: model {run.model_flops:.3g} (6N + attention, {run.model_flops / tokens:.3g} per token); "
        f"compiled matmuls {run.hlo.matmul_flops * devices:.3g} ({run.hlo.matmul_flops:.3g} per device"
        f"{', recomputation included' if cfg.remat_policy != 'none' else ''}"
        f"{kernels})",
        "",
        "| memory per device | bytes |",
        "|---|---|",
        f"| parameters | {human_bytes(run.parameter_bytes)} |",
        f"| optimizer state | {human_bytes(run.optimizer_bytes)} |",
        f"| batch | {human_bytes(run.batch_bytes)} |",
        f"| temporaries: activations, gradients, workspace ({compiler}) | {human_bytes(run.temp_bytes)} |",
    ]
    if platform == "cpu":
        lines.append(f"| of them at most: arrays the CPU program all-reduces whole before slicing (gradients, partial "
                     f"sums; GPUs and TPUs reduce-scatter) | {human_bytes(run.hlo.whole_before_scatter)} |")
    lines.append(f"| peak: arguments + temporaries + outputs not written in place | {human_bytes(run.peak_bytes)} |")
    if platform == "cpu":
        lines.append(f"| peak without those whole arrays | "
                     f"{human_bytes(run.peak_bytes - run.hlo.whole_before_scatter)} |")
    lines += [
        "",
        "| collective | ops | runs per step | data per device per step | sent per device per step |",
        "|---|---|---|---|---|",
    ]
    kinds = run.hlo.by_kind()
    lines += [f"| {kind} | {row['ops']} | {row['executions']} | {human_bytes(row['bytes'])} | "
              f"{human_bytes(row['wire_bytes'])} |" for kind, row in sorted(kinds.items())] or ["| (none) | | | | |"]
    if not run.estimates:
        return "\n".join(lines + ["", f"(no step-time estimate: no datasheet figures for a {device.device_kind} "
                                       "here; the compiler's plan above fits its memory)"])
    lines += [
        "",
        "| accelerator | compute | memory | collectives | step (overlapped) | MFU | fits in memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in run.estimates:
        low = run.peak_bytes - run.hlo.whole_before_scatter
        fits = ("yes" if run.peak_bytes <= e.accelerator.memory else "maybe" if low <= e.accelerator.memory
                else "no") + f" ({human_bytes(e.accelerator.memory)})"
        lines.append(f"| {e.accelerator.name} | {human_seconds(e.compute_s)} | {human_seconds(e.memory_s)} | "
                     f"{human_seconds(e.collectives_s)} | {human_seconds(e.step_s)} "
                     f"({human_seconds(e.overlapped_s)}) | {e.mfu:.0%} | {fits} |")
    advice = memory_advice(run, cfg, layout)
    if advice:
        lines.append(advice)
    links = {"tpu": "one ICI torus axis", "gpu": "NVLink (8 per node) / network"}.get(
        platform, "NVLink (8 per node) / network, or one ICI torus axis")
    lines.append(f"step time model: compute at {UTILISATION:.0%} of bf16 peak on the compiled matmul FLOPs"
                 f"{' and the kernels' if run.kernel_flops else ''}; memory: every live byte once at HBM bandwidth; "
                 f"collectives: ring wire bytes over {links}; step = max(compute, memory) + collectives, "
                 f"(overlapped) = max of all three")
    return "\n".join(lines)


def simulate_devices(count: int) -> None:
    """Makes jax start with ``count`` CPU devices; must run before anything initialises a jax backend."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    # The CPU compiler's default scheduler trades memory for parallelism (it runs every rematerialised forward
    # pass early); GPU and TPU schedule for memory, so the memory-minimising scheduler is the closer figure.
    os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count={count} "
                               "--xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


def check_devices_fit(mesh_shape: str, device_count: int | None) -> None:
    """``--devices`` against the devices ``mesh_shape`` fixes, named as the flag: the dry run sets the simulated
    device count itself, so the mesh's own advice (XLA_FLAGS) would not reach it."""
    if device_count is None or mesh_shape == "auto":
        return
    sizes = mesh_axes(mesh_shape).values()
    fixed = math.prod(size for size in sizes if size != -1)
    if -1 in sizes and device_count % fixed:
        raise ConfigError(f"--devices {device_count}: mesh_shape '{mesh_shape}' fixes {fixed} devices, which does "
                          f"not divide {device_count}; give a multiple of {fixed}")
    if -1 not in sizes and device_count != fixed:
        raise ConfigError(f"--devices {device_count}: mesh_shape '{mesh_shape}' needs {fixed} devices; give "
                          f"--devices {fixed} or leave --devices out")


MOST_SIMULATED = 16384  # simulated CPU devices a dry run creates at most


def run_dry_run(cfg, device_count: int | None, accelerator: str | None = None, topology: str | None = None) -> str:
    """``train.py --dry-run``: the report for ``cfg`` on ``device_count`` simulated devices (default: the count
    ``mesh_shape`` fixes), or compiled for ``topology``, a TPU slice or a GPU node; an ``auto`` mesh or layout is
    chosen for ``accelerator``'s memory (default H100's; with ``topology`` its own accelerator's)."""
    from parallel.auto import AUTO, resolve
    from training.peft import build_model
    from parallel.mesh import fixed_device_count

    if device_count is not None and device_count < 1:
        raise ConfigError(f"--devices: {device_count} is not a device count; it must be at least 1")
    if topology:
        if device_count is not None:
            raise ConfigError("--devices: not with --topology, which fixes the device count")
        if accelerator:
            raise ConfigError("--accelerator: not with --topology, whose devices are the accelerator")
        # The host's own backend (jax read JAX_PLATFORMS at import): the accelerator's program is only compiled,
        # and its plugin then neither looks for the device nor checks the libraries that would drive one.
        jax.config.update("jax_platforms", "cpu")
        devices = topology_devices(topology)
        kind = devices[0].device_kind
        # the plan is the compiler's anyway; the estimate needs the accelerator's datasheet
        accelerators = (on_hosts(ACCELERATORS[DEVICE_KINDS[kind]], devices),) if kind in DEVICE_KINDS else ()
        if not accelerators and AUTO in (cfg.mesh_shape, cfg.layout):
            raise ConfigError(f"--topology: an 'auto' mesh or layout is chosen for the device's memory, and this "
                              f"estimate knows no datasheet for a {kind}; give mesh_shape and layout")
        memory = accelerators[0].memory if accelerators else None
    else:
        fixed = fixed_device_count(cfg.mesh_shape)  # first: a mesh_shape that does not parse is the problem
        check_devices_fit(cfg.mesh_shape, device_count)
        count = device_count or fixed
        if count is None:
            raise ConfigError(f"--dry-run: mesh_shape '{cfg.mesh_shape}' leaves the device count open; "
                              "give --devices N")
        if count > MOST_SIMULATED:  # minutes to create, then XLA:CPU aborts
            given = "--devices" if device_count else f"mesh_shape '{cfg.mesh_shape}'"
            raise ConfigError(f"{given}: {count:,} devices are more than the {MOST_SIMULATED:,} CPU devices one "
                              "process simulates (16,384 take 15 s to create; 32,768 aborted XLA:CPU after a minute)")
        simulate_devices(count)
        if jax.device_count() != count:  # a backend started before us (e.g. inside a test process)
            raise ConfigError(f"--devices: jax already runs with {jax.device_count()} devices, not {count}")
        devices, accelerators = jax.devices(), tuple(ACCELERATORS.values())
        memory = ACCELERATORS[accelerator or "h100"].memory
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    layout, note = resolve(cfg, make_model, make_optimizer(cfg), devices=devices, memory=memory)
    run = dry_run(cfg, layout, make_model, accelerators, memory)
    return (f"{note}\n" if note else "") + report(run, cfg, layout)
