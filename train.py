"""Train a NeoMesh model: ``python train.py --config configs/quickstart.json``.

Reads the JSON config, builds the device mesh and layout, creates (or resumes) a sharded train state, and runs
the jitted train step over batches that are a pure function of the step. Writes metrics.jsonl, TensorBoard
events and orbax checkpoints under ``model_path``; prints a sample at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    from neomesh.help import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--config", metavar="FILE", help="JSON config: a path, or a shipped config by name "
                       "(quickstart, gpt_neo_125M, moe, ...: see configs/); with --data it defaults to quickstart")
    which.add_argument("--model", metavar="NAME", help="GPT-Neo's way to name a config: configs/NAME.json")
    p.add_argument("--data", nargs="+", metavar="PATH", help="train on your own text: .txt / .jsonl / .jsonl.zst "
                   "files, folders or globs (prepared once into data_cache/, cached by content, with a tokenizer "
                   "of n_vocab tokens and a 5%% eval split), or a folder data/make_dataset.py wrote")
    p.add_argument("--model-path", help="run directory; overrides the config's model_path (with --data: "
                   "runs/NAME-HASH, named like the prepared data's folder)")
    fresh = p.add_mutually_exclusive_group()
    fresh.add_argument("--resume", action="store_true", help="resume from model_path (the default when it has "
                       "a checkpoint); an error if it has none")
    fresh.add_argument("--new", action="store_true", help="start fresh; an existing run directory is moved aside")
    p.add_argument("--eval", action="store_true", help="only evaluate the latest checkpoint")
    p.add_argument("--init-from", metavar="HF_MODEL", help="start a new run from a Hugging Face model's weights "
                   "(GPT-Neo, GPT-2; fresh optimizer state and schedule): fine-tuning; a directory, or ORG/NAME "
                   "from the local Hugging Face cache")
    p.add_argument("--stop-at-step", type=int, metavar="N", help="checkpoint and stop after step N (a time-sliced "
                   "job); the next run resumes there exactly")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key; VALUE is JSON, or a plain string (repeatable)")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default")
    p.add_argument("--check-dataset", action="store_true", help="decode the first train batch, print token id "
                   "range, counts and its first text, and exit")
    dist = p.add_argument_group("multi-host (jax.distributed)")
    dist.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0 (with --num-processes and "
                      "--process-id)")
    dist.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    dist.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0..N-1")
    dist.add_argument("--distributed", action="store_true", help="auto-detect the cluster (TPU pod, SLURM)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar: a log line every log_every steps "
                   "instead (also what happens when the output is not a terminal)")
    dry = p.add_argument_group("dry run: compile the train step for the mesh on simulated CPU devices, print "
                               "parameters, FLOPs, memory per device, collectives and step-time estimates, exit")
    dry.add_argument("--dry-run", action="store_true", help="compile for the configured mesh, report, exit")
    dry.add_argument("--devices", type=int, metavar="N", help="simulated devices (default: what mesh_shape fixes)")
    dry.add_argument("--accelerator", default="h100", choices=("h100", "tpu-v4", "tpu-v5e"),
                     help="whose memory per device an 'auto' mesh or layout is chosen for")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.help_config and not args.config and not args.model and not args.data:
        p.error("--config (or --model NAME, or --data) is required")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from config import ConfigError, describe_keys, load_config, model_config_path

    if args.help_config:
        print(describe_keys())
        return 0
    try:
        # Everything that needs no jax is checked first, so a mistake costs well under a second.
        config = args.config or (model_config_path(args.model) if args.model else "quickstart")
        cfg, notes = load_config(config, tuple(args.set))
        if args.data:
            from data.make_dataset import config_for_data
            cfg = config_for_data(cfg, args.data)
        if args.model_path:
            cfg = cfg.replace(model_path=args.model_path)
        if args.init_from:
            from neomesh.hf_cache import resolve_model
            args.init_from = resolve_model(args.init_from, "--init-from")
        if args.dry_run:
            return dry_run(args, cfg, notes)
        train(args, cfg, notes)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130
    return 0


def dry_run(args, cfg, notes: list[str]) -> int:
    from parallel.dry_run import run_dry_run  # imports jax, but starts no backend: --devices still applies

    for note in notes:
        print(f"note: {note}")
    print(f"dry run: {args.config or args.model}")
    print(run_dry_run(cfg, args.devices, args.accelerator))
    return 0


def train(args, cfg, notes: list[str]) -> None:
    import jax
    from tqdm import tqdm

    from config import ConfigError
    from data.source import NoEvalSet, make_source
    from models import registry
    from models.generate import complete
    from parallel import distributed
    from parallel.auto import resolve
    from parallel.state import abstract_train_state, create_train_state
    from parallel.steps import (batch_shapes, batch_shardings, make_eval_step, make_train_step, mean_of,
                                microbatch_count)
    from training.checkpoint import Checkpoints
    from training.flops import peak_flops_per_second, train_flops_per_token
    from training.metrics import MetricsWriter
    from training.objectives import objective_for, report
    from training.optimizer import learning_rate_schedule, make_optimizer
    from training.progress import Progress, wants_bar

    if args.check_dataset:
        from data.check import check_dataset
        return check_dataset(cfg)
    distributed.initialize(args.coordinator, args.num_processes, args.process_id, args.distributed)
    lead = jax.process_index() == 0
    say = tqdm.write if lead else (lambda *a, **k: None)
    for note in notes:
        say(f"note: {note}")

    tx, schedule = make_optimizer(cfg), learning_rate_schedule(cfg)
    make_model = lambda rngs: registry.build(cfg, rngs)  # noqa: E731
    layout, auto_note = resolve(cfg, make_model, tx)
    if auto_note:
        say(auto_note)
    say(f"mesh {dict(layout.mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} devices "
        f"({jax.process_count()} processes); layout {layout.text}")
    objective = objective_for(cfg)
    train_shapes = batch_shapes(objective, cfg, cfg.train_batch_size)
    eval_shapes = batch_shapes(objective, cfg, cfg.eval_batch_size)
    train_sharding = batch_shardings(layout, objective, train_shapes, "train_batch_size")
    eval_sharding = batch_shardings(layout, objective, eval_shapes, "eval_batch_size")
    train_data = None if args.eval else make_source(cfg, "train")  # --eval reads eval-only datasets too
    try:
        eval_data = make_source(cfg, "eval") if cfg.eval_steps else None
    except NoEvalSet as e:
        eval_data = None
        say(f"note: {e}; evaluation is skipped")

    def global_batch(source, step, shapes, sharding):
        def rows_of(rows):
            batch = source.batch(step, next(iter(shapes.values()))[0], rows)
            batch = batch if isinstance(batch, dict) else {"tokens": batch}
            objective.check_batch(cfg, batch, source.description)
            return batch

        return distributed.global_batch(rows_of, sharding, shapes)

    if args.new and lead and os.path.exists(cfg.model_path):
        aside = f"{cfg.model_path.rstrip('/')}-{time.strftime('%Y%m%d-%H%M%S')}"
        os.rename(cfg.model_path, aside)
        say(f"--new: moved the previous run to {aside}")
    if args.new and jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("new run directory")
    # the run keeps its tokenizer: predict.py and export use it
    if lead and train_data is not None and hasattr(train_data.tokenizer, "save"):
        os.makedirs(os.path.join(cfg.model_path, "tokenizer"), exist_ok=True)
        train_data.tokenizer.save(os.path.join(cfg.model_path, "tokenizer", "tokenizer.json"))
    checkpoints = Checkpoints(cfg.model_path, cfg.keep_checkpoints)
    latest = checkpoints.latest_step()
    if latest is not None:
        graphdef, abstract, shardings = abstract_train_state(make_model, tx, layout)
        state = checkpoints.restore(abstract, latest)
        say(f"resumed from {checkpoints.directory} at step {latest}")
    elif args.resume or args.eval:
        raise ConfigError(f"model_path: no checkpoint to {'evaluate' if args.eval else 'resume'} in "
                          f"{checkpoints.directory}")
    else:
        params = imported_params(cfg, args.init_from) if args.init_from else None
        graphdef, state, shardings = create_train_state(make_model, tx, layout, cfg.seed, params=params)
        if args.init_from:
            from parallel.state import match_params

            _, missing, unused = match_params(params, state.params)
            say(f"initialised from {args.init_from}" + (f"; fresh (not in it): {', '.join(missing)}" if missing else "")
                + (f"; unused (this task has no place for them): {', '.join(unused)}" if unused else ""))
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(state.params))
    say(f"model: {n_params / 1e6:.2f}M parameters, {cfg.n_layer} layers {list(cfg.attention_layers)}")

    eval_step = make_eval_step(graphdef, objective, layout, shardings.params, eval_sharding,
                               precision=cfg.precision)

    def evaluate(params) -> dict:
        sums = [eval_step(params, global_batch(eval_data, i, eval_shapes, eval_sharding))
                for i in range(cfg.eval_steps)]
        # bits per byte compare next-token losses across tokenizers; masked or per-example losses have none
        bytes_per_token = eval_data.bytes_per_token if objective.name == "causal_lm" else None
        return report(objective, mean_of(sums), bytes_per_token)

    start = int(state.step)
    metrics = MetricsWriter(cfg.model_path, start)
    if args.eval:
        result = evaluate(state.params) if eval_data else {}
        say(f"eval at step {start}: " + "  ".join(f"{k} {v:.4f}" for k, v in result.items()))
        metrics.write({"step": start, "kind": "eval", **result})
        metrics.close()
        checkpoints.close()
        return

    microbatches = microbatch_count(cfg, layout)
    train_step = make_train_step(graphdef, objective, tx, schedule, layout, shardings, train_sharding,
                                 precision=cfg.precision, microbatches=microbatches, seed=cfg.seed)
    tokens_per_step = cfg.train_batch_size * cfg.n_ctx
    peak = peak_flops_per_second()
    flops_per_token = train_flops_per_token(cfg)
    stop = min(cfg.train_steps, args.stop_at_step or cfg.train_steps)
    progress = Progress(start, stop, cfg.train_steps, tokens_per_step, cfg.log_interval,
                        bar=wants_bar(args.no_progress, lead), say=say)
    last_eval = last_eval_step = saved = None
    tick = time.perf_counter()
    for step in range(start, stop):
        state, out = train_step(state, global_batch(train_data, step, train_shapes, train_sharding))
        out = {k: float(v) for k, v in jax.device_get(out).items()}
        now = time.perf_counter()
        tokens_per_sec = tokens_per_step / (now - tick)
        mfu = tokens_per_sec * flops_per_token / peak if peak else None
        metrics.write({"step": step + 1, "kind": "train", **out, "tokens_per_sec": tokens_per_sec, "mfu": mfu})
        progress.update(step + 1, out, now - tick)
        done = step + 1 == stop
        finished = step + 1 == cfg.train_steps
        if eval_data is not None and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or finished):
            last_eval, last_eval_step = evaluate(state.params), step + 1
            metrics.write({"step": step + 1, "kind": "eval", **last_eval})
            say(f"step {step + 1}: eval " + "  ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
        if (step + 1) % cfg.steps_per_checkpoint == 0 or done:
            checkpoints.save(step + 1, state, cfg.to_dict())
            saved = os.path.join(cfg.model_path, "checkpoints", str(step + 1))
        tick = time.perf_counter()  # eval and checkpoint time are not training time
    progress.close()
    checkpoints.close()
    metrics.close()
    if cfg.sample_tokens and cfg.task == "causal_lm":  # every process takes part: the parameters are spread
        with layout.active():
            text = complete(graphdef, state.params, train_data.tokenizer, cfg.sample_prompt, cfg.sample_tokens,
                            cfg.n_ctx, seed=cfg.seed, entmax=cfg.entmax_loss)
        say(f"sample:\n{cfg.sample_prompt}{text}")
    for line in progress.summary(stop - start, last_eval, last_eval_step, saved, cfg.model_path):
        say(line)


def imported_params(cfg, hf_dir: str):
    """A Hugging Face model's weights for ``cfg``'s model; a one-line error if its shape differs."""
    from config import ConfigError
    from convert.hf import load_hf

    theirs, params = load_hf(hf_dir)
    keys = ["model", "n_embd", "n_layer", "n_head", "n_vocab", "n_ctx", "attention_layers", "activation_function",
            "no_weight_tie", "qkv_bias", "attention_scale", "intermediate", "norm_position", "n_token_types"] + (
        ["local_attention_radius"] if "local" in cfg.attention_layers else [])
    for key in keys:
        if getattr(theirs, key) != getattr(cfg, key):
            raise ConfigError(f"--init-from {hf_dir}: {key} is {getattr(theirs, key)} there but "
                              f"{getattr(cfg, key)} in the config")
    return params


if __name__ == "__main__":
    sys.exit(main())
