"""Run metrics: one JSON line per step in <model_path>/metrics.jsonl, TensorBoard events, the progress bar.

Only process 0 writes. Rows are strict JSON (NaN and Inf are written as null) and each is flushed whole as it is
written. A resumed run first rewrites the file (atomically) without rows past the step it resumed from, and
without a torn last line that a killed run may have left, so the file always reads as one uninterrupted run
with no step twice.
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


def _summary_writer_class():
    """tensorboardX's SummaryWriter (event files without TensorFlow), imported without torch: tensorboardX imports
    torch whenever it is installed, only to accept torch tensors, which costs every run seconds at start-up."""
    import sys

    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # makes "import torch" raise ImportError, which tensorboardX handles
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


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
        SummaryWriter = _summary_writer_class()

        # A big queue: if its writer thread dies (disk full), adding events must not block the run.
        self.tensorboard = SummaryWriter(os.path.join(model_path, "tensorboard"), purge_step=start_step + 1,
                                         max_queue=100_000)

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
        from neomesh.errors import raise_background_failure

        raise_background_failure()  # e.g. TensorBoard's writer thread hit a full disk
        row = {key: strict(value) for key, value in row.items()}
        try:
            self.file.write(json.dumps(row, allow_nan=False) + "\n")
            self.file.flush()
        except OSError as e:
            raise ConfigError(f"{self.path}: {e.strerror}") from None
        if row["kind"] == "eval":
            self.evals[row["step"]] = row
        for key, value in row.items():
            if key not in ("step", "kind") and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tensorboard.add_scalar(f"{row['kind']}/{key}", value, row["step"])

    def close(self) -> None:
        if not self.enabled or self.file is None:
            return
        try:
            self.file.close()
        except OSError:
            pass  # already reported by write
        try:
            self.tensorboard.close()
        except OSError:
            # tensorboardX retries the failed flush at exit (an atexit hook) unless the writer counts as closed.
            self.tensorboard.file_writer.event_writer._closed = True
        self.file = None
