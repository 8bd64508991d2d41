"""Adapter-only weight files and merged export.

``save_adapter`` writes only the parameters that train under a ``peft`` setting (LoRA factors, prefixes, adapters,
a task head) to one safetensors file, with the setting in its metadata (and, saved from the model itself, each LoRA's
scale alpha / rank); ``load_adapter`` puts them back into a model's parameters (the base weights come from wherever
the base came from), or into the model itself, checking those scales. ``merged_params`` folds every LoRA
update into its kernel and drops the factors: the base model's tree, which ``export_merged`` writes as a Hugging
Face directory through convert/ (GPT-Neo, GPT-2, BERT, T5 alike).
"""

from __future__ import annotations

import json

import jax
import numpy as np
from flax import nnx

from config import Config, ConfigError, check_peft
from parallel.state import path_name, split_params
from training.peft.trainable import trainable_filter


def _flat(tree: dict) -> dict[str, np.ndarray]:
    return {path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def save_adapter(path: str, params: dict | nnx.Module, settings: dict) -> list[str]:
    """Writes the parameters that train under ``settings`` (``peft``) to the safetensors file ``path``; returns
    their names. Given the model itself rather than its parameters, the file also records each LoRA's scale
    (alpha / rank), which ``load_adapter`` into a model then checks: the same factors under another alpha compute
    another update."""
    from safetensors.numpy import save_file

    from training.peft.lora import lora_modules

    settings = check_peft(settings)
    metadata = {"peft": json.dumps(settings)}
    if isinstance(params, nnx.Module):
        metadata["lora_scale"] = json.dumps({name: m.scale for name, m in lora_modules(params)})
        params = nnx.to_pure_dict(nnx.state(params, nnx.Param))
    names = list(_flat(params))
    for part, marks in (("lora", ("/lora_a", "/lora_b")), ("prefix", ("/prefix/",)), ("adapter", ("_adapter/",))):
        if part in settings and not any(mark in name for name in names for mark in marks):
            raise ConfigError(f"save_adapter: settings name {part}, but params hold no {part} parameters (an empty "
                              "file would have been written); name the parts the model has, or apply_peft first")
    trained, _ = split_params(params, trainable_filter(settings))
    tensors = {name: np.ascontiguousarray(v, np.float32) for name, v in _flat(trained).items()}
    try:
        save_file(tensors, path, metadata=metadata)
    except Exception as e:  # noqa: BLE001 - safetensors' own error type for a directory or a missing folder
        raise ConfigError(f"{path}: cannot write the adapter file ({str(e).splitlines()[0][:160]})") from None
    return sorted(tensors)


def read_adapter(path: str) -> tuple[dict[str, np.ndarray], dict | None]:
    """({parameter name: array}, the ``peft`` setting it was saved with) of an adapter file."""
    tensors, meta = _read(path)
    return tensors, json.loads(meta["peft"]) if "peft" in meta else None


def _read(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(path, "numpy") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for damaged or missing files
        raise ConfigError(f"{path}: not a readable adapter file ({str(e).splitlines()[0][:160]})") from None
    return tensors, meta


def load_adapter(path: str, params: dict | nnx.Module) -> dict | nnx.Module:
    """``params`` with the adapter file's parameters in place of theirs (same sharding and dtype). A name the
    model lacks, or another shape, is a one-line error naming it. Given the model itself, its parameters are
    replaced in place and it is returned; a LoRA of another scale than the file records (another alpha: the same
    shapes, another update), or one already merged into its kernel, is a one-line error naming it."""
    from training.peft.lora import lora_modules

    tensors, meta = _read(path)
    if not isinstance(params, nnx.Module):
        return _replaced(path, tensors, params)
    saved = json.loads(meta.get("lora_scale", "{}"))
    for name, m in lora_modules(params):
        if name in saved and not np.isclose(saved[name], m.scale):
            raise ConfigError(f"{path}: {name}'s LoRA was saved with scale alpha/rank {saved[name]:g}, the model's "
                              f"is {m.scale:g}; apply_peft with the alpha and rank it was trained with")
        if m.merged and f"{name}/lora_a" in tensors:  # the kernel holds the old factors' update
            raise ConfigError(f"{path}: {name}'s LoRA is merged into its kernel; load the factors before merge (or "
                              "unmerge first)")
    nnx.update(params, nnx.State(_replaced(path, tensors, nnx.to_pure_dict(nnx.state(params, nnx.Param)))))
    return params


def _replaced(path: str, tensors: dict[str, np.ndarray], params: dict) -> dict:
    wanted = _flat(jax.tree.map(lambda a: np.zeros((), np.int8), params))
    for name, value in tensors.items():
        if name not in wanted:
            raise ConfigError(f"{path}: parameter {name} is not in the model (apply the same peft setting first)")

    def replace(p, leaf):
        name = path_name(p)
        if name not in tensors:
            return leaf
        if tuple(tensors[name].shape) != tuple(leaf.shape):
            raise ConfigError(f"{path}: parameter {name} has shape {tuple(tensors[name].shape)}, the model's is "
                              f"{tuple(leaf.shape)}")
        value = np.asarray(tensors[name], leaf.dtype)
        return jax.device_put(value, leaf.sharding) if hasattr(leaf, "sharding") else value

    return jax.tree_util.tree_map_with_path(replace, params)


def merged_params(graphdef: nnx.GraphDef, params: dict) -> dict:
    """The base model's parameters: every LoRA update added into its kernel, the factors dropped. Prefixes,
    adapters and a custom attention function change the computation itself, not a weight, so a model with them
    cannot merge (one-line error)."""
    from training.peft.lora import merge

    extra = [n for n in _flat(params) if "/prefix/" in n or "_adapter/" in n]
    if extra:
        raise ConfigError(f"merge: {extra[0]} belongs to a prefix or an adapter, which cannot be folded into the "
                          "base weights; only LoRA merges")
    model = merge(nnx.merge(graphdef, nnx.State(params)))
    hooked = [(path, m.attention_fn) for path, m in nnx.iter_graph(model) if getattr(m, "attention_fn", None)]
    if hooked:  # the base model's family computes with its own attention: the export would drop it silently
        path, fn = hooked[0]
        raise ConfigError(f"merge: {'/'.join(map(str, path))} computes with a custom attention function "
                          f"({getattr(fn, '__name__', repr(fn))}), which base weights cannot hold; "
                          "set_attention_fn(model, None) first to export without it")
    merged = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return split_params(merged, lambda name: name.rsplit("/", 1)[-1] not in ("lora_a", "lora_b"))[0]


def export_merged(cfg: Config, graphdef: nnx.GraphDef, params: dict, hf_dir: str,
                  tokenizer_dir: str | None = None) -> None:
    """Writes the LoRA-merged model as a Hugging Face directory of its family (``convert.hf.export_params``)."""
    from convert.hf import export_params

    export_params(cfg.replace(peft=None), merged_params(graphdef, params), hf_dir, tokenizer_dir)


