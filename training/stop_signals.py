"""SIGTERM (schedulers, preemptible VMs) and SIGINT (Ctrl-C): finish the current step, checkpoint, exit.

Once training runs (``arm``), a signal only asks the loop to stop after the step in flight; the loop saves a
checkpoint at that step, waits for every pending save, and exits 0 (SIGTERM) or 130 (SIGINT). Before that
nothing is lost by stopping, so a signal stops at once; a second signal also stops at once.

Multi-host, all processes must save the same step. JAX's preemption service does exactly that: a SIGTERM to any
process is propagated to all, and ``reached_preemption_sync_point`` (through orbax's ``reached_preemption``)
turns true on every process at the same step. So there SIGTERM is left to JAX's own handler, and SIGINT is
handed to it by re-sending SIGTERM to this process.
"""

from __future__ import annotations

import os
import signal


class StopNow(Exception):
    """A SIGTERM before the first step (nothing to save yet) or a second signal: stop without a checkpoint."""


class StopSignals:
    def __init__(self, multi_process: bool):
        self.multi_process = multi_process
        self.received: str | None = None  # "SIGTERM" or "SIGINT", once one arrived
        self.armed = False
        self.previous = {}

    def install(self) -> None:
        """Installs the handlers (main thread only); ``uninstall`` puts the previous ones back."""
        signals = (signal.SIGINT,) if self.multi_process else (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def arm(self) -> None:
        """From now on a signal waits for the current step to finish and its checkpoint."""
        self.armed = True

    def _handle(self, signum, frame) -> None:
        del frame
        name = signal.Signals(signum).name
        if not self.armed or self.received is not None:
            self.received = self.received or name
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise StopNow(name)
        self.received = name
        if self.multi_process and signum == signal.SIGINT:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells the other processes

    def should_stop(self, step: int, reached_preemption) -> bool:
        """Whether the loop stops after ``step``; every process must call this at every step (multi-host it is
        a sync point that all processes pass at the same step)."""
        if self.multi_process:
            return reached_preemption(step)
        return self.received is not None

    @property
    def exit_code(self) -> int:
        return 130 if self.received == "SIGINT" else 0

    @property
    def cause(self) -> str:
        return self.received or "a preemption notice (SIGTERM to a process of this run)"
