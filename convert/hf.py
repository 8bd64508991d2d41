"""Hugging Face directories as NeoMesh models: load one, import it as a run, export a run back.

Each family's mapping lives in its own file (convert/gpt_neo.py, convert/bert.py, convert/t5.py, convert/vit.py);
``MAPPINGS`` picks it by the HF config's ``model_type`` on the way in and by the NeoMesh config's ``model`` on the
way out.
"""

from __future__ import annotations

import json
import os
import re
import sys

import jax
import numpy as np

from config import Config, ConfigError
from convert import bert, gpt_neo, hf_tokenizer, t5, vit
from convert.hf_dir import TOKENIZER_FILES, flatten, load_tokenizer, read_hf_dir, restore_replaced, write_hf_dir
from neomesh import label_names
from neomesh.paths import run_tokenizer_dir

MAPPINGS = {model_type: module for module in (gpt_neo, bert, t5, vit) for model_type in module.MODEL_TYPES}


def _mapping(model_type: str, source: str):
    if not isinstance(model_type, str) or model_type not in MAPPINGS:
        raise ConfigError(f"{source}: model_type '{model_type}' is not supported (supported: "
                          f"{', '.join(MAPPINGS)})")
    return MAPPINGS[model_type]


# The config.json keys NeoMesh's keys are read from, across the families (for errors that name the file's key).
HF_NAMES = {"n_ctx": ("max_position_embeddings", "n_positions"), "n_embd": ("hidden_size", "n_embd", "d_model"),
            "n_layer": ("num_hidden_layers", "num_layers", "n_layer"), "n_vocab": ("vocab_size",),
            "n_head": ("num_attention_heads", "num_heads", "n_head"), "d_ff": ("intermediate_size", "n_inner", "d_ff"),
            "layer_norm_epsilon": ("layer_norm_epsilon", "layer_norm_eps"), "local_attention_radius": ("window_size",),
            "n_decoder_layer": ("num_decoder_layers",),
            "res_dropout": ("hidden_dropout_prob", "resid_dropout", "resid_pdrop", "dropout_rate"),
            "embed_dropout": ("hidden_dropout_prob", "embed_dropout", "embd_pdrop", "dropout_rate"),
            "attn_dropout": ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop", "dropout_rate"),
            "classifier_dropout": ("classifier_dropout",)}


def _config_of(hf: dict, source: str) -> Config:
    """The NeoMesh config of a config.json's content: a key missing or of another type than transformers writes
    is one line naming the file (the families' mappings index and compute with the values)."""
    mapping = _mapping(hf.get("model_type"), source)
    try:
        cfg = mapping.config_from_hf(hf, source)
        if hf.get("problem_type") == "regression" and not cfg.regression:  # transformers: MSE over every output
            raise ConfigError(f"{source}: problem_type regression with num_labels {cfg.num_labels} ({cfg.task}); "
                              "NeoMesh's regression is a sequence classifier's one score (num_labels 1)")
        if hf.get("problem_type") == MULTI_LABEL:
            return multi_label_of(cfg, source)
        if cfg.task == "question_answering":  # the question-answering pipeline's: at most half a window, else a
            cfg = cfg.replace(doc_stride=min(cfg.doc_stride, cfg.n_ctx // 2))  # short n_ctx answers nothing
        return cfg
    except ConfigError as e:  # a NeoMesh key's check: named as the file's key it was read from
        key, sep, why = str(e).partition(": ")
        theirs = next((name for name in HF_NAMES.get(key, ()) if name in hf), None)
        if not sep or str(e).startswith(source):
            raise
        raise ConfigError(f"{source}: {theirs}: {why} (read as NeoMesh's {key})" if theirs else f"{source}: {e}") \
            from None
    except KeyError as e:
        raise ConfigError(f"{source}: no {e.args[0]!r} (a {hf['model_type']} config.json has it, as transformers "
                          "writes it)") from None
    except (TypeError, AttributeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{source}: a value of another type than transformers writes ({e})") from None


MULTI_LABEL = "multi_label_classification"  # transformers' problem_type: one sigmoid per label, BCEWithLogitsLoss


def multi_label_of(cfg: Config, source: str) -> Config:
    """``cfg`` of a config.json whose problem_type is multi_label_classification: a sequence classifier's is
    multi-label; an image classifier's (ViT's BCE loss) is refused, as NeoMesh's image classifiers are single-label;
    the other heads' losses ignore it in transformers too."""
    if cfg.task == "sequence_classification" and cfg.num_labels >= 2:
        return cfg.replace(multi_label=True)
    if cfg.task in ("sequence_classification", "image_classification"):
        raise ConfigError(f"{source}: problem_type {MULTI_LABEL} with num_labels {cfg.num_labels} ({cfg.task}); "
                          "NeoMesh's multi-label classifiers are sequence classifiers of 2 or more labels")
    return cfg


def hf_config(hf_dir: str) -> Config:
    """The NeoMesh config of a Hugging Face model directory, from its config.json alone (no weights read)."""
    from convert.hf_dir import not_a_model_directory
    from neomesh.json_file import read_json

    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise not_a_model_directory(hf_dir)
    hf = read_json(path)
    if not isinstance(hf, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return with_preprocessing(_config_of(hf, path), hf_dir)


def with_preprocessing(cfg: Config, hf_dir: str) -> Config:
    """``cfg`` with the input normalisation of ``hf_dir``'s image processor (a ViT's image_mean and image_std)."""
    return cfg.replace(**vit.normalisation_from_hf(hf_dir, cfg.num_channels)) if cfg.model == "vit" else cfg


def load_hf(hf_dir: str, task: str | None = None) -> tuple[Config, dict]:
    """(NeoMesh config, parameter tree of float32 numpy arrays) of a Hugging Face model directory. ``task``: the
    task a run fine-tunes it for, whose head may start from weights a checkpoint without a task head keeps (a BERT
    classifier's dense layer from a bare BertModel's pooler)."""
    return model_of(hf_dir, *read_hf_dir(hf_dir), task=task)


def model_of(hf_dir: str, hf_config: dict, tensors: dict, task: str | None = None) -> tuple[Config, dict]:
    """``load_hf`` of what ``read_hf_dir(hf_dir)`` read: its config.json's content and its weights."""
    source = f"{hf_dir}/config.json"
    mapping = _mapping(hf_config.get("model_type"), source)
    cfg = with_preprocessing(_config_of(hf_config, source), hf_dir)
    headless = task is not None and cfg.task == "masked_lm"  # a bare or pretraining encoder: no task head
    try:
        # a question-answering head's two outputs are start and end, whatever labels a bare model's config names
        head = dict(task=task, num_labels=2) if task == "question_answering" else dict(task=task)
        return cfg, mapping.params_from_hf(cfg.replace(**head) if headless else cfg, tensors, hf_dir)
    except ValueError as e:  # a reshape to the shape config.json gives
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{hf_dir}: the weights do not have the shapes its config.json gives (n_embd {cfg.n_embd}, "
                          f"n_head {cfg.n_head}, n_layer {cfg.n_layer}): {e}; were they saved together?") from None


def check_finite(params: dict, what: str) -> None:
    """A one-line error naming the first parameter holding NaN or infinity."""
    from convert.hf_dir import flatten

    for name, value in flatten(params).items():
        if not np.all(np.isfinite(np.asarray(value, np.float32))):
            raise ConfigError(f"{what}: parameter {name} holds NaN or infinity; nothing was written")


def import_hf(hf_dir: str, model_path: str) -> Config:
    """Writes MODEL_PATH/config.json, a step-0 checkpoint (fresh optimizer state) and, when ``hf_dir`` has one,
    MODEL_PATH/tokenizer/, so predict.py --model-path and train.py (fine-tuning) both start from the imported
    weights. ``hf_dir`` may be ORG/NAME from the local Hugging Face cache."""
    import jax

    from convert.hf_dir import copy_tokenizer, has_tokenizer
    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from training.checkpoint import Checkpoints
    from neomesh.hf_cache import resolve_model
    from training.optimizer import make_optimizer

    hf_dir = resolve_model(hf_dir, "import")  # a directory, or a name from the local Hugging Face cache
    hf_config, tensors = read_hf_dir(hf_dir)  # config.json read once: the model's keys and its label names
    cfg, params = model_of(hf_dir, hf_config, tensors)
    cfg = cfg.replace(model_path=model_path)
    tokenizer = has_tokenizer(hf_dir)
    if cfg.reads_text and not tokenizer:
        # The model's tokenizer is hf_dir's, which has none: predict.py says so, rather than reading text with
        # the default dataset's tokenizer (a run without tokenizer/ falls back to it).
        cfg = cfg.replace(tokenizer_path=hf_dir)
    if os.path.exists(model_path) and not os.path.isdir(model_path):
        raise ConfigError(f"import: {model_path} is a file, not a directory")
    existing = os.path.join(model_path, "checkpoints")
    if os.path.isdir(existing) and any(name.isdigit() for name in os.listdir(existing)):  # a save in flight: none
        raise ConfigError(f"{model_path}: already holds a run's checkpoints; import into a new directory")
    run_tokenizer_dir(model_path)
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, state, _ = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), layout,
                                     cfg.seed, params=params)
    # The checkpoint last: it makes the directory a run, so an import killed before it can be redone, and a run
    # never lacks its tokenizer (predict.py would read text with the default dataset's, without a word).
    try:
        os.makedirs(model_path, exist_ok=True)
        if tokenizer:
            copy_tokenizer(hf_dir, run_tokenizer_dir(model_path))
        names = label_names.from_hf(hf_config)
        if names and len(names) == cfg.num_labels:  # kept for the run's export
            label_names.save(model_path, names)
        config_path = os.path.join(model_path, "config.json")
        with open(config_path + ".tmp", "w") as f:
            json.dump({k: v for k, v in cfg.to_dict().items() if v is not None}, f, indent=2)
        os.replace(config_path + ".tmp", config_path)
    except OSError as e:
        raise ConfigError(f"{e.filename or model_path}: {e.strerror}") from None
    with Checkpoints(model_path, cfg.keep_checkpoints) as checkpoints:
        checkpoints.save(0, state, cfg.to_dict())
    return cfg


def per_layer(cfg: Config, params: dict) -> dict:
    """The parameters of a ``share_parameters`` model, which live in the first block that has each
    (models/block.share_parameters), as the same model without sharing holds them: every block's own copy."""
    from flax import traverse_util

    from models import registry
    from parallel.state import abstract_model

    held = flatten(params)

    def source(path: str) -> str:  # <stack>/blocks/<i>/<rest> not held: the first block's <rest> that is
        if path in held:
            return path
        stack, layer, rest = re.fullmatch(r"(.*blocks)/(\d+)/(.*)", path).groups()
        return next(f"{stack}/{j}/{rest}" for j in range(int(layer)) if f"{stack}/{j}/{rest}" in held)

    unshared = abstract_model(lambda rngs: registry.build(cfg.replace(share_parameters=False), rngs))[1]
    return traverse_util.unflatten_dict({path: held[source(path)] for path in flatten(unshared)}, sep="/")


def export_params(cfg: Config, params: dict, hf_dir: str, tokenizer_dir: str | None = None,
                  labels: list[str] | None = None, eos_id: int | None = None) -> None:
    """Writes ``params`` of a ``cfg`` model as a Hugging Face directory of its family (from_pretrained loads it);
    a classifier's ``labels`` (names in id order) become its ``id2label``; ``eos_id``: the end-of-text id of a
    run without a tokenizer folder (the bytes tokenizer's 256), so transformers' generate stops at it. The files
    of ``tokenizer_dir`` are copied; one of NeoMesh's own gets what AutoTokenizer needs (convert/hf_tokenizer.py)."""
    mapping = _mapping(cfg.model, "export: model")
    if cfg.activation_function not in mapping.ACTIVATIONS_TO_HF:
        raise ConfigError(f"export: activation_function {cfg.activation_function!r} has no Hugging Face equivalent")
    if cfg.head_hidden:
        raise ConfigError("export: head_hidden: Hugging Face's classifiers are one linear layer, this head is an MLP")
    if cfg.attention_fn:
        raise ConfigError(f"export: attention_fn {cfg.attention_fn}: Hugging Face's {cfg.model} computes with its "
                          "built-in attention, which these weights were not trained with")
    hf_config = mapping.config_to_hf(cfg)
    if cfg.regression:  # what transformers infers from num_labels 1, said outright for every reader of the config
        hf_config["problem_type"] = "regression"
    if cfg.multi_label:  # transformers would infer single-label classification from integer labels
        hf_config["problem_type"] = MULTI_LABEL
    if labels and "id2label" in hf_config:
        hf_config.update(label_names.to_hf(labels))
    params = jax.tree.map(np.asarray, params)
    if cfg.share_parameters:
        params = per_layer(cfg, params)
        print(f"note: export: share_parameters: each of the {cfg.n_layer} layers gets a copy of the one set of block "
              "weights (Hugging Face's families hold weights per layer; imported back, the layers train apart)",
              file=sys.stderr, flush=True)
    check_finite(params, "export")
    tensors = mapping.params_to_hf(cfg, params)
    extra = {vit.PREPROCESSOR: vit.preprocessor_to_hf(cfg)} if cfg.model == "vit" else {}
    if tokenizer_dir:
        extra.update(fit_to_tokenizer(cfg, hf_config, tensors, tokenizer_dir, mapping))
    elif eos_id is not None:
        hf_config["eos_token_id"] = eos_id
        _default_bos(hf_config, eos_id)
    write_hf_dir(hf_dir, hf_config, tensors, tokenizer_dir, extra)


def _default_bos(hf_config: dict, eos_id: int) -> None:
    """A family without a start token of its own starts with end-of-text, as GPT-2's vocabulary does."""
    if hf_config.get("bos_token_id") is None:
        hf_config["bos_token_id"] = eos_id


def fit_to_tokenizer(cfg: Config, hf_config: dict, tensors: dict, tokenizer_dir: str, mapping) -> dict[str, dict]:
    """Gives ``hf_config`` (and a RoBERTa's ``tensors``) the ids of the tokenizer in ``tokenizer_dir``; returns the
    tokenizer files to write over the copied ones ({} for a tokenizer imported with its tokenizer_config.json)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    hf_config["eos_token_id"] = tokenizer.eos_id
    _default_bos(hf_config, tokenizer.eos_id)
    if cfg.model in gpt_neo.MODEL_TYPES and cfg.task == "sequence_classification" and \
            tokenizer.padding_id != tokenizer.eos_id:
        # transformers pools each row's last token that is not pad_token_id; padding with end-of-text, which
        # also ends each NeoMesh row, it would pool the token before it: left out, it pools the last (batch 1)
        hf_config["pad_token_id"] = tokenizer.padding_id
    if cfg.model == "bert" and tokenizer.padding_id != tokenizer.eos_id:
        # transformers' BERT never trains pad_token_id's embedding row: the pad token's, not id 0 (a NeoMesh
        # BPE's end-of-text, which starts and ends every row)
        hf_config["pad_token_id"] = tokenizer.padding_id
    if cfg.model == "t5":  # T5's own vocabulary pads with id 0; generate pads finished rows with pad_token_id
        hf_config["pad_token_id"] = tokenizer.padding_id
    note = bert.pad_as_tokenizer(cfg, hf_config, tensors, tokenizer, tokenizer_dir) if cfg.model == "roberta" else None
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return hf_tokenizer.tokenizer_files(cfg, tokenizer, mapping) if hf_tokenizer.is_own(tokenizer_dir) else {}


# what write_hf_dir leaves
EXPORT_FILES = frozenset(("config.json", "model.safetensors", vit.PREPROCESSOR, *TOKENIZER_FILES))


def check_export_dir(hf_dir: str, files: frozenset = EXPORT_FILES,
                     required: tuple[str, ...] = ("config.json", "model.safetensors")) -> None:
    """Refuses an export directory that holds anything but a previous export (which export replaces: ``required``
    and others of ``files``), and one whose parent is not writable (where it is staged)."""
    from convert.hf_dir import check_staging_place

    if os.path.exists(hf_dir) and not os.path.isdir(hf_dir):
        raise ConfigError(f"export: {hf_dir} is a file, not a directory")
    check_staging_place(hf_dir)
    names = set(os.listdir(hf_dir)) if os.path.isdir(hf_dir) else set()
    names -= {name + ".tmp" for name in files}  # an earlier version's export, killed mid-write: replaced too
    if names and not (set(required) <= names and names <= files):
        other = sorted(names - files) or sorted(set(required) - names)
        what = f"holds {other[0]}" if names - files else f"has no {other[0]}"
        raise ConfigError(f"export: {hf_dir} is not empty and not a previous export (it {what}); export into a new "
                          "or empty directory")


def check_export_sources(cfg: Config, model_path: str, hf_dir: str) -> None:
    """Refuses to write over what the run reads: its init_from base (a LoRA run's logits would change) or the
    directory its tokenizer comes from."""
    from neomesh.hf_cache import resolve_model

    target = os.path.realpath(hf_dir)
    sources = [("init_from", cfg.init_from), ("tokenizer_path", cfg.tokenizer_path),
               ("tokenizer", os.path.join(model_path, "tokenizer"))]
    for key, source in sources:
        if not source:
            continue
        try:
            directory = resolve_model(source, key) if key == "init_from" else source
        except ConfigError:  # a base that is gone is not this directory
            continue
        if os.path.isfile(directory):
            directory = os.path.dirname(directory)  # a tokenizer.json
        elif key == "tokenizer_path" and not os.path.isdir(directory):
            continue  # "bytes", or a name data/tokenizer.py resolves: no directory of the user's
        if os.path.realpath(directory) == target:
            raise ConfigError(f"export: {hf_dir} is the run's {key} ({source}), which it reads; export into "
                              "another directory")


def export_hf(model_path: str, hf_dir: str) -> Config:
    """Restores the latest checkpoint of MODEL_PATH on one device and writes an HF directory of its family.
    ``hf_dir`` must be new, empty or a previous export (replaced); never the run's init_from or tokenizer."""
    from data.tokenizer import ByteTokenizer
    from pretrained import load_run

    if not os.path.isdir(model_path):
        raise ConfigError(f"export: {model_path}: no such directory (a NeoMesh run directory)")
    restore_replaced(hf_dir)  # the previous export, back in place if an export was killed while replacing it
    check_export_dir(hf_dir)

    def check(cfg: Config) -> None:  # before the weights are restored (minutes for a big run)
        check_export_sources(cfg, model_path, hf_dir)
        parts = [part for part in ("prefix", "adapter") if part in (cfg.peft_settings or {})]
        if parts:
            raise ConfigError(f"export: {model_path} trains {' and '.join(f'peft.{p}' for p in parts)}, which "
                              f"change{'s' * (len(parts) == 1)} the computation rather than a weight, so no Hugging "
                              "Face model of its family holds it (only LoRA runs export, merged); "
                              "training.peft.weights.save_adapter writes its parameters")

    tokenizer_dir = run_tokenizer_dir(model_path)  # before the checkpoint is read
    cfg, graphdef, params = load_run(model_path, check_config=check)
    if cfg.peft is not None:  # LoRA folded into the base weights, the factors dropped: the base family's layout
        from training.peft.weights import merged_params

        params, cfg = merged_params(graphdef, params), cfg.replace(peft=None)
    # A ViT's tokenizer/ is not read (an older import left it empty).
    own_tokenizer = cfg.reads_text and os.path.isdir(tokenizer_dir)
    export_params(cfg, params, hf_dir, tokenizer_dir if own_tokenizer else None,
                  label_names.load(model_path, cfg.num_labels),
                  eos_id=ByteTokenizer.eos_id if cfg.reads_text and not own_tokenizer and reads_bytes(cfg) else None)
    if cfg.reads_text and not own_tokenizer:
        print(f"note: {no_tokenizer_note(cfg, model_path, hf_dir)}", file=sys.stderr, flush=True)
    return cfg


def reads_bytes(cfg: Config) -> bool | None:
    """Whether a run reads its text as UTF-8 bytes (the "bytes" tokenizer); None where that cannot be told."""
    from data.source import configured_tokenizer

    path = configured_tokenizer(cfg)
    return None if path is None else path == "bytes"


def no_tokenizer_note(cfg: Config, model_path: str, hf_dir: str) -> str:
    """What an export of a text model without a tokenizer/ folder says: transformers loads the weights, but
    nothing there turns text into ids. The "bytes" tokenizer is not written as a tokenizer.json: one would read a
    typed "<|endoftext|>" as the end-of-text id 256 where NeoMesh reads its 13 bytes (the tokenizers library
    always matches its special tokens in text; the switch that stops it, encode_special_tokens, is not saved)."""
    if reads_bytes(cfg):
        return (f"{hf_dir} has no tokenizer: {model_path} reads text as UTF-8 bytes (tokenizer 'bytes': ids "
                "0..255, end-of-text 256), which no tokenizer.json reproduces exactly; transformers takes its ids "
                "(list(text.encode('utf-8'))), and predict.py --model-path, eval.py and Pretrained read text with "
                f"the run itself ({model_path})")
    return (f"{hf_dir} has no tokenizer: {model_path} has no tokenizer/ folder; put the model's tokenizer files "
            f"in {hf_dir} before --hf-model, Pretrained or transformers' pipelines read text with it")
