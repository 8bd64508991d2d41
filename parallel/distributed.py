"""Multi-host start-up and per-process feeding of the global batch."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding


def initialize(coordinator: str | None, num_processes: int | None, process_id: int | None, auto: bool) -> None:
    """Joins a multi-process run: explicit coordinator/count/id, or ``auto`` (TPU pods, SLURM, Open MPI, where
    jax finds them itself). A no-op for a single process."""
    if coordinator is None and not auto:
        return
    # CPU processes need a collectives backend to talk to each other; GPUs and TPUs ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout, silence = join_timeout(), peer_timeout()
    joined = threading.Event()
    where = f"--coordinator {coordinator}" if coordinator else "--distributed"
    count = f"the {num_processes} processes" if num_processes else "the cluster's processes"
    this = f" (this is process {process_id})" if process_id is not None else ""

    def watch():
        # jax gives up after its initialization_timeout by aborting the process from C++ with a stack trace, and
        # says nothing before: say that this process waits, and give up first (jax's timeout is set later), in one line.
        if joined.wait(min(10.0, timeout / 2)):
            return
        at = f" at {coordinator}" if coordinator else ""
        print(f"waiting for {count} to join{at}{this}", file=sys.stderr, flush=True)
        if joined.wait(timeout - min(10.0, timeout / 2)):
            return
        how = ("start each one with the same --coordinator and --num-processes and its own --process-id"
               if coordinator else "start the command on every host of the cluster")
        print(f"error: {where}: {count} did not all join within {timeout} s{this}; {how} (NEOMESH_JOIN_TIMEOUT="
              "SECONDS waits longer)", file=sys.stderr, flush=True)
        os._exit(2)

    threading.Thread(target=watch, daemon=True).start()
    try:
        if coordinator is None:
            join_detected_cluster(timeout + 30)
        else:
            jax.distributed.initialize(coordinator, num_processes, process_id,
                                       initialization_timeout=timeout + 30)
    finally:
        joined.set()
    check_device_counts()
    watch_peers(silence)


def join_detected_cluster(timeout: int) -> None:
    """jax.distributed.initialize on the cluster jax detects; where it detects none (a plain machine, a shell
    outside the SLURM job) one line saying so, not jax's ValueError traceback ('coordinator_address should be
    defined')."""
    from config import ConfigError

    try:
        jax.distributed.initialize(initialization_timeout=timeout)
    except ValueError as e:
        raise ConfigError(f"--distributed: found no cluster to join here (no SLURM job, TPU pod or Open MPI run; "
                          f"jax: {e}); on other machines start each process with --coordinator HOST:PORT "
                          "--num-processes N --process-id I") from None


_watching = threading.Event()  # set while watch_peers' thread may report a stopped peer
HEARTBEATS = "neomesh/alive/"


def watch_peers(timeout: int) -> None:
    """Stops this process in one line when another process of the run sends no heartbeat for ``timeout`` seconds,
    or the coordination service (process 0) is gone. A dead peer makes a collective fail at once only in the ranks
    that read from it; the others waited silently until jax's 100 s heartbeat timeout aborted the process from C++
    (2 of 10 kill -9s on CPU here). Each process writes a fresh value to jax's key-value store every few seconds
    and reads everyone's in one call; when a value last changed is timed here, so the hosts' clocks need not agree."""
    import atexit
    import time

    from jax._src import distributed as jax_distributed

    from neomesh.errors import EXIT_ERROR, peer_stopped

    client, me, count = jax_distributed.global_state.client, jax.process_index(), jax.process_count()
    period = max(0.5, min(2.0, timeout / 5))

    def stop(why: str) -> None:
        if _watching.is_set():
            print(f"error: {peer_stopped(why)}", file=sys.stderr, flush=True)
            os._exit(EXIT_ERROR)

    def beat() -> None:
        seen = {k: (None, time.monotonic()) for k in range(count) if k != me}  # value, when it last changed
        while True:  # until the process ends; it stops reporting when it starts leaving (see below)
            try:
                client.key_value_set(f"{HEARTBEATS}{me}", str(time.monotonic_ns()), allow_overwrite=True)
                values = {int(key.rsplit("/", 1)[1]): value for key, value in client.key_value_dir_get(HEARTBEATS)}
            except Exception as e:  # noqa: BLE001 - the service itself is gone: its process died
                if not _watching.is_set():  # jax.distributed shut down: this process is leaving
                    return
                stop(f"the coordination service at process 0 stopped answering: {str(e).strip().splitlines()[0]}")
                return
            now = time.monotonic()
            for k, (value, since) in seen.items():
                if values.get(k) != value:
                    seen[k] = (values.get(k), now)
                elif now - since > timeout:
                    stop(f"process {k} sent no heartbeat for {timeout} s")
            time.sleep(period)

    _watching.set()
    # A process leaving (its exit, or stop_together) reports nothing more, but beats on while it waits in jax's
    # shutdown barrier for the others. atexit runs this before jax's shutdown (registered earlier, run later).
    atexit.register(_watching.clear)
    threading.Thread(target=beat, daemon=True, name="neomesh-peers").start()


def peer_timeout() -> int:
    """Seconds without a heartbeat after which another process counts as stopped: ``NEOMESH_PEER_TIMEOUT``, else 60."""
    return _seconds_from_environment("NEOMESH_PEER_TIMEOUT", default=60, minimum=5)


def check_device_counts() -> None:
    """Raises ConfigError where the processes hold different numbers of devices: jax's collectives between
    processes (multihost_utils) and a mesh over them assume the same count everywhere, and failed with a reshape
    error ('cannot reshape array of size 3 into shape (2,2)')."""
    counts = [0] * jax.process_count()
    for device in jax.devices():
        counts[device.process_index] += 1
    if len(set(counts)) > 1:
        each = ", ".join(f"process {i}: {n}" for i, n in enumerate(counts))
        stop_together(f"the {len(counts)} processes hold different numbers of devices ({each}); every process "
                      "must see the same number (CUDA_VISIBLE_DEVICES, XLA_FLAGS' "
                      "--xla_force_host_platform_device_count)")


def join_timeout() -> int:
    """Seconds a process waits at start-up for the others to join: ``NEOMESH_JOIN_TIMEOUT``, else jax's 300."""
    return _seconds_from_environment("NEOMESH_JOIN_TIMEOUT", default=300, minimum=10)


def _seconds_from_environment(name: str, default: int, minimum: int) -> int:
    """The whole number of seconds in environment variable ``name`` (``default`` when unset); one line otherwise."""
    from config import ConfigError

    text = os.environ.get(name, str(default))
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < minimum:
        raise ConfigError(f"{name}: {text!r} is not a number of seconds of at least {minimum}")
    return seconds


def check_same_command(settings: dict) -> None:
    """Raises ConfigError, in every process at once, where the processes of a multi-process run were given
    different ``settings`` ({config key or flag: value}, JSON-able): a run of different configs would meet at its
    first collective with arrays of other shapes and abort inside gloo or NCCL, or hang. A no-op alone."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils


    text = json.dumps(settings, sort_keys=True, default=str).encode()
    lengths = np.asarray(multihost_utils.process_allgather(np.int32(len(text)))).reshape(-1)
    mine = np.zeros(int(lengths.max()), np.uint8)
    mine[:len(text)] = np.frombuffer(text, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(mine))  # (processes, longest)
    everyone = [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, lengths)]
    differ = [key for key in sorted(set().union(*everyone))
              if any(d.get(key) != everyone[0].get(key) for d in everyone)]
    if not differ:
        return
    key = differ[0]
    values = ", ".join(f"process {i}: {json.dumps(d.get(key))}" for i, d in enumerate(everyone))
    more = f" (and {', '.join(differ[1:4])}{', ...' if len(differ) > 4 else ''})" if len(differ) > 1 else ""
    stop_together(f"{key} differs between the {len(everyone)} processes ({values}){more}: every process "
                  "must run the same command, config and --set values")


def process_zero_value(value: int) -> int:
    """Process 0's ``value`` in every process (what its files say decides for all; a no-op alone)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def stop_together(message: str) -> None:
    """Raises ConfigError(message) in a problem every process found: first all of them leave jax.distributed
    together (its shutdown is a barrier), since a process that exits while the others are still joined makes
    the coordination service abort them from C++ before they can print their one line."""
    from config import ConfigError

    _watching.clear()
    jax.distributed.shutdown()
    raise ConfigError(message)


def process_rows(sharding: NamedSharding, global_shape: tuple[int, ...]) -> slice:
    """The contiguous range of batch rows that this process's devices hold."""
    starts, stops = [], []
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        rows = index[0]
        starts.append(rows.start or 0)
        stops.append(global_shape[0] if rows.stop is None else rows.stop)
    return slice(min(starts), max(stops))


def global_batch(make_rows: Callable[[slice], dict], shardings: dict[str, NamedSharding],
                 shapes: dict[str, tuple[int, ...]]) -> dict[str, jax.Array]:
    """Global arrays {field: (B, ...)} from this process's rows only: ``make_rows(rows)`` builds just those rows
    of every field. Every field is split over batch the same way."""
    first = next(iter(shardings))
    rows = process_rows(shardings[first], shapes[first])
    local = make_rows(rows)

    def field(name: str) -> jax.Array:
        shape, values = shapes[name], np.asarray(local[name])

        def shard(index):
            r = index[0]
            local_rows = slice((r.start or 0) - rows.start, (shape[0] if r.stop is None else r.stop) - rows.start)
            return values[(local_rows, *index[1:])]  # a tuple: Python 3.10 has no starred subscripts

        return jax.make_array_from_callback(shape, shardings[name], shard)

    return {name: field(name) for name in shardings}
