"""Which model a run started from (``init_from``), recorded beside its checkpoints in ``init_from.json``.

A run that checkpoints only its trained parameters (peft checkpoint 'trainable') reads the rest from init_from
again: on resume, in predict.py, ``Pretrained`` and export. Another model of the same shape put at that path would
fit and be used without a word. A fingerprint taken when the run starts tells it apart, cheaply (at most 1 MiB read
per file): for a Hugging Face directory each weight file's and config.json's size and a hash of 16 evenly spaced
64 KiB pieces, and a Hub snapshot's revision; for a NeoMesh run used as base, its newest checkpoint step and the
same of that checkpoint's files; for a peft adapter directory, its adapter files and its base model's. Runs from
before the record was kept have none: their base is read unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os

from config import ConfigError

FILE = "init_from.json"
PIECES, PIECE = 16, 64 * 1024
WEIGHTS = (".safetensors", ".bin", ".h5", ".msgpack")  # what a Hugging Face directory keeps its weights in


def sampled_hash(path: str) -> str:
    """sha256 of the file's size and ``PIECES`` evenly spaced pieces of ``PIECE`` bytes (the whole of a small one)."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= PIECES * PIECE:
            digest.update(f.read())
        else:
            for i in range(PIECES):
                f.seek(i * (size - PIECE) // (PIECES - 1))
                digest.update(f.read(PIECE))
    return digest.hexdigest()[:32]


def fingerprint(path: str) -> dict:
    """What identifies the model in ``path`` (see the module docstring), without reading its weights whole."""
    from convert.peft_adapter import CONFIG_FILE as ADAPTER_CONFIG
    from training.init_from import adapter_base, is_run
    from training.run_dir import saved_steps

    if is_run(path):
        step = max(saved_steps(path), default=None)
        root = os.path.join(path, "checkpoints", str(step))
        names = sorted(os.path.relpath(os.path.join(folder, name), root)
                       for folder, _, files in os.walk(root) for name in files) if step is not None else []
        found = {"step": step}
    else:
        root = path
        names = sorted(n for n in os.listdir(path) if n in ("config.json", ADAPTER_CONFIG) or n.endswith(WEIGHTS))
        snapshots, revision = os.path.split(os.path.normpath(os.path.realpath(path)))
        found = {"revision": revision} if os.path.basename(snapshots) == "snapshots" else {}
    files = {name: {"bytes": os.path.getsize(os.path.join(root, name)),
                    "sampled_sha256": sampled_hash(os.path.join(root, name))} for name in names}
    base = None if is_run(path) else adapter_base(path)
    if base is not None:  # a peft adapter directory: its files and its base model's
        files.update({f"base_model/{name}": value for name, value in fingerprint(base)["files"].items()})
    return {**found, "files": files}


def record(model_path: str, init_from: str, found: dict) -> None:
    """Writes the fingerprint ``found`` of ``init_from`` into the run, whole or not at all."""
    path = os.path.join(model_path, FILE)
    os.makedirs(model_path, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"init_from": init_from, "fingerprint": found}, f, indent=1)
    os.replace(path + ".tmp", path)


def recorded(model_path: str) -> dict | None:
    """The fingerprint the run in ``model_path`` recorded of its base; None where it has none (an older run)."""
    try:
        with open(os.path.join(model_path, FILE), encoding="utf-8") as f:
            saved = json.load(f)["fingerprint"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{os.path.join(model_path, FILE)}: unreadable ({e}); it records which model the run's "
                          "init_from was") from None
    return saved


def changes(then: dict, now: dict) -> list[str]:
    """What differs between two fingerprints, in words."""
    if then.get("step") != now.get("step"):
        return [f"its newest checkpoint was step {then.get('step')}, now {now.get('step')}"]
    said = [f"revision {then['revision']}, now {now.get('revision')}"] if then.get("revision") != now.get(
        "revision") and "revision" in then else []
    old, new = then.get("files", {}), now.get("files", {})
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            said.append(f"{name} is gone")
        elif name not in old:
            said.append(f"{name} is new")
        elif old[name]["bytes"] != new[name]["bytes"]:
            said.append(f"{name} has {new[name]['bytes']} bytes, not {old[name]['bytes']}")
        elif old[name]["sampled_sha256"] != new[name]["sampled_sha256"]:
            said.append(f"{name} has other contents")
    return said


def check_base(model_path: str, init_from: str) -> str | None:
    """A one-line error where ``init_from`` no longer holds the model the run in ``model_path`` started from; a note
    where the run recorded none; None where it is the same."""
    then = recorded(model_path)
    if then is None:
        return (f"note: {model_path} records no fingerprint of its init_from (a run from before they were kept): "
                f"{init_from} is read unchecked")
    said = changes(then, fingerprint(init_from))
    if said:
        shown = "; ".join(said[:3]) + (f"; {len(said) - 3} more" if len(said) > 3 else "")
        raise ConfigError(f"init_from {init_from}: not the model the run in {model_path} started from ({shown}), "
                          "and its checkpoints hold only the trained parameters (peft checkpoint 'trainable'), which "
                          "go on that model; put the original back there, or start a new run on the one there now "
                          "(train.py --new moves this one aside)")
    return None
