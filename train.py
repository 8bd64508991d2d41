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

from training.run_dir import (check_init_from_given, check_resume_base, has_checkpoint, missing_run_directory,
                              model_directory_problem, newest_saved_config, only_damaged, run_config, saved_steps)
from training.run_tokenizer import save_tokenizer, with_tokenizer_of_init_from, with_tokenizer_of_run
from training.saved_state import base_params, checkpoints_trained_only, saved_part, state_shapes, storage_changed

# Steps whose metrics stay on the device before the loop fetches them (and at every checkpoint and evaluation):
# fetching after every step would stall the device while the host logs and builds the next batch.
METRICS_FETCH_EVERY = 10


def build_parser() -> argparse.ArgumentParser:
    from neomesh.help import ArgumentParser, HelpFormatter
    from parallel.estimate import ACCELERATORS  # no jax: the parser stays fast

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--config", metavar="FILE", help="JSON config: a path, or a shipped config by name "
                       "(quickstart, gpt_neo_125M, moe, ...: see configs/); with --data it defaults to quickstart, "
                       "with the --model-path of a run to the run's own (its newest checkpoint's)")
    which.add_argument("--model", metavar="NAME", help="GPT-Neo's way to name a config: configs/NAME.json")
    p.add_argument("--data", nargs="+", metavar="PATH", help="train on your own text: .txt / .jsonl / .jsonl.zst "
                   "files, folders or globs (prepared once into data_cache/, cached by content, with a tokenizer "
                   "of n_vocab tokens and a 5%% eval split), or a folder data/make_dataset.py wrote; for a ViT (task "
                   "image_classification) a folder of class folders, CLASS/IMAGE")
    p.add_argument("--skip-bad-files", action="store_true", help="with --data: leave out text files that cannot be "
                   "read or decoded (not UTF-8, binary, corrupt or truncated .zst, bad JSON), or an image folder's "
                   "unreadable images, each named in a warning line, instead of stopping")
    p.add_argument("--model-path", help="run directory; overrides the config's model_path (with --data: "
                   "runs/NAME-HASH, named like the prepared data's folder)")
    fresh = p.add_mutually_exclusive_group()
    fresh.add_argument("--resume", action="store_true", help="resume from model_path (the default when it has "
                       "a checkpoint); an error if it has none")
    fresh.add_argument("--new", action="store_true", help="start fresh; an existing run directory is moved aside")
    p.add_argument("--eval", action="store_true", help="only evaluate the latest checkpoint")
    p.add_argument("--init-from", metavar="HF_MODEL", help="start a new run from a Hugging Face model's weights "
                   "(GPT-Neo, GPT-2, BERT/RoBERTa, T5, ViT: the families python -m convert imports; fresh optimizer "
                   "state and schedule): fine-tuning; a directory, or ORG/NAME from the local Hugging Face cache")
    p.add_argument("--stop-at-step", type=int, metavar="N", help="checkpoint and stop after step N (a time-sliced "
                   "job); the next run resumes there exactly")
    p.add_set_option("override a config key; VALUE is JSON, or a plain string")
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
    dry.add_argument("--accelerator", choices=tuple(ACCELERATORS),
                     help="whose memory per device an 'auto' mesh or layout is chosen for (default h100)")
    dry.add_argument("--topology", metavar="DEVICES", help="compile with the accelerator's own compiler instead, none "
                     "needed: a TPU slice (v5e:2x2, v4:2x2x1, v5p:2x2x2; needs libtpu: pip install "
                     "\"jax[tpu]==0.10.2\") or GPUs (h100, h100:8, h200:2x8 = hosts x GPUs; needs pip install "
                     "\"jax[cuda12-local]==0.10.2\" \"nvidia-cudnn-cu12>=9.8,<10\")")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.eval and args.new:  # first: --new would move the run aside before --eval found nothing
        p.exit(2, "error: --eval: not with --new (--new moves the run aside and starts a fresh one; --eval "
               "evaluates the run in model_path as it is)\n")
    if not (args.help_config or args.config or args.model or args.data):
        check_run_to_go_on_with(p, args)
    dry_only = [flag for flag, value in (("--devices", args.devices), ("--topology", args.topology),
                                         ("--accelerator", args.accelerator)) if value is not None]
    if dry_only and not args.dry_run:
        p.error(f"{dry_only[0]}: only with --dry-run")
    if args.skip_bad_files and not args.data:
        p.error("--skip-bad-files: only with --data (it leaves out the bad files --data reads)")
    return args


def check_run_to_go_on_with(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Without --config, --model or --data, train.py goes on with the run in --model-path: a usage error where
    there is none, naming a --model-path that is no directory (a mistyped one) as eval.py and predict.py do."""
    goes_on = args.model_path and not (args.new or args.init_from)
    if goes_on and newest_saved_config(args.model_path):
        return
    missing = goes_on and (missing_run_directory(args.model_path) or model_directory_problem(args.model_path))
    if missing:
        starts = not (args.eval or args.resume or os.path.exists(args.model_path))
        p.exit(2, f"error: {missing}" + ("; --config (or --model NAME) starts a new run there\n" if starts else "\n"))
    if goes_on and (args.eval or args.resume) and "://" not in args.model_path \
            and not (has_checkpoint(args.model_path) or only_damaged(args.model_path)):  # as the run itself says
        p.exit(2, f"error: model_path: no checkpoint to {'evaluate' if args.eval else 'resume'} in "
                  f"{os.path.join(args.model_path, 'checkpoints')}\n")
    p.error("--config (or --model NAME, or --data, or the --model-path of a run to go on with) is required")


def distributed_problem(args) -> str | None:
    """What is wrong with --coordinator, --num-processes and --process-id, if anything: found here in one line,
    where jax.distributed would raise a traceback, or, for a count without a coordinator, run one process alone."""
    given = [flag for flag, value in (("--num-processes", args.num_processes), ("--process-id", args.process_id))
             if value is not None]
    if args.coordinator is None:
        return (f"{given[0]}: only with --coordinator HOST:PORT (with --distributed the cluster gives the count "
                f"and id)" if given else None)
    if args.distributed:  # one of the two ways to join would be ignored
        return "--distributed: not with --coordinator (--distributed finds the cluster itself; --coordinator " \
               "HOST:PORT with --num-processes and --process-id names it)"
    host, _, port = args.coordinator.rpartition(":")
    if not host or not port.isdigit():
        return f"--coordinator {args.coordinator}: not HOST:PORT (e.g. 10.0.0.1:1234)"
    if len(given) < 2:
        return "--coordinator: give --num-processes N and --process-id I too"
    if args.num_processes < 1:
        return f"--num-processes: {args.num_processes} is not a process count; it must be at least 1"
    if not 0 <= args.process_id < args.num_processes:
        return f"--process-id: {args.process_id} is not in 0..{args.num_processes - 1} (of --num-processes " \
               f"{args.num_processes})"
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    from parallel.xla_flags import apply_defaults

    apply_defaults(compilation_cache=not args.dry_run)  # before jax starts; a dry run reports its compile
    from config import ConfigError, describe_keys, load_config, model_config_path
    from evaluation.tasks import check_config_tasks
    from neomesh.errors import EXIT_ERROR, run_main
    from training.stop_signals import StopNow

    if args.help_config:
        print(describe_keys())
        return 0
    if args.stop_at_step is not None and args.stop_at_step < 1:
        print(f"error: --stop-at-step: {args.stop_at_step} is not a step (steps count from 1)", file=sys.stderr)
        return EXIT_ERROR
    problem = distributed_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_ERROR

    def run():
        # Everything that needs no jax is checked first, so a mistake costs well under a second.
        config = args.config or (model_config_path(args.model) if args.model else None)
        own = None if config else run_config(args)  # a run directory's own config, else the quickstart's
        cfg, notes = own or load_config(config or "quickstart", tuple(args.set))
        check_batches_can_be_made(cfg, bool(args.data))
        check_config_tasks(cfg)  # the eval tasks' files, read before any data is prepared
        problem = model_directory_problem(args.model_path or cfg.model_path)  # a Hugging Face user's model
        if problem:
            raise ConfigError(problem)
        goes_on = not (args.init_from or cfg.init_from or args.new or args.dry_run or args.check_dataset)
        if goes_on:  # before --data prepares text with another tokenizer than the run's
            check_init_from_given(args.model_path or (None if args.data else cfg.model_path), cfg)
        if args.init_from or cfg.init_from:
            from neomesh.hf_cache import resolve_model
            from convert.hf_dir import check_has_weights
            from training.init_from import adapter_base, is_run, with_architecture_of

            where = "--init-from" if args.init_from else "init_from"
            cfg = cfg.replace(init_from=resolve_model(args.init_from or cfg.init_from, where))
            cfg = with_architecture_of(cfg, where, notes)
            if not is_run(cfg.init_from):  # now, not after --data prepared text with the tokenizer it lacks too
                check_has_weights(adapter_base(cfg.init_from) or cfg.init_from)
        elif cfg.init_new_head:
            raise ConfigError("init_new_head: only with --init-from (a new head on the backbone of the classifier it "
                              "names)")
        if not args.check_dataset:  # before --data prepares text, --new moves a run aside, or a device starts
            from parallel.layout import check_text
            check_text(cfg.mesh_shape, cfg.layout)
        if args.data:
            from data.make_dataset import config_for_data
            reader = None
            if cfg.init_from and cfg.tokenizer_path is None:  # fine-tuning reads text with the model's tokenizer
                from training.init_from import source_tokenizer
                cfg = cfg.replace(tokenizer_path=source_tokenizer(cfg.init_from))
            elif not (cfg.init_from or args.new):  # a run going on reads new text with its own tokenizer
                from training.run_tokenizer import tokenizer_of_run_for_data
                reader = tokenizer_of_run_for_data(cfg, args.model_path, args.data)
            cfg = config_for_data(cfg, args.data, args.skip_bad_files, tokenizer=reader)
            if goes_on and not args.model_path:  # the run directory named after the data
                check_init_from_given(cfg.model_path, cfg)
        elif cfg.init_from:
            cfg = with_tokenizer_of_init_from(cfg, notes)
        if args.model_path:
            cfg = cfg.replace(model_path=args.model_path)
        if not (cfg.init_from or args.new):
            cfg = with_tokenizer_of_run(cfg, notes)
        if cfg.init_from and not args.new:
            check_resume_base(cfg, notes)
        if args.stop_at_step is not None and not (args.new or args.dry_run):  # before data and model are built
            newest = max(saved_steps(cfg.model_path), default=0)
            if args.stop_at_step <= newest:
                raise ConfigError(f"--stop-at-step: {args.stop_at_step} is not after the run's step {newest}")
        if args.dry_run:
            return dry_run(args, cfg, notes)
        try:
            return train(args, cfg, notes)
        except ConfigError as e:
            if not own or not str(e).startswith("mesh_shape:") or any(
                    s.startswith("mesh_shape=") for s in args.set):
                raise
            raise ConfigError(f"{e} (the mesh of the run's own config, from its checkpoint; --set mesh_shape=... "
                              "names one for the devices here: a run resumes on any mesh)") from None

    try:  # Ctrl-C before the signal handlers are installed
        return run_main(run, "interrupted before the first step; nothing to save")
    except StopNow as e:
        print(e, file=sys.stderr)
        return e.exit_code


def dry_run(args, cfg, notes: list[str]) -> int:
    from parallel.dry_run import run_dry_run  # imports jax, but starts no backend: --devices still applies

    for note in notes:
        print(f"note: {note}")
    print(f"dry run: {args.config or args.model}")
    print(run_dry_run(cfg, args.devices, args.accelerator, args.topology))
    return 0


def train(args, cfg, notes: list[str]) -> int:
    """Trains (or with --eval evaluates) as the arguments say, under the run lock and the signal handlers;
    returns the exit code."""
    import shutil

    import jax

    from parallel import distributed
    from training.run_lock import lock_run, move_run_aside
    from training.stop_signals import StopSignals

    if args.check_dataset:
        from data.check import check_dataset
        return check_dataset(cfg)
    distributed.initialize(args.coordinator, args.num_processes, args.process_id, args.distributed)
    distributed.check_same_command({**cfg.to_dict(), "--eval": args.eval, "--new": args.new,
                                    "--resume": args.resume, "--stop-at-step": args.stop_at_step})
    signals = StopSignals(multi_process=jax.process_count() > 1)
    signals.install()
    try:
        lead = jax.process_index() == 0
        aside = move_run_aside(cfg.model_path, lead) if args.new else None
        if aside and lead:
            print(f"--new: moved the previous run to {aside}")
        created = not os.path.exists(cfg.model_path)
        lock = lock_run(cfg.model_path, lead, print if lead else (lambda *a: None))
        run = {"trained": False}
        try:
            return run_training(args, cfg, notes, signals, run)
        except BaseException:
            # A run that failed before doing anything (a bad --resume or --init-from, say) leaves no directory,
            # and a --new one puts the run it moved aside back (a layout typo would have moved it for nothing).
            if created and lead and not run["trained"] and not has_checkpoint(cfg.model_path):
                lock.release()
                shutil.rmtree(cfg.model_path, ignore_errors=True)
                if aside and not os.path.exists(cfg.model_path):
                    os.rename(aside, cfg.model_path)
                    print(f"--new: nothing was started; moved the previous run back to {cfg.model_path}")
            raise
        finally:
            lock.release()
    finally:
        signals.uninstall()


def _trained_without_checkpoints(cfg) -> int | None:
    """The last step of metrics.jsonl where the run trained past its second checkpoint step, or to its end, and
    yet ``checkpoints/`` holds none (so a fresh start would rewrite the file without those rows); None otherwise.
    A run killed before its first save committed starts over, as it should: saves are asynchronous, and the first
    is only sure to be on disk once the second has begun (which waits for it); a finished run waited for its
    last. Process 0 decides for all."""
    import jax

    from parallel.distributed import process_zero_value
    from training.metrics import read_rows

    last = 0
    if jax.process_index() == 0 and not has_checkpoint(cfg.model_path):
        last = max((row["step"] for row in read_rows(os.path.join(cfg.model_path, "metrics.jsonl"))[0]), default=0)
    last = process_zero_value(last)
    return last if last > 2 * cfg.steps_per_checkpoint or 0 < cfg.train_steps <= last else None


def check_batches_can_be_made(cfg, data: bool = False) -> None:
    """Masked-LM batches are made from token streams by mlm_training, seq2seq ones by span_corruption or from the
    (input, target) pairs of jsonl files; without them no dataset gives their fields, which a run found only
    after preparing its data. ``data``: --data names the text (make_dataset says what it can feed)."""
    from config import ConfigError

    if cfg.task == "masked_lm" and not cfg.mlm_training:
        raise ConfigError("mlm_training: false, but task masked_lm trains on the batches it makes from the data's "
                          "tokens (--set mlm_training=true)")
    name = cfg.datasets[0][0] if cfg.datasets else ""
    if cfg.task == "seq2seq" and not data and len(cfg.datasets) == 1 and not name.startswith("tfds:"):
        from data.pairs import pairs_mistake
        from data.source import load_dataset_config

        mistake = pairs_mistake(cfg, load_dataset_config(name))
        if mistake:
            raise ConfigError(mistake)


def run_training(args, cfg, notes, signals, run) -> int:
    """The run itself: restore (or create) the state, train, checkpoint, evaluate, sample."""
    import jax
    import jax.numpy as jnp
    from tqdm import tqdm

    from config import ConfigError
    from data.labelled import ExampleStream
    from data.shards import reading_note
    from data.source import NoEvalSet, make_source
    from neomesh.errors import raise_background_failure
    from models.generate import complete
    from parallel import distributed
    from parallel.auto import resolve
    from parallel.state import abstract_train_state, create_train_state, path_name, per_layer_params
    from parallel.steps import (batch_shapes, batch_shardings, make_eval_step, make_train_step, mean_of,
                                microbatch_count)
    from training.base_identity import check_base, fingerprint, record
    from training.checkpoint import Checkpoints, check_same_model, model_changes, training_changes
    from training.eval_reads import repeat_note
    from training.layer_stack import stacked_plan
    from training.flops import peak_flops_per_second, train_flops_per_token
    from training.init_from import imported_params
    from training.metrics import MetricsWriter
    from training.objectives import objective_for, report
    from training.optimizer import bad_step_counts, learning_rate_schedule, make_optimizer
    from training.peft import build_model, trainable_filter
    from training.peft.trainable import check_trainable
    from training.progress import Progress, wants_bar
    from neomesh import label_names
    from neomesh.paths import run_tokenizer_dir

    lead = jax.process_index() == 0
    say = tqdm.write if lead else (lambda *a, **k: None)
    tokenizer_dir = run_tokenizer_dir(cfg.model_path)  # found here, not once the model is built
    for note in notes:
        say(f"note: {note}")
    tx, schedule = make_optimizer(cfg), learning_rate_schedule(cfg)
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    trainable = trainable_filter(cfg.peft_settings)  # None: every parameter trains
    layout, auto_note = resolve(cfg, make_model, tx)
    if auto_note:
        say(auto_note)
    say(f"mesh {dict(layout.mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} devices "
        f"({jax.process_count()} processes); layout {layout.text}")
    objective = objective_for(cfg, layout)
    train_shapes = batch_shapes(objective, cfg, cfg.train_batch_size)
    eval_shapes = batch_shapes(objective, cfg, cfg.eval_batch_size)
    train_sharding = batch_shardings(layout, objective, train_shapes, "train_batch_size")
    # eval_batch_size shapes only the eval_steps batches (eval_tasks score in batches of any size)
    eval_sharding = batch_shardings(layout, objective, eval_shapes, "eval_batch_size") if cfg.eval_steps else None
    # The parameters against the layout and the peft targets first: a mistake there is found before any data is read.
    graphdef, abstract, shardings = abstract_train_state(make_model, tx, layout, trainable)
    check_trainable(cfg.peft_settings, [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        abstract.params)[0]])
    train_data = None if args.eval else make_source(cfg, "train")  # --eval reads eval-only datasets too
    note = reading_note(train_data, jax.process_count()) if train_data is not None else None
    if note:
        say(note)
    try:
        eval_data = make_source(cfg, "eval") if cfg.eval_steps else None
    except NoEvalSet as e:
        eval_data = None
        say(f"note: {e}; evaluation is skipped")
    # (without a checkpoint, "no checkpoint to evaluate" comes first)
    if args.eval and eval_data is None and not cfg.eval_tasks and has_checkpoint(cfg.model_path):
        why = "its datasets have no eval set" if cfg.eval_steps else "eval_steps is 0"
        raise ConfigError(f"--eval: nothing to evaluate: {why}, and eval_tasks is empty; --set eval_steps=N with an "
                          "eval set, or eval_tasks, names something")
    repeats = repeat_note(eval_data, cfg) if eval_data is not None else None
    if repeats:
        say(repeats)
    for source in (train_data, eval_data):
        if isinstance(source, ExampleStream):  # examples held in memory: say what was read, label by label
            say(f"data {source.description}")

    def global_batch(source, step, shapes, sharding):
        def rows_of(rows):
            batch = source.batch(step, next(iter(shapes.values()))[0], rows)
            batch = batch if isinstance(batch, dict) else {"tokens": batch}
            objective.check_batch(cfg, batch, source.description)
            return batch

        return distributed.global_batch(rows_of, sharding, shapes)

    if cfg.init_from and checkpoints_trained_only(cfg) and has_checkpoint(cfg.model_path):
        unchecked = check_base(cfg.model_path, cfg.init_from)  # the base its trained parameters go on
        if unchecked:
            say(unchecked)
    params = imported_params(cfg, cfg.init_from) if cfg.init_from else None  # read before writing anything
    with Checkpoints(cfg.model_path, cfg.keep_checkpoints) as checkpoints:
        changed = {}  # step -> the model keys this config changes (the shapes fit, so the run would go on silently)
        retrained = {}  # step -> the other keys it changes that steer training (lr, train_steps, seed, ...)

        def stored_as(saved: dict, step: int):  # see Checkpoints.restore_newest_good
            where = f"the checkpoint at step {step} in {checkpoints.directory}"
            changed[step] = model_changes(saved, cfg)
            retrained[step] = training_changes(saved, cfg)
            stacking = checkpoints.stacked_layers(step)
            if saved.get("scan_layers", False) == cfg.scan_layers and stacking == stacked_plan(abstract.params):
                return check_same_model(saved, cfg, state_shapes, where)
            return storage_changed(cfg, saved, stacking, where, make_model, layout, trainable, abstract, shardings,
                                   say)

        state, latest = checkpoints.restore_newest_good(saved_part(cfg, abstract), stored_as, say)
        if latest is not None:
            say(f"resumed from {checkpoints.directory} at step {latest}")
            if changed.get(latest):
                say(f"note: model keys differ from the config checkpoint {latest} was trained with: "
                    f"{'; '.join(changed[latest])} (its parameters fit; this run goes on with the config's values)")
            if retrained.get(latest) and not args.eval:
                say(f"note: training keys differ from the config checkpoint {latest} was trained with: "
                    f"{'; '.join(retrained[latest])} (this run goes on with the config's values)")
            if saved_part(cfg, abstract) is not abstract:  # the checkpoint holds the trained parts: add the base
                state = state.replace(params=base_params(cfg, make_model, params, abstract, shardings, state.params))
            position = None if args.eval else restore_input_position(train_data, checkpoints, latest, cfg,
                                                                      train_sharding, train_shapes)
            if position:
                say(position)
        elif only_damaged(cfg.model_path):  # starting afresh here would drop its metrics.jsonl rows without a word
            raise ConfigError(f"model_path: no usable checkpoint in {checkpoints.directory} (every one was damaged "
                              f"and moved to {os.path.join(cfg.model_path, 'damaged_checkpoints')}); --new starts a "
                              "fresh run, moving this directory aside")
        elif (trained_to := _trained_without_checkpoints(cfg)) is not None:
            why = "is a file, not a folder" if os.path.isfile(checkpoints.directory) else \
                "holds no checkpoint (deleted? on a disk not mounted?)"
            raise ConfigError(f"model_path: {cfg.model_path}/metrics.jsonl has rows up to step {trained_to}, but "
                              f"{checkpoints.directory} {why}; starting over would drop them: --new starts a fresh "
                              "run, moving this directory aside")
        elif args.resume or args.eval:
            # --init-from's weights are where a new run starts, not a checkpoint of this one
            hint = "; --eval evaluates a run's checkpoint: train from --init-from first (--set train_steps=1 and " \
                   "--set lr=0 evaluates its weights as they are)" if args.eval and cfg.init_from else ""
            raise ConfigError(f"model_path: no checkpoint to {'evaluate' if args.eval else 'resume'} in "
                              f"{checkpoints.directory}{hint}")
        else:
            graphdef, state, shardings = create_train_state(make_model, tx, layout, cfg.seed, params=params,
                                                            trainable=trainable,
                                                            abstract=(graphdef, abstract, shardings))
            if cfg.init_from:
                from parallel.state import match_params
                from training.layer_stack import unstack_abstract

                if lead:  # checked wherever a trained-only checkpoint of this run reads its base again
                    record(cfg.model_path, cfg.init_from, fingerprint(cfg.init_from))
                _, missing, unused = match_params(params, unstack_abstract(abstract.params))
                from training.init_from import head_names, initialised_notes

                if cfg.init_new_head:  # its head's output layer was left out: fresh, but not for want of it
                    head = head_names(cfg)
                    say(f"init_new_head: a new head of {cfg.num_labels} labels, initialised fresh: {', '.join(head)}")
                    missing = [name for name in missing if name not in head]
                for line in initialised_notes(cfg.init_from, missing, unused):
                    say(line)
        if lead and train_data is not None and hasattr(train_data.tokenizer, "save"):  # kept for predict.py, export
            save_tokenizer(train_data.tokenizer, os.path.join(tokenizer_dir, "tokenizer.json"))
        names = getattr(train_data, "label_names", None)
        if lead and label_names.named(names):  # export writes them as the Hugging Face config's id2label
            label_names.save(cfg.model_path, names)
        n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(state.params))
        layers = f"{cfg.n_layer} encoder and {cfg.decoder_layers} decoder layers" if cfg.model == "t5" else \
            f"{cfg.n_layer} layers {list(cfg.attention_layers)}"
        say(f"model: {n_params / 1e6:.2f}M parameters, {layers}")
        if trainable is not None:
            from parallel.state import split_params

            n_trained = sum(math.prod(p.shape) for p in jax.tree.leaves(split_params(state.params, trainable)[0]))
            say(f"peft: {n_trained:,} of {n_params:,} parameters train ({100 * n_trained / n_params:.2f}%); the "
                "rest are frozen (no gradients, no optimizer state)")
            base_note = peft_base_note(cfg)
            if base_note:
                say(base_note)
        start = int(state.step)
        if args.stop_at_step is not None and args.stop_at_step <= start:
            raise ConfigError(f"--stop-at-step: {args.stop_at_step} is not after the run's step {start}")
        finished_line = (f"the run in {cfg.model_path} is finished: step {start} of train_steps {cfg.train_steps}; "
                         "nothing to do (raise train_steps to train on, --eval to evaluate, predict.py to sample, or "
                         "--new)")
        redo_eval = (latest is not None and not args.eval and (eval_data is not None or bool(cfg.eval_tasks))
                     and eval_missed(cfg, start))
        if start >= cfg.train_steps and not args.eval and not redo_eval:
            say(finished_line)
            return 0

        eval_step = make_eval_step(graphdef, objective, layout, shardings.params, eval_sharding,
                                   precision=cfg.precision) if eval_sharding else None

        layers_of = lambda params: per_layer_params(params, abstract.params)  # noqa: E731 - generation's storage
        scorer = task_scorer(cfg, graphdef, layers_of(state.params) if cfg.eval_tasks else None, train_data, layout)

        def evaluate(params) -> dict:
            result = {}
            if eval_data is not None:
                sums = [eval_step(params, global_batch(eval_data, i, eval_shapes, eval_sharding))
                        for i in range(cfg.eval_steps)]
                # bits per byte compare next-token losses across tokenizers; masked or per-example losses have none
                bytes_per_token = eval_data.bytes_per_token if objective.name == "causal_lm" else None
                result = report(objective, mean_of(sums), bytes_per_token, eval_data)
            if scorer is not None:  # eval_tasks: LAMBADA, multiple choice
                from evaluation.tasks import run_config_tasks

                scorer.params = layers_of(params)
                result.update(run_config_tasks(scorer, cfg))
            return result

        signals.check()  # a Ctrl-C Python dropped during start-up
        metrics = MetricsWriter(cfg.model_path, start, say)
        try:
            if args.eval:
                result = evaluate(state.params) if eval_data or scorer else {}
                line = f"eval at step {start}: {eval_text(result)}"
                stored = metrics.stored_eval(start)
                if stored is None:
                    say(line)
                    metrics.write({"step": start, "kind": "eval", **result})
                elif same_eval(stored, result):
                    say(f"{line} (metrics.jsonl already has the eval of step {start}; not appended)")
                else:  # the row kept is not what was just printed: say so, with its numbers
                    kept = {k: math.nan if stored[k] is None else stored[k] for k in result if k in stored}
                    say(f"{line} (not appended: metrics.jsonl already has an eval of step {start} that differs, "
                        f"{eval_text(kept)}: it was made with other eval settings, data or model)")
                return 0
            if redo_eval:  # the previous run saved this step, then died evaluating it: its row would be lost
                result = evaluate(state.params)
                metrics.write({"step": start, "kind": "eval", **result})
                say(f"step {start}: eval {eval_text(result)} (due at the step resumed from; metrics.jsonl had none)")
                if start >= cfg.train_steps:
                    say(finished_line)
                    return 0

            microbatches = microbatch_count(cfg, layout)
            train_step = make_train_step(graphdef, objective, tx, schedule, layout, shardings, train_sharding,
                                         precision=cfg.precision, microbatches=microbatches,
                                         accumulate_unreduced=cfg.accumulate_unreduced, seed=cfg.seed,
                                         trainable=trainable)
            tokens_per_step = cfg.train_batch_size * cfg.n_ctx
            peak = peak_flops_per_second()
            flops_per_token = train_flops_per_token(cfg)
            stop = min(cfg.train_steps, args.stop_at_step or cfg.train_steps)
            progress = Progress(start, stop, cfg.train_steps, tokens_per_step, cfg.log_interval,
                                bar=wants_bar(args.no_progress, lead), say=say)
            last_eval = last_eval_step = None
            saved_step = latest
            steps_done = 0
            stopping = False
            tick = time.perf_counter()
            signals.arm()
            pending = []  # (step, metrics, bad-step counts) still on the device: fetched at the next sync point

            def save(number, state) -> int:
                checkpoints.save(number, saved_part(cfg, state), cfg.to_dict(),
                                 data=train_data.state(cfg.train_batch_size))
                return number

            for step in range(start, stop):
                batch = global_batch(train_data, step - cfg.data_start_step, train_shapes, train_sharding)
                state, out = train_step(state, batch)
                # copies: the next step donates (deletes) this state's buffers before they are fetched
                pending.append((step + 1, out, [jnp.copy(c) for c in bad_step_counts(state.opt_state)]))
                run["trained"] = True
                steps_done += 1
                stopping = signals.should_stop(step + 1, checkpoints.manager.reached_preemption)
                done = step + 1 == stop
                saving = (step + 1) % cfg.steps_per_checkpoint == 0 or done or stopping
                finished = step + 1 == cfg.train_steps
                evaluating = (eval_data is not None or scorer is not None) and (
                    (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or finished)
                if saving or evaluating or step == start or (step + 1) % METRICS_FETCH_EVERY == 0:
                    # The host-device sync point: until here the host only enqueued steps, building each next
                    # batch while the device ran the previous step. The first step is fetched alone (it compiles).
                    fetched, pending = jax.device_get(pending), []
                    now = time.perf_counter()
                    seconds = (now - tick) / len(fetched)  # the window's steps share its time evenly
                    tokens_per_sec = tokens_per_step / seconds
                    mfu = tokens_per_sec * flops_per_token / peak if peak else None
                    for number, out, (bad_in_row, bad_total) in fetched:
                        out = {k: float(v) for k, v in out.items()}
                        metrics.write({"step": number, "kind": "train", **out, "tokens_per_sec": tokens_per_sec,
                                       "mfu": mfu, "skipped_steps": int(bad_total)})
                        if bad_in_row:
                            check_bad_step(number, out, int(bad_in_row), cfg, saved_step, say)
                        progress.update(number, out, seconds)
                    tick = now
                raise_background_failure()
                if saving:
                    saved_step = save(step + 1, state)
                if evaluating:
                    last_eval, last_eval_step = evaluate(state.params), step + 1
                    metrics.write({"step": step + 1, "kind": "eval", **last_eval})
                    say(f"step {step + 1}: eval {eval_text(last_eval)}")
                    if not stopping and signals.arrived_alone():  # during the eval: stop here, not a step later
                        stopping = True
                        saved_step = saved_step if saving else save(step + 1, state)
                if stopping:
                    break
                if saving or evaluating:
                    tick = time.perf_counter()  # eval and checkpoint time are not training time
            progress.close()
        finally:
            metrics.close()
            signals.disarm()
    # Leaving the with-block waited for every pending save.
    if stopping:
        say(f"stopped by {signals.cause}: saved the checkpoint of step {saved_step} in {checkpoints.directory}")
        return signals.exit_code
    signals.check()
    if cfg.sample_tokens and cfg.task == "causal_lm":  # every process takes part: the parameters are spread
        with layout.active():
            text = complete(graphdef, layers_of(state.params), train_data.tokenizer, cfg.sample_prompt,
                            cfg.sample_tokens, cfg.generation_positions, seed=cfg.seed, entmax=cfg.entmax_loss)
        say(f"sample:\n{cfg.sample_prompt}{text}")
        signals.check()
    checkpoint = os.path.join(cfg.model_path, "checkpoints", str(saved_step)) if saved_step is not None else None
    for line in progress.summary(steps_done, last_eval, last_eval_step, checkpoint, cfg.model_path):
        say(line)
    return 0


def eval_missed(cfg, step: int) -> bool:
    """Whether an eval was due at ``step`` (every ``eval_every`` steps, and at ``train_steps``) and metrics.jsonl
    holds none. The loop saves a step's checkpoint before evaluating it, so a run killed during that eval resumes
    after it, and would never write its row. Process 0's file decides for every process (eval is collective)."""
    import jax

    from parallel.distributed import process_zero_value
    from training.metrics import read_rows

    due = step > 0 and (step == cfg.train_steps or bool(cfg.eval_every and step % cfg.eval_every == 0))
    if not due:
        return False
    rows = read_rows(os.path.join(cfg.model_path, "metrics.jsonl"))[0] if jax.process_index() == 0 else []
    return bool(process_zero_value(not any(row["step"] == step and row.get("kind") == "eval" for row in rows)))


def eval_text(result: dict) -> str:
    """``loss 5.2471  perplexity 190.0074  lambada_examples 330``: counts as counts, the rest to 4 decimals."""
    return "  ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {v:.4f}" for k, v in result.items())


def same_eval(stored: dict, result: dict) -> bool:
    """Whether a stored eval row holds ``result``'s numbers (non-finite ones are stored as null)."""
    def same(old, new) -> bool:
        if old is None or not math.isfinite(new):
            return old is None and not math.isfinite(new)
        return math.isclose(old, new, rel_tol=1e-6)

    return all(key in stored and same(stored[key], value) for key, value in result.items())


def task_scorer(cfg, graphdef, params, train_data, layout):
    """The scorer of the config's ``eval_tasks`` (None without any), reading text with the run's tokenizer."""
    if not cfg.eval_tasks:
        return None
    from data.source import make_tokenizer
    from evaluation.scorer import Scorer

    tokenizer = train_data.tokenizer if train_data is not None else make_tokenizer(cfg)
    return Scorer(cfg, graphdef, params, tokenizer, layout, batch_size=cfg.eval_batch_size)


def check_bad_step(step: int, out: dict, in_row: int, cfg, saved_step, say) -> None:
    """Reports a skipped step; stops the run (one line, no checkpoint) after ``max_bad_steps`` in a row."""
    from config import ConfigError

    finite = math.isfinite(out["loss"]) and math.isfinite(out["grad_norm"])
    why = ("non-finite loss or gradient" if not finite else
           f"gradient norm {out['grad_norm']:.3g} above {cfg.grad_spike_factor:g} x its running mean")
    if in_row >= cfg.max_bad_steps:
        last = f"step {saved_step}" if saved_step is not None else "none"
        raise ConfigError(f"step {step}: {in_row} steps in a row skipped ({why}, max_bad_steps={cfg.max_bad_steps}); "
                          f"stopped without saving (the last checkpoint, {last}, is intact); lower lr or check "
                          "the data")
    say(f"step {step}: {why}; update skipped ({in_row} in a row, stopping at {cfg.max_bad_steps})")


def peft_base_note(cfg) -> str | None:
    """A note for a parameter-efficient run with nothing to fine-tune: no init_from, so its frozen parameters stay
    the seeded random init (the README's fine-tuning templates run so without --init-from)."""
    if cfg.peft is None or cfg.init_from is not None or "all" in (cfg.peft_settings.get("trainable") or ()):
        return None
    return ("note: peft without init_from: the frozen parameters keep this run's random init; to fine-tune a trained "
            "model give --init-from DIR or ORG/NAME")


def restore_input_position(source, checkpoints, step: int, cfg, shardings: dict, shapes: dict) -> str | None:
    """Puts the train source at checkpoint ``step``'s batch (``step - data_start_step``) from the input position
    saved with the checkpoint (no re-reading) for this process's rows of the batch; returns the line to print (None
    when the source needs no position)."""
    from parallel.distributed import process_rows

    field = next(iter(shardings))  # every field is split over batch the same way
    rows = process_rows(shardings[field], shapes[field])
    return source.restore(step - cfg.data_start_step, shapes[field][0], rows, checkpoints.restore_input(step))


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())
