"""Hugging Face models by name from the local cache: ``--hf-model EleutherAI/gpt-neo-125M`` finds the snapshot
that ``huggingface-cli download`` (or ``transformers``) left in ``~/.cache/huggingface/hub``. Nothing is
downloaded; a model that is not there is a one-line error saying how to get it.

The cache layout (huggingface_hub's): ``HUB/models--ORG--NAME/refs/main`` holds a commit hash and
``HUB/models--ORG--NAME/snapshots/<hash>/`` the files (links into ``blobs/``). ``HUB`` is ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
import re

from neomesh.paths import cache_home

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def hub_cache_dir() -> str:
    """The directory huggingface_hub caches repositories in, by its own environment variables."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return os.path.expanduser(os.environ[variable])
    home = os.environ.get("HF_HOME") or os.path.join(cache_home(), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def download_hint(repo: str) -> str:
    return (f"download it with `huggingface-cli download {repo}` (or `hf download {repo}`, or "
            f"`git clone https://huggingface.co/{repo}`) and pass the name or the directory")


def cached_snapshot(repo: str, revision: str = "main") -> str | None:
    """The cached snapshot directory of model ``repo`` at ``revision`` (a branch, tag or commit), or None."""
    folder = os.path.join(hub_cache_dir(), "models--" + repo.replace("/", "--"))
    snapshots = os.path.join(folder, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    ref = os.path.join(folder, "refs", revision)
    if os.path.isfile(ref):
        with open(ref) as f:
            commit = f.read().strip()
        path = os.path.join(snapshots, commit)
        return path if os.path.isdir(path) else None
    if os.path.isdir(os.path.join(snapshots, revision)):  # a commit hash
        return os.path.join(snapshots, revision)
    if revision != "main":
        return None
    # No refs/main (a copied cache, or one filled by hand): the most recently written snapshot.
    found = [os.path.join(snapshots, name) for name in os.listdir(snapshots)]
    found = [path for path in found if os.path.isdir(path)]
    return max(found, key=os.path.getmtime) if found else None


def left_behind_export(path: str) -> str | None:
    """The previous export that an export killed between its two renames left beside ``path`` (``path.old-PID``,
    see convert.hf_dir.write_hf_dir), when ``path`` is gone."""
    from neomesh.paths import left_by_the_dead

    if not path or (os.path.lexists(path) and not os.path.islink(path)):
        return None
    found = left_by_the_dead(os.path.realpath(path) if os.path.islink(path) else os.path.normpath(path), "old")
    return found[0] if found else None


def resolve_model(name: str, option: str = "--hf-model") -> str:
    """A local directory for ``name``: ``name`` itself when it is a directory, else the cached snapshot of the
    Hugging Face model ``ORG/NAME[@REVISION]``. Raises ``ConfigError`` (one line, with how to download) when
    neither is there; without the download hint when ``name`` is a local path (its first part is a directory
    here, as ``runs/`` is)."""
    from config import ConfigError

    if os.path.isdir(name):
        return name
    replaced = left_behind_export(name)
    if replaced:
        raise ConfigError(f"{option} {name}: no such directory; {replaced} holds the export that was there (an "
                          f"export killed while replacing it left it): rename it to {name}, or export again")
    if os.path.isfile(name):  # config.json or model.safetensors itself
        raise ConfigError(f"{option} {name}: a file; give the model's directory ({os.path.dirname(name) or '.'})")
    repo, _, revision = name.partition("@")
    if not _REPO_ID.match(repo) or repo.startswith((".", "/")):
        raise ConfigError(f"{option} {name}: no such directory")
    snapshot = cached_snapshot(repo, revision or "main")
    if snapshot is None and os.path.isdir(repo.split("/")[0]):  # runs/missing: a local path, not ORG/NAME
        raise ConfigError(f"{option} {name}: no such directory")
    if snapshot is None:
        raise ConfigError(f"{option} {name}: no such directory, and not in the Hugging Face cache "
                          f"{hub_cache_dir()} (nothing is downloaded); {download_hint(repo)}")
    if not os.path.isfile(os.path.join(snapshot, "config.json")) or \
            not any(os.path.isfile(os.path.join(snapshot, w)) for w in WEIGHTS):
        raise ConfigError(f"{option} {name}: the cached snapshot {snapshot} lacks config.json or the weights "
                          f"({' / '.join(WEIGHTS)}); {download_hint(repo)}")
    return snapshot
