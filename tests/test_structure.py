"""The layout contract, checked on the source: models/ depends on neither parallel/ nor training/, model code
speaks logical dimension names only (mesh axes appear in the layout alone), and TensorFlow stays inside data/
(and starts without loading Keras)."""

import ast
import os
import re
import subprocess
import sys

import pytest

from tests.common import ROOT


def python_files(folder):
    for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
        yield from (os.path.join(dirpath, n) for n in names if n.endswith(".py"))


def imported_modules(path):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@pytest.mark.parametrize("folder", ["models"])
def test_models_import_neither_parallel_nor_training(folder):
    for path in python_files(folder):
        bad = [m for m in imported_modules(path) if m.split(".")[0] in ("parallel", "training", "data", "convert")]
        assert not bad, f"{os.path.relpath(path, ROOT)} imports {bad}"


def test_model_code_names_no_mesh_axis():
    """Mesh axes (GPT-Neo's x, y, z) and partition specs belong to the layout; model code names dimensions."""
    mesh_axis = re.compile(r"""["'][xyz]["']|PartitionSpec|NamedSharding|\bMesh\b""")
    for path in python_files("models"):
        for number, line in enumerate(open(path), 1):
            assert not mesh_axis.search(line), f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}"


@pytest.mark.parametrize("folder", ["models", "parallel", "training", "convert"])
def test_tensorflow_is_imported_only_by_data(folder):
    for path in python_files(folder):
        assert not [m for m in imported_modules(path) if m.split(".")[0] == "tensorflow"], path


def test_tensorflow_starts_without_keras_and_tf_keras_still_works():
    """data/tf_import skips TensorFlow's eager Keras load (seconds of every run's start-up), TFDS included;
    tf.keras still loads."""
    code = ("import os, sys; from data.tf_import import tensorflow, tensorflow_datasets; tensorflow_datasets(); "
            "tf = tensorflow(); "
            "print('keras' in sys.modules, 'TF_USE_LEGACY_KERAS' in os.environ, "
            "int(tf.data.Dataset.range(4).reduce(tf.constant(0, tf.int64), lambda a, b: a + b)), "
            "tf.keras.layers.Dense.__module__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"})
    assert result.stdout.split() == ["False", "False", "6", "keras.src.layers.core.dense"], result.stderr[-2000:]


@pytest.mark.parametrize("folder", ["models", "parallel", "convert", "benchmarks"])
def test_the_readmes_repository_section_names_every_file(folder):
    """The README's Repository tree names every module of these folders (it left out the ViT family's files and
    the main train-step benchmark)."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    tree = readme.split("\n## Repository\n", 1)[1].split("\n## ", 1)[0]
    files = sorted(n for n in os.listdir(os.path.join(ROOT, folder))
                   if n.endswith((".py", ".sh")) and n not in ("__init__.py", "__main__.py"))
    missing = [n for n in files if not re.search(rf"\b{re.escape(n)}\b", tree)]
    assert not missing, f"README.md's Repository section does not name {folder}/ {', '.join(missing)}"
