"""The zoo's registry: the config's ``model`` key -> the family that builds it, and that family's config defaults.

Adding a family is a new file in models/ and one line here. The table is plain data (nothing here imports jax),
so a config is validated, family defaults included, before any accelerator library starts.

A family's defaults fill only the keys a config does not set: ``{"model": "bert"}`` is a post-LayerNorm,
bidirectional, masked-LM encoder, and ``{"model": "bert", "task": "sequence_classification"}`` the same encoder
with a classification head.
"""

from __future__ import annotations

import importlib

_BERT = {
    "task": "masked_lm", "causal": False, "norm_position": "post", "layer_norm_epsilon": 1e-12,
    "attention_scale": "inverse_sqrt_head_dim", "qkv_bias": True, "activation_function": "gelu_exact",
    "n_token_types": 2, "n_ctx": 512, "n_vocab": 30522, "scale_by_depth": False,
}

_T5 = {  # T5-small's shape (original T5: ReLU, tied); T5 v1.1 sets mlp_glu, gelu, no_weight_tie
    "task": "seq2seq", "span_corruption": True, "norm": "rmsnorm", "layer_norm_epsilon": 1e-6,
    "attention_scale": "unscaled", "qkv_bias": False, "dense_bias": False, "activation_function": "relu",
    "n_ctx": 512, "n_vocab": 32128, "n_embd": 512, "n_head": 8, "n_layer": 6, "d_ff": 2048, "scale_by_depth": False,
}

_VIT = {  # ViT-B/16's shape (transformers' ViTConfig defaults); images from the embedded digits by default
    "task": "image_classification", "causal": False, "norm_position": "pre", "layer_norm_epsilon": 1e-12,
    "attention_scale": "inverse_sqrt_head_dim", "qkv_bias": True, "activation_function": "gelu_exact",
    "n_embd": 768, "n_head": 12, "n_layer": 12, "d_ff": 3072, "scale_by_depth": False,
    "datasets": [["digits", None, None, None]],
}

FAMILIES: dict[str, tuple[str, dict]] = {
    # model: ("module:Class", config defaults)
    "gpt_neo": ("models.gpt_neo:GPTNeo", {"task": "causal_lm"}),
    "gpt2": ("models.gpt_neo:GPTNeo", {"task": "causal_lm", "qkv_bias": True, "attention_scale":
                                       "inverse_sqrt_head_dim", "n_ctx": 1024, "scale_by_depth": False}),
    "bert": ("models.bert:Bert", _BERT),
    "roberta": ("models.bert:Bert", {**_BERT, "layer_norm_epsilon": 1e-5, "n_token_types": 1, "position_offset": 2,
                                     "n_vocab": 50265}),
    "t5": ("models.t5:T5", _T5),
    "vit": ("models.vit:ViT", _VIT),
}


def defaults(model: str) -> dict:
    """The config defaults of family ``model`` (a known name)."""
    return dict(FAMILIES[model][1])


def family(model: str) -> type:
    """The module class that builds ``model`` (imported on first use: the table above stays jax-free)."""
    module, name = FAMILIES[model][0].split(":")
    return getattr(importlib.import_module(module), name)


def build(cfg, rngs):
    """The model of ``cfg`` (a ``config.Config``), initialised from ``rngs``."""
    return family(cfg.model)(cfg, rngs=rngs)
