"""Console commands of an installed NeoMesh (``[project.scripts]`` in pyproject.toml). Each runs the same
``main`` as its script in the repository, so ``neomesh-train ARGS`` is ``python train.py ARGS``:

    neomesh-train             train.py
    neomesh-predict           predict.py
    neomesh-make-dataset      data/make_dataset.py   (your own text -> tokenizer, TFRecords, dataset config)
    neomesh-train-tokenizer   data/train_tokenizer.py
    neomesh-create-tfrecords  data/create_tfrecords.py
    neomesh-hf                python -m convert      (Hugging Face import / export)
    neomesh-eval              eval.py                (LAMBADA, multiple choice)
    neomesh-lm-eval           python -m evaluation.harness  (lm-evaluation-harness with the neomesh model)
    neomesh-plot              python -m tools.plot   (loss curves of runs as a PNG)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

# NeoMesh's own top-level modules. Installed as top-level names (see pyproject.toml), so another distribution
# with the same generic name could shadow one of them.
OWN_MODULES = ("config", "train", "predict", "pretrained", "eval", "models", "parallel", "training", "data", "convert",
               "evaluation", "tools")


def shadowed_modules() -> list[str]:
    """``name (path)`` of each of NeoMesh's top-level modules that resolves to a file outside NeoMesh."""
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for name in OWN_MODULES:
        spec = importlib.util.find_spec(name)
        where = None if spec is None else (spec.origin if spec.has_location else
                                           next(iter(spec.submodule_search_locations or []), None))
        if where is None or not os.path.abspath(where).startswith(home + os.sep):
            out.append(f"{name} ({where or 'not found'})")
    return out


def _run(module: str, argv=None) -> int:
    shadowed = shadowed_modules()
    if shadowed:
        print(f"error: NeoMesh's top-level modules are shadowed by other files: {', '.join(shadowed)}; install "
              "NeoMesh into its own virtual environment", file=sys.stderr)
        return 2
    return importlib.import_module(module).main(argv)


def train(argv=None) -> int:
    return _run("train", argv)


def predict(argv=None) -> int:
    return _run("predict", argv)


def make_dataset(argv=None) -> int:
    return _run("data.make_dataset", argv)


def train_tokenizer(argv=None) -> int:
    return _run("data.train_tokenizer", argv)


def create_tfrecords(argv=None) -> int:
    return _run("data.create_tfrecords", argv)


def hf_convert(argv=None) -> int:
    """Hugging Face import/export; the one place that knows which module implements it."""
    return _run("convert.__main__", argv)


def evaluate(argv=None) -> int:
    return _run("eval", argv)


def lm_eval(argv=None) -> int:
    if importlib.util.find_spec("lm_eval") is None:  # not in requirements.txt: the [eval] extra
        print("error: neomesh-lm-eval runs lm-evaluation-harness, which is not installed: pip install lm_eval (or "
              "NeoMesh's [eval] extra)", file=sys.stderr)
        return 2
    return _run("evaluation.harness", argv)


def plot(argv=None) -> int:
    return _run("tools.plot", argv)
