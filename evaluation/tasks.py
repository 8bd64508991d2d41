"""The evaluation tasks by name: what ``eval_tasks`` in a config, ``train.py --eval`` and ``eval.py`` run."""

from __future__ import annotations

from config import EVAL_TASKS as TASKS  # the names eval_tasks accepts: one list, kept beside the config's keys
from config import ConfigError


def run_tasks(scorer, tasks, lambada_path: str | None = None, multiple_choice_path: str | None = None,
              limit: int | None = None) -> dict:
    """{metric: value} of every task in ``tasks`` on ``scorer``'s model (each task's metrics carry its name)."""
    from evaluation import lambada, multiple_choice

    result = {}
    for task in tasks:
        if task == "lambada":
            result.update(lambada.evaluate(scorer, lambada_path, limit))
        elif task == "multiple_choice":
            if multiple_choice_path is None:
                raise ConfigError("multiple_choice: no questions file (multiple_choice_path, or "
                                  "--multiple-choice-path)")
            result.update(multiple_choice.evaluate(scorer, multiple_choice_path, limit))
        else:
            raise ConfigError(f"unknown evaluation task {task!r} (known: {', '.join(TASKS)})")
    return result


def check_config_tasks(cfg) -> None:
    """Reads the files of the config's ``eval_tasks`` as their evaluation will: a missing file (naming its key) or
    a line they cannot score is a one-line error before training, not after ``eval_every`` steps of it."""
    import os

    from evaluation import lambada, multiple_choice

    for key in ("lambada_path", "multiple_choice_path"):
        path = getattr(cfg, key)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{key}: {path}: no such file")
    if "lambada" in cfg.eval_tasks:
        lambada.read_examples(cfg.lambada_path or lambada.EMBEDDED, cfg.eval_task_examples)
    if "multiple_choice" in cfg.eval_tasks and cfg.multiple_choice_path is not None:
        multiple_choice.read_questions(cfg.multiple_choice_path, cfg.eval_task_examples)


def run_config_tasks(scorer, cfg) -> dict:
    """``run_tasks`` with the config's ``eval_tasks`` and their files."""
    return run_tasks(scorer, cfg.eval_tasks, cfg.lambada_path, cfg.multiple_choice_path, cfg.eval_task_examples)
