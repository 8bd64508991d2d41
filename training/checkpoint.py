"""Sharded, asynchronous, atomic checkpoints with orbax; restore reshards onto whatever mesh is current.

Orbax writes each step into a temporary directory and renames it when complete, so a crash mid-save leaves the
previous checkpoint intact. All processes call ``save``/``restore`` together (multi-host).
"""

from __future__ import annotations

import contextlib
import os

import jax
import orbax.checkpoint as ocp

from config import ConfigError
from training.input_checkpoint import ITEM as INPUT_ITEM
from training.input_checkpoint import InputStateHandler, InputStateRestore, InputStateSave


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
    from absl import logging

    level = logging.get_verbosity()
    if quiet:
        logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(level)


class Checkpoints:
    def __init__(self, model_path: str, keep: int, read_only: bool = False):
        self.directory = os.path.abspath(os.path.join(model_path, "checkpoints"))
        if read_only and not os.path.isdir(self.directory):
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        if read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0,
                                                   enable_async_checkpointing=False)
        else:
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
        with _quiet_absl(read_only):  # orbax warns that a read-only manager is read-only
            self.manager = ocp.CheckpointManager(self.directory, options=options,
                                                 item_names=("state", "config", INPUT_ITEM),
                                                 item_handlers={INPUT_ITEM: InputStateHandler()})

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, config: dict, data: dict | None = None) -> None:
        """Starts an async save; returns once device arrays are copied off the devices. ``data`` is the input
        position (a source's ``state()``), saved as its own item of the same step."""
        items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config))
        items.update(input_position_item(data))
        self.manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore_input(self, step: int):
        """The input position saved with ``step`` (``training.input_checkpoint.SavedInput``), or None where the
        checkpoint has none (written by a source that needs none, or before positions were saved) or it is
        unreadable."""
        if not os.path.isdir(os.path.join(self.directory, str(step), INPUT_ITEM)):
            return None
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**{INPUT_ITEM: InputStateRestore()}))[INPUT_ITEM]
        except (OSError, ValueError):  # an unreadable position costs a replay, never the run
            return None

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

    def restore_params(self, abstract_params, step: int | None = None):
        """Only the parameters (no optimizer state), placed with the shardings in ``abstract_params``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        target = {"params": abstract_params}
        restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), target)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True)))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model_path: checkpoint {self.directory}/{step} does not fit this config's "
                              f"model ({str(e).splitlines()[0][:200]})") from None
        return restored.state["params"]

    def config(self, step: int | None = None) -> dict:
        """The config the checkpoint was written with."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        return dict(self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config)

    def close(self) -> None:
        """Waits for pending saves to finish."""
        self.manager.wait_until_finished()
        self.manager.close()


def input_position_item(data: dict | None) -> dict:
    """The checkpoint item for a source's ``state()`` (none when the source has no position to save)."""
    if data is None:
        return {}
    return {INPUT_ITEM: InputStateSave(meta=data["meta"], shards=data["shards"])}

