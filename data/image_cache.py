"""Image folders decoded once, not at every start: a run (and its resume, and the next run on the same folder)
finds the pixels the first one decoded.

Decoding is most of an image folder's start (400 500x375 JPEGs in 1.6 s on 2 cores: 10,000 images take 40 s, at
every start and resume). ``read_images`` keeps what it decoded, the pixels and which files could not be read, in
``$XDG_CACHE_HOME/neomesh/images`` (``~/.cache/neomesh/images``), one ``.npz`` per list of files and image shape,
named by a hash of that shape and each file's path, size and modification time: an image changed, added or
removed is a new list, decoded anew. A file is written whole and then renamed into place (what a run killed
while writing leaves is removed at the next write); the directory is held to ``MAX_BYTES``, least recently used
out first. ``NEOMESH_IMAGE_CACHE=0`` turns it off; a cache home that cannot be written is no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

import numpy as np

from neomesh.paths import cache_home, left_by_the_dead

FORMAT = 1  # part of every name: a change of what a file holds starts anew
MAX_BYTES = 32 * 2**30


def cache_dir(environ=os.environ) -> str | None:
    """Where decoded folders are kept, or None with ``NEOMESH_IMAGE_CACHE=0``."""
    if environ.get("NEOMESH_IMAGE_CACHE", "1") == "0":
        return None
    return os.path.join(cache_home(environ), "neomesh", "images")


def entry_for(files: list[str], size: int, channels: int, environ=os.environ) -> str | None:
    """The file that holds ``files`` decoded at ``size`` x ``size`` x ``channels`` (None with the cache off)."""
    directory = cache_dir(environ)
    if directory is None:
        return None
    try:
        stamps = [stamp(path) for path in files]
    except OSError:  # a file gone since the folder was listed: no cache; decoding it names the file
        return None
    key = json.dumps([FORMAT, size, channels, stamps]).encode()
    return os.path.join(directory, f"{hashlib.sha256(key).hexdigest()[:32]}.npz")


def stamp(path: str) -> list:
    """What identifies a file's content here: its absolute path, size and modification time."""
    status = os.stat(path)
    return [os.path.abspath(path), status.st_size, status.st_mtime_ns]


def load(path: str | None, shape: tuple[int, ...]) -> tuple[np.ndarray, list[str | None]] | None:
    """(images of ``shape``, a problem or None per image) as ``save`` kept them, or None where ``path`` holds
    nothing usable."""
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            images, problems = saved["images"], saved["problems"]
        os.utime(path)  # recently used: the last to go
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent or damaged: decoded again
        return None
    if images.shape != shape or images.dtype != np.uint8 or problems.shape != shape[:1]:
        return None
    return images, [str(p) or None for p in problems]


def save(path: str | None, images: np.ndarray, problems: list[str | None]) -> None:
    """Keeps ``images`` and ``problems`` in ``path``; quietly nothing where its directory cannot be written."""
    if path is None:
        return
    temporary = f"{path}.tmp-{os.getpid()}"  # the staging name left_by_the_dead finds if this process dies
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as f:
            np.savez(f, images=images, problems=np.array([p or "" for p in problems], dtype=str))
        os.replace(temporary, path)
    except OSError:  # unwritable, or a full disk: the run goes on, it decodes again next time
        try:
            os.remove(temporary)
        except OSError:
            pass
        return
    evict(os.path.dirname(path), keep=path)


def evict(directory: str, keep: str, max_bytes: int = MAX_BYTES) -> None:
    """Removes what processes that died while writing left, then the least recently used entries of
    ``directory`` until it holds at most ``max_bytes`` (``keep``, just written, stays whatever its size)."""
    entries, staged = [], set()
    for entry in os.scandir(directory):
        try:
            if entry.name.endswith(".npz"):
                status = entry.stat()
                entries.append((status.st_mtime, status.st_size, entry.path))
            elif ".npz.tmp-" in entry.name:
                staged.add(entry.path.rsplit(".tmp-", 1)[0])
        except OSError:  # removed by another process meanwhile
            pass
    for stale in (path for target in staged for path in left_by_the_dead(target, "tmp")):
        try:
            os.remove(stale)
        except OSError:
            pass
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        if path != keep:
            try:
                os.remove(path)
            except OSError:
                pass
            total -= size
