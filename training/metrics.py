"""Run metrics: one JSON line per step in <model_path>/metrics.jsonl, TensorBoard events, the progress bar.

Only process 0 writes. Rows are strict JSON (NaN and Inf are written as null) and each is flushed whole as it is
written. A resumed run first rewrites the file (atomically) without rows past the step it resumed from, and
without a torn last line that a killed run may have left, so the file always reads as one uninterrupted run
with no step twice. TensorBoard's event file is written in step with it: each row's event is on disk before the
row is, and a resumed run's event file starts by hiding (TensorBoard's purge) every event from the step it resumed
from on, then logs that step's rows again, so TensorBoard shows the same rows, none twice, whenever a run died.
"""

from __future__ import annotations

import json
import math
import os

import jax

from config import ConfigError


def strict(value):
    """``value`` with NaN and Inf floats replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_rows(path: str) -> tuple[list[dict], list[int]]:
    """(the rows of a metrics.jsonl, 1-based numbers of the lines that are not whole JSON rows)."""
    rows, bad = [], []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    bad.append(number)
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    rows.append(row)
                else:
                    bad.append(number)
    except FileNotFoundError:
        pass
    return rows, bad


def _tensorboard_classes():
    """tensorboardX's event protos and record checksum (event files without TensorFlow), imported without torch:
    tensorboardX imports torch whenever it is installed, only to accept torch tensors, which costs every run seconds
    at start-up."""
    import sys

    if "torch" not in sys.modules and "tensorboardX" not in sys.modules:
        sys.modules["torch"] = None  # makes "import torch" raise ImportError, which tensorboardX handles
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.record_writer import masked_crc32c

    return Event, SessionLog, Summary, masked_crc32c


class EventFile:
    """A TensorBoard event file under ``directory``, written synchronously: tensorboardX's SummaryWriter queues
    events for a thread that writes them every two minutes, so a run killed with -9 lost rows that metrics.jsonl
    (flushed row by row) kept, and a resume never wrote them again. ``purge_step``: TensorBoard hides the events of
    earlier files from that step on."""

    def __init__(self, directory: str, purge_step: int):
        import socket
        import time

        self.Event, SessionLog, self.Summary, self.crc = _tensorboard_classes()
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}")
        self.file = open(self.path, "ab")  # a second file in the same second adds to the first: still in order
        self.add(self.Event(wall_time=time.time(), step=purge_step, file_version="brain.Event:2"))
        self.add(self.Event(wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def add(self, event) -> None:
        """Writes ``event`` through to the operating system (no fsync: a killed process loses nothing)."""
        import struct

        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self.file.write(header + struct.pack("<I", self.crc(header)) + data + struct.pack("<I", self.crc(data)))
        self.file.flush()

    def scalars(self, step: int, values: dict) -> None:
        import time

        summary = self.Summary(value=[self.Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        self.add(self.Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        self.file.close()


def _ends_with_newline(path: str) -> bool:
    """False for a missing file, or one whose last row lost its newline (appending would glue rows together)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return True
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except FileNotFoundError:
        return False


class MetricsWriter:
    def __init__(self, model_path: str, start_step: int, say=print):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(model_path, "metrics.jsonl")
        self.file = None
        if not self.enabled:
            return
        os.makedirs(model_path, exist_ok=True)
        rows, bad = read_rows(self.path)
        if bad == [len(rows) + len(bad)]:
            say(f"note: {self.path}: dropped its torn last line (not a whole JSON row; a run was stopped mid-write)")
        elif bad:  # inside the file: no stopped run leaves those (a resumed run drops a torn line first)
            say(f"note: {self.path}: dropped damaged line(s) {bad[:5]}{' ...' if len(bad) > 5 else ''} (not "
                "whole JSON rows)")
        kept = [row for row in rows if row["step"] <= start_step]
        self.evals = {row["step"]: row for row in kept if row.get("kind") == "eval"}  # the last row of each step
        if bad or len(kept) < len(rows) or not _ends_with_newline(self.path):
            self._rewrite(kept)
        self.file = self._open("a")
        self.tensorboard = None
        try:
            self.tensorboard = EventFile(os.path.join(model_path, "tensorboard"), purge_step=start_step)
            for row in kept:  # the purge hid the resumed step's rows (of a previous run, or not all written)
                if row["step"] == start_step:
                    self._log(row)
        except OSError as e:
            raise ConfigError(f"{os.path.join(model_path, 'tensorboard')}: {e.strerror}") from None

    def _open(self, mode: str):
        try:
            return open(self.path, mode, encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{self.path}: {e.strerror}") from None

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row, allow_nan=False) + "\n" for row in rows)
            os.replace(tmp, self.path)
        except OSError as e:
            raise ConfigError(f"{self.path}: {e.strerror}") from None

    def stored_eval(self, step: int) -> dict | None:
        """The eval row the file holds for ``step`` (None if none, or on a process that does not write)."""
        return self.evals.get(step) if self.enabled else None

    def write(self, row: dict) -> None:
        """``row`` has ``step`` and ``kind`` ("train" or "eval") and numbers (None where unknown)."""
        if not self.enabled:
            return
        row = {key: strict(value) for key, value in row.items()}
        try:
            self._log(row)  # first: a row in metrics.jsonl is in TensorBoard too, however the run dies
        except OSError as e:
            raise ConfigError(f"{self.tensorboard.path}: {e.strerror}") from None
        try:
            self.file.write(json.dumps(row, allow_nan=False) + "\n")
            self.file.flush()
        except OSError as e:
            raise ConfigError(f"{self.path}: {e.strerror}") from None
        if row["kind"] == "eval":
            self.evals[row["step"]] = row

    def _log(self, row: dict) -> None:
        """The row's numbers as TensorBoard scalars ``kind/key`` (None, a non-finite number, is left out)."""
        self.tensorboard.scalars(row["step"], {
            f"{row['kind']}/{key}": value for key, value in row.items()
            if key not in ("step", "kind") and isinstance(value, (int, float)) and not isinstance(value, bool)})

    def close(self) -> None:
        if not self.enabled or self.file is None:
            return
        for file in (self.file, self.tensorboard):
            try:
                if file is not None:
                    file.close()
            except OSError:
                pass  # already reported by write
        self.file = self.tensorboard = None
