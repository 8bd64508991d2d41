"""Hugging Face ``peft`` LoRA adapter directories <-> NeoMesh LoRA runs and models.

A peft adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors``: for each adapted
module ``base_model.model.<module>.lora_A.weight`` (R, in) and ``lora_B.weight`` (out, R), computing
``W x + (lora_alpha / r) B A x`` as NeoMesh's ``LoraEinsum`` does, plus whole copies of the modules that train
beside them (``modules_to_save``: a task head). NeoMesh's factors are A (in dims..., R) and B (R, out dims...),
flattened in the order the family's mapping flattens the kernel, so they map by reshape and transpose.

GPT-2 fuses q, k and v into one ``c_attn``, which peft adapts with one LoRA: the q/k/v factors of a layer become
one of rank ``len(qkv) * R`` whose A stacks theirs and whose B is block-diagonal (zero where a projection has no
LoRA), so it computes each projection's update exactly; ``rank_pattern``/``alpha_pattern`` keep its scale. On the
way in, each of q, k, v takes c_attn's A and its own rows of B. NeoMesh's LoRA has one rank and one scale: an
adapter with several (``rank_pattern``, ``alpha_pattern``) is loaded at the largest rank, smaller factors padded
with zeros and each B scaled to the common alpha / rank (the same update).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from config import Config, ConfigError

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS",
              "seq2seq": "SEQ_2_SEQ_LM"}


def hf_projections(cfg: Config, legacy: bool = False) -> dict[str, tuple[str, int | None]]:
    """{NeoMesh block projection path: (the Hugging Face module that holds it, its slot in GPT-2's fused
    q/k/v ``c_attn``, else None)}. transformers 5 renamed ViT's modules (``vit.layers.0.attention.q_proj``; its
    checkpoints keep the old weight names), and peft names them so; ``legacy``: the names transformers 4 gave."""
    if cfg.model == "t5":
        return _t5_projections(cfg)
    table = {}
    for i in range(cfg.n_layer):
        b = f"blocks/{i}/"
        if cfg.model == "gpt2":
            h = f"transformer.h.{i}."
            table.update({b + f"attn/{x}": (h + "attn.c_attn", j) for j, x in enumerate("qkv")})
            table.update({b + "attn/out": (h + "attn.c_proj", None), b + "mlp/c_fc": (h + "mlp.c_fc", None),
                          b + "mlp/c_proj": (h + "mlp.c_proj", None)})
        elif cfg.model == "gpt_neo":
            h = f"transformer.h.{i}."
            table.update({b + f"attn/{x}": (f"{h}attn.attention.{x}_proj", None) for x in ("q", "k", "v", "out")})
            table.update({b + "mlp/c_fc": (h + "mlp.c_fc", None), b + "mlp/c_proj": (h + "mlp.c_proj", None)})
        elif cfg.model == "vit" and not legacy:
            h = f"vit.layers.{i}."
            table.update({b + f"attn/{x}": (f"{h}attention.{name}_proj", None)
                          for x, name in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))})
            table.update({b + "mlp/c_fc": (h + "mlp.fc1", None), b + "mlp/c_proj": (h + "mlp.fc2", None)})
        else:  # BERT, RoBERTa, ViT of old: one encoder layout, ViT's attention one level deeper
            h = f"{cfg.model}.encoder.layer.{i}."
            attention = "attention.attention." if cfg.model == "vit" else "attention.self."
            table.update({b + f"attn/{x}": (f"{h}{attention}{name}", None)
                          for x, name in (("q", "query"), ("k", "key"), ("v", "value"))})
            table.update({b + "attn/out": (h + "attention.output.dense", None),
                          b + "mlp/c_fc": (h + "intermediate.dense", None),
                          b + "mlp/c_proj": (h + "output.dense", None)})
    return table


def _t5_projections(cfg: Config) -> dict[str, tuple[str, None]]:
    mlp = (("c_gate", "wi_0"), ("c_fc", "wi_1")) if cfg.mlp_glu else (("c_fc", "wi"),)
    table = {}
    for side, layers in (("encoder", cfg.n_layer), ("decoder", cfg.decoder_layers)):
        for i in range(layers or 0):
            ours, theirs = f"{side}/blocks/{i}/", f"{side}.block.{i}.layer."
            attention = [("attn", "0.SelfAttention")] + ([("crossattention", "1.EncDecAttention")] if side ==
                                                          "decoder" else [])
            for part, module in attention:
                table.update({f"{ours}{part}/{x}": (f"{theirs}{module}.{name}", None)
                              for x, name in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))})
            last = "2" if side == "decoder" else "1"
            table.update({f"{ours}mlp/{x}": (f"{theirs}{last}.DenseReluDense.{name}", None)
                          for x, name in mlp + (("c_proj", "wo"),)})
    return table


def _mapping(cfg: Config):
    from convert.hf import MAPPINGS

    return MAPPINGS[cfg.model]


def _flat(params: dict) -> dict[str, np.ndarray]:
    from convert.hf_dir import flatten

    return {name: np.asarray(value, np.float32) for name, value in flatten(params).items()}


# --- export -------------------------------------------------------------------------------------------------------

def check_adapter_exportable(cfg: Config) -> None:
    """A one-line error naming what of a run's ``peft`` setting a Hugging Face peft LoRA adapter cannot hold (the
    config alone: before any weight is read)."""
    from training.peft.trainable import trainable_items

    settings = cfg.peft_settings or {}
    if "lora" not in settings:
        raise ConfigError("export --adapter: the run has no peft.lora; export it whole (without --adapter)")
    held = [f"peft.{part}" for part in ("prefix", "adapter") if part in settings] + \
        [f"peft.trainable {item!r}" for item in trainable_items(settings) if item not in ("lora", "head")]
    if held:
        raise ConfigError(f"export --adapter: {held[0]} has no place in a Hugging Face peft LoRA adapter (it holds "
                          "LoRA factors and whole modules_to_save); export the merged model without --adapter")
    if cfg.task == "masked_lm" and "head" in trainable_items(settings):
        raise ConfigError("export --adapter: the masked-LM head trains (peft.trainable 'head'), and it shares the word "
                          "embeddings, which a peft adapter's modules_to_save cannot hold; train with peft.trainable "
                          "[\"lora\"], or export the merged model without --adapter")
    if cfg.share_parameters:
        raise ConfigError("export --adapter: share_parameters: a peft adapter holds factors per layer")
    hf_projections(cfg)


def adapter_of(cfg: Config, params: dict, base: str | None) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json's content, adapter_model.safetensors' tensors) of a LoRA model's parameters ``params``
    (factors and base weights, unmerged); ``base``: its ``base_model_name_or_path``."""
    from parallel.state import split_params

    check_adapter_exportable(cfg)
    settings = cfg.peft_settings
    lora = settings["lora"]
    rank, alpha = lora["rank"], lora["alpha"]
    flat = _flat(params)
    table = hf_projections(cfg)
    adapted = sorted(name[:-len("/lora_a")] for name in flat if name.endswith("/lora_a"))
    for path in adapted:
        if path not in table:
            kinds = ", ".join(sorted({p.split("/", 2)[2] for p in table}))
            raise ConfigError(f"export --adapter: {path} has LoRA, and no Hugging Face {cfg.model} module it maps "
                              f"to adapts in peft (block projections only: {kinds})")
    modules: dict[str, list[tuple[int | None, str]]] = {}
    for path in adapted:
        module, slot = table[path]
        modules.setdefault(module, []).append((slot, path))
    tensors, ranks = {}, {}
    for module, parts in modules.items():
        a = [flat[f"{path}/lora_a"].reshape(-1, rank).T for _, path in parts]  # (R, in) each
        b = [flat[f"{path}/lora_b"].reshape(rank, -1).T for _, path in parts]  # (out, R) each
        if parts[0][0] is None:
            lora_a, lora_b = a[0], b[0]
        else:  # GPT-2's fused q/k/v: A stacked, B block-diagonal in the slots of c_attn's output
            width = b[0].shape[0]
            lora_a, lora_b = np.concatenate(a), np.zeros((3 * width, rank * len(parts)), np.float32)
            for j, ((slot, _), block) in enumerate(zip(parts, b)):
                lora_b[slot * width:(slot + 1) * width, j * rank:(j + 1) * rank] = block
        tensors[f"{PREFIX}{module}.lora_A.weight"], tensors[f"{PREFIX}{module}.lora_B.weight"] = lora_a, lora_b
        ranks[module] = lora_a.shape[0]
    base_cfg = cfg.replace(peft=None)
    base_params = split_params(params, lambda n: n.rsplit("/", 1)[-1] not in ("lora_a", "lora_b"))[0]
    hf, saved, owners = _head_modules(base_cfg, base_params, settings, set(modules))
    tensors.update({PREFIX + key: value for key, value in saved.items()})
    wider = {module: r for module, r in ranks.items() if r != rank}  # GPT-2's c_attn with two or three of q/k/v
    rank_pattern = _patterns(wider, _module_names(hf))
    task_type = None if cfg.model == "t5" and not cfg.decoder_layers else TASK_TYPES.get(cfg.task)  # an encoder
    config = {"peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base,
              "r": rank, "lora_alpha": alpha, "lora_dropout": lora["dropout"],
              "target_modules": _target_modules(set(modules), _module_names(hf)),
              "fan_in_fan_out": cfg.model == "gpt2",  # GPT-2's Conv1D stores (in, out)
              "bias": "none", "modules_to_save": owners or None,
              "rank_pattern": rank_pattern, "alpha_pattern": {key: alpha * r / rank for key, r in rank_pattern.items()},
              "init_lora_weights": True, "use_rslora": False, "use_dora": False, "inference_mode": True}
    return config, tensors


def _module_names(hf: dict[str, np.ndarray]) -> set[str]:
    """The names of the modules with a weight matrix (those peft's target_modules may match)."""
    return {key.rsplit(".", 1)[0] for key, value in hf.items() if key.endswith(".weight") and value.ndim == 2}


def _matches(key: str, module: str) -> bool:
    return module == key or module.endswith("." + key)  # peft's target_modules rule


def _target_modules(adapted: set[str], modules: set[str]) -> list[str]:
    """The shortest module name suffixes (``c_attn``, ``attention.self.query``) that peft matches with exactly the
    ``adapted`` modules of all ``modules``; full names where a layer's set differs."""
    keys = set()
    for module in adapted:
        parts = module.split(".")
        keys.add(next(key for key in (".".join(parts[-n:]) for n in range(1, len(parts) + 1))
                      if all(m in adapted for m in modules | adapted if _matches(key, m))))
    return sorted(keys)


def _patterns(values: dict[str, int], modules: set[str]) -> dict[str, int]:
    """``rank_pattern``-style keys for per-module values: the last name where every module of it has the same."""
    by_name: dict[str, set[int]] = {}
    for module, value in values.items():
        by_name.setdefault(module.rsplit(".", 1)[-1], set()).add(value)
    out = {}
    for module, value in values.items():
        name = module.rsplit(".", 1)[-1]
        every = [m for m in modules | set(values) if m.rsplit(".", 1)[-1] == name]
        # peft reads the keys as regular expressions
        out[name if len(by_name[name]) == 1 and all(m in values for m in every) else re.escape(module)] = value
    return out


def _head_modules(cfg: Config, params: dict, settings: dict, adapted: set[str]
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """(every Hugging Face weight of the base model, the weights of the whole modules that hold what trains
    beside the LoRA factors, those modules: peft's modules_to_save). Which Hugging Face weights those are is found
    by moving the trained parameters and seeing which weights the family's mapping moves."""
    import jax

    from parallel.state import path_name
    from training.peft.trainable import trainable_filter

    mapping = _mapping(cfg)
    mapping.config_to_hf(cfg)  # what transformers cannot hold is one line here
    trains = trainable_filter(settings)
    hf = {k: np.asarray(v, np.float32) for k, v in mapping.params_to_hf(cfg, jax.tree.map(np.asarray, params)).items()}
    moved = jax.tree_util.tree_map_with_path(
        lambda p, v: np.asarray(v) + 1.0 if trains(path_name(p)) else np.asarray(v), params)
    changed = [k for k, v in mapping.params_to_hf(cfg, moved).items() if not np.array_equal(v, hf[k])]
    owners = {k.rsplit(".", 1)[0] for k in changed}
    while True:  # the outermost module whose weights all train (peft wraps a classifier whole)
        wider = {_whole(m.rsplit(".", 1)[0], hf, changed) or m if "." in m else m for m in owners}
        wider = {m for m in wider if not any(m.startswith(o + ".") for o in wider)}
        if wider == owners:
            break
        owners = wider
    for module in owners:
        if module in adapted or any(a.startswith(module + ".") for a in adapted):
            raise ConfigError(f"export --adapter: {module} both trains whole and has LoRA; peft holds one or the "
                              "other")
    return hf, {k: v for k, v in hf.items() if any(k.startswith(m + ".") for m in owners)}, sorted(owners)


def _whole(module: str, hf: dict, changed: list[str]) -> str | None:
    """``module`` if every weight under it is in ``changed``."""
    return module if all(k in changed for k in hf if k.startswith(module + ".")) else None


ADAPTER_FILES = frozenset((CONFIG_FILE, WEIGHTS_FILE))


def export_adapter(model_path: str, out_dir: str) -> Config:
    """Writes the LoRA run ``model_path`` as a Hugging Face peft adapter directory ``out_dir`` (new, empty or a
    previous adapter export, replaced); its base is the run's ``init_from``."""
    from convert.hf import check_export_dir, check_export_sources
    from convert.hf_dir import restore_replaced, write_hf_dir
    from pretrained import load_run

    if not os.path.isdir(model_path):
        raise ConfigError(f"export: {model_path}: no such directory (a NeoMesh run directory)")
    restore_replaced(out_dir)
    check_export_dir(out_dir, ADAPTER_FILES, (CONFIG_FILE, WEIGHTS_FILE))

    def check(cfg: Config) -> None:  # before the weights are restored
        check_export_sources(cfg, model_path, out_dir)
        check_adapter_exportable(cfg)

    cfg, _, params = load_run(model_path, check_config=check)
    config, tensors = adapter_of(cfg, params, base_name(cfg.init_from))
    write_hf_dir(out_dir, config, tensors, names=(CONFIG_FILE, WEIGHTS_FILE))
    import sys

    if cfg.init_from is None:
        print(f"note: {model_path} has no init_from: the adapter's base_model_name_or_path is null; its base is "
              f"the run's own initial weights, which no Hugging Face model holds", file=sys.stderr, flush=True)
    elif os.path.isdir(os.path.join(cfg.init_from, "checkpoints")):
        print(f"note: the adapter's base_model_name_or_path is the NeoMesh run {cfg.init_from}; peft loads it onto "
              f"that run's export (python -m convert export {cfg.init_from} DIR)", file=sys.stderr, flush=True)
    return cfg


def base_name(init_from: str | None) -> str | None:
    """What an adapter names as its base for a run's ``init_from``: ORG/NAME for a snapshot in the Hugging Face
    cache, an adapter directory's own base (the run went on training it), else the directory."""
    if init_from is None:
        return None
    if is_adapter_dir(init_from) and not os.path.isdir(os.path.join(init_from, "checkpoints")):
        return read_adapter_config(init_from).get("base_model_name_or_path")
    snapshots, _ = os.path.split(os.path.normpath(init_from))
    repo = os.path.basename(os.path.dirname(snapshots))
    if os.path.basename(snapshots) == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/", 1)
    return init_from


# --- import -------------------------------------------------------------------------------------------------------

def is_adapter_dir(path: str) -> bool:
    """Whether ``path`` is a peft adapter directory (it has adapter_config.json)."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE))


def not_an_adapter(path: str) -> str:
    """Why ``path`` is no peft adapter directory, in the words an error starts with."""
    if os.path.basename(os.path.normpath(path)) == CONFIG_FILE and os.path.isfile(path):
        return f"is the adapter's {CONFIG_FILE}; give its directory, {os.path.dirname(path) or '.'}"
    return f"not a peft adapter directory (no {CONFIG_FILE})"


def read_adapter_config(path: str) -> dict:
    """adapter_config.json's content (the weights unread)."""
    from neomesh.json_file import read_json

    if not is_adapter_dir(path):
        raise ConfigError(f"{path}: {not_an_adapter(path)}")
    config = read_json(os.path.join(path, CONFIG_FILE))
    if not isinstance(config, dict):
        raise ConfigError(f"{path}/{CONFIG_FILE}: expected a JSON object")
    return config


def read_adapter_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json's content, {weight name without ``base_model.model.``: float32 array})."""
    config = read_adapter_config(path)
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise ConfigError(f"{path}: no {WEIGHTS_FILE} (an adapter saved with safe_serialization=False: load it "
                          "with peft and save it again)")
    from safetensors.numpy import load_file

    try:
        tensors = load_file(weights)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for damaged files
        raise ConfigError(f"{weights}: not a readable safetensors file ({str(e).splitlines()[0][:160]})") from None
    return config, {k[len(PREFIX):] if k.startswith(PREFIX) else k: np.asarray(v, np.float32)
                    for k, v in tensors.items()}


def adapter_base(path: str) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    base = read_adapter_config(path).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}/{CONFIG_FILE}: no base_model_name_or_path; give the base model as well")
    return base


def _check_lora_config(config: dict, source: str) -> None:
    unsupported = {"peft_type": config.get("peft_type") != "LORA", "use_dora": config.get("use_dora"),
                   "bias": config.get("bias", "none") != "none", "lora_bias": config.get("lora_bias"),
                   "layer_replication": config.get("layer_replication"),
                   "trainable_token_indices": config.get("trainable_token_indices"),
                   "target_parameters": config.get("target_parameters")}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"{source}: {key} {json.dumps(config.get(key))}: NeoMesh's LoRA is plain LoRA "
                              "(peft_type LORA, no DoRA, no trained biases)")


def _pattern(patterns: dict, module: str, default):
    for key, value in (patterns or {}).items():  # peft's get_pattern_key
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def lora_of_adapter(cfg: Config, path: str) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the ``peft`` setting, {NeoMesh factor name: array}, {Hugging Face weight name: array} of its
    modules_to_save) of the adapter directory ``path`` on a ``cfg`` base model."""
    config, tensors = read_adapter_dir(path)
    source = f"{path}/{CONFIG_FILE}"
    _check_lora_config(config, source)
    table = hf_projections(cfg)
    inverse: dict[str, list[tuple[int | None, str]]] = {}
    for names in [table] + ([hf_projections(cfg, legacy=True)] if cfg.model == "vit" else []):
        for ours, (module, slot) in names.items():
            inverse.setdefault(module, []).append((slot, ours))
    factors = {}
    for key in tensors:
        if ".lora_" not in key:
            continue
        module, _, which = key.partition(".lora_")
        if which not in ("A.weight", "B.weight"):
            raise ConfigError(f"{path}/{WEIGHTS_FILE}: {key}: an embedding or other LoRA kind NeoMesh does not hold")
        if module not in inverse:
            raise ConfigError(f"{path}/{WEIGHTS_FILE}: {key}: LoRA on {module}, which is no block projection of a "
                              f"{cfg.model} model with {cfg.n_layer} layers (NeoMesh adapts "
                              f"{', '.join(sorted({m.split('.')[-1] for m in inverse}))})")
        factors.setdefault(module, {})[which[0]] = tensors[key]
    if not factors:
        raise ConfigError(f"{path}/{WEIGHTS_FILE}: holds no LoRA factors")
    r, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    root = np.sqrt if config.get("use_rslora") else (lambda x: x)
    common = alpha / root(r)
    top = max(f["A"].shape[0] for f in factors.values())
    out = {}
    for module, f in factors.items():
        if set(f) != {"A", "B"}:
            raise ConfigError(f"{path}/{WEIGHTS_FILE}: {module} has lora_{'AB'[('A' in f)]} only")
        a, b = f["A"], f["B"]  # (R, in), (out, R)
        rank = a.shape[0]
        scale = _pattern(config.get("alpha_pattern"), module, alpha) / root(_pattern(config.get("rank_pattern"),
                                                                                    module, r))
        b = b * (scale / common)  # the common scale, the same update
        for slot, ours in inverse[module]:
            part = b if slot is None else np.split(b, 3)[slot]
            out[f"{ours}/lora_a"] = np.pad(a.T, ((0, 0), (0, top - rank)))
            out[f"{ours}/lora_b"] = np.pad(part.T, ((0, top - rank), (0, 0)))
    adapted = {name.rsplit("/", 1)[0] for name in out}
    names = {p.rsplit("/", 1)[-1] for p in adapted}
    short = all(p in adapted for p in table if p.rsplit("/", 1)[-1] in names)  # the same in every block
    settings = {"lora": {"targets": sorted(names) if short else sorted(adapted), "rank": int(top),
                         "alpha": float(common * top), "dropout": float(config.get("lora_dropout", 0.0))}}
    saved = {k: v for k, v in tensors.items() if ".lora_" not in k}
    return settings, out, saved


def adapter_params(cfg: Config, params: dict, path: str) -> tuple[Config, dict]:
    """(``cfg`` with the adapter's ``peft`` LoRA setting, the parameters of that model: ``params``, the base's,
    with the peft adapter directory ``path``'s LoRA factors, and its modules_to_save in place of the base's)."""
    import jax

    from parallel.state import abstract_model, path_name
    from training.peft import build_model

    if cfg.peft is not None:
        raise ConfigError(f"--adapter {path}: the model already has peft parts ({', '.join(cfg.peft)}); load the "
                          "adapter onto its base")
    settings, factors, saved = lora_of_adapter(cfg, path)
    given = _flat(params)
    if saved:  # whole modules: through the family's mapping, as the base's own weights
        mapping = _mapping(cfg)
        hf = mapping.params_to_hf(cfg, jax.tree.map(np.asarray, params))
        unknown = sorted(set(saved) - set(hf))
        if unknown:
            raise ConfigError(f"{path}/{WEIGHTS_FILE}: {unknown[0]} is not a weight of the base model")
        given.update(_flat(mapping.params_from_hf(cfg, {**hf, **saved}, path)))
    cfg = cfg.replace(peft=settings)
    abstract = abstract_model(lambda rngs: build_model(cfg, rngs))[1]

    def put(p, leaf):
        name = path_name(p)
        if name not in factors:
            return given[name]
        rows = leaf.shape[0] if name.endswith("lora_b") else math.prod(leaf.shape[:-1])  # (R, out), (in, R)
        if factors[name].shape != (rows, math.prod(leaf.shape) // rows):
            raise ConfigError(f"{path}: the adapter's {name} has shape {factors[name].shape}, the base model's "
                              f"{leaf.shape}: an adapter of another base model (another size?)")
        return factors[name].reshape(leaf.shape)

    return cfg, jax.tree_util.tree_map_with_path(put, abstract)
