"""Load any zoo model from a NeoMesh run directory or a Hugging Face directory, placed on a layout.

    from pretrained import load
    cfg, graphdef, params, tokenizer = load("runs/quickstart")          # or an HF directory

``load_run`` restores the latest checkpoint's parameters (without optimizer state) onto any mesh: orbax reshards
what another mesh wrote. ``load`` also accepts Hugging Face directories (config.json + weights) and finds the
tokenizer either way.
"""

from __future__ import annotations

import os

import jax

from config import Config, ConfigError, from_dict


def default_layout():
    """One device, data layout: where a model lands unless told otherwise."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh

    return Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")


def load_run(model_path: str, layout=None, overrides: tuple[str, ...] = ()) -> tuple[Config, object, dict]:
    """(config, graphdef, parameters) of the latest checkpoint in ``model_path``, on ``layout`` (default: one
    device). The checkpoint may have been written on any mesh. A damaged checkpoint (its checksums differ) or one
    holding NaN or infinity is a one-line error."""
    from models import registry
    from parallel.state import sharded_abstract_params
    from training.checkpoint import Checkpoints

    with Checkpoints(model_path, keep=1, read_only=True) as checkpoints:
        step = checkpoints.latest_step()
        cfg, _ = from_dict(checkpoints.located_config(step), source=f"{model_path} checkpoint config",
                           overrides=overrides)
        graphdef, abstract = sharded_abstract_params(lambda rngs: registry.build(cfg, rngs), layout or default_layout())
        params = checkpoints.restore_params_verified(abstract, step)  # damaged or non-finite: refused
    return cfg, graphdef, params


def load_hf_model(hf_dir: str, layout=None) -> tuple[Config, object, dict]:
    """(config, graphdef, parameters) of a Hugging Face model directory, placed on ``layout``."""
    from convert.hf import load_hf
    from models import registry
    from parallel.state import check_params_fit, sharded_abstract_params

    cfg, params = load_hf(hf_dir)
    graphdef, abstract = sharded_abstract_params(lambda rngs: registry.build(cfg, rngs), layout or default_layout())
    check_params_fit(params, abstract)
    return cfg, graphdef, jax.tree.map(lambda p, a: jax.device_put(p, a.sharding), params, abstract)


def load(path: str, layout=None, overrides: tuple[str, ...] = (), kind: str = "auto"):
    """(config, graphdef, parameters, tokenizer) of a NeoMesh run directory (``kind`` "run"; it has checkpoints/)
    or a Hugging Face directory ("hf"; it has config.json and weights); "auto" tells them apart."""
    from convert.hf_dir import load_tokenizer
    from data.source import make_tokenizer

    if kind == "auto":
        kind = "run" if os.path.isdir(os.path.join(path, "checkpoints")) else "hf" if os.path.exists(
            os.path.join(path, "config.json")) else None
    if kind == "run":
        cfg, graphdef, params = load_run(path, layout, overrides)
        tokenizer_dir = os.path.join(path, "tokenizer")
        tokenizer = load_tokenizer(tokenizer_dir) if os.path.isdir(tokenizer_dir) else make_tokenizer(cfg)
    elif kind == "hf":
        cfg, graphdef, params = load_hf_model(path, layout)
        tokenizer = load_tokenizer(path)
    else:
        raise ConfigError(f"{path}: neither a NeoMesh run directory (no checkpoints/) nor a Hugging Face model "
                          "directory (no config.json)")
    if tokenizer.vocab_size > cfg.n_vocab:
        raise ConfigError(f"n_vocab: {cfg.n_vocab} is smaller than the tokenizer's {tokenizer.vocab_size} tokens")
    return cfg, graphdef, params, tokenizer
