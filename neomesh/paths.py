"""Where things are, in a checkout and in an installed NeoMesh.

In a checkout (``python train.py`` from the repository, or ``pip install -e .``) the shipped configs are the
repository's ``configs/`` and relative data paths in dataset configs (``data_cache/...``) are relative to the
repository root, as they always were. In an installed copy (``pip install .``) the configs are package data of
``neomesh`` and relative data paths are relative to the current directory, like ``runs/`` is: the installed
tree is no place to write data.
"""

from __future__ import annotations

import os

PACKAGE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PACKAGE)  # the repository root in a checkout; site-packages when installed


def in_checkout() -> bool:
    """True when running from the repository (its configs/ and pyproject.toml beside the packages)."""
    return os.path.isdir(os.path.join(ROOT, "configs", "dataset_configs")) and \
        os.path.isfile(os.path.join(ROOT, "pyproject.toml"))


def configs_dir() -> str:
    """The shipped ``configs/`` directory (with ``dataset_configs/`` inside)."""
    return os.path.join(ROOT if in_checkout() else PACKAGE, "configs")


def work_root() -> str:
    """What relative data paths in the shipped dataset configs are relative to."""
    return ROOT if in_checkout() else os.getcwd()


def cache_home(environ=os.environ) -> str:
    """The user's cache directory: ``$XDG_CACHE_HOME``, else ``~/.cache`` (NeoMesh's caches live in its
    ``neomesh/``, Hugging Face's in its ``huggingface/``)."""
    return environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def left_by_the_dead(target: str, kind: str) -> list[str]:
    """The ``<target>.<kind>-PID`` paths whose process is gone from this host, newest first (a live process's, or
    another user's, are not listed)."""
    import glob

    found = []
    for path in glob.glob(glob.escape(target) + f".{kind}-*"):
        pid = path.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            found.append(path)
        except OSError:  # alive, another user's
            pass
    return sorted(found, key=_modified, reverse=True)


def _modified(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def remove_stale_staging(target: str) -> None:
    """Removes ``<target>.tmp-PID`` directories whose process is gone from this host: what a build or an export
    killed before publishing its staging directory left beside ``target`` (a live one's is left alone)."""
    import shutil

    for path in left_by_the_dead(target, "tmp"):
        shutil.rmtree(path, ignore_errors=True)


def run_tokenizer_dir(model_path: str) -> str:
    """``MODEL_PATH/tokenizer``, the folder where a run keeps its tokenizer (train.py and the imports write it,
    predict.py, eval.py and export read it). A file of that name is a one-line error saying what to do: making
    the folder failed with a bare "File exists", and reading fell back to the config's tokenizer without a word."""
    from config import ConfigError

    path = os.path.join(model_path, "tokenizer")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{path}: a file, not a folder: a run keeps its tokenizer in a folder of that name "
                          f"({path}/tokenizer.json); move the file away (a tokenizer.json goes inside that folder)")
    return path
