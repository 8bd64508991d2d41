"""Hugging Face BERT and RoBERTa <-> NeoMesh ``bert`` / ``roberta`` models.

Encoder weights map one to one (torch Linear weights are (out, in); NeoMesh attention kernels (D, N, H) and
(N, H, D)). Heads map when the checkpoint has them: ``*ForMaskedLM`` carries the MLM head (``cls.predictions`` /
``lm_head``), ``*ForSequenceClassification`` the pooler and classifier, ``*ForTokenClassification`` a per-token
linear ``classifier`` (no pooler), ``*ForQuestionAnswering`` a per-token ``qa_outputs`` of start and end logits
(NeoMesh's token classifier of two labels); a bare ``BertModel`` has none, and a model built for a task whose head the
checkpoint lacks starts that head fresh (the caller says so), but for a BERT classifier's dense layer, which
starts from the checkpoint's pooler where it has one (``BertModel``, ``BertForPreTraining``), as transformers'.
A masked-LM decoder saved untied (``tie_word_embeddings`` false) loads as ``no_weight_tie``.
"""

from __future__ import annotations

import json

import numpy as np

from config import TOKEN_HEAD_TASKS, Config, ConfigError, from_dict
from convert.hf_dir import flatten, getter, strip_prefix, token_head

MODEL_TYPES = ("bert", "roberta")
# transformers' class suffix -> the task of its head (a bare or pretraining model: masked_lm)
HEAD_SUFFIXES = {"ForSequenceClassification": "sequence_classification",
                 "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering"}
ACTIVATIONS_FROM_HF = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu",
                       "silu": "silu", "swish": "silu", "tanh": "tanh"}
ACTIVATIONS_TO_HF = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu",
                     "tanh": "tanh"}


def config_from_hf(hf: dict, source: str = "config.json") -> Config:
    """The NeoMesh config of a BERT or RoBERTa Hugging Face config."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise ConfigError(f"{source}: model_type '{kind}' is not a BERT or RoBERTa model")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS_FROM_HF:
        raise ConfigError(f"{source}: hidden_act '{act}' is not supported (supported: "
                          f"{', '.join(ACTIVATIONS_FROM_HF)})")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{source}: position_embedding_type '{hf['position_embedding_type']}' is not supported "
                          "(absolute)")
    architecture = (hf.get("architectures") or [""])[0]
    task = next((task for suffix, task in HEAD_SUFFIXES.items() if architecture.endswith(suffix)), "masked_lm")
    if kind == "roberta" and not isinstance(hf.get("pad_token_id", 1), int):
        raise ConfigError(f"{source}: pad_token_id {json.dumps(hf['pad_token_id'])}: RoBERTa counts positions from "
                          "pad_token_id + 1, so it must be an id (RoBERTa's is 1)")
    offset = hf.get("pad_token_id", 1) + 1 if kind == "roberta" else 0  # RoBERTa's table reserves the rows below
    hidden_dropout = hf.get("hidden_dropout_prob", 0.1)  # transformers drops the embeddings and each branch with it
    keys = dict(model=kind, n_embd=hf["hidden_size"], n_layer=hf["num_hidden_layers"],
                n_head=hf["num_attention_heads"], d_ff=hf["intermediate_size"], n_vocab=hf["vocab_size"],
                n_ctx=hf["max_position_embeddings"] - offset, position_offset=offset,
                n_token_types=hf.get("type_vocab_size", 2), layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
                activation_function=ACTIVATIONS_FROM_HF[act], res_dropout=hidden_dropout, embed_dropout=hidden_dropout,
                attn_dropout=hf.get("attention_probs_dropout_prob", 0.1),
                classifier_dropout=hf.get("classifier_dropout"), task=task,
                no_weight_tie=hf.get("tie_word_embeddings", True) is False,
                num_labels=len(hf.get("id2label") or {0: 0, 1: 1}))
    cfg, _ = from_dict(keys, source=source)
    return cfg


def params_from_hf(cfg: Config, tensors: dict[str, np.ndarray], source: str = "weights") -> dict:
    """Hugging Face weights -> the NeoMesh parameter tree (numpy), with whichever heads the checkpoint has."""
    sd = strip_prefix(tensors, ("bert.", "roberta."))
    get = getter(sd, source)
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim

    def norm(prefix):
        return {"scale": get(prefix + ".weight"), "bias": get(prefix + ".bias")}

    def linear(name):
        return {"kernel": get(name + ".weight").T, "bias": get(name + ".bias")}

    blocks = {}
    for i in range(cfg.n_layer):
        b = f"encoder.layer.{i}."
        attn = {ours: {"kernel": get(f"{b}attention.self.{theirs}.weight").T.reshape(d, n, h),
                       "bias": get(f"{b}attention.self.{theirs}.bias").reshape(n, h)}
                for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value"))}
        attn["out"] = {"kernel": get(f"{b}attention.output.dense.weight").T.reshape(n, h, d),
                       "bias": get(f"{b}attention.output.dense.bias")}
        blocks[i] = {"attn": attn, "ln_1": norm(f"{b}attention.output.LayerNorm"),
                     "mlp": {"c_fc": linear(f"{b}intermediate.dense"), "c_proj": linear(f"{b}output.dense")},
                     "ln_2": norm(f"{b}output.LayerNorm")}
    params = {"wte": {"embedding": get("embeddings.word_embeddings.weight")},
              "wpe": {"embedding": get("embeddings.position_embeddings.weight")},
              "ln_embed": norm("embeddings.LayerNorm"), "blocks": blocks}
    if cfg.n_token_types:
        params["wtt"] = {"embedding": get("embeddings.token_type_embeddings.weight")}
    mlm = "cls.predictions." if cfg.model == "bert" else "lm_head."
    if f"{mlm}bias" in sd:
        transform = "cls.predictions.transform." if cfg.model == "bert" else "lm_head."
        params["mlm"] = {"dense": linear(f"{transform}dense"), "bias": get(f"{mlm}bias"),
                         "layer_norm": norm(transform + ("LayerNorm" if cfg.model == "bert" else "layer_norm"))}
        if cfg.no_weight_tie:  # its own decoder (tie_word_embeddings false), not the word embeddings
            params["mlm"]["decoder"] = {"kernel": get(f"{mlm}decoder.weight").T}
    if cfg.task in TOKEN_HEAD_TASKS:  # one linear layer on every token, both families
        if f"{token_head(cfg)}.weight" in sd:
            params["token_classifier"] = {"mlp": {"layers": {0: linear(token_head(cfg))}}}
    elif cfg.model == "bert" and "classifier.weight" in sd:
        params["classifier"] = {"dense": linear("pooler.dense"), "out": linear("classifier")}
    elif cfg.model == "bert" and cfg.task == "sequence_classification" and "pooler.dense.weight" in sd:
        # a bare or pretraining BERT: its pooler starts the classifier, as in transformers (the output layer fresh)
        params["classifier"] = {"dense": linear("pooler.dense")}
    elif cfg.model == "roberta" and "classifier.out_proj.weight" in sd:
        params["classifier"] = {"dense": linear("classifier.dense"), "out": linear("classifier.out_proj")}
    return params


def config_to_hf(cfg: Config) -> dict:
    """The transformers config (as a dict) of a NeoMesh BERT or RoBERTa config."""
    unsupported = {"rotary_emb": cfg.rotary_emb, "mlp_glu": cfg.mlp_glu, "moe_layers": cfg.moe_layers,
                   "num_mem_kv": cfg.num_mem_kv, "norm": cfg.norm_kind != "layernorm",
                   "norm_position": cfg.norm_position != "post", "causal": cfg.causal, "rezero": cfg.rezero,
                   "attention_scale": cfg.attention_scale != "inverse_sqrt_head_dim", "qkv_bias": not cfg.qkv_bias,
                   "dense_bias": not cfg.dense_bias, "macaron": cfg.macaron,
                   # BERT counts positions from 0, RoBERTa from pad_token_id + 1 (its config's only way to say it)
                   "position_offset": (cfg.position_offset == 0) == (cfg.model == "roberta")}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"export: {key}={getattr(cfg, key)!r} has no {cfg.model} equivalent in transformers")
    if set(cfg.attention_layers) != {"global"}:
        raise ConfigError(f"export: {cfg.model} has only global layers, not {sorted(set(cfg.attention_layers))}")
    name = "Bert" if cfg.model == "bert" else "Roberta"
    head = {task: suffix for suffix, task in HEAD_SUFFIXES.items()}.get(cfg.task, "ForMaskedLM")
    hf = {"model_type": cfg.model, "architectures": [name + head], "vocab_size": cfg.n_vocab,
          "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
          "intermediate_size": cfg.intermediate, "hidden_act": ACTIVATIONS_TO_HF[cfg.activation_function],
          "max_position_embeddings": cfg.position_rows + cfg.position_offset,
          "type_vocab_size": max(cfg.n_token_types, 1),
          "layer_norm_eps": cfg.layer_norm_epsilon, "hidden_dropout_prob": cfg.res_dropout,
          "attention_probs_dropout_prob": cfg.attn_dropout, "classifier_dropout": cfg.classifier_dropout,
          "initializer_range": 0.02, "position_embedding_type": "absolute", "torch_dtype": "float32",
          "tie_word_embeddings": not (cfg.no_weight_tie and cfg.task == "masked_lm")}
    hf["pad_token_id"] = cfg.position_offset - 1 if cfg.model == "roberta" else 0  # BERT's [PAD]
    if cfg.task in ("sequence_classification", "token_classification"):
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_labels)}
    return hf


TOKEN_ROLES = ("eos", "pad", "unk", "mask", "cls", "sep")  # an exported tokenizer's special tokens


def text_processor(cfg: Config, tokenizer):
    """What NeoMesh's data puts around an encoder's text (and second text), as a tokenizers post-processor for an
    export: ``encode_pairs``'s template (data/labelled.py, data/token_labels.py and Pretrained read text so)."""
    return tokenizer.pair_processor()


def pad_as_tokenizer(cfg: Config, hf: dict, tensors: dict[str, np.ndarray], tokenizer, where: str) -> str | None:
    """Makes a RoBERTa export (``hf`` and ``tensors``, changed in place) pad as the run's ``tokenizer`` does;
    returns a note where transformers cannot match NeoMesh on every input.

    transformers' RobertaEmbeddings takes ``pad_token_id`` for padding wherever it appears in the ids and counts
    the other tokens' positions from ``pad_token_id + 1``; NeoMesh reads padding from ``segment_ids`` and counts
    from ``position_offset``. So ``pad_token_id`` is the tokenizer's pad token, and the position table is shifted
    to put NeoMesh's row ``position_offset + i`` at ``pad_token_id + 1 + i`` (its padding row, ``position_offset -
    1``, at ``pad_token_id``; rows below that are never read: zeros). Where the two agree (RoBERTa's own tokenizer,
    NeoMesh's BPE: pad 1, offset 2) nothing changes. A tokenizer without a pad token pads with end-of-text, which
    also ends every row: ``pad_token_id`` stays ``position_offset - 1``, a token transformers then takes for
    padding wherever it appears."""
    offset = cfg.position_offset
    if tokenizer.padding_id == tokenizer.eos_id:
        return (f"export: the tokenizer {where} has no pad token, so pad_token_id is {offset - 1} (position_offset - "
                f"1: transformers' RoBERTa counts positions from pad_token_id + 1), its token "
                f"{tokenizer.decode([offset - 1])!r}, which transformers takes for padding wherever it appears: the "
                "positions after it differ from NeoMesh's")
    pad = tokenizer.padding_id
    name = "roberta.embeddings.position_embeddings.weight"
    table, shift = tensors[name], pad + 1 - offset  # (position_rows + offset, D)
    if shift > 0:
        table = np.concatenate([np.zeros((shift, table.shape[1]), table.dtype), table])
    tensors[name] = table[-shift:] if shift < 0 else table  # (position_rows + pad + 1, D)
    hf["pad_token_id"], hf["max_position_embeddings"] = pad, cfg.position_rows + pad + 1
    return None


def params_to_hf(cfg: Config, params: dict) -> dict[str, np.ndarray]:
    """The NeoMesh parameter tree -> Hugging Face weight names (float32) of the config's task head; the tied
    decoder weight is left out (transformers ties it to the word embeddings)."""
    d = cfg.n_embd
    p = {k: np.asarray(v, np.float32) for k, v in flatten(params).items()}
    prefix = "bert." if cfg.model == "bert" else "roberta."
    out = {}

    def linear(name, ours):
        out[name + ".weight"], out[name + ".bias"] = p[ours + "/kernel"].T, p[ours + "/bias"]

    def norm(name, ours):
        out[name + ".weight"], out[name + ".bias"] = p[ours + "/scale"], p[ours + "/bias"]

    out[prefix + "embeddings.word_embeddings.weight"] = p["wte/embedding"]
    out[prefix + "embeddings.position_embeddings.weight"] = p["wpe/embedding"]
    # Without token types, transformers' one row (type_vocab_size 1) is added to every token: a zero row adds nothing
    out[prefix + "embeddings.token_type_embeddings.weight"] = p["wtt/embedding"] if cfg.n_token_types else \
        np.zeros((1, cfg.n_embd), np.float32)
    norm(prefix + "embeddings.LayerNorm", "ln_embed")
    for i in range(cfg.n_layer):
        b, ours = f"{prefix}encoder.layer.{i}.", f"blocks/{i}/"
        for theirs, name in (("query", "q"), ("key", "k"), ("value", "v")):
            out[f"{b}attention.self.{theirs}.weight"] = p[f"{ours}attn/{name}/kernel"].reshape(d, d).T
            out[f"{b}attention.self.{theirs}.bias"] = p[f"{ours}attn/{name}/bias"].reshape(d)
        out[f"{b}attention.output.dense.weight"] = p[f"{ours}attn/out/kernel"].reshape(d, d).T
        out[f"{b}attention.output.dense.bias"] = p[f"{ours}attn/out/bias"]
        norm(f"{b}attention.output.LayerNorm", f"{ours}ln_1")
        linear(f"{b}intermediate.dense", f"{ours}mlp/c_fc")
        linear(f"{b}output.dense", f"{ours}mlp/c_proj")
        norm(f"{b}output.LayerNorm", f"{ours}ln_2")
    if cfg.task == "masked_lm":
        head = "cls.predictions." if cfg.model == "bert" else "lm_head."
        transform = head + "transform." if cfg.model == "bert" else head
        linear(transform + "dense", "mlm/dense")
        norm(transform + ("LayerNorm" if cfg.model == "bert" else "layer_norm"), "mlm/layer_norm")
        out[head + "bias"] = p["mlm/bias"]
        if cfg.no_weight_tie:  # transformers then keeps the decoder's bias apart too: the same values
            out[head + "decoder.weight"], out[head + "decoder.bias"] = p["mlm/decoder/kernel"].T, p["mlm/bias"]
    elif cfg.task in TOKEN_HEAD_TASKS:
        linear(token_head(cfg), "token_classifier/mlp/layers/0")
    elif cfg.model == "bert":
        linear(prefix + "pooler.dense", "classifier/dense")
        linear("classifier", "classifier/out")
    else:
        linear("classifier.dense", "classifier/dense")
        linear("classifier.out_proj", "classifier/out")
    return out
