"""Reading and writing Hugging Face model directories: config.json, weights, tokenizer files.

A directory holds config.json, weights (model.safetensors, sharded *.safetensors, or pytorch_model.bin, which
needs torch) and tokenizer files (tokenizer.json, or GPT-2's vocab.json + merges.txt, BERT's vocab.txt, or T5's
SentencePiece spiece.model).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil

import numpy as np

from config import ConfigError
from neomesh.json_file import read_json

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "spiece.model",
                   "tokenizer_config.json", "special_tokens_map.json")
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model")  # one of these makes a tokenizer


def not_a_model_directory(path: str) -> ConfigError:
    """The error for a ``path`` without config.json, naming a NeoMesh run directory given in its place."""
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return ConfigError(f"{path}: a NeoMesh run directory (checkpoints/, no config.json), not a Hugging Face model "
                           "directory: predict.py and eval.py read it with --model-path; python -m convert export "
                           "makes one of it")
    return ConfigError(f"{path}: not a Hugging Face model directory (no config.json)")


def has_weights(path: str) -> bool:
    """Whether ``path`` holds weights ``read_hf_dir`` reads: safetensors shards or a pytorch_model.bin."""
    return bool(glob.glob(os.path.join(path, "*.safetensors"))) or \
        os.path.exists(os.path.join(path, "pytorch_model.bin"))


def check_has_weights(path: str) -> None:
    """The one-line error for a directory without weights: ``read_hf_dir``'s, and its callers' that check before
    preparing data or starting a device."""
    if not has_weights(path):
        raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin")


def read_hf_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, {weight name: float32 array}) of a Hugging Face model directory."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise not_a_model_directory(path)
    hf_config = read_json(config_path)
    if not isinstance(hf_config, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    check_has_weights(path)
    shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if shards:
        from safetensors.numpy import load_file

        tensors = {}
        for shard in shards:
            try:
                tensors.update(load_file(shard))
            except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for damaged files
                raise ConfigError(f"{shard}: not a readable safetensors file ({str(e).splitlines()[0][:160]})") \
                    from None
    else:  # pytorch_model.bin
        try:
            import torch
        except ImportError:
            raise ConfigError(f"{path}/pytorch_model.bin needs torch to read; install it or save as safetensors") \
                from None
        try:
            state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many types for damaged files
            raise ConfigError(f"{path}/pytorch_model.bin: not a readable PyTorch state dict "
                              f"({str(e).splitlines()[0][:160]})") from None
        tensors = {k: v.float().numpy() for k, v in state.items()}
    tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    for name, value in tensors.items():  # such weights are refused, not loaded
        if not np.isfinite(value).all():
            raise ConfigError(f"{path}: weight {name} holds NaN or infinity; refusing it")
    return hf_config, tensors


def export_target(out_dir: str) -> str:
    """The directory an export to ``out_dir`` replaces (a link's target, which it is staged beside)."""
    return os.path.realpath(out_dir) if os.path.islink(out_dir) else os.path.normpath(out_dir)


def check_staging_place(out_dir: str) -> None:
    """Refuses an export whose target's parent is not writable (one line saying why it must be), before any work."""
    parent = os.path.dirname(export_target(out_dir)) or "."
    if os.path.isdir(parent) and not os.access(parent, os.W_OK):
        raise staging_refused(out_dir, parent)


def staging_refused(out_dir: str, where: str, why: str | None = None) -> ConfigError:
    """The error for an export that cannot stage beside its target: a writable ``out_dir`` is not enough."""
    return ConfigError(f"export: {where} is not writable{f' ({why})' if why else ''}: an export is staged beside "
                       f"{out_dir} and renamed into its place, the only way to replace a directory at once (so a kill "
                       "leaves it whole); export to a writable place and move the directory")


def restore_replaced(out_dir: str) -> None:
    """Puts back the previous export that an export killed between its two renames left as ``<out_dir>.old-PID``
    with no ``out_dir``; one beside ``out_dir`` (killed while removing it) is removed."""
    from neomesh.paths import left_by_the_dead

    target = export_target(out_dir)
    for path in left_by_the_dead(target, "old"):  # the newest first
        if os.path.lexists(target):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.rename(path, target)


def write_hf_dir(out_dir: str, hf_config: dict, tensors: dict[str, np.ndarray],
                 tokenizer_dir: str | None = None, extra: dict[str, dict] | None = None,
                 names: tuple[str, str] = ("config.json", "model.safetensors")) -> None:
    """Writes config.json, model.safetensors (or the two ``names``: a peft adapter's), (if given) the tokenizer
    files and ``extra``'s JSON files ({name: content}: a ViT's preprocessor_config.json, an own tokenizer's
    tokenizer_config.json) for from_pretrained; an ``extra`` file replaces a tokenizer file of its name (a
    tokenizer.json given its post-processor).

    All of it goes into a staging directory beside ``out_dir`` that then takes its place, so an export that is
    killed or fails (a full disk) leaves ``out_dir`` as it was: a previous export whole, never its weights beside
    another run's tokenizer, and no half-written file that a later export would refuse. The previous export is
    renamed aside first (``<out_dir>.old-PID``): killed before the new one takes its place, the next export puts
    it back, and reading ``out_dir`` meanwhile names it."""
    from safetensors.numpy import save_file

    from neomesh.paths import remove_stale_staging

    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    out_dir = export_target(out_dir)
    staging, old = f"{out_dir}.tmp-{os.getpid()}", f"{out_dir}.old-{os.getpid()}"
    config_name, weights_name = names
    weights_path = os.path.join(staging, weights_name)
    try:
        restore_replaced(out_dir)
        remove_stale_staging(out_dir)  # left by exports that were killed
        try:
            os.makedirs(staging)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise staging_refused(out_dir, os.path.dirname(e.filename or staging), e.strerror) from None
        if tokenizer_dir:
            copy_tokenizer(tokenizer_dir, staging)
        for name, content in {config_name: hf_config, **(extra or {})}.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
        save_file(tensors, weights_path, metadata={"format": "pt"})
        if os.path.isdir(out_dir):  # a previous export (or an empty directory): kept aside until the new is in place
            os.rename(out_dir, old)
            try:
                os.rename(staging, out_dir)
            except BaseException:  # a failure, or Ctrl-C: the previous export back in place
                os.rename(old, out_dir)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out_dir)
    except OSError as e:
        raise ConfigError(f"{e.filename or out_dir}: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - safetensors reports write errors as its own type
        if "os error" not in str(e):
            raise
        raise ConfigError(f"{os.path.join(out_dir, weights_name)}: {str(e).splitlines()[0][:160]}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_tokenizer(path: str):
    """The tokenizer of an HF directory: tokenizer.json, GPT-2's vocab.json + merges.txt, or BERT's vocab.txt."""
    from data.tokenizer import load_tokenizer as load

    if not has_tokenizer(path):
        raise ConfigError(f"{path}: no tokenizer (tokenizer.json, vocab.json + merges.txt, vocab.txt, or "
                          "spiece.model)")
    return load(path)


def has_tokenizer(path: str) -> bool:
    """Whether directory ``path`` holds a tokenizer's vocabulary (not just tokenizer_config.json)."""
    return any(os.path.exists(os.path.join(path, name)) for name in VOCABULARY_FILES)


def copy_tokenizer(src: str, dst: str) -> None:
    """Copies the tokenizer files of ``src`` into ``dst``; ``dst`` is made only when there is one to copy."""
    names = [name for name in TOKENIZER_FILES if os.path.exists(os.path.join(src, name))]
    if names:
        os.makedirs(dst, exist_ok=True)
    for name in names:
        shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def token_head(cfg) -> str:
    """transformers' name of a per-token head (NeoMesh's ``token_classifier``): question answering's ``qa_outputs``,
    else ``classifier``."""
    return "qa_outputs" if cfg.task == "question_answering" else "classifier"


def strip_prefix(tensors: dict, prefixes: tuple[str, ...]) -> dict:
    """Weight names without the first of ``prefixes`` they start with (``transformer.``, ``bert.``, ...)."""
    out = {}
    for name, value in tensors.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        out[name] = value
    return out


def getter(tensors: dict, source: str):
    """``get(name)``: the named weight, or a one-line error naming the missing one."""
    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ConfigError(f"{source}: missing weight '{name}'")
        return tensors[name]

    return get


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": x}} -> {"a/b": x}."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(flatten(value, name + "/") if isinstance(value, dict) else {name: value})
    return flat
