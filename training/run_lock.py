"""One run at a time per run directory: ``<model_path>/run.lock``.

The lock is an ``fcntl.flock`` on the file, which the kernel releases when its holder dies however it dies
(kill -9 included), and the file names the holder (host, pid, start time) for the error message. A lock file
left by a dead run is taken over with a note. Only process 0 of a multi-host run takes the lock; the others
learn the outcome from it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from config import ConfigError

LOCK_NAME = "run.lock"


class RunLock:
    """Holds ``<model_path>/run.lock`` from ``acquire`` to ``release``."""

    def __init__(self, model_path: str):
        self.path = os.path.join(model_path, LOCK_NAME)
        self.file = None

    def acquire(self) -> str | None:
        """Takes the lock; returns a note when it took over a stale lock file, raises ``ConfigError`` (one line)
        when another live run holds it."""
        directory = os.path.dirname(self.path) or "."
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ConfigError(f"model_path: {directory} is a file, not a run directory")
        os.makedirs(directory, exist_ok=True)
        while True:
            f = open(self.path, "a+", encoding="utf-8")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read(f))
                f.close()
                raise ConfigError(f"{self.path}: another run is using this model_path ({holder}); wait for it to "
                                  "end, or use another --model-path") from None
            if _same_file(f, self.path):
                break
            f.close()  # the holder removed the file as we opened it: lock the new one
        previous = _read(f)
        note = None
        if previous:
            directory = os.path.join(os.path.dirname(self.path), "checkpoints")
            saved = os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))
            note = (f"{self.path}: took over the lock of a run that is gone ({_describe(previous)}); "
                    + ("its last complete checkpoint is used" if saved else "it saved no checkpoint"))
        f.seek(0)
        f.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
                  f)
        f.flush()
        self.file = f
        return note

    def release(self) -> None:
        """Removes the lock file and lets go of the lock (in this order, so no other run locks a removed file)."""
        if self.file is None:
            return
        try:
            os.remove(self.path)
        except OSError:
            pass
        self.file.close()
        self.file = None


def _same_file(f, path: str) -> bool:
    try:
        return os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read(f) -> dict:
    f.seek(0)
    try:
        holder = json.loads(f.read() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"unreadable": True}
    return holder if isinstance(holder, dict) else {"unreadable": True}


def _describe(holder: dict) -> str:
    if not holder or holder.get("unreadable"):
        return "holder unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def lock_run(model_path: str, lead: bool, say=print) -> RunLock:
    """Process 0 takes the run lock (a note if it took over a stale one); every process raises the same one-line
    error if another run holds it."""
    lock = RunLock(model_path)
    error = None
    if lead:
        try:
            note = lock.acquire()
            if note:
                say(f"note: {note}")
        except ConfigError as e:
            error = str(e)
    _agree(error, f"{lock.path}: another run is using this model_path (process 0 could not take the lock)")
    return lock


def move_run_aside(model_path: str, lead: bool) -> str | None:
    """``--new``: moves an existing run directory to ``<model_path>-<time>`` (under its lock, so a live run is
    never moved from under itself); returns where it went, or None if there was none."""
    aside, error = None, None
    if lead and os.path.exists(model_path):
        lock = RunLock(model_path)
        try:
            lock.acquire()
            aside = f"{model_path.rstrip('/')}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(model_path, aside)
            lock.path = os.path.join(aside, LOCK_NAME)
        except ConfigError as e:
            error = str(e)
        except OSError as e:
            error = f"{model_path}: could not move it aside: {e.strerror}"
        finally:
            lock.release()
    _agree(error, f"{model_path}: process 0 could not move the previous run aside")
    return aside


def _agree(error: str | None, elsewhere: str) -> None:
    """Raises ``error`` on process 0 and ``elsewhere`` on the others when process 0 failed (multi-host: all
    processes must leave together, or the others would wait for it forever)."""
    from parallel.distributed import process_zero_value

    if process_zero_value(error is not None) and error is None:
        error = elsewhere
    if error:
        raise ConfigError(error)
