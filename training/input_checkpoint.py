"""The input pipeline's position as the ``data`` item of an orbax checkpoint, committed with the step it belongs to.

The item directory holds ``meta.json`` (written by process 0: step, batch size, shard count, a fingerprint of the
stream) and ``shard_NNNNN.state`` for each shard of the stream (``data/shards.py``), written by every process
that reads that shard. Where several processes read one shard their states are equivalent; each writes under its
own temporary name and renames, so the file left is always one whole state. Orbax writes the item inside the
step's temporary directory and renames the step when every item of every process is written, so a step either
has its input position or does not exist. The states are opaque bytes here (tf.data iterator checkpoints made by
``data/tf_source.py``): this module does not import TensorFlow.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jax
import orbax.checkpoint as ocp
from etils import epath

ITEM = "data"


@dataclasses.dataclass
class SavedInput:
    """A checkpoint's input position: ``meta`` and the state of any shard on demand (None if it was not saved)."""

    meta: dict
    directory: epath.Path

    def read(self, shard: int) -> bytes | None:
        path = self.directory / _shard_file(shard)
        return path.read_bytes() if path.exists() else None


def _shard_file(shard: int) -> str:
    return f"shard_{shard:05d}.state"


class InputStateHandler(ocp.AsyncCheckpointHandler):
    """Writes and reads the ``data`` item (see the module docstring)."""

    async def _write(self, directory: epath.Path, meta: dict, shards: dict[int, bytes]) -> None:
        process = jax.process_index()
        for shard, state in shards.items():
            tmp = directory / f"{_shard_file(shard)}.tmp-{process}"
            tmp.write_bytes(state)
            tmp.replace(directory / _shard_file(shard))  # equivalent states: whichever lands last is whole
        if process == 0:
            (directory / "meta.json").write_text(json.dumps(meta))

    async def async_save(self, directory: epath.Path, args: "InputStateSave"):
        # The bytes were taken when the step was saved; only the writing happens in the background.
        return [ocp.future.CommitFutureAwaitingContractedSignals(
            self._write(directory, dict(args.meta), dict(args.shards)), name="input_state_save")]

    def save(self, directory: epath.Path, args: "InputStateSave") -> None:
        async def run():
            for f in await self.async_save(directory, args):
                f.result()
        asyncio.run(run())

    def restore(self, directory: epath.Path, args: "InputStateRestore | None" = None) -> SavedInput:
        return SavedInput(json.loads((directory / "meta.json").read_text()), directory)


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
    """The ``state()`` of a source: ``meta`` (a JSON dict) and ``shards`` ({shard: bytes}) of this process."""

    meta: dict
    shards: dict


@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
    pass
