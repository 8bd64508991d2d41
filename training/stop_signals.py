"""SIGTERM (schedulers, preemptible VMs) and SIGINT (Ctrl-C): finish the current step, checkpoint, exit.

Once training runs (``arm``), a signal only asks the loop to stop after the step in flight; the loop saves a
checkpoint at that step, waits for every pending save, and exits 0 (SIGTERM) or 130 (SIGINT). Before that
nothing is lost by stopping, so a signal stops at once; a second signal also stops at once.

Python runs a handler between any two bytecodes of the main thread, a finalizer's or a garbage collector
callback's included (jax registers one), and drops what is raised there with an "Exception ignored" message. So a
stop is also kept as ``pending``: the next ``check`` (at ``arm``, every step, and after the loop) raises it, and
the message for a dropped one is left out.

Multi-host, all processes must save the same step. JAX's preemption service does exactly that: a SIGTERM to any
process is propagated to all, and ``reached_preemption_sync_point`` (through orbax's ``reached_preemption``)
turns true on every process at the same step. So there SIGTERM is left to JAX's own handler, and SIGINT is
handed to it by re-sending SIGTERM to this process.
"""

from __future__ import annotations

import os
import signal
import sys


class StopNow(BaseException):
    """A signal that stops the command at once: before the first step (nothing to save yet), after the last
    checkpoint, or a second signal. A BaseException, like KeyboardInterrupt: no ``except Exception`` (a restore
    that treats any failure as a damaged checkpoint, say) may mistake it for something else."""

    def __init__(self, signal_name: str, when: str):
        super().__init__(f"stopped by {signal_name} {when}")
        self.exit_code = 130 if signal_name == "SIGINT" else 0


class StopSignals:
    def __init__(self, multi_process: bool):
        self.multi_process = multi_process
        self.received: str | None = None  # "SIGTERM" or "SIGINT", once one arrived
        self.phase = "before"  # "before" the first step, "training", or "after" the last checkpoint
        self.pending: StopNow | None = None  # a stop raised by the handler, in case Python dropped it
        self.previous = {}
        self.previous_unraisable = None

    def install(self) -> None:
        """Installs the handlers (main thread only); ``uninstall`` puts the previous ones back."""
        signals = (signal.SIGINT,) if self.multi_process else (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            self.previous[sig] = signal.signal(sig, self._handle)
        self.previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}
        if self.previous_unraisable is not None:
            sys.unraisablehook, self.previous_unraisable = self.previous_unraisable, None

    def _unraisable(self, info) -> None:
        if not isinstance(info.exc_value, StopNow):  # a dropped stop is raised again at the next check
            self.previous_unraisable(info)

    def check(self) -> None:
        """Raises a stop the handler raised where Python dropped it."""
        if self.pending is not None:
            raise self.pending

    def arm(self) -> None:
        """From now on a signal waits for the current step to finish and its checkpoint."""
        self.check()
        self.phase = "training"

    def disarm(self) -> None:
        """The last checkpoint is written: a signal stops at once."""
        self.phase = "after"

    def _handle(self, signum, frame) -> None:
        del frame
        name = signal.Signals(signum).name
        if self.phase == "before":
            self.pending = StopNow(name, "before the first step; nothing to save")
        elif self.phase == "after":
            self.pending = StopNow(name, "after the last checkpoint was saved")
        elif self.received is not None:
            self.pending = StopNow(name, "again, before the checkpoint was written; the last complete one is intact")
        if self.pending is not None:
            raise self.pending
        self.received = name
        if self.multi_process and signum == signal.SIGINT:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells the other processes

    def should_stop(self, step: int, reached_preemption) -> bool:
        """Whether the loop stops after ``step``; every process must call this at every step (multi-host it is
        a sync point that all processes pass at the same step)."""
        self.check()
        if self.multi_process:
            return reached_preemption(step)
        return self.received is not None

    def arrived_alone(self) -> bool:
        """Whether a signal arrived in a one-process run (a multi-process run learns of one only at
        ``should_stop``'s sync point, which every process passes at the same step)."""
        return not self.multi_process and self.received is not None

    @property
    def exit_code(self) -> int:
        return 130 if self.received == "SIGINT" else 0

    @property
    def cause(self) -> str:
        return self.received or "a preemption notice (SIGTERM to a process of this run)"
