"""Hugging Face interop: GPT-Neo and GPT-2 checkpoints in, GPT-Neo checkpoints out.

    python -m models.hf import HF_DIR MODEL_PATH     # a NeoMesh run directory: checkpoint, config.json, tokenizer
    python -m models.hf export MODEL_PATH HF_DIR     # a directory transformers' from_pretrained loads

An HF directory holds config.json, weights (model.safetensors, or pytorch_model.bin which needs torch) and
tokenizer files (tokenizer.json, or GPT-2's vocab.json + merges.txt). GPT-2 maps onto the same decoder with q/k/v
biases (``qkv_bias``) and its 1/sqrt(head_dim) attention scale folded into the query projection, since NeoMesh
attention is unscaled like GPT-Neo's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil

import numpy as np

from config import Config, ConfigError, from_dict

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
ACTIVATIONS_FROM_HF = {"gelu_new": "gelu", "gelu": "gelu_exact", "relu": "relu", "silu": "silu", "swish": "silu",
                       "tanh": "tanh", "sigmoid": "sigmoid"}
ACTIVATIONS_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu", "swish": "silu",
                     "tanh": "tanh", "sigmoid": "sigmoid"}


# ---------------------------------------------------------------------------------------------------------------
# Reading a Hugging Face directory.

def read_hf_dir(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, {weight name: float32 array}) of a Hugging Face model directory."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ConfigError(f"{path}: not a Hugging Face model directory (no config.json)")
    hf_config = read_json(config_path)
    if not isinstance(hf_config, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if shards:
        from safetensors.numpy import load_file

        tensors = {}
        for shard in shards:
            try:
                tensors.update(load_file(shard))
            except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for damaged files
                raise ConfigError(f"{shard}: not a readable safetensors file ({str(e).splitlines()[0][:160]})") \
                    from None
    elif os.path.exists(os.path.join(path, "pytorch_model.bin")):
        try:
            import torch
        except ImportError:
            raise ConfigError(f"{path}/pytorch_model.bin needs torch to read; install it or save as safetensors") \
                from None
        try:
            state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many types for damaged files
            raise ConfigError(f"{path}/pytorch_model.bin: not a readable PyTorch state dict "
                              f"({str(e).splitlines()[0][:160]})") from None
        tensors = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin")
    tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    check_finite(tensors, path)
    return hf_config, tensors


def read_json(path: str):
    """A JSON file's content; a one-line error naming the file if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a JSON text file (byte {e.start} is not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def check_finite(tensors: dict[str, np.ndarray], where: str) -> None:
    """A one-line error naming the first weight that holds NaN or Inf: such weights are refused."""
    for name, value in tensors.items():
        if not np.isfinite(value).all():
            raise ConfigError(f"{where}: weight {name} holds NaN or Inf; refusing it")


def config_from_hf(hf: dict, source: str = "config.json") -> Config:
    """The NeoMesh model config of a GPT-Neo or GPT-2 Hugging Face config."""
    kind = hf.get("model_type")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS_FROM_HF:
        raise ConfigError(f"{source}: activation_function '{act}' is not supported")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if abs(eps - 1e-5) > 1e-12:
        raise ConfigError(f"{source}: layer_norm_epsilon {eps} differs from GPT-Neo's 1e-5")
    if kind == "gpt_neo":
        d, layers = hf["hidden_size"], hf["num_layers"]
        keys = dict(n_embd=d, n_layer=layers, n_head=hf["num_heads"], n_ctx=hf["max_position_embeddings"],
                    attention_types=hf.get("attention_types", [[["global", "local"], layers // 2]]),
                    local_attention_radius=hf.get("window_size", 256), intermediate=hf.get("intermediate_size"))
    elif kind == "gpt2":
        d, layers = hf["n_embd"], hf["n_layer"]
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if hf.get(key):
                raise ConfigError(f"{source}: GPT-2 option {key}=true is not supported")
        if not hf.get("scale_attn_weights", True):
            raise ConfigError(f"{source}: GPT-2 option scale_attn_weights=false is not supported")
        keys = dict(n_embd=d, n_layer=layers, n_head=hf["n_head"], n_ctx=hf["n_positions"],
                    attention_types=[[["global"], layers]], intermediate=hf.get("n_inner"), qkv_bias=True)
    else:
        raise ConfigError(f"{source}: model_type '{kind}' is not supported (gpt_neo, gpt2)")
    intermediate = keys.pop("intermediate")
    if intermediate not in (None, 4 * d):
        raise ConfigError(f"{source}: intermediate size {intermediate} is not 4 * {d}")
    cfg, _ = from_dict({**keys, "n_vocab": hf["vocab_size"], "activation_function": ACTIVATIONS_FROM_HF[act],
                        "no_weight_tie": not hf.get("tie_word_embeddings", True)}, source=source)
    return cfg


def _strip(tensors: dict) -> dict:
    """Drops the optional ``transformer.`` prefix and non-parameter buffers (GPT-2's attn.bias masks)."""
    out = {}
    for name, value in tensors.items():
        name = name.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias")):
            continue
        out[name] = value
    return out


def params_from_hf(cfg: Config, hf: dict, tensors: dict[str, np.ndarray], source: str = "weights") -> dict:
    """Hugging Face weights -> the NeoMesh parameter tree (numpy). torch Linear weights are (out, in), GPT-2's
    Conv1D weights (in, out)."""
    sd = _strip(tensors)
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim
    gpt2 = hf.get("model_type") == "gpt2"

    def get(name):
        if name not in sd:
            raise ConfigError(f"{source}: missing weight '{name}'")
        return sd[name]

    def norm(prefix):
        return {"scale": get(prefix + ".weight"), "bias": get(prefix + ".bias")}

    def linear(name, transpose=True):
        w = get(name + ".weight")
        return {"kernel": w.T if transpose else w, "bias": get(name + ".bias")}

    blocks = {}
    for i in range(cfg.n_layer):
        b = f"h.{i}."
        if gpt2:
            qkv_w, qkv_b = get(b + "attn.c_attn.weight"), get(b + "attn.c_attn.bias")  # (D, 3D), (3D,)
            scale = h ** -0.5  # folded into q: GPT-2 divides logits by sqrt(head_dim), NeoMesh does not
            q, k, v = (qkv_w[:, j * d:(j + 1) * d].reshape(d, n, h) for j in range(3))
            qb, kb, vb = (qkv_b[j * d:(j + 1) * d].reshape(n, h) for j in range(3))
            attn = {"q": {"kernel": q * scale, "bias": qb * scale}, "k": {"kernel": k, "bias": kb},
                    "v": {"kernel": v, "bias": vb},
                    "out": {"kernel": get(b + "attn.c_proj.weight").reshape(n, h, d),
                            "bias": get(b + "attn.c_proj.bias")}}
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
    return params


# ---------------------------------------------------------------------------------------------------------------
# Writing a Hugging Face GPT-Neo directory.

def gpt_neo_config(cfg: Config) -> dict:
    """The transformers GPTNeoConfig (as a dict) of a GPT-Neo-compatible NeoMesh config."""
    unsupported = {"qkv_bias": cfg.qkv_bias, "num_mem_kv": cfg.num_mem_kv, "rotary_emb": cfg.rotary_emb,
                   "moe_layers": cfg.moe_layers}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"export: {key}={json.dumps(value)} has no GPT-Neo equivalent")
    if set(cfg.attention_layers) - {"global", "local"}:
        raise ConfigError(f"export: GPT-Neo has only global and local layers, not {sorted(set(cfg.attention_layers))}")
    return {
        "model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"], "vocab_size": cfg.n_vocab,
        "max_position_embeddings": cfg.n_ctx, "hidden_size": cfg.n_embd, "num_layers": cfg.n_layer,
        "num_heads": cfg.n_head, "attention_types": cfg.attention_types or [[["global"], cfg.n_layer]],
        "window_size": cfg.local_attention_radius, "intermediate_size": 4 * cfg.n_embd,
        "activation_function": ACTIVATIONS_TO_HF[cfg.activation_function], "resid_dropout": cfg.res_dropout,
        "embed_dropout": cfg.embed_dropout, "attention_dropout": cfg.attn_dropout, "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": not cfg.no_weight_tie,
        "torch_dtype": "float32",
    }


def params_to_gpt_neo(cfg: Config, params: dict) -> dict[str, np.ndarray]:
    """The NeoMesh parameter tree -> Hugging Face GPT-Neo weight names (float32, torch Linear layout)."""
    d = cfg.n_embd
    p = {k: np.asarray(v, np.float32) for k, v in _flatten(params).items()}
    out = {"transformer.wte.weight": p["wte/embedding"], "transformer.wpe.weight": p["wpe/embedding"],
           "transformer.ln_f.weight": p["ln_f/scale"], "transformer.ln_f.bias": p["ln_f/bias"]}
    for i in range(cfg.n_layer):
        b, hb = f"blocks/{i}/", f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            out[f"{hb}{norm}.weight"], out[f"{hb}{norm}.bias"] = p[f"{b}{norm}/scale"], p[f"{b}{norm}/bias"]
        for name in "qkv":
            out[f"{hb}attn.attention.{name}_proj.weight"] = p[f"{b}attn/{name}/kernel"].reshape(d, d).T
        out[f"{hb}attn.attention.out_proj.weight"] = p[f"{b}attn/out/kernel"].reshape(d, d).T
        out[f"{hb}attn.attention.out_proj.bias"] = p[f"{b}attn/out/bias"]
        for name in ("c_fc", "c_proj"):
            out[f"{hb}mlp.{name}.weight"] = p[f"{b}mlp/{name}/kernel"].T
            out[f"{hb}mlp.{name}.bias"] = p[f"{b}mlp/{name}/bias"]
    out["lm_head.weight"] = p["lm_head/kernel"].T if cfg.no_weight_tie else p["wte/embedding"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flatten(value, name + "/") if isinstance(value, dict) else {name: value})
    return flat


def write_gpt_neo(cfg: Config, params: dict, out_dir: str, tokenizer_dir: str | None = None) -> None:
    """Writes config.json, model.safetensors and the tokenizer files for transformers' from_pretrained."""
    from safetensors.numpy import save_file

    tensors = params_to_gpt_neo(cfg, params)
    check_finite(tensors, "export")
    if not cfg.no_weight_tie:
        del tensors["lm_head.weight"]  # tied: transformers re-creates it from wte
    hf = gpt_neo_config(cfg)
    try:
        os.makedirs(out_dir, exist_ok=True)
        if tokenizer_dir:
            tokenizer = load_tokenizer(tokenizer_dir)
            copy_tokenizer(tokenizer_dir, out_dir)
            hf["bos_token_id"] = hf["eos_token_id"] = tokenizer.eos_id
        # Written under temporary names and renamed, so a failure (a full disk) leaves no half-written file.
        config_path, weights_path = os.path.join(out_dir, "config.json"), os.path.join(out_dir, "model.safetensors")
        with open(config_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(hf, f, indent=2)
        save_file(tensors, weights_path + ".tmp", metadata={"format": "pt"})
        os.replace(config_path + ".tmp", config_path)
        os.replace(weights_path + ".tmp", weights_path)
    except OSError as e:
        raise ConfigError(f"{e.filename or out_dir}: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - safetensors reports write errors as its own type
        if "No space left" not in str(e) and "os error" not in str(e):
            raise
        raise ConfigError(f"{out_dir}: could not write the weights ({str(e).splitlines()[0][:160]})") from None


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers.

def load_tokenizer(path: str):
    """The tokenizer of an HF directory: tokenizer.json, or GPT-2's vocab.json + merges.txt."""
    from data.tokenizer import load_tokenizer as load

    if not any(os.path.exists(os.path.join(path, name)) for name in ("tokenizer.json", "vocab.json")):
        raise ConfigError(f"{path}: no tokenizer (tokenizer.json, or vocab.json + merges.txt)")
    return load(path)


def copy_tokenizer(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


# ---------------------------------------------------------------------------------------------------------------
# Command line.

def import_hf(hf_dir: str, model_path: str) -> Config:
    """Writes MODEL_PATH/config.json, MODEL_PATH/tokenizer/ and a step-0 checkpoint (fresh optimizer state), so
    predict.py --model-path and train.py (fine-tuning) both start from the imported weights."""
    import jax

    from models.gpt_neo import GPTNeo
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from training.checkpoint import Checkpoints
    from training.optimizer import make_optimizer

    hf, tensors = read_hf_dir(hf_dir)
    cfg = config_from_hf(hf, f"{hf_dir}/config.json").replace(model_path=model_path)
    params = params_from_hf(cfg, hf, tensors, hf_dir)
    existing = os.path.join(model_path, "checkpoints")
    if os.path.isdir(existing) and os.listdir(existing):
        raise ConfigError(f"{model_path}: already holds a run's checkpoints; import into a new directory")
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, state, _ = create_train_state(lambda rngs: GPTNeo(cfg, rngs=rngs), make_optimizer(cfg), layout, cfg.seed,
                                     params=params)
    with Checkpoints(model_path, cfg.keep_checkpoints) as checkpoints:
        checkpoints.save(0, state, cfg.to_dict())
    copy_tokenizer(hf_dir, os.path.join(model_path, "tokenizer"))
    with open(os.path.join(model_path, "config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.to_dict().items() if v is not None}, f, indent=2)
    return cfg


def export_hf(model_path: str, hf_dir: str) -> None:
    """Restores the latest checkpoint of MODEL_PATH on one device and writes a GPT-Neo HF directory."""
    from training.checkpoint import restore_params

    cfg, _, params = restore_params(model_path)
    tokenizer_dir = os.path.join(model_path, "tokenizer")
    write_gpt_neo(cfg, params, hf_dir, tokenizer_dir if os.path.isdir(tokenizer_dir) else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face directory -> NeoMesh run directory")
    imp.add_argument("hf_dir")
    imp.add_argument("model_path")
    exp = sub.add_parser("export", help="NeoMesh run directory -> Hugging Face GPT-Neo directory")
    exp.add_argument("model_path")
    exp.add_argument("hf_dir")
    args = p.parse_args(argv)
    from errors import run_main

    def run():
        if args.command == "import":
            cfg = import_hf(args.hf_dir, args.model_path)
            print(f"imported {cfg.n_layer} layers x {cfg.n_embd} into {args.model_path}: generate with "
                  f"predict.py --model-path {args.model_path}; train on data with its tokenizer with train.py "
                  f"--config YOUR_CONFIG --model-path {args.model_path}")
        else:
            export_hf(args.model_path, args.hf_dir)
            print(f"exported {args.model_path} to {args.hf_dir}")

    return run_main(run)


if __name__ == "__main__":
    from errors import exit_process

    exit_process(main())
