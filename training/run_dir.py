"""What a run directory already holds, read before a run starts and without jax: whether it has checkpoints (or
only damaged ones), the config its newest checkpoint was written with, whether that checkpoint holds only the
trained parameters, the config a run named without ``--config`` goes on with, and the checks of ``--init-from``
against the run there."""

from __future__ import annotations

import os
import re


def missing_run_directory(model_path: str) -> str | None:
    """Why a local ``model_path`` cannot hold a run to read (no such directory, or a file), in one line; None where
    it may (a remote path is left to orbax)."""
    if "://" in model_path:
        return None
    if os.path.isfile(model_path):
        return f"model_path: {model_path} is a file, not a run directory"
    if not os.path.exists(model_path):
        return f"model_path: {model_path}: no such run directory (nothing trained there yet)"
    return None


def gpt_neo_checkpoint_problem(model_path: str) -> str | None:
    """Why a local ``model_path`` holding GPT-Neo's mesh-tensorflow checkpoint (``model.ckpt-STEP.index``, no
    checkpoints/) is no run, in one line naming the converter; None otherwise. GPT-Neo's ``model_path`` held its
    checkpoints so: training there would start a fresh model at step 0 beside weights it never reads."""
    import glob

    if "://" in model_path or has_checkpoint(model_path):
        return None
    steps = [re.fullmatch(r"model\.ckpt-(\d+)\.index", os.path.basename(path))
             for path in glob.glob(os.path.join(glob.escape(model_path), "model.ckpt-*.index"))]
    steps = [int(match.group(1)) for match in steps if match]
    if not steps:
        return None
    name = f"model.ckpt-{max(steps)}"
    return (f"model_path: {model_path} holds GPT-Neo's mesh-tensorflow checkpoint {name}, which NeoMesh does not "
            f"read in place; python -m convert.gpt_neo_mtf {model_path} NEW_DIR [--keep-step] converts it to a run "
            "that --model-path NEW_DIR trains, samples and evaluates")


def model_directory_problem(model_path: str) -> str | None:
    """Why ``model_path`` cannot be a run to write, in one line, where it is a URL (``gs://``: the run's lock,
    metrics.jsonl and tokenizer are written with the file system's calls, which made a local folder ``gs:``), a
    GPT-Neo mesh-tensorflow checkpoint directory or a Hugging Face model directory (config.json and weights, no
    checkpoints/): train.py would start a fresh model there, beside weights it never reads (``--init-from`` reads
    a Hugging Face model's, the converter GPT-Neo's). None otherwise."""
    from convert.hf_dir import has_weights

    if "://" in model_path:
        return (f"model_path: {model_path}: a run is written to a local or mounted directory, not a URL; mount the "
                "bucket (gcsfuse on a TPU VM) and name a folder in it")
    gpt_neo = gpt_neo_checkpoint_problem(model_path)
    if gpt_neo:
        return gpt_neo
    if has_checkpoint(model_path) or \
            not os.path.isfile(os.path.join(model_path, "config.json")) or not has_weights(model_path):
        return None  # not a model (a config.json of one's own is no model without weights)
    return (f"model_path: {model_path} is a Hugging Face model directory (config.json and weights, no "
            f"checkpoints/), not a run directory: --init-from {model_path} fine-tunes it, with --model-path naming a "
            "new directory for the run")


def saved_steps(model_path: str) -> list[int]:
    """The steps of the checkpoints in ``model_path`` (their folders' names), by the names alone."""
    directory = os.path.join(model_path, "checkpoints")
    return [int(name) for name in os.listdir(directory) if name.isdigit()] if os.path.isdir(directory) else []


def has_checkpoint(model_path: str) -> bool:
    return bool(saved_steps(model_path))


def only_damaged(model_path: str) -> bool:
    """Whether the run in ``model_path`` has checkpoints only in damaged_checkpoints/ (training/checkpoint.py moved
    every one there): a run that trained, not a fresh directory."""
    damaged = os.path.join(model_path, "damaged_checkpoints")
    return os.path.isdir(damaged) and bool(os.listdir(damaged)) and not has_checkpoint(model_path)


def newest_saved_config(model_path: str) -> dict | None:
    """The config the newest checkpoint in ``model_path`` was written with, read as orbax wrote it (no jax); None
    where there is none or it is unreadable (restoring then says what is wrong)."""
    import json

    steps = saved_steps(model_path)
    if not steps:
        return None
    try:
        with open(os.path.join(model_path, "checkpoints", str(max(steps)), "config", "metadata"),
                  encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def holds_trained_only(saved: dict) -> bool | None:
    """Whether a run saved with config ``saved`` checkpoints only its trained parameters (peft checkpoint
    'trainable'), so resuming needs its base model; None where its peft setting is unreadable."""
    from config import ConfigError, check_peft

    try:
        return saved.get("peft") is not None and check_peft(saved["peft"])["checkpoint"] == "trainable"
    except ConfigError:
        return None


def run_config(args):
    """``(config, notes)`` a run directory named without ``--config`` goes on with: the config of its newest
    checkpoint, ``--set`` applied (as predict.py reads a run); None for a new run, or one given data or a model
    to start from."""
    from config import from_dict

    if not args.model_path or args.new or args.data or args.init_from:
        return None
    saved = newest_saved_config(args.model_path)
    if saved is None:
        return None
    cfg, notes = from_dict(saved, source=f"{args.model_path}'s config", overrides=tuple(args.set))
    return cfg, [f"config: the run's own, from its newest checkpoint in {args.model_path} (no --config given; "
                 "--config FILE would use another)", *notes]


def check_init_from_given(model_path: str | None, cfg) -> None:
    """A run started from a Hugging Face model resumes from it again: its checkpoint may hold only the trained
    parameters (peft checkpoint 'trainable'), and the model's shape is that model's. A one-line error when the
    run's newest checkpoint records an init_from that this command does not give and needs."""
    import shlex

    from config import ConfigError
    from training.init_from import ARCHITECTURE

    saved = newest_saved_config(model_path) if model_path else None
    if not saved or not saved.get("init_from"):
        return
    partial = holds_trained_only(saved) is not False  # unreadable: assume the base is needed
    reshaped = any(key in saved and saved[key] != getattr(cfg, key) for key in ARCHITECTURE)
    if partial or reshaped:
        why = "its checkpoints hold only the trained parameters" if partial else "the model's shape is that model's"
        raise ConfigError(f"--init-from: the run in {model_path} was started with --init-from "
                          f"{shlex.quote(saved['init_from'])} ({why}); pass it again to resume (or --new for a "
                          "fresh run)")


def check_resume_base(cfg, notes: list) -> None:
    """``init_from`` given where ``model_path`` already holds a run, which resumes from its own checkpoint. A run
    started without one would silently go on from its own weights, never reading init_from's: a one-line error.
    A run started from another model: a note, since model paths move (a full checkpoint does not read the new
    model's weights; one that holds only its trained parameters puts them on the new model's)."""
    import shlex

    from config import ConfigError

    saved = newest_saved_config(cfg.model_path)
    if not saved:
        return
    if not saved.get("init_from"):
        raise ConfigError(f"--init-from: {cfg.model_path} already holds a run, not started from a model, which would "
                          f"resume from its own checkpoint and never read {shlex.quote(cfg.init_from)}'s weights; "
                          "--new moves it aside and starts from them, or --model-path names a new directory")
    if os.path.realpath(saved["init_from"]) == os.path.realpath(cfg.init_from):
        return
    if holds_trained_only(saved):
        notes.append(f"the run in {cfg.model_path} was started with --init-from {saved['init_from']}; its "
                     f"checkpoints hold only the trained parameters, which now go on {cfg.init_from}'s weights")
    else:
        notes.append(f"the run in {cfg.model_path} was started with --init-from {saved['init_from']}; it resumes "
                     f"from its checkpoint, which holds every parameter: {cfg.init_from}'s weights are not used")
