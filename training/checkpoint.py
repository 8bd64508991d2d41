"""Sharded, asynchronous, atomic checkpoints with orbax; restore reshards onto whatever mesh is current.

Orbax writes each step into a temporary directory and renames it when complete, so a crash mid-save leaves the
previous checkpoint intact. All processes call ``save``/``restore`` together (multi-host).
"""

from __future__ import annotations

import os

import orbax.checkpoint as ocp

from config import ConfigError


class Checkpoints:
    def __init__(self, model_path: str, keep: int):
        self.directory = os.path.abspath(os.path.join(model_path, "checkpoints"))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "config"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, config: dict) -> None:
        """Starts an async save; returns once device arrays are copied off the devices."""
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        config=ocp.args.JsonSave(config)), force=True)

    def restore(self, abstract_state, step: int | None = None):
        """The state at ``step`` (default: latest), placed with the shardings in ``abstract_state``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state)))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model_path: checkpoint {self.directory}/{step} does not fit this config's "
                              f"model ({str(e).splitlines()[0][:200]})") from None
        return restored.state

    def close(self) -> None:
        """Waits for pending saves to finish."""
        self.manager.wait_until_finished()
        self.manager.close()
