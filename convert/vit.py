"""Hugging Face ViT (``ViTModel``, ``ViTForImageClassification``) <-> NeoMesh ``vit`` models.

The patch embedding is a stride-P convolution there, (D, C, P, P); here the same weights as a (P * P * C, D)
matmul over flattened patches (models/vit.py ``patches``). Encoder weights map one to one; the classifier maps
when the checkpoint has one (a bare ``ViTModel`` has a pooler instead, which NeoMesh's ViT does not use: its
classifier then starts fresh, as transformers does).
"""

from __future__ import annotations

import numpy as np

from config import Config, ConfigError, from_dict
from convert.hf_dir import flatten, getter, strip_prefix

MODEL_TYPES = ("vit",)
ACTIVATIONS_FROM_HF = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
ACTIVATIONS_TO_HF = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu"}


def config_from_hf(hf: dict, source: str = "config.json") -> Config:
    """The NeoMesh config of a ViT Hugging Face config."""
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS_FROM_HF:
        raise ConfigError(f"{source}: hidden_act '{act}' is not supported (supported: "
                          f"{', '.join(ACTIVATIONS_FROM_HF)})")
    # Only the masked-image-modeling head reads encoder_stride; transformers writes its default 16 into every
    # ViTConfig, so a classifier with another patch size carries a stale one.
    patch, stride = hf.get("patch_size", 16), hf.get("encoder_stride", 16)
    if "ViTForMaskedImageModeling" in (hf.get("architectures") or []) and stride != patch:
        raise ConfigError(f"{source}: encoder_stride {stride} differs from patch_size {patch} "
                          "(ViTForMaskedImageModeling's head)")
    labels = hf.get("id2label") or {}
    hidden_dropout = hf.get("hidden_dropout_prob", 0.0)  # transformers drops the embeddings and each branch with it
    keys = dict(model="vit", n_embd=hf.get("hidden_size", 768), n_layer=hf.get("num_hidden_layers", 12),
                n_head=hf.get("num_attention_heads", 12), d_ff=hf.get("intermediate_size", 3072),
                image_size=hf.get("image_size", 224), patch_size=patch,
                num_channels=hf.get("num_channels", 3), layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
                qkv_bias=hf.get("qkv_bias", True), activation_function=ACTIVATIONS_FROM_HF[act],
                res_dropout=hidden_dropout, embed_dropout=hidden_dropout,
                attn_dropout=hf.get("attention_probs_dropout_prob", 0.0),
                num_labels=max(len(labels), 2))
    cfg, _ = from_dict(keys, source=source)
    return cfg


PREPROCESSOR = "preprocessor_config.json"  # transformers' image processor settings, beside config.json


def normalisation_from_hf(hf_dir: str, num_channels: int) -> dict:
    """``{"image_mean", "image_std"}`` of a Hugging Face ViT directory's image processor (both None where it does
    not normalise), or {} where the directory has no preprocessor_config.json. NeoMesh scales pixels to [0, 1]
    before normalising, as the processor's rescale_factor 1/255 does; another rescaling is a one-line error."""
    import json
    import math
    import os

    path = os.path.join(hf_dir, PREPROCESSOR)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            processor = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(processor, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if processor.get("do_rescale", True) and not math.isclose(processor.get("rescale_factor", 1 / 255), 1 / 255):
        raise ConfigError(f"{path}: rescale_factor {processor['rescale_factor']}; NeoMesh feeds pixels scaled to "
                          "[0, 1] (1/255)")
    if not processor.get("do_normalize", True):
        return {"image_mean": None, "image_std": None}
    out = {}
    for key, default in (("image_mean", 0.5), ("image_std", 0.5)):  # ViTImageProcessor's defaults
        value = processor.get(key, default)
        value = [value] * num_channels if isinstance(value, (int, float)) else value
        if not isinstance(value, list) or len(value) != num_channels:
            raise ConfigError(f"{path}: {key} {json.dumps(value)} is not one number per channel ({num_channels})")
        out[key] = [float(v) for v in value]
    return out


def preprocessor_to_hf(cfg: Config) -> dict:
    """The preprocessor_config.json of a NeoMesh ViT: images resized to image_size, scaled to [0, 1] and normalised
    as the config's image_mean and image_std say (not at all without them), as its training batches were."""
    normalise = cfg.image_mean is not None
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": cfg.image_size, "width": cfg.image_size}, "resample": 2,  # bilinear, as image folders
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": normalise,
            "image_mean": cfg.image_mean if normalise else [0.5] * cfg.num_channels,
            "image_std": cfg.image_std if normalise else [0.5] * cfg.num_channels}


def params_from_hf(cfg: Config, tensors: dict[str, np.ndarray], source: str = "weights") -> dict:
    """Hugging Face weights -> the NeoMesh parameter tree (numpy), with the classifier when the checkpoint has one."""
    sd = strip_prefix(tensors, ("vit.",))
    get = getter(sd, source)
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim

    def norm(prefix):
        return {"scale": get(prefix + ".weight"), "bias": get(prefix + ".bias")}

    def linear(name):
        return {"kernel": get(name + ".weight").T, "bias": get(name + ".bias")}

    blocks = {}
    for i in range(cfg.n_layer):
        b = f"encoder.layer.{i}."
        attn = {ours: {"kernel": get(f"{b}attention.attention.{theirs}.weight").T.reshape(d, n, h)}
                for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value"))}
        if cfg.qkv_bias:
            for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
                attn[ours]["bias"] = get(f"{b}attention.attention.{theirs}.bias").reshape(n, h)
        attn["out"] = {"kernel": get(f"{b}attention.output.dense.weight").T.reshape(n, h, d),
                       "bias": get(f"{b}attention.output.dense.bias")}
        blocks[i] = {"ln_1": norm(f"{b}layernorm_before"), "attn": attn, "ln_2": norm(f"{b}layernorm_after"),
                     "mlp": {"c_fc": linear(f"{b}intermediate.dense"), "c_proj": linear(f"{b}output.dense")}}
    conv = get("embeddings.patch_embeddings.projection.weight")  # (D, C, P, P)
    params = {"patch_embed": {"kernel": conv.transpose(2, 3, 1, 0).reshape(-1, d),  # (P * P * C, D)
                              "bias": get("embeddings.patch_embeddings.projection.bias")},
              "cls_token": get("embeddings.cls_token").reshape(d),
              "wpe": get("embeddings.position_embeddings")[0], "blocks": blocks, "ln_f": norm("layernorm")}
    if "classifier.weight" in sd:
        if sd["classifier.weight"].shape[0] != cfg.num_labels:
            raise ConfigError(f"{source}: classifier has {sd['classifier.weight'].shape[0]} labels, the config "
                              f"{cfg.num_labels}")
        params["classifier"] = linear("classifier")
    return params


def config_to_hf(cfg: Config) -> dict:
    """The transformers config (as a dict) of a NeoMesh ViT config (ViTForImageClassification)."""
    unsupported = {"rotary_emb": cfg.rotary_emb, "mlp_glu": cfg.mlp_glu, "moe_layers": cfg.moe_layers,
                   "norm": cfg.norm_kind != "layernorm", "norm_position": cfg.norm_position != "pre",
                   "causal": cfg.causal, "rezero": cfg.rezero, "macaron": cfg.macaron,
                   "attention_scale": cfg.attention_scale != "inverse_sqrt_head_dim", "dense_bias": not cfg.dense_bias}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"export: {key}={getattr(cfg, key)!r} has no ViT equivalent in transformers")
    if set(cfg.attention_layers) != {"global"}:
        raise ConfigError(f"export: ViT has only global layers, not {sorted(set(cfg.attention_layers))}")
    return {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": cfg.n_embd,
            "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "intermediate_size": cfg.intermediate,
            "hidden_act": ACTIVATIONS_TO_HF[cfg.activation_function], "image_size": cfg.image_size,
            "patch_size": cfg.patch_size, "num_channels": cfg.num_channels, "qkv_bias": cfg.qkv_bias,
            "layer_norm_eps": cfg.layer_norm_epsilon, "hidden_dropout_prob": cfg.res_dropout,
            "attention_probs_dropout_prob": cfg.attn_dropout, "initializer_range": 0.02, "encoder_stride":
            cfg.patch_size, "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
            "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)}, "torch_dtype": "float32"}


def params_to_hf(cfg: Config, params: dict) -> dict[str, np.ndarray]:
    """The NeoMesh parameter tree -> ViTForImageClassification weight names (float32)."""
    d, p, c = cfg.n_embd, cfg.patch_size, cfg.num_channels
    flat = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
    out = {}

    def linear(name, ours):
        out[name + ".weight"], out[name + ".bias"] = flat[ours + "/kernel"].T, flat[ours + "/bias"]

    def norm(name, ours):
        out[name + ".weight"], out[name + ".bias"] = flat[ours + "/scale"], flat[ours + "/bias"]

    out["vit.embeddings.cls_token"] = flat["cls_token"].reshape(1, 1, d)
    out["vit.embeddings.position_embeddings"] = flat["wpe"][None]
    out["vit.embeddings.patch_embeddings.projection.weight"] = \
        flat["patch_embed/kernel"].reshape(p, p, c, d).transpose(3, 2, 0, 1)
    out["vit.embeddings.patch_embeddings.projection.bias"] = flat["patch_embed/bias"]
    for i in range(cfg.n_layer):
        b, ours = f"vit.encoder.layer.{i}.", f"blocks/{i}/"
        for theirs, name in (("query", "q"), ("key", "k"), ("value", "v")):
            out[f"{b}attention.attention.{theirs}.weight"] = flat[f"{ours}attn/{name}/kernel"].reshape(d, -1).T
            if cfg.qkv_bias:
                out[f"{b}attention.attention.{theirs}.bias"] = flat[f"{ours}attn/{name}/bias"].reshape(-1)
        out[f"{b}attention.output.dense.weight"] = flat[f"{ours}attn/out/kernel"].reshape(-1, d).T
        out[f"{b}attention.output.dense.bias"] = flat[f"{ours}attn/out/bias"]
        norm(f"{b}layernorm_before", f"{ours}ln_1")
        norm(f"{b}layernorm_after", f"{ours}ln_2")
        linear(f"{b}intermediate.dense", f"{ours}mlp/c_fc")
        linear(f"{b}output.dense", f"{ours}mlp/c_proj")
    norm("vit.layernorm", "ln_f")
    linear("classifier", "classifier")
    return out
