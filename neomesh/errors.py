"""One line for an expected failure, a traceback for a bug.

Every command-line entry point runs through ``run_main`` (and its ``__main__`` ends with ``exit_process``). Bad
input and failures of the world outside (a missing or unreadable file, a full disk, a damaged checkpoint) print
``error: ...`` naming the file and exit 2; anything else is a bug and keeps its traceback. While a command runs,
failures in background threads (orbax's async checkpoint writer, TensorBoard's event writer) are collected instead
of printed as tracebacks, and ``raise_background_failure`` turns the first into the same one line in the main
thread.
"""

from __future__ import annotations

import _thread
import errno
import json
import logging
import os
import re
import sys
import threading
from typing import Callable

from config import ConfigError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # a shell's code for SIGINT (128 + 2)
_DISK_FULL = re.compile(r"No space left on device|os_error_code='28'|RESOURCE_EXHAUSTED")
# XLA's RESOURCE_EXHAUSTED for device memory (an allocation at run time, a TPU program's plan at compile time),
# which is not a full disk.
_DEVICE_MEMORY = re.compile(r"RESOURCE_EXHAUSTED: ([^\n]*(?:[Oo]ut of memory|memory required|allocat)[^\n]*)")
_FAILED_PATH = re.compile(r'(?:Failed writing:|local file) "([^"]+)"')  # TensorStore names the file so
# How a collective or the coordination service reports a process of the run that died (kill -9, a lost host):
# gloo's socket to it closes; jax's coordination service stops hearing its heartbeats.
_PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|heartbeat timeout|stopped sending "
                        r"heartbeats|[Ss]ocket closed")


def one_line(e: BaseException) -> str | None:
    """The one-line message of an expected failure; None for anything else (a bug, which keeps its traceback)."""
    if isinstance(e, ConfigError):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text: byte {e.start} ({e.object[e.start:e.start + 1]!r}) {e.reason}"
    if isinstance(e, json.JSONDecodeError):
        return f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
    if isinstance(e, OSError):
        where = e.filename if e.filename is not None else None
        what = e.strerror or str(e).splitlines()[0]
        if getattr(e, "filename2", None) is not None:
            where = f"{where} -> {e.filename2}"
        return f"{where}: {what}" if where is not None else what
    if type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and _PEER_LOST.search(str(e)):
        return peer_stopped(str(e).strip().splitlines()[0].removeprefix("UNKNOWN: ").removeprefix("INTERNAL: "))
    memory = _DEVICE_MEMORY.search(str(e)) if not isinstance(e, ConfigError) else None
    if memory:
        return (f"out of device memory: {memory.group(1).strip()[:300].rstrip('.')}; a smaller batch, "
                "recompute_grad, scan_layers or more devices need less")
    if disk_full(e):
        path = _FAILED_PATH.search(str(e))
        return f"{path.group(1)}: No space left on device" if path else "No space left on device"
    return None


def peer_stopped(why: str) -> str:
    """The one line of a process whose run lost another process (``why``: how this one found out)."""
    return (f"another process of this run stopped ({why[:200]}); this process stops too: start every process again "
            "to resume from the last checkpoint")


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps) is ENOSPC, including TensorStore's RESOURCE_EXHAUSTED write errors."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if not isinstance(e, ConfigError) and _DISK_FULL.search(str(e)) and not _DEVICE_MEMORY.search(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def innermost_line(e: BaseException, limit: int = 240) -> str:
    """The first line of the innermost explicit cause (``raise ... from``) of ``e``: orbax wraps TensorStore's
    precise message in a generic one ("Encountered error while reading array index ...")."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Background:
    """While installed: expected failures raised in background threads are collected (``threading.excepthook``)
    instead of printed; ERROR records orbax logs from its threads (it re-raises the failure in the main thread)
    are held back; TensorStore's reports of results it could not deliver to a closed event loop are dropped."""

    def __init__(self):
        self.failures: list[BaseException] = []
        self.held_logs: list[str] = []
        self.previous = None
        self.loggers = [logging.getLogger("absl"), logging.getLogger("asyncio")]

    def install(self) -> None:
        self.previous = (threading.excepthook, sys.excepthook, sys.unraisablehook)
        threading.excepthook, sys.excepthook, sys.unraisablehook = self.excepthook, self.sys_excepthook, \
            self.unraisablehook
        for logger in self.loggers:
            logger.addFilter(self.filter)

    def uninstall(self) -> None:
        threading.excepthook, sys.excepthook, sys.unraisablehook = self.previous
        for logger in self.loggers:
            logger.removeFilter(self.filter)

    def excepthook(self, args) -> None:
        if args.exc_value is not None and one_line(args.exc_value) is not None:
            self.failures.append(args.exc_value)
        else:
            self.previous[0](args)

    @staticmethod
    def _undeliverable(value) -> bool:
        # TensorStore's I/O threads deliver results to the event loops of orbax's save threads; once a failed
        # save has closed its loop, each later delivery raises this, which Python prints from C.
        return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"

    def sys_excepthook(self, kind, value, tb) -> None:
        if not self._undeliverable(value):
            self.previous[1](kind, value, tb)

    def unraisablehook(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # Ctrl-C whose handler ran inside a finalizer (jax's gc callback): Python dropped it with "Exception
            # ignored" and the command went on. Delivered to the main thread again, from another thread once this
            # hook has returned (in here it would be raised and dropped again), it stops the command.
            again = threading.Timer(0.05, _thread.interrupt_main)
            again.daemon = True
            again.start()
        elif not self._undeliverable(unraisable.exc_value):
            self.previous[2](unraisable)

    def filter(self, record: logging.LogRecord) -> bool:
        """Holds back orbax's ERROR records and asyncio's reports of tasks that failed on an expected cause."""
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        expected = record.exc_info is not None and one_line(record.exc_info[1]) is not None
        if message.startswith("[process=") or (record.name == "asyncio" and expected):  # "[process=": orbax
            self.held_logs.append(message.splitlines()[0])
            return False
        return True


_background: _Background | None = None  # the hooks of the command running in this process
_lingering: _Background | None = None  # the hooks left in place after a command's expected failure


def raise_background_failure() -> None:
    """Raises the first expected failure of a background thread as a ``ConfigError`` (one line)."""
    if _background is not None and _background.failures:
        raise ConfigError(one_line(_background.failures[0]))


def run_main(body: Callable[[], int | None], interrupted: str = "interrupted") -> int:
    """Runs a command's body: 0 (or its own code) on success; ``error: ...`` on stderr and 2 for an expected
    failure; ``interrupted`` on stderr and 130 for Ctrl-C; a traceback for anything else.

    After an expected failure the hooks stay in place until the process ends (``exit_process``) or the next
    command starts: background threads failing on the same cause (orbax's writers on a full disk) may still be
    winding down, and they have nothing to add to the one line."""
    global _background, _lingering
    if _lingering is not None:
        _lingering.uninstall()
        _lingering = None
    background = _Background()
    background.install()
    _background = background
    failed = False
    try:
        code = body()
    except KeyboardInterrupt:  # Ctrl-C: one line, as every command says it
        print(interrupted, file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - only expected failures are caught; the rest re-raise
        message = one_line(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        failed = True
        return EXIT_ERROR
    finally:
        _background = None
        if failed or background.failures:
            _lingering = background
        else:
            background.uninstall()
    if background.failures:
        print(f"error: {one_line(background.failures[0])}", file=sys.stderr)
        return EXIT_ERROR
    for line in background.held_logs:  # a background failure that never reached the main thread
        print(f"warning: orbax: {line}", file=sys.stderr)
    return 0 if code is None else code


def exit_process(code: int) -> None:
    """The end of a command's ``__main__``. After an expected failure it exits at once: background threads
    still failing on the same cause (orbax's writers on a full disk) would only print more tracebacks, and
    Python would wait for them."""
    if code == EXIT_ERROR:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
