"""Hugging Face T5 <-> NeoMesh ``t5`` models: ``T5ForConditionalGeneration`` (encoder and decoder) and
``T5EncoderModel`` (an encoder alone: ``n_decoder_layer`` 0).

torch Linear weights are (out, in); NeoMesh attention kernels are (D, N, H) and (N, H, D). Each stack's relative
position bias table lives in its first block in transformers (``block.0.layer.0.SelfAttention.
relative_attention_bias``) and once per stack here. The gated MLP's ``wi_0`` (through the activation) is NeoMesh's
``c_gate`` and ``wi_1`` its ``c_fc``. Original T5 scales the decoder output by d_model**-0.5 before the shared
embedding; T5 v1.1 does not, and carries its own ``lm_head.weight`` (``no_weight_tie`` here). Older transformers
configs say v1.1 with ``tie_word_embeddings: false``; transformers 5 always writes ``tie_word_embeddings: true``
and says it with ``scale_decoder_outputs: false`` (the head stays untied when the checkpoint holds one).
"""

from __future__ import annotations

import json

import numpy as np

from config import Config, ConfigError, from_dict
from convert.hf_dir import flatten, getter

MODEL_TYPES = ("t5",)
ACTIVATIONS_FROM_HF = {"relu": "relu", "gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                       "silu": "silu", "swish": "silu", "tanh": "tanh"}
ACTIVATIONS_TO_HF = {"relu": "relu", "gelu_exact": "gelu", "gelu": "gelu_new", "silu": "silu", "swish": "silu",
                     "tanh": "tanh"}


def scales_decoder_output(hf: dict) -> bool:
    """Whether the decoder output is scaled by d_model**-0.5 (original T5) or not (v1.1), in either spelling:
    transformers 5's ``scale_decoder_outputs`` wins over ``tie_word_embeddings``, as it does there."""
    if "scale_decoder_outputs" in hf:
        return hf["scale_decoder_outputs"] is not False
    return hf.get("tie_word_embeddings", True) is not False


def config_from_hf(hf: dict, source: str = "config.json") -> Config:
    """The NeoMesh config of a T5 Hugging Face config."""
    if hf.get("model_type") != "t5":
        raise ConfigError(f"{source}: model_type '{hf.get('model_type')}' is not a T5 model")
    projection = hf.get("feed_forward_proj", "relu")
    parts = projection.split("-")
    gated = parts[0] == "gated"
    act = "gelu_new" if projection == "gated-gelu" else parts[-1]  # transformers' own special case
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in ACTIVATIONS_FROM_HF:
        raise ConfigError(f"{source}: feed_forward_proj '{projection}' is not supported (relu, gated-gelu, or "
                          f"[gated-]ACT with ACT one of {', '.join(ACTIVATIONS_FROM_HF)})")
    missing = [k for k in ("d_model", "num_heads", "num_layers", "d_ff", "vocab_size") if k not in hf]
    if missing:
        raise ConfigError(f"{source}: no '{missing[0]}' (a T5 config.json has d_model, num_heads, num_layers, d_ff "
                          "and vocab_size)")
    d, n = hf["d_model"], hf["num_heads"]
    encoder_only = (hf.get("architectures") or [""])[0] == "T5EncoderModel"
    layers, dropout = hf["num_layers"], hf.get("dropout_rate", 0.1)
    keys = dict(model="t5", n_embd=d, n_head=n, n_layer=layers, d_ff=hf["d_ff"], n_vocab=hf["vocab_size"],
                n_decoder_layer=0 if encoder_only else hf.get("num_decoder_layers") or layers,
                layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6), mlp_glu=gated,
                activation_function=ACTIVATIONS_FROM_HF[act],
                relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
                relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
                no_weight_tie=not scales_decoder_output(hf),
                # transformers' one rate drops the embeddings, each branch and the attention probabilities
                res_dropout=dropout, embed_dropout=dropout, attn_dropout=dropout,
                decoder_start_token_id=hf.get("decoder_start_token_id", hf.get("pad_token_id", 0)) or 0)
    if hf.get("d_kv", d // n) * n != d:
        keys["d_kv"] = hf["d_kv"]
    cfg, _ = from_dict(keys, source=source)
    return cfg


def params_from_hf(cfg: Config, tensors: dict[str, np.ndarray], source: str = "weights") -> dict:
    """Hugging Face weights -> the NeoMesh parameter tree (numpy). Old checkpoints that store the tied embedding
    under ``encoder.embed_tokens`` instead of ``shared`` load too."""
    sd = dict(tensors)
    if "shared.weight" not in sd and "encoder.embed_tokens.weight" in sd:
        sd["shared.weight"] = sd["encoder.embed_tokens.weight"]
    get = getter(sd, source)
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim

    def attention(prefix):
        out = {name: {"kernel": get(f"{prefix}.{name}.weight").T.reshape(d, n, h)} for name in "qkv"}
        out["out"] = {"kernel": get(f"{prefix}.o.weight").T.reshape(n, h, d)}
        return out

    def mlp(prefix):
        names = (("c_gate", "wi_0"), ("c_fc", "wi_1")) if cfg.mlp_glu else (("c_fc", "wi"),)
        return {ours: {"kernel": get(f"{prefix}.{theirs}.weight").T} for ours, theirs in names + (("c_proj", "wo"),)}

    def scale(name):
        return {"scale": get(name + ".weight")}

    def stack(side, layers, decoder):
        blocks = {}
        for i in range(layers):
            b = f"{side}.block.{i}.layer."
            block = {"ln_1": scale(b + "0.layer_norm"), "attn": attention(b + "0.SelfAttention")}
            if decoder:
                block.update(ln_cross=scale(b + "1.layer_norm"), crossattention=attention(b + "1.EncDecAttention"))
            last = b + ("2" if decoder else "1")
            block.update(ln_2=scale(last + ".layer_norm"), mlp=mlp(last + ".DenseReluDense"))
            blocks[i] = block
        return {"blocks": blocks, "ln_f": scale(f"{side}.final_layer_norm"), "relative_attention_bias": {
            "embedding": get(f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")}}

    params = {"wte": {"embedding": get("shared.weight")}, "encoder": stack("encoder", cfg.n_layer, False)}
    if cfg.decoder_layers:
        params["decoder"] = stack("decoder", cfg.decoder_layers, True)
        if cfg.no_weight_tie:  # transformers 5 ties a head the checkpoint lacks to the shared embedding
            params["lm_head"] = {"kernel": sd.get("lm_head.weight", params["wte"]["embedding"]).T}
    return params


TOKEN_ROLES = ("eos", "pad", "unk")  # an exported tokenizer's special tokens (convert/hf_tokenizer.py)


def text_processor(cfg: Config, tokenizer):
    """End-of-text after each text, as NeoMesh ends T5's inputs and targets (data/pairs.py ``encode_ended``) and
    transformers' T5 tokenizer ends them with </s>, as a tokenizers post-processor for an export."""
    from tokenizers import processors

    eos = tokenizer.eos_token
    return processors.TemplateProcessing(single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:0 {eos}:0",
                                         special_tokens=[(eos, tokenizer.eos_id)])


def check_exportable(cfg: Config) -> None:
    """A one-line error naming the first option transformers' T5 cannot hold."""
    unsupported = {"norm": cfg.norm_kind != "rmsnorm", "norm_position": cfg.norm_position != "pre",
                   "rezero": cfg.rezero, "dense_bias": cfg.dense_bias, "qkv_bias": cfg.qkv_bias,
                   "attention_scale": cfg.attention_scale != "unscaled",
                   "activation_function": cfg.activation_function not in ACTIVATIONS_TO_HF or (
                       cfg.mlp_glu and cfg.activation_function == "gelu_exact")}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"export: {key}={json.dumps(getattr(cfg, key))} has no t5 equivalent in transformers")


def config_to_hf(cfg: Config) -> dict:
    """The transformers config (as a dict) of an exportable NeoMesh T5 config."""
    check_exportable(cfg)
    act = cfg.activation_function
    projection = ("gated-gelu" if act == "gelu" else f"gated-{ACTIVATIONS_TO_HF[act]}") if cfg.mlp_glu else \
        ACTIVATIONS_TO_HF[act]
    encoder_only = cfg.decoder_layers == 0
    return {"model_type": "t5", "architectures": ["T5EncoderModel" if encoder_only else "T5ForConditionalGeneration"],
            "vocab_size": cfg.n_vocab, "d_model": cfg.n_embd, "d_kv": cfg.head_dim, "d_ff": cfg.intermediate,
            "num_layers": cfg.n_layer, "num_decoder_layers": cfg.decoder_layers or cfg.n_layer,
            "num_heads": cfg.n_head, "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
            "relative_attention_max_distance": cfg.relative_attention_max_distance, "dropout_rate": cfg.res_dropout,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "initializer_factor": 1.0, "feed_forward_proj": projection,
            "is_encoder_decoder": not encoder_only, "use_cache": True,
            "pad_token_id": 0, "decoder_start_token_id": cfg.decoder_start_token_id, "torch_dtype": "float32",
            # v1.1 in both spellings: older transformers read only tie_word_embeddings (false: untied, unscaled);
            # transformers 5 reads scale_decoder_outputs and unties a head that differs from the embedding
            "tie_word_embeddings": not cfg.no_weight_tie, "scale_decoder_outputs": not cfg.no_weight_tie}


def params_to_hf(cfg: Config, params: dict) -> dict[str, np.ndarray]:
    """The NeoMesh parameter tree -> Hugging Face weight names (float32); tied copies of the shared embedding are
    left out (transformers ties them)."""
    d = cfg.n_embd
    p = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
    out = {"shared.weight": p["wte/embedding"]}

    def attention(prefix, ours):
        for name in "qkv":
            out[f"{prefix}.{name}.weight"] = p[f"{ours}/{name}/kernel"].reshape(d, -1).T
        out[f"{prefix}.o.weight"] = p[f"{ours}/out/kernel"].reshape(-1, d).T

    def stack(side, layers, decoder):
        for i in range(layers):
            b, ours = f"{side}.block.{i}.layer.", f"{side}/blocks/{i}/"
            out[b + "0.layer_norm.weight"] = p[ours + "ln_1/scale"]
            attention(b + "0.SelfAttention", ours + "attn")
            if decoder:
                out[b + "1.layer_norm.weight"] = p[ours + "ln_cross/scale"]
                attention(b + "1.EncDecAttention", ours + "crossattention")
            last = b + ("2" if decoder else "1")
            out[last + ".layer_norm.weight"] = p[ours + "ln_2/scale"]
            names = (("wi_0", "c_gate"), ("wi_1", "c_fc")) if cfg.mlp_glu else (("wi", "c_fc"),)
            for theirs, name in names + (("wo", "c_proj"),):
                out[f"{last}.DenseReluDense.{theirs}.weight"] = p[f"{ours}mlp/{name}/kernel"].T
        out[f"{side}.final_layer_norm.weight"] = p[f"{side}/ln_f/scale"]
        out[f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
            p[f"{side}/relative_attention_bias/embedding"]

    stack("encoder", cfg.n_layer, False)
    if cfg.decoder_layers:
        stack("decoder", cfg.decoder_layers, True)
        if cfg.no_weight_tie:
            out["lm_head.weight"] = p["lm_head/kernel"].T
    return out
