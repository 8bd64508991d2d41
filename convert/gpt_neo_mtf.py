"""GPT-Neo's own mesh-tensorflow checkpoints (the format of its 1.3B and 2.7B releases) -> a NeoMesh run:

    python -m convert.gpt_neo_mtf CHECKPOINT_DIR MODEL_PATH [--config CONFIG.json] [--tokenizer DIR] [--keep-step]

CHECKPOINT_DIR is what GPT-Neo's ``model_path`` held: ``checkpoint``, ``model.ckpt-STEP.index`` and its data
shards (GPT-Neo saved with ``sharded=True``; TensorFlow reads the shards as one checkpoint), and the release's
``config.json`` (GPT-Neo's config; ``--config`` names another). MODEL_PATH becomes a NeoMesh run: a checkpoint
with fresh optimizer state, config.json, and ``tokenizer/`` when ``--tokenizer`` names one (GPT-Neo's releases
use GPT-2's: a local folder with vocab.json + merges.txt). The run starts at step 0 (fine-tuning); with
``--keep-step`` it continues at the checkpoint's global step, as GPT-Neo's Colab fine-tuned (train_steps = that
step + N), reading its data from the first batch (``data_start_step``). A MODEL_PATH that already holds a run's
checkpoints is refused.

What the checkpoint holds, from GPT-Neo's models/gpt2/gpt2.py and models/layers.py on mesh-tensorflow: every
variable whole, whatever the layout (mesh-tensorflow saves each variable's master copy; its per-device slices
are never saved), float32, or bfloat16 when the run had ``precision: bfloat16``, all under ``gpt2/``:

    wte [vocab, embd]   wpe [n_ctx, embd] (absent with rotary)   ln_f/g, ln_f/b [embd]
    h{i}/norm_1/g, b    h{i}/attn/q, k, v [embd, heads*features_per_head] (heads-major)
    h{i}/attn/o [heads*features_per_head, embd]   h{i}/attn/compute_output_bias/o_b [embd]
    h{i}/attn/mem_k, mem_v [num_mem_kv, heads, features_per_head]   (global layers with num_mem_kv)
    h{i}/norm_2/g, b    h{i}/mlp/conv1d_main/c_fc/kernel [embd, 4*embd], bias; .../c_proj/kernel, bias

``none`` layers have no norm_1 and no attn. Optimizer slots (``.../adam_m``, ``_slot_v``, ...) and
``global_step`` are skipped. GPT-Neo's rotary rotated the two halves of each head (feature i with i + H/2): the
run gets ``rotary_style: halves``. Refused, each with its reason: untied output layers (``no_weight_tie``: GPT-Neo's
``wte_final_linear`` reads the last block without ln_f and adds a bias; NeoMesh's applies ln_f), mixture-of-experts
layers, and the model options NeoMesh does not have yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from config import Config, ConfigError, from_dict
from neomesh.json_file import read_json

PREFIX = "gpt2/"
OPTIMIZER_SLOT = re.compile(r"(/adam_[mv]|_slot_\w+)$")
SLICE = re.compile(r"_slice_\d+$")


def checkpoint_prefix(path: str) -> str:
    """The checkpoint prefix (``.../model.ckpt-STEP``) of a directory (its latest) or of a prefix itself."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            raise ConfigError(f"{path}: no TensorFlow checkpoint (no 'checkpoint' file naming model.ckpt-STEP)")
        return prefix
    if not os.path.exists(path + ".index"):
        raise ConfigError(f"{path}: neither a checkpoint directory nor a checkpoint prefix (no {path}.index)")
    return path


def read_checkpoint(prefix: str) -> tuple[dict[str, np.ndarray], int | None]:
    """({variable name without ``gpt2/``: float32 array}, global step) of a GPT-Neo checkpoint."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise ConfigError(f"{prefix}: unreadable checkpoint ({str(e).splitlines()[0][:200]})") from None
    names = reader.get_variable_to_shape_map()
    sliced = sorted(n for n in names if SLICE.search(n))
    if sliced:
        raise ConfigError(f"{prefix}: holds per-device slices ({sliced[0]}); GPT-Neo's checkpoints hold whole "
                          "variables, so this was not written by GPT-Neo's saver")
    tensors = {name[len(PREFIX):]: np.asarray(reader.get_tensor(name)).astype(np.float32)
               for name in names if name.startswith(PREFIX) and not OPTIMIZER_SLOT.search(name)}
    if not tensors:
        raise ConfigError(f"{prefix}: no GPT-Neo variables (names under {PREFIX})")
    step = int(reader.get_tensor("global_step")) if "global_step" in names else None
    return tensors, step


def config_from_gpt_neo(raw: dict, source: str) -> Config:
    """The NeoMesh config of a GPT-Neo config; a one-line error for what cannot be converted."""
    cfg, _ = from_dict(raw, source=source)
    if cfg.no_weight_tie:
        raise ConfigError(f"{source}: no_weight_tie: GPT-Neo's untied output layer reads the last block without "
                          "ln_f and adds a bias, NeoMesh's applies ln_f; the logits would differ, so it is not "
                          "converted")
    if cfg.moe_layers:
        raise ConfigError(f"{source}: moe_layers: mesh-tensorflow's mixture-of-experts weights are not converted")
    options = [key for key in ("mlp_glu", "scalenorm", "rezero", "macaron", "axial_pos_emb", "share_parameters")
               if getattr(cfg, key)]
    if options:
        raise ConfigError(f"{source}: {options[0]}: checkpoints with GPT-Neo's block options are not converted yet")
    if cfg.rotary_emb and cfg.rotary_dim != cfg.head_dim:
        raise ConfigError(f"{source}: rotary_emb_fraction: GPT-Neo rotated whole heads; set it to 1.0")
    return cfg.replace(rotary_style="halves") if cfg.rotary_emb else cfg


def params_from_mtf(cfg: Config, tensors: dict[str, np.ndarray], source: str) -> dict:
    """GPT-Neo's variables -> the NeoMesh parameter tree (numpy)."""
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim
    untied = sorted(k for k in tensors if k.startswith("wte_final_linear/"))
    if untied:
        raise ConfigError(f"{source}: {PREFIX}{untied[0]}: an untied output layer (no_weight_tie), which GPT-Neo "
                          "applied without ln_f and with a bias; NeoMesh's applies ln_f, so it is not converted")
    experts = sorted(k for k in tensors if "/moe/" in k)
    if experts:
        raise ConfigError(f"{source}: {PREFIX}{experts[0]}: mixture-of-experts weights are not converted")
    used = set()

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ConfigError(f"{source}: no variable {PREFIX}{name}, which the config's model needs")
        used.add(name)
        return tensors[name]

    def norm(prefix: str) -> dict:
        return {"scale": get(prefix + "/g"), "bias": get(prefix + "/b")}

    blocks = {}
    for i, kind in enumerate(cfg.attention_layers):
        b = f"h{i}/"
        block = {"ln_2": norm(b + "norm_2"), "mlp": {
            name: {"kernel": get(f"{b}mlp/conv1d_main/{name}/kernel"), "bias": get(f"{b}mlp/conv1d_main/{name}/bias")}
            for name in ("c_fc", "c_proj")}}
        if kind != "none":
            attn = {name: {"kernel": get(f"{b}attn/{name}").reshape(d, n, h)} for name in "qkv"}  # (D, N, H)
            attn["out"] = {"kernel": get(b + "attn/o").reshape(n, h, d),  # (N, H, D)
                           "bias": get(b + "attn/compute_output_bias/o_b")}
            if kind == "global" and cfg.num_mem_kv:
                attn["mem_k"], attn["mem_v"] = get(b + "attn/mem_k"), get(b + "attn/mem_v")  # (S, N, H)
            block.update(ln_1=norm(b + "norm_1"), attn=attn)
        blocks[i] = block
    params = {"wte": {"embedding": get("wte")}, "blocks": blocks, "ln_f": norm("ln_f")}
    if not cfg.rotary_emb:
        params["wpe"] = {"embedding": get("wpe")}
    left = sorted(set(tensors) - used)
    if left:
        raise ConfigError(f"{source}: variable {PREFIX}{left[0]} has no place in the config's model (is the config "
                          "the one this checkpoint was trained with?)")
    return params


def convert(checkpoint: str, model_path: str, config_path: str | None = None, tokenizer: str | None = None,
            keep_step: bool = False) -> tuple[Config, int]:
    """Writes MODEL_PATH (checkpoint, config.json, tokenizer/); returns the config and the run's step."""
    import jax

    from data.tokenizer import load_tokenizer
    from models import registry
    from neomesh.paths import run_tokenizer_dir
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from training.checkpoint import Checkpoints
    from training.optimizer import make_optimizer

    existing = os.path.join(model_path, "checkpoints")
    if os.path.isdir(existing) and os.listdir(existing):  # as convert import: never beside another run's steps
        raise ConfigError(f"{model_path}: already holds a run's checkpoints; import into a new directory")
    tokenizer_dir = run_tokenizer_dir(model_path)
    prefix = checkpoint_prefix(checkpoint)
    config_path = config_path or os.path.join(checkpoint if os.path.isdir(checkpoint) else
                                              os.path.dirname(checkpoint), "config.json")
    if not os.path.exists(config_path):
        raise ConfigError(f"{config_path}: no GPT-Neo config (the release's config.json); name it with --config")
    raw = read_json(config_path)
    cfg = config_from_gpt_neo({**raw, "model_path": model_path}, os.path.basename(config_path))
    tensors, global_step = read_checkpoint(prefix)
    params = params_from_mtf(cfg, tensors, prefix)
    tok = load_tokenizer(tokenizer) if tokenizer else None
    if tok is not None and tok.vocab_size > cfg.n_vocab:
        raise ConfigError(f"--tokenizer {tokenizer}: {tok.vocab_size} tokens do not fit n_vocab {cfg.n_vocab}")
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), layout,
                                             cfg.seed, params=params)
    step = (global_step or 0) if keep_step else 0
    cfg = cfg.replace(data_start_step=step)  # the run's data starts at its first batch, not skipped to the step
    state = state.replace(step=jax.device_put(np.int32(step), shardings.step))
    checkpoints = Checkpoints(model_path, cfg.keep_checkpoints)
    checkpoints.save(step, state, cfg.to_dict())
    checkpoints.close()
    if tok is not None:
        os.makedirs(tokenizer_dir, exist_ok=True)
        tok.save(os.path.join(tokenizer_dir, "tokenizer.json"))
    with open(os.path.join(model_path, "config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.to_dict().items() if v is not None}, f, indent=2)
    return cfg, step


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser

    p = ArgumentParser(prog="python -m convert.gpt_neo_mtf", description=__doc__, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="GPT-Neo's model_path (or a model.ckpt-STEP prefix)")
    p.add_argument("model_path", help="the NeoMesh run directory to write")
    p.add_argument("--config", help="GPT-Neo's config JSON (default: CHECKPOINT/config.json)")
    p.add_argument("--tokenizer", help="the model's tokenizer (GPT-2's: a folder with vocab.json + merges.txt)")
    p.add_argument("--keep-step", action="store_true", help="continue at the checkpoint's global step")
    args = p.parse_args(argv)
    try:
        cfg, step = convert(args.checkpoint, args.model_path, args.config, args.tokenizer, args.keep_step)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {cfg.n_layer} layers x {cfg.n_embd} into {args.model_path} at step {step}: generate with "
          f"predict.py --model-path {args.model_path}"
          + ("" if args.tokenizer else " once it has a tokenizer/ (pass --tokenizer)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
