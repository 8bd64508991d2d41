"""EleutherAI's lm-evaluation-harness on NeoMesh models: the harness's model ``neomesh``.

    python -m evaluation.harness --model neomesh --model_args path=runs/quickstart --tasks lambada_openai
    python -m evaluation.harness --model neomesh --model_args path=HF_DIR,batch_size=16 \\
        --tasks my_task --include_path my_tasks/

The command is the harness's own command line (``lm_eval``'s arguments, all of them) with the ``neomesh``
model registered first: lm_eval has no plug-in entry point for models, so plain ``lm_eval --model neomesh``
cannot find it. From Python, ``lm_eval.simple_evaluate(model=NeoMeshLM(path=...), tasks=[...])``.

``path`` is a NeoMesh run directory or a Hugging Face GPT-Neo/GPT-2 directory; ``batch_size`` rows are scored
per jitted call; ``mesh_shape``/``layout`` shard the model as in predict.py (their commas need lm_eval's JSON
form: ``--model_args '{"path": "RUN", "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y"}'``). Needs
``pip install lm_eval`` (the ``eval`` extra).
"""

from __future__ import annotations

import os
import sys

import numpy as np

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # requirements.txt leaves it out: the [eval] extra
    if __name__ != "__main__" or not (e.name or "").startswith("lm_eval"):
        raise
    print("error: python -m evaluation.harness runs lm-evaluation-harness, which is not installed: pip install "
          "lm_eval (or NeoMesh's [eval] extra)", file=sys.stderr)
    sys.exit(2)

from config import ConfigError
from evaluation.scorer import LENGTH_STEP, Scorer

DEFAULT_MAX_GEN_TOKS = 256
MODEL_ARGS = ("path", "batch_size", "mesh_shape", "layout", "max_gen_toks")


@register_model("neomesh")
class NeoMeshLM(LM):
    """``loglikelihood``, ``loglikelihood_rolling`` and ``generate_until`` over one loaded NeoMesh model."""

    def __init__(self, path: str, batch_size: int | str = 8, mesh_shape: str | None = None,
                 layout: str = "batch:x", max_gen_toks: int = DEFAULT_MAX_GEN_TOKS):
        super().__init__()
        from pretrained import layout_for

        if str(batch_size).startswith("auto"):
            batch_size = 8  # no memory probing: a fixed batch
        self.scorer = Scorer.from_pretrained(path, layout_for(mesh_shape, layout), int(batch_size))
        self.tokenizer = self.scorer.tokenizer
        self.max_gen_toks = int(max_gen_toks)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "NeoMeshLM":
        """The command line's ``--model_args`` (checked: a misspelt ``mesh_shape`` must not run unsharded) win
        over its general options (``--batch_size`` defaults to 1; those this model has no use for, ``device``,
        are left out)."""
        unknown = [key for key in arg_dict if key not in MODEL_ARGS]
        if unknown:
            raise ConfigError(f"--model_args {unknown[0]}: not an argument of the neomesh model "
                              f"({', '.join(MODEL_ARGS)})")
        if "path" not in arg_dict:
            raise ConfigError("--model_args: give path=DIR (a NeoMesh run or a Hugging Face model directory)")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in MODEL_ARGS}
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "NeoMeshLM":
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        scores = self.scorer.loglikelihood([request.args for request in requests])
        return [(score.logprob, score.greedy) for score in scores]

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Each text's whole log-likelihood after end-of-text, in windows of ``n_ctx`` that score every token
        once, each with as much context as fits (the harness's rolling windows)."""
        windows, owner = [], []
        for index, request in enumerate(requests):
            (text,) = request.args
            for window in get_rolling_token_windows(self.tokenizer.encode(text), self.tokenizer.eos_id,
                                                    self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, score in zip(owner, self.scorer.score_tokens(windows)):
            totals[index] += score.logprob
        return totals

    def generate_until(self, requests) -> list[str]:
        """Greedy (or, with ``do_sample``, sampled) continuations, cut at the first of ``until``; requests with
        the same settings run as one left-padded batch of ``batch_size`` rows."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(self._settings(request.args[1]), []).append(index)
        for settings, indices in groups.items():
            for start in range(0, len(indices), self.scorer.batch_size):
                chunk = indices[start:start + self.scorer.batch_size]
                texts = self._generate([requests[i].args[0] for i in chunk], *settings)
                for i, text in zip(chunk, texts):
                    out[i] = text
        return out  # type: ignore[return-value]

    def _settings(self, kwargs: dict) -> tuple:
        kwargs = dict(kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        temperature = float(kwargs.pop("temperature", 0.0)) if kwargs.pop("do_sample", False) else 0.0
        return tuple(until), max_new, temperature

    def _generate(self, contexts: list[str], until: tuple, max_new: int, temperature: float) -> list[str]:
        import jax

        from models.generate import Sampling, sample

        tokenizer, n_ctx = self.tokenizer, self.max_length
        max_new = min(max_new, n_ctx - 1)
        encoded = [(tokenizer.encode(c) or [tokenizer.eos_id])[-(n_ctx - max_new):] for c in contexts]
        width = min(n_ctx - max_new, -(-max(map(len, encoded)) // LENGTH_STEP) * LENGTH_STEP)
        rows = self.scorer.batch_size  # a fixed batch: one compiled program per width
        prompts = np.full((rows, width), tokenizer.eos_id, np.int32)
        pad = np.full((rows,), width - 1, np.int32)
        for row, ids in enumerate(encoded):
            prompts[row, width - len(ids):], pad[row] = ids, width - len(ids)  # left-padded
        settings = Sampling(max_new_tokens=max_new, temperature=temperature, eos_id=tokenizer.eos_id)
        with self.scorer.layout.active():
            tokens = np.asarray(jax.device_get(sample(self.scorer.graphdef, self.scorer.params, prompts, pad,
                                                      settings, jax.random.key(0))))
        texts = []
        for ids in tokens[:len(contexts)].tolist():
            ids = ids[:ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids
            text = tokenizer.decode(ids)
            cut = min((text.find(stop) for stop in until if stop and stop in text), default=-1)
            texts.append(text if cut < 0 else text[:cut])
        return texts


def main(argv=None) -> int:
    """lm_eval's command line with the ``neomesh`` model registered, under predict.py's XLA defaults and
    compilation cache (jax is imported by now, but starts its backends at the first computation)."""
    from neomesh.errors import run_main
    from parallel.xla_flags import apply_defaults

    apply_defaults()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    return run_main(_evaluate)  # Ctrl-C is one line, as in the other commands


def _evaluate() -> None:
    from lm_eval.__main__ import cli_evaluate

    _check_include_path(sys.argv[1:])
    _check_model_args(sys.argv[1:])
    try:
        cli_evaluate()
    except ValueError as e:  # lm_eval's way to say a --tasks name is unknown, with a traceback
        if not str(e).startswith("Tasks not found"):
            raise
        raise ConfigError(f"--tasks: {_first_line(e)} (lm_eval's own: python -m evaluation.harness ls tasks; a task "
                          "of your own is a YAML file in the folder --include_path names)") from None
    except ConnectionError as e:  # datasets' word for a task whose data is neither cached nor reachable
        raise ConfigError(f"--tasks: {_first_line(e)}: the task's data set comes from the Hugging Face Hub; run it "
                          "once with network (it is cached, then HF_DATASETS_OFFLINE=1 reads the cache), or give a "
                          "task of your own whose YAML names local files (--include_path)") from None


def _first_line(e: BaseException) -> str:
    """The first line of ``e``: the error shows only its message's first line, and the advice must follow it."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _option_values(args: list[str], names: tuple[str, ...]) -> list[str]:
    """The values given to an option of lm_eval's (``--name V ...``, several for nargs="+", or ``--name=V``)."""
    values = []
    for i, arg in enumerate(args):
        if arg in names:
            for value in args[i + 1:]:
                if value.startswith("-"):
                    break
                values.append(value)
        elif arg.split("=", 1)[0] in names and "=" in arg:
            values.append(arg.split("=", 1)[1])
    return values


def _check_model_args(args: list[str]) -> None:
    """lm_eval splits key=value --model_args at every comma, so mesh_shape=x:4,y:2 ended in its "expected
    `key=value`, got 'y:2'", naming neither the key nor the way out: the JSON form, which keeps commas."""
    import json

    try:  # lm_eval's own split: quotes and brackets keep their commas (a private module, so it may move)
        from lm_eval._cli.utils import split_top_level
    except ImportError:
        def split_top_level(text: str) -> list[str]:
            return text.split(",")

    values = _option_values(args, ("--model_args", "-a"))
    if "neomesh" not in _option_values(args, ("--model",)) or not values or values[0].lstrip().startswith("{"):
        return  # another model's, or the JSON form
    pieces = [piece for value in values for piece in split_top_level(value)]
    stray = next((piece for piece in pieces if "=" not in piece), None)
    if stray is not None:
        example = _as_json(pieces) if "=" in pieces[0] else \
            {"path": "RUN", "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y"}
        raise ConfigError(f"--model_args: {stray!r} is not key=value: lm_eval splits --model_args at commas, so "
                          f"values holding commas (mesh_shape, layout) go in its JSON form: --model_args "
                          f"'{json.dumps(example)}'")


def _as_json(pieces: list[str]) -> dict[str, str]:
    """The arguments the user meant: each piece without '=' is the rest of the value before it."""
    meant: dict[str, str] = {}
    for piece in pieces:
        if "=" in piece:
            key, value = piece.split("=", 1)
            meant[key] = value
        else:
            meant[key] += "," + piece
    return meant


def _check_include_path(args: list[str]) -> None:
    """A missing --include_path folder is one line (lm_eval went on to 'Tasks not found' and a traceback)."""
    for i, arg in enumerate(args):
        path = args[i + 1] if arg == "--include_path" and i + 1 < len(args) else \
            arg.split("=", 1)[1] if arg.startswith("--include_path=") else None
        if path is not None and not os.path.exists(path):
            raise ConfigError(f"--include_path {path}: no such folder (it holds the YAML files of your own tasks)")


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())
