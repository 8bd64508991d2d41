"""The input pipeline's position as the ``data`` item of an orbax checkpoint, committed with the step it belongs to.

The item directory holds ``meta.json`` (written by process 0: step, batch size, shard count, a fingerprint of the
stream) and ``shard_NNNNN.state`` for each shard of the stream (``data/shards.py``), written by every process
that reads that shard. Where several processes read one shard their states are equivalent; each writes under its
own temporary name and renames, so the file left is always one whole state. Orbax writes the item inside the
step's temporary directory and renames the step when every item of every process is written, so a step either
has its input position or does not exist. The states are opaque bytes here (tf.data iterator checkpoints made by
``data/tf_source.py``): this module does not import TensorFlow.

Each state file starts with a line holding the SHA-256 of the state, checked when it is read: a damaged file is
reported as such (and its shard replayed) before TensorFlow parses it, which would fail with an empty "Graph
execution error:" and C++ log lines. ``meta.json`` says the files carry the line; earlier files have none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json

import jax
import orbax.checkpoint as ocp
from etils import epath

ITEM = "data"
_HEADER = b"neomesh-input-state sha256="
_CHECKSUMMED = "state_checksum"  # the meta.json key saying that every state file starts with the header


@dataclasses.dataclass
class SavedInput:
    """A checkpoint's input position: ``meta`` and the state of any shard on demand (None if it was not saved)."""

    meta: dict
    directory: epath.Path
    checksummed: bool = False

    def read(self, shard: int) -> bytes | None:
        """The shard's state; ``ValueError`` (one line, naming the file) when it is damaged."""
        path = self.directory / _shard_file(shard)
        if not path.exists():
            return None
        data = path.read_bytes()
        return _checked(data, path.name) if self.checksummed else data


def _with_checksum(state: bytes) -> bytes:
    return _HEADER + hashlib.sha256(state).hexdigest().encode() + b"\n" + state


def _checked(data: bytes, name: str) -> bytes:
    """The state in ``data`` (header line, state), verified against the header's checksum."""
    header, newline, state = data.partition(b"\n")
    if not header.startswith(_HEADER) or not newline:
        raise ValueError(f"{name} is damaged (its checksum line is missing)")
    if hashlib.sha256(state).hexdigest().encode() != header[len(_HEADER):]:
        raise ValueError(f"{name} is damaged (its checksum does not match its {len(state):,} bytes)")
    return state


def _shard_file(shard: int) -> str:
    return f"shard_{shard:05d}.state"


class InputStateHandler(ocp.AsyncCheckpointHandler):
    """Writes and reads the ``data`` item (see the module docstring)."""

    async def _write(self, directory: epath.Path, meta: dict, shards: dict[int, bytes]) -> None:
        process = jax.process_index()
        for shard, state in shards.items():
            tmp = directory / f"{_shard_file(shard)}.tmp-{process}"
            tmp.write_bytes(_with_checksum(state))
            tmp.replace(directory / _shard_file(shard))  # equivalent states: whichever lands last is whole
        if process == 0:
            (directory / "meta.json").write_text(json.dumps({**meta, _CHECKSUMMED: "sha256"}))

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
        meta = json.loads((directory / "meta.json").read_text())
        return SavedInput(meta, directory, checksummed=meta.pop(_CHECKSUMMED, None) == "sha256")


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
