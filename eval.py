"""Evaluate a language model: ``python eval.py --model-path runs/quickstart`` (LAMBADA on the shipped passages).

The model comes from a NeoMesh run directory (``--model-path``, default the config's model_path) or a Hugging
Face GPT-Neo/GPT-2 directory (``--hf-model``). Tasks: ``lambada`` (``lambada_acc``, last-word accuracy, and
``lambada_ppl``; a LAMBADA-format jsonl with ``--lambada-path``, e.g. the standard ``lambada_test.jsonl``) and
``multiple_choice`` (``--multiple-choice-path``: jsonl of {context, choices, label}; ``choice_acc``,
``choice_acc_norm``, ``choice_acc_bytes``, ``choice_acc_per_token``). Without ``--tasks`` a run is evaluated on the
tasks whose files are given, else its config's ``eval_tasks``, else lambada. For lm-evaluation-harness tasks see
``python -m evaluation.harness``.
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    from neomesh.help import ArgumentParser, HelpFormatter
    from predict import DEFAULT_LAYOUT

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--config", metavar="FILE", help="JSON config (a path, or a shipped config by name); its "
                       "model_path is the default --model-path")
    which.add_argument("--model", metavar="NAME", help="GPT-Neo's way to name a config: configs/NAME.json")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model-path", help="NeoMesh run directory with checkpoints")
    source.add_argument("--hf-model", metavar="DIR_OR_NAME", help="Hugging Face GPT-Neo/GPT-2 model: a directory, "
                        "or ORG/NAME from the local Hugging Face cache")
    p.add_argument("--adapter", metavar="DIR", help="a Hugging Face peft LoRA adapter directory put on the model, "
                   "as predict.py --adapter puts it")
    p.add_argument("--tasks", metavar="LIST", help="comma-separated: lambada, multiple_choice (default: the "
                   "tasks whose files are given, else the run's eval_tasks, else lambada)")
    p.add_argument("--lambada-path", metavar="FILE", help="LAMBADA-format jsonl (default: the config's lambada_path, "
                   "else the shipped embedded-corpus passages)")
    p.add_argument("--multiple-choice-path", metavar="FILE", help="jsonl of {context, choices, label}")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N examples of each task")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="rows scored at once")
    p.add_argument("--mesh-shape", metavar="SHAPE", help="run sharded on this mesh, e.g. x:4,y:2 (default: one "
                   "device)")
    p.add_argument("--layout", default=DEFAULT_LAYOUT, help="layout with --mesh-shape")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_set_option()
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from parallel.xla_flags import apply_defaults

    apply_defaults()  # before jax starts
    from neomesh.errors import run_main

    def run():
        check_options(args)  # before jax starts: a mistake costs well under a second
        evaluate(args)

    return run_main(run)


def check_options(args) -> None:
    """Checks the options, the task names and the files, all without jax."""
    import os

    from config import ConfigError
    from evaluation.tasks import TASKS
    from predict import check_layout_has_mesh, check_sets_place_nothing, resolve_model_source

    if not (args.config or args.model or args.model_path or args.hf_model):
        raise ConfigError("give --config, --model, --model-path or --hf-model")
    if args.adapter is not None:
        from convert.peft_adapter import is_adapter_dir, not_an_adapter
        if not is_adapter_dir(args.adapter):
            raise ConfigError(f"--adapter {args.adapter}: {not_an_adapter(args.adapter)}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    if args.batch_size < 1:
        raise ConfigError("--batch-size must be at least 1")
    check_layout_has_mesh(args.mesh_shape, args.layout)
    check_sets_place_nothing(args.set, "eval.py")
    check_no_examples_set(args.set)
    resolve_model_source(args)
    if args.tasks is not None:
        args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        unknown = [t for t in args.tasks if t not in TASKS]
        if unknown or not args.tasks:
            raise ConfigError(f"--tasks: unknown task {unknown[0]!r} (known: {', '.join(TASKS)})" if unknown else
                              f"--tasks: no task named (known: {', '.join(TASKS)})")
    files = (("lambada", "--lambada-path", args.lambada_path),
             ("multiple_choice", "--multiple-choice-path", args.multiple_choice_path))
    for task, option, path in files:
        if path is None:
            continue
        if not os.path.isfile(path):
            raise ConfigError(f"{option} {path}: no such file")
        if args.tasks is not None and task not in args.tasks:  # a file given for a task not run: never read
            raise ConfigError(f"{option} is for the {task} task, which --tasks {','.join(args.tasks)} leaves out; "
                              f"add it to --tasks, or drop {option}")
    if args.tasks is None:  # the files given name the tasks wanted
        args.tasks = [task for task, _, path in files if path is not None] or None


def check_no_examples_set(sets) -> None:
    """eval.py scores every example unless --limit (the config's eval_task_examples caps training's evaluations
    only), so a ``--set eval_task_examples=N`` would change nothing, without a word."""
    from config import ConfigError, parse_override

    for text in sets:
        key, value = parse_override(text)
        if key == "eval_task_examples" and value is not None:  # null (all of them) is what eval.py does
            raise ConfigError(f"--set {text}: eval.py scores every example of a task (eval_task_examples caps "
                              f"training's evaluations); give --limit {value}")


def evaluate(args) -> dict:
    import json

    from evaluation.scorer import Scorer
    from evaluation.tasks import run_tasks
    from pretrained import layout_for

    layout = layout_for(args.mesh_shape, args.layout, ("--mesh-shape", "--layout"))
    path = args.hf_model or args.model_path
    scorer = Scorer.from_pretrained(path, layout, args.batch_size, tuple(args.set),
                                    kind="hf" if args.hf_model else "run", adapter=args.adapter)
    cfg = scorer.cfg
    tasks = args.tasks or cfg.eval_tasks or ["lambada"]
    if "multiple_choice" in tasks and not (args.multiple_choice_path or cfg.multiple_choice_path):
        from config import ConfigError
        raise ConfigError("--tasks multiple_choice needs --multiple-choice-path (a jsonl of {context, choices, "
                          "label})")
    result = run_tasks(scorer, tasks, args.lambada_path or cfg.lambada_path,
                       args.multiple_choice_path or cfg.multiple_choice_path, args.limit)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{path}: " + ", ".join(tasks))
        for name, value in result.items():
            print(f"  {name:<28} {value:.4f}" if isinstance(value, float) else f"  {name:<28} {value}")
    return result


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())
