"""Run metrics: one JSON line per step in <model_path>/metrics.jsonl, TensorBoard events, the progress bar.

Only process 0 writes. A resumed run first drops rows past the step it resumed from, so the file always reads
as one uninterrupted run.
"""

from __future__ import annotations

import json
import os

import jax


class MetricsWriter:
    def __init__(self, model_path: str, start_step: int):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(model_path, "metrics.jsonl")
        if not self.enabled:
            return
        os.makedirs(model_path, exist_ok=True)
        kept = []
        if os.path.exists(self.path):
            with open(self.path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= start_step]
        with open(self.path, "w") as f:
            f.writelines(kept)
        from tensorboardX import SummaryWriter  # writes event files without TensorFlow

        self.tensorboard = SummaryWriter(os.path.join(model_path, "tensorboard"), purge_step=start_step + 1)

    def write(self, row: dict) -> None:
        """``row`` has ``step`` and ``kind`` ("train" or "eval") and numbers (None where unknown)."""
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for key, value in row.items():
            if key not in ("step", "kind") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{row['kind']}/{key}", value, row["step"])

    def close(self) -> None:
        if self.enabled:
            self.tensorboard.close()
