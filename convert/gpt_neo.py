"""Hugging Face GPT-Neo and GPT-2 <-> NeoMesh ``gpt_neo`` / ``gpt2`` models.

torch Linear weights are (out, in), GPT-2's Conv1D weights (in, out); NeoMesh attention kernels are (D, N, H) and
(N, H, D). GPT-2 is NeoMesh's ``gpt2`` family: q/k/v biases and logits scaled by 1/sqrt(head_dim), as in
transformers, so its weights map one to one. ``*ForSequenceClassification`` (a bias-free ``score`` on the last real
token), ``*ForTokenClassification`` (a ``classifier`` on every token) and ``*ForQuestionAnswering`` (``qa_outputs``, a
start and an end logit on every token) carry NeoMesh's classification heads.
"""

from __future__ import annotations

import json

import numpy as np

from config import TOKEN_HEAD_TASKS, Config, ConfigError, from_dict
from convert.hf_dir import flatten, getter, strip_prefix, token_head

MODEL_TYPES = ("gpt_neo", "gpt2")
GPT2_END_OF_TEXT = 50256  # transformers' GPT-2 and GPT-Neo configs' default bos/eos id
HEADS = {"causal_lm": ("LMHeadModel", "ForCausalLM"), "sequence_classification": ("ForSequenceClassification",) * 2,
         "token_classification": ("ForTokenClassification",) * 2,
         "question_answering": ("ForQuestionAnswering",) * 2}  # task -> GPT-2's and GPT-Neo's class suffix
ACTIVATIONS_FROM_HF = {"gelu_new": "gelu", "gelu": "gelu_exact", "relu": "relu", "silu": "silu", "swish": "silu",
                       "tanh": "tanh", "sigmoid": "sigmoid"}
ACTIVATIONS_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu", "swish": "silu",
                     "tanh": "tanh", "sigmoid": "sigmoid"}


def config_from_hf(hf: dict, source: str = "config.json") -> Config:
    """The NeoMesh config of a GPT-Neo or GPT-2 Hugging Face config."""
    kind = hf.get("model_type")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS_FROM_HF:
        raise ConfigError(f"{source}: activation_function '{act}' is not supported "
                          f"(supported: {', '.join(ACTIVATIONS_FROM_HF)})")
    if kind == "gpt_neo":
        d, layers = hf["hidden_size"], hf["num_layers"]
        keys = dict(model="gpt_neo", n_embd=d, n_layer=layers, n_head=hf["num_heads"],
                    n_ctx=hf["max_position_embeddings"],
                    attention_types=hf.get("attention_types", [[["global", "local"], layers // 2]]),
                    local_attention_radius=hf.get("window_size", 256), d_ff=hf.get("intermediate_size"),
                    res_dropout=hf.get("resid_dropout", 0.0), embed_dropout=hf.get("embed_dropout", 0.0),
                    attn_dropout=hf.get("attention_dropout", 0.0))
    elif kind == "gpt2":
        d, layers = hf["n_embd"], hf["n_layer"]
        # reorder_and_upcast_attn computes the logits in float32, as NeoMesh's attention always does: the same model
        if hf.get("scale_attn_by_inverse_layer_idx"):
            raise ConfigError(f"{source}: GPT-2 option scale_attn_by_inverse_layer_idx=true is not supported")
        keys = dict(model="gpt2", n_embd=d, n_layer=layers, n_head=hf["n_head"], n_ctx=hf["n_positions"],
                    attention_types=[[["global"], layers]], d_ff=hf.get("n_inner"),
                    attention_scale="inverse_sqrt_head_dim" if hf.get("scale_attn_weights", True) else "unscaled",
                    res_dropout=hf.get("resid_pdrop", 0.1), embed_dropout=hf.get("embd_pdrop", 0.1),
                    attn_dropout=hf.get("attn_pdrop", 0.1))
    else:
        raise ConfigError(f"{source}: model_type '{kind}' is not a GPT-Neo or GPT-2 model")
    # transformers' token classifiers drop their input at classifier_dropout, else 0.1 (GPT-Neo's default)
    keys["classifier_dropout"] = 0.1 if hf.get("classifier_dropout") is None else hf["classifier_dropout"]
    architecture = (hf.get("architectures") or [""])[0]
    for suffix, task in (("ForSequenceClassification", "sequence_classification"),
                         ("ForTokenClassification", "token_classification"),
                         ("ForQuestionAnswering", "question_answering")):
        if architecture.endswith(suffix):
            keys.update(task=task, num_labels=len(hf.get("id2label") or {0: 0, 1: 1}))
    cfg, _ = from_dict({**keys, "n_vocab": hf["vocab_size"], "activation_function": ACTIVATIONS_FROM_HF[act],
                        "layer_norm_epsilon": hf.get("layer_norm_epsilon", 1e-5),
                        "no_weight_tie": not hf.get("tie_word_embeddings", True)}, source=source)
    return cfg


def params_from_hf(cfg: Config, tensors: dict[str, np.ndarray], source: str = "weights") -> dict:
    """Hugging Face weights -> the NeoMesh parameter tree (numpy)."""
    sd = {k: v for k, v in strip_prefix(tensors, ("transformer.",)).items()
          if not k.endswith((".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias"))}
    get = getter(sd, source)
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim

    def norm(prefix):
        return {"scale": get(prefix + ".weight"), "bias": get(prefix + ".bias")}

    def linear(name, transpose=True):
        w = get(name + ".weight")
        return {"kernel": w.T if transpose else w, "bias": get(name + ".bias")}

    blocks = {}
    for i in range(cfg.n_layer):
        b = f"h.{i}."
        if cfg.model == "gpt2":
            qkv_w, qkv_b = get(b + "attn.c_attn.weight"), get(b + "attn.c_attn.bias")  # (D, 3D), (3D,)
            attn = {name: {"kernel": qkv_w[:, j * d:(j + 1) * d].reshape(d, n, h),
                           "bias": qkv_b[j * d:(j + 1) * d].reshape(n, h)} for j, name in enumerate("qkv")}
            attn["out"] = {"kernel": get(b + "attn.c_proj.weight").reshape(n, h, d),
                           "bias": get(b + "attn.c_proj.bias")}
            mlp = {"c_fc": linear(b + "mlp.c_fc", transpose=False), "c_proj": linear(b + "mlp.c_proj", False)}
        else:
            a = b + "attn.attention."
            attn = {name: {"kernel": get(f"{a}{name}_proj.weight").T.reshape(d, n, h)} for name in "qkv"}
            attn["out"] = {"kernel": get(a + "out_proj.weight").T.reshape(n, h, d), "bias": get(a + "out_proj.bias")}
            mlp = {"c_fc": linear(b + "mlp.c_fc"), "c_proj": linear(b + "mlp.c_proj")}
        blocks[i] = {"ln_1": norm(b + "ln_1"), "attn": attn, "ln_2": norm(b + "ln_2"), "mlp": mlp}
    params = {"wte": {"embedding": get("wte.weight")}, "wpe": {"embedding": get("wpe.weight")}, "blocks": blocks,
              "ln_f": norm("ln_f")}
    if cfg.no_weight_tie:
        params["lm_head"] = {"kernel": get("lm_head.weight").T}
    if cfg.task == "sequence_classification" and "score.weight" in sd:
        params["score"] = {"out": {"kernel": get("score.weight").T}}
    elif cfg.task in TOKEN_HEAD_TASKS and f"{token_head(cfg)}.weight" in sd:
        params["token_classifier"] = {"mlp": {"layers": {0: linear(token_head(cfg))}}}
    return params


TOKEN_ROLES = ("bos", "eos", "pad")  # an exported tokenizer's special tokens (convert/hf_tokenizer.py)


def text_processor(cfg: Config, tokenizer):
    """What NeoMesh's data puts around a classifier's text (data/labelled.py ``encode_pairs``, data/token_labels.py:
    end-of-text, or [CLS], before it and end-of-text after), as a tokenizers post-processor for an export; None for
    a language model, whose prompt transformers' generate must see as it is."""
    return None if cfg.task == "causal_lm" else tokenizer.pair_processor()


def check_exportable(cfg: Config) -> None:
    """A one-line error naming the first option transformers' GPT-Neo/GPT-2 cannot hold."""
    unsupported = {"num_mem_kv": cfg.num_mem_kv, "rotary_emb": cfg.rotary_emb, "moe_layers": cfg.moe_layers,
                   "mlp_glu": cfg.mlp_glu, "rezero": cfg.rezero, "macaron": cfg.macaron,
                   "axial_pos_emb": cfg.axial_pos_emb, "position_offset": cfg.position_offset,
                   "norm": cfg.norm_kind != "layernorm", "norm_position": cfg.norm_position != "pre",
                   "dense_bias": not cfg.dense_bias, "causal": not cfg.causal,
                   "task": cfg.task not in HEADS}
    if cfg.model == "gpt_neo":
        unsupported.update(qkv_bias=cfg.qkv_bias, attention_scale=cfg.attention_scale != "unscaled")
    else:
        unsupported.update(qkv_bias=not cfg.qkv_bias)
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"export: {key}={json.dumps(getattr(cfg, key))} has no {cfg.model} equivalent in "
                              "transformers")
    allowed = {"global", "local"} if cfg.model == "gpt_neo" else {"global"}
    if set(cfg.attention_layers) - allowed:
        raise ConfigError(f"export: {cfg.model} has only {' and '.join(sorted(allowed))} layers, not "
                          f"{sorted(set(cfg.attention_layers) - allowed)}")


def config_to_hf(cfg: Config) -> dict:
    """The transformers config (as a dict) of an exportable NeoMesh GPT-Neo or GPT-2 config."""
    check_exportable(cfg)
    gpt2_head, neo_head = HEADS[cfg.task]
    labels = {"id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
              "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)}} if cfg.task != "causal_lm" else {}
    common = {**labels, "vocab_size": cfg.n_vocab, "activation_function": ACTIVATIONS_TO_HF[cfg.activation_function],
              "layer_norm_epsilon": cfg.layer_norm_epsilon, "initializer_range": 0.02, "use_cache": True,
              "tie_word_embeddings": not cfg.no_weight_tie or cfg.task != "causal_lm",  # a classifier has no lm_head
              "classifier_dropout": cfg.head_dropout, "torch_dtype": "float32"}
    if cfg.n_vocab <= GPT2_END_OF_TEXT:  # transformers' default ids would name no token: none, until a tokenizer's
        common.update(bos_token_id=None, eos_token_id=None)
    if cfg.model == "gpt2":
        return {**common, "model_type": "gpt2", "architectures": ["GPT2" + gpt2_head], "n_positions": cfg.position_rows,
                "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.intermediate,
                "resid_pdrop": cfg.res_dropout, "embd_pdrop": cfg.embed_dropout, "attn_pdrop": cfg.attn_dropout}
    return {**common, "model_type": "gpt_neo", "architectures": ["GPTNeo" + neo_head],
            "max_position_embeddings": cfg.position_rows, "hidden_size": cfg.n_embd, "num_layers": cfg.n_layer,
            "num_heads": cfg.n_head, "attention_types": cfg.attention_types or [[["global"], cfg.n_layer]],
            "window_size": cfg.local_attention_radius, "intermediate_size": cfg.intermediate,
            "resid_dropout": cfg.res_dropout, "embed_dropout": cfg.embed_dropout,
            "attention_dropout": cfg.attn_dropout}


def params_to_hf(cfg: Config, params: dict) -> dict[str, np.ndarray]:
    """The NeoMesh parameter tree -> Hugging Face weight names (float32); the tied lm_head is left out."""
    d = cfg.n_embd
    p = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
    out = {"transformer.wte.weight": p["wte/embedding"], "transformer.wpe.weight": p["wpe/embedding"],
           "transformer.ln_f.weight": p["ln_f/scale"], "transformer.ln_f.bias": p["ln_f/bias"]}
    for i in range(cfg.n_layer):
        b, hb = f"blocks/{i}/", f"transformer.h.{i}."
        for name in ("ln_1", "ln_2"):
            out[f"{hb}{name}.weight"], out[f"{hb}{name}.bias"] = p[f"{b}{name}/scale"], p[f"{b}{name}/bias"]
        if cfg.model == "gpt2":
            out[f"{hb}attn.c_attn.weight"] = np.concatenate([p[f"{b}attn/{x}/kernel"].reshape(d, d) for x in "qkv"], 1)
            out[f"{hb}attn.c_attn.bias"] = np.concatenate([p[f"{b}attn/{x}/bias"].reshape(d) for x in "qkv"])
            out[f"{hb}attn.c_proj.weight"] = p[f"{b}attn/out/kernel"].reshape(d, d)
            out[f"{hb}attn.c_proj.bias"] = p[f"{b}attn/out/bias"]
            for name in ("c_fc", "c_proj"):  # Conv1D: (in, out), as NeoMesh stores them
                out[f"{hb}mlp.{name}.weight"] = p[f"{b}mlp/{name}/kernel"]
                out[f"{hb}mlp.{name}.bias"] = p[f"{b}mlp/{name}/bias"]
            continue
        for name in "qkv":
            out[f"{hb}attn.attention.{name}_proj.weight"] = p[f"{b}attn/{name}/kernel"].reshape(d, d).T
        out[f"{hb}attn.attention.out_proj.weight"] = p[f"{b}attn/out/kernel"].reshape(d, d).T
        out[f"{hb}attn.attention.out_proj.bias"] = p[f"{b}attn/out/bias"]
        for name in ("c_fc", "c_proj"):
            out[f"{hb}mlp.{name}.weight"] = p[f"{b}mlp/{name}/kernel"].T
            out[f"{hb}mlp.{name}.bias"] = p[f"{b}mlp/{name}/bias"]
    if cfg.task == "sequence_classification":  # the classifiers hold no lm_head
        out["score.weight"] = p["score/out/kernel"].T
    elif cfg.task in TOKEN_HEAD_TASKS:
        out[f"{token_head(cfg)}.weight"], out[f"{token_head(cfg)}.bias"] = (p["token_classifier/mlp/layers/0/kernel"].T,
                                                                           p["token_classifier/mlp/layers/0/bias"])
    elif cfg.no_weight_tie:
        out["lm_head.weight"] = p["lm_head/kernel"].T
    return out
