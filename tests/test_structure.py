"""The layout contract, checked on the source: models/ depends on neither parallel/ nor training/, model code
speaks logical dimension names only (mesh axes appear in the layout alone), and TensorFlow stays inside data/."""

import ast
import os
import re

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
