"""The model a run starts from (``init_from``): a Hugging Face directory (or ORG/NAME, resolved before) or a
NeoMesh run directory, read the same way: its config, its weights, its tokenizer and its label names.

``init_new_head`` starts a classifier on another classifier's backbone with a fresh head of ``num_labels``
(transformers' ``ignore_mismatched_sizes``): the head's output layer, the parameters whose shape follows
``num_labels``, is left out of the weights so it takes the model's init, and the old head's label names go with it.
"""

from __future__ import annotations

import os

from config import MODEL_VALUE, Config, ConfigError, shipped_configs_of

# A run's model keys that a Hugging Face model of its family fixes by its family alone: from a run they come with
# its weights too (ARCHITECTURE are those a config.json holds).
RUN_ARCHITECTURE = ("norm", "scalenorm", "rezero", "macaron", "axial_pos_emb", "dense_bias", "num_mem_kv",
                    "moe_layers", "moe_params", "moe_activation", "rotary_emb", "rotary_emb_fraction", "rotary_style",
                    "attention_fn", "attention_fn_layers", "share_parameters")
CLASSIFIERS = ("sequence_classification", "token_classification", "image_classification")


def is_run(path: str) -> bool:
    """Whether ``path`` is a NeoMesh run directory (it has checkpoints/) rather than a Hugging Face one."""
    return os.path.isdir(os.path.join(path, "checkpoints"))


def adapter_base(path: str) -> str | None:
    """The base model directory of a Hugging Face peft adapter directory ``path`` (its base_model_name_or_path,
    a directory or ORG/NAME from the local cache); None when ``path`` is no adapter directory."""
    from convert.peft_adapter import adapter_base as named_base, is_adapter_dir

    if not is_adapter_dir(path) or is_run(path):
        return None
    from neomesh.hf_cache import resolve_model

    return resolve_model(named_base(path), f"{path}: base_model_name_or_path")


def source_config(path: str) -> Config:
    """The config of the model in ``path``, without reading its weights (a peft adapter's: its base's)."""
    base = adapter_base(path)
    if base is not None:
        return source_config(base)
    if not is_run(path):
        from convert.hf import hf_config

        return hf_config(path)
    from config import from_dict
    from training.checkpoint import Checkpoints

    with Checkpoints(path, keep=1, read_only=True) as checkpoints:
        step = checkpoints.latest_step()
        if step is None:
            raise ConfigError(f"{path}: a NeoMesh run directory with no checkpoint to start from")
        return from_dict(checkpoints.located_config(step), source=f"{path} checkpoint config")[0]


def source_params(path: str, task: str | None = None) -> tuple[Config, dict]:
    """(config, parameter tree of float32 numpy arrays) of the model in ``path``; ``task``: the one a run
    fine-tunes it for (``convert.hf.load_hf``). A peft adapter directory's are its base's with the adapter's LoRA
    factors, and its config has the adapter's ``peft`` setting."""
    base = adapter_base(path)
    if base is not None:
        from convert.peft_adapter import adapter_params

        return adapter_params(*source_params(base, task), path)
    if not is_run(path):
        from convert.hf import load_hf

        return load_hf(path, task)
    import jax
    import numpy as np

    from pretrained import load_run

    cfg, graphdef, params = load_run(path)
    if cfg.peft is not None:  # LoRA folded into the kernels, as export does; the new run's peft is its own
        from training.peft.weights import merged_params

        parts = [part for part in ("prefix", "adapter") if part in cfg.peft_settings]
        if parts:  # without them the new run would compute another model
            raise ConfigError(f"--init-from {path}: it trains {' and '.join(f'peft.{p}' for p in parts)}, which "
                              f"change{'s' * (len(parts) == 1)} the computation rather than a weight, so a new run "
                              f"cannot start from it (only LoRA merges into the weights); go on with it in its own "
                              f"directory (--model-path {path})")
        params, cfg = merged_params(graphdef, params), cfg.replace(peft=None)
    return cfg, jax.tree.map(lambda p: np.asarray(p, np.float32), params)


def source_tokenizer(path: str) -> str | None:
    """What ``tokenizer_path`` reads text with for the model in ``path``: a Hugging Face directory itself (where
    a missing tokenizer is then named), a run's ``tokenizer/``, else the tokenizer the run read its text with
    ("bytes", or its dataset's); None where that cannot be told. A peft adapter directory's: its own, else its
    base's."""
    base = adapter_base(path)
    if base is not None:
        from convert.hf_dir import has_tokenizer

        return path if has_tokenizer(path) else source_tokenizer(base)
    if not is_run(path):
        return path
    from convert.hf_dir import has_tokenizer
    from neomesh.paths import run_tokenizer_dir

    own = run_tokenizer_dir(path)
    if has_tokenizer(own):
        return own
    from data.source import configured_tokenizer

    return configured_tokenizer(source_config(path))


def has_tokenizer(path: str | None) -> bool:
    """Whether ``source_tokenizer``'s answer names a tokenizer that is there."""
    from convert.hf_dir import has_tokenizer as holds_one

    return path is not None and (path == "bytes" or os.path.isfile(path) or holds_one(path))


def source_labels(path: str) -> list[str] | None:
    """The label names of the classifier in ``path`` (a Hugging Face ``id2label``, a run's labels.json)."""
    import json

    from neomesh import label_names

    path = adapter_base(path) or path
    if is_run(path):
        try:
            return label_names.load(path, source_config(path).num_labels)
        except ConfigError:
            return None
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return label_names.from_hf(json.load(f))
    except (OSError, ValueError):
        return None


def may_lack_head(path: str, theirs: Config) -> bool:
    """Whether the model in ``path`` may have no classifier for all its config says: a ViT config.json gives
    image_classification with transformers' default two labels whether or not it is a bare ViTModel (its
    ``architectures`` tell, where they are written; the weights tell for sure)."""
    if theirs.model != "vit" or is_run(path):
        return False
    import json

    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return True
    return not any(str(name).endswith("ForImageClassification") for name in architectures)


def check_head(cfg: Config, theirs: Config, where: str, headless: bool = False) -> None:
    """A one-line error when ``cfg`` fine-tunes ``theirs``'s classifier with another label count, or single-label
    where it is multi-label or the other way round, and does not ask for a new head; ``headless``: ``theirs`` has
    no classifier, whatever its config's label count."""
    if theirs.task == cfg.task and cfg.task in CLASSIFIERS and theirs.num_labels != cfg.num_labels \
            and not cfg.init_new_head and not headless:
        has = "one output (a regression)" if theirs.regression else f"{theirs.num_labels} labels"
        raise ConfigError(f"{where} {cfg.init_from}: its classifier has {has}, but num_labels "
                          f"is {cfg.num_labels}; --set init_new_head=true keeps its backbone and starts a new head "
                          f"of {cfg.num_labels} (--set num_labels={theirs.num_labels} fine-tunes its head)")
    if theirs.task == cfg.task and theirs.multi_label != cfg.multi_label and not cfg.init_new_head and not headless:
        kinds = {True: "multi-label (a sigmoid per label)", False: "single-label (a softmax over labels)"}
        raise ConfigError(f"{where} {cfg.init_from}: its classifier is {kinds[theirs.multi_label]}, but multi_label is "
                          f"{str(cfg.multi_label).lower()}; --set multi_label={str(theirs.multi_label).lower()} "
                          "fine-tunes its head (--set init_new_head=true starts a new one)")


def head_names(cfg: Config) -> list[str]:
    """The path names of the head's output layer: the parameters whose shape follows ``num_labels``."""
    import jax

    from parallel.state import abstract_model, path_name
    from training.peft import build_model

    def shapes(num_labels: int) -> dict:
        c = cfg.replace(num_labels=num_labels)
        leaves = jax.tree_util.tree_leaves_with_path(abstract_model(lambda rngs: build_model(c, rngs))[1])
        return {path_name(path): leaf.shape for path, leaf in leaves}

    ours, other = shapes(cfg.num_labels), shapes(cfg.num_labels + 1)
    return sorted(name for name, shape in ours.items() if other.get(name) != shape)


def initialised_notes(source: str, missing: list[str], unused: list[str]) -> list[str]:
    """The lines saying what a run took from ``source``: the parameters it lacks (fresh) and those it has to spare.
    A task head it lacks has a line of its own, so the summary of LoRA factors or other fresh parts never hides it
    (transformers warns the same way: "newly initialized: ['score.weight']")."""
    from training.peft.trainable import PARTS

    head = [name for name in missing if PARTS["head"](name.split("/"))]
    rest = [name for name in missing if name not in head]
    lines = [f"initialised from {source}" + (f"; fresh (not in it): {summary(rest)}" if rest else "")
             + (f"; unused (this task has no place for them): {', '.join(unused)}" if unused else "")]
    if head:
        lines.append(f"warning: {source} has no task head; initialised fresh (train it before use): "
                     f"{', '.join(head)}")
    return lines


def summary(names: list[str], most: int = 8) -> str:
    """Parameter names for a one-line note: the first ``most``, then how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def without_head(cfg: Config, params: dict) -> tuple[dict, list[str]]:
    """``params`` without the head's output layer (it starts from the model's init), and its path names."""
    from parallel.state import split_params

    names = head_names(cfg)
    return split_params(params, lambda name: name not in names)[0], names


ARCHITECTURE = ("n_embd", "n_layer", "n_head", "n_vocab", "n_ctx", "n_positions", "attention_types",
                "activation_function", "no_weight_tie", "qkv_bias", "attention_scale", "d_ff", "norm_position",
                "n_token_types", "local_attention_radius", "layer_norm_epsilon", "position_offset", "mlp_glu",
                # T5's and ViT's own (a T5's n_ctx is only its data's length: relative positions hold no table)
                "n_decoder_layer", "d_kv", "relative_attention_num_buckets", "relative_attention_max_distance",
                "decoder_start_token_id", "image_size", "patch_size", "num_channels",
                "image_mean", "image_std")  # a ViT's input normalisation: what its weights were trained on


def with_architecture_of(cfg: Config, where: str, notes: list[str]) -> Config:
    """``cfg`` with the shape of the Hugging Face model it starts from (``init_from``), as from_pretrained takes
    it from the checkpoint; each key that changes gets a note. The model family must be the same (one-line error
    otherwise)."""
    import json

    theirs = source_config(cfg.init_from)
    if theirs.model == "t5":  # relative positions: any length
        theirs = theirs.replace(n_ctx=cfg.n_ctx)
    elif theirs.learned_position_table and cfg.n_ctx < theirs.position_rows:
        # Fine-tuning on shorter sequences than the model's position table (transformers' max_seq_length): the
        # table stays whole, the config's n_ctx is the length trained on.
        theirs = theirs.replace(n_ctx=cfg.n_ctx, n_positions=theirs.position_rows)
    if theirs.model != cfg.model:
        from models.registry import FAMILIES

        shipped = shipped_configs_of(theirs.model)
        # gpt2/gpt_neo and bert/roberta share a module: the config's task and data go on with --set model=
        same_module = FAMILIES[theirs.model][0] == FAMILIES[cfg.model][0]
        raise ConfigError(f"{where} {cfg.init_from}: a {theirs.model} model, but the config's model is {cfg.model}; "
                          + (f"--set model={theirs.model} keeps this config's task and data, or " if same_module
                             else "") + f"name a config of the {theirs.model} family with --config" +
                          (f" (shipped: {', '.join(shipped)})" if shipped else ""))
    check_head(cfg, theirs, where, may_lack_head(cfg.init_from, theirs))  # imported_params checks the weights
    keys = ARCHITECTURE + (RUN_ARCHITECTURE if is_run(cfg.init_from) else ())
    changes = {key: getattr(theirs, key) for key in keys if getattr(theirs, key) != getattr(cfg, key)}
    new = cfg.replace(**changes)
    if adapter_base(cfg.init_from) is not None:  # a peft adapter: its LoRA goes on training
        new = with_lora_of_adapter(new, theirs, where, notes)
    # Another spelling of the same model (d_ff 768 for null at n_embd 192, attention_types in full) is no change.
    changed = {key: value for key, value in changes.items()
               if getattr(new, MODEL_VALUE.get(key, key)) != getattr(cfg, MODEL_VALUE.get(key, key))}
    if changed:
        notes.append(f"{where}: the model's shape is {cfg.init_from}'s: " + ", ".join(
            f"{key} {json.dumps(value)}" for key, value in changed.items()))
    return new


def with_lora_of_adapter(cfg: Config, base: Config, where: str, notes: list[str]) -> Config:
    """``cfg`` with the LoRA setting (targets, rank, alpha, dropout) of the peft adapter ``init_from`` on ``base``;
    its other ``peft`` keys (trainable, checkpoint) as they were. A LoRA setting that changes (or comes where the
    config had none) gets a note."""
    import json

    from config import check_peft
    from convert.peft_adapter import lora_of_adapter

    lora = lora_of_adapter(base, cfg.init_from)[0]["lora"]
    if (cfg.peft_settings or {}).get("lora") != check_peft({"lora": lora})["lora"]:  # none: it trained all
        notes.append(f"{where}: peft.lora is the adapter's: {json.dumps(lora)}")
    return cfg.replace(peft={**(cfg.peft or {}), "lora": lora})


def imported_params(cfg: Config, hf_dir: str) -> dict:
    """The weights of the model ``cfg`` starts from (a Hugging Face directory or a NeoMesh run) for ``cfg``'s
    model; a one-line error if its shape differs. With ``init_new_head``, without the head's output layer."""
    theirs, params = source_params(hf_dir, cfg.task)
    keys = ["model", "n_embd", "n_layer", "n_head", "n_vocab", "attention_layers", "activation_function",
            "no_weight_tie", "qkv_bias", "attention_scale", "intermediate", "norm_position", "n_token_types"] + (
        ["local_attention_radius"] if "local" in cfg.attention_layers else []) + (
        [] if cfg.model == "t5" else ["position_rows"])  # T5's relative positions fit any length
    for key in keys:
        if getattr(theirs, key) != getattr(cfg, key):
            raise ConfigError(f"--init-from {hf_dir}: {key} is {getattr(theirs, key)} there but "
                              f"{getattr(cfg, key)} in the config")
    # A bare ViTModel has no classifier (it starts fresh), only its config's default id2label of 2 labels.
    headless = cfg.model == "vit" and "classifier" not in params
    check_head(cfg.replace(init_from=hf_dir), theirs, "--init-from", headless)
    return without_head(cfg, params)[0] if cfg.init_new_head else params
