"""Reading and writing Hugging Face model directories: config.json, weights, tokenizer files.

A directory holds config.json, weights (model.safetensors, sharded *.safetensors, or pytorch_model.bin, which
needs torch) and tokenizer files (tokenizer.json, or GPT-2's vocab.json + merges.txt, BERT's vocab.txt, or T5's
SentencePiece spiece.model).
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np

from config import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "spiece.model",
                   "tokenizer_config.json", "special_tokens_map.json")


def read_hf_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, {weight name: float32 array}) of a Hugging Face model directory."""
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise ConfigError(f"{path}: not a Hugging Face model directory (no config.json)")
    with open(config_path) as f:
        hf_config = json.load(f)
    shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if shards:
        from safetensors.numpy import load_file

        tensors = {k: v for shard in shards for k, v in load_file(shard).items()}
    elif os.path.exists(os.path.join(path, "pytorch_model.bin")):
        try:
            import torch
        except ImportError:
            raise ConfigError(f"{path}/pytorch_model.bin needs torch to read; install it or save as safetensors") \
                from None
        state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        tensors = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin")
    return hf_config, {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def write_hf_dir(out_dir: str, hf_config: dict, tensors: dict[str, np.ndarray],
                 tokenizer_dir: str | None = None) -> None:
    """Writes config.json, model.safetensors and (if given) the tokenizer files for from_pretrained."""
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    if tokenizer_dir:
        copy_tokenizer(tokenizer_dir, out_dir)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def load_tokenizer(path: str):
    """The tokenizer of an HF directory: tokenizer.json, GPT-2's vocab.json + merges.txt, or BERT's vocab.txt."""
    from data.tokenizer import load_tokenizer as load

    if not any(os.path.exists(os.path.join(path, name)) for name in ("tokenizer.json", "vocab.json", "vocab.txt",
                                                                      "spiece.model")):
        raise ConfigError(f"{path}: no tokenizer (tokenizer.json, vocab.json + merges.txt, vocab.txt, or "
                          "spiece.model)")
    return load(path)


def copy_tokenizer(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


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
