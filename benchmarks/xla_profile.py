"""Where a compiled step's time goes, by XLA op: ``python benchmarks/train_step.py --profile DIR``.

Runs the step under ``jax.profiler`` (a Perfetto trace written to DIR, for ui.perfetto.dev) and prints the ops
whose summed durations are largest, each with the model operation it came from (the HLO's ``op_name`` metadata,
such as ``transpose(jvp(BTD,DF->BTF))/dot_general``: the MLP's first matmul in the backward pass). On CPUs XLA
traces its ops only with ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` (``CPU_FLAG``, set before jax
starts). XLA:CPU runs independent ops side by side, so durations of ops that overlapped add up to more than the
wall time. On a GPU the kernels on the device's tracks count (not their launches on the host), each matched to its
instruction by the ``hlo_op`` XLA annotates it with, or by its name (a fusion's kernel is the fusion's name with
``_N`` for ``.N``). Inside a CUDA graph (XLA's command buffers) ``hlo_op`` names the graph, and the library
kernels there (cuBLAS, cuDNN) have names of their own: those count by library, unmatched
(``GPU_PROFILE_OPTIONS`` compiles the profiled program without command buffers, so that every kernel matches).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Callable

CPU_FLAG = "--xla_cpu_enable_xprof_traceme=true"
# The profiled program's compile options on GPUs: no command buffers (CUDA graphs), whose kernels the trace would
# tag with the graph instead of their instruction. On one H100 (2026-11-27) the graphs held 96% of the 125M step's
# kernel time and left its cuBLAS and cuDNN kernels unattributed.
GPU_PROFILE_OPTIONS = {"xla_gpu_enable_command_buffer": ""}
LIBRARY_KERNELS = (("cuBLAS", re.compile(r"^(nvjet|sm\d+_xmma|cutlass|cublas)", re.I)),
                   ("cuDNN", re.compile(r"cudnn", re.I)), ("copy", re.compile(r"^(memset|memcpy)", re.I)))


def trace_cpu_ops(directory: str) -> None:
    """Refuses a ``--profile`` ``directory`` that is a file (``ConfigError``: the trace's writer would fail after
    the timing), then adds CPU_FLAG to ``XLA_FLAGS`` before jax starts, where this XLA knows it (it quits on a flag
    it does not know); inert on accelerators."""
    from config import ConfigError
    from parallel.xla_flags import known_flags

    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"--profile: {directory} is a file, not a directory for the trace")

    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *known_flags([CPU_FLAG])]).strip()


def op_names(hlo_text: str) -> dict[str, str]:
    """{instruction name: the jax operation it came from} for the instructions of a compiled module's text."""
    names = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
        if match:
            # the text escapes quotes inside the name (params[\'blocks\']...): shown as jax wrote it
            names[match.group(1)] = re.sub(r"^jit\([^)]*\)/", "", match.group(2)).replace("\\'", "'")
    return names


def profile(run: Callable[[], None], hlo_text: str, directory: str, runs: int = 2) -> list[tuple]:
    """Calls ``run`` (one step, blocking until done) ``runs`` times under the profiler and returns every
    (operation, instruction kind, milliseconds per run) row, the largest summed duration first."""
    import jax

    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(runs):
            run()
    # this run's trace: a reused DIR holds earlier ones too (glob's order is arbitrary)
    trace = max(glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True),
                key=os.path.getmtime)
    with gzip.open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals = op_totals(events, op_names(hlo_text))
    return [(op, kind, micros / 1e3 / runs) for (op, kind), micros in totals.most_common()]


def op_totals(events: list[dict], names: dict[str, str]) -> collections.Counter:
    """Summed microseconds per (jax operation, XLA op kind) of a trace's complete events. Where the trace has
    accelerator tracks, only their events count: the host's launch events of the same ops would count twice, and
    there a kernel no instruction claims counts as ("-", its library or its name)."""
    devices = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and re.search(r"/device:(GPU|TPU)", str(e.get("args", {}).get("name", "")))}
    totals = collections.Counter()
    for event in events:
        if event.get("ph") != "X" or (devices and event.get("pid") not in devices):
            continue
        kernel = str(event.get("name", ""))
        candidates = (kernel, event.get("args", {}).get("hlo_op"), re.sub(r"_([0-9]+)$", r".\1", kernel))
        name = next((n for n in candidates if n in names), None)
        if name is not None:
            kind = re.sub(r"[.][0-9]+$", "", name)  # ynn_fusion.152 -> ynn_fusion
            totals[(names[name], kind)] += event.get("dur", 0)
        elif devices:
            library = next((lib for lib, pattern in LIBRARY_KERNELS if pattern.search(kernel)), None)
            totals[("-", library or re.sub(r"_[0-9]+$", "", kernel)[:60])] += event.get("dur", 0)
    return totals


def print_profile(rows: list[tuple], directory: str, shown: int = 25) -> None:
    """The first ``shown`` of ``profile``'s rows, then what the others add up to and the total of them all, so that
    the table accounts for the whole traced time."""
    print(f"\nXLA ops by summed duration per step (trace: {directory}; overlapping ops add up):")
    print("| ms per step | operation | XLA op |")
    print("|---:|---|---|")
    for op, kind, millis in rows[:shown]:
        print(f"| {millis:,.1f} | {op} | {kind} |")
    if len(rows) > shown:
        print(f"| {sum(millis for *_, millis in rows[shown:]):,.1f} | the {len(rows) - shown} other operations | |")
    print(f"| {sum(millis for *_, millis in rows):,.1f} | all traced operations | |")
