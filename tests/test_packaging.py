"""pyproject.toml: every top-level package is declared, the console commands exist, and a built wheel installed
into a fresh virtual environment runs its commands from any directory with the shipped configs."""

import importlib
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tests.common import ROOT

with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    PYPROJECT = tomllib.load(f)
NOT_INSTALLED = {"tests", "benchmarks", "configs", "runs", "data_cache", "build", "notebooks"}


def test_every_top_level_module_is_declared():
    """A new top-level package (e.g. convert/) must be added to pyproject.toml, or installed commands break."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    on_disk = {name[:-3] for name in os.listdir(ROOT) if name.endswith(".py")}
    on_disk |= {name for name in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, name, "__init__.py"))}
    declared = set(setuptools["py-modules"]) | {p for p in setuptools["packages"] if "." not in p}
    assert on_disk - NOT_INSTALLED == declared


def test_console_commands_point_at_functions():
    scripts = PYPROJECT["project"]["scripts"]
    assert {"neomesh-train", "neomesh-predict", "neomesh-make-dataset", "neomesh-hf"} <= set(scripts)
    for target in scripts.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_extras_and_license():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"data", "gpu", "tpu", "test", "tensorboard"} <= set(extras)
    assert any(r.startswith("tensorflow-cpu") for r in extras["data"])
    assert any(r.startswith("tensorboard") for r in extras["tensorboard"])
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    with open(os.path.join(ROOT, "LICENSE")) as f:
        assert "Apache License" in f.read(200)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from a copy of the tree, installed (no dependencies: they come from the system) into a
    fresh virtual environment; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "runs", "data_cache", "build", "*.egg-info", "__pycache__", ".pytest_cache", "tests"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            str(source), "-w", str(tmp / "wheels")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp / "wheels").iterdir()
    names = zipfile.ZipFile(wheel).namelist()
    assert {"config.py", "train.py", "predict.py", "pretrained.py", "neomesh/configs/quickstart.json",
            "neomesh/configs/dataset_configs/embedded_bpe.json", "models/gpt_neo.py", "convert/hf.py",
            "data/make_dataset.py"} <= set(names)
    assert any(n.endswith("licenses/LICENSE") for n in names) and not any(n.startswith("tests/") for n in names)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def run_installed(bin_dir, command, *args, cwd, env=None):
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(bin_dir / command), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**environment, **(env or {})})


def test_installed_commands_run_from_any_directory(installed, tmp_path):
    listing = run_installed(installed, "neomesh-train", "--config", "quickstart", "--help-config", cwd=tmp_path)
    assert listing.returncode == 0 and "log_every" in listing.stdout
    by_model = run_installed(installed, "neomesh-predict", "--model", "quickstart", "--prompt", "x", cwd=tmp_path)
    assert by_model.returncode == 2 and "runs/quickstart: no such run directory" in by_model.stderr, by_model.stderr
    typo = run_installed(installed, "neomesh-train", "--config", "configs/quickstat.json", cwd=tmp_path)
    assert typo.returncode == 2 and "did you mean configs/quickstart.json?" in typo.stderr
    bad_set = run_installed(installed, "neomesh-train", "--config", "configs/quickstart.json", "--set", "n_embed=8",
                            cwd=tmp_path)
    assert bad_set.returncode == 2 and "error: --set n_embed=8: unknown key 'n_embed'" in bad_set.stderr
    missing = run_installed(installed, "neomesh-predict", "--hf-model", "EleutherAI/gpt-neo-125M", "--prompt", "x",
                            cwd=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert missing.returncode == 2 and "huggingface-cli download EleutherAI/gpt-neo-125M" in missing.stderr
    for command in ("neomesh-make-dataset", "neomesh-train-tokenizer", "neomesh-create-tfrecords", "neomesh-hf"):
        helped = run_installed(installed, command, "--help", cwd=tmp_path)
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {command}"), helped.stderr
    where = subprocess.run([str(installed / "python"), "-c", "import data.source as s, neomesh.paths as p; "
                            "print(p.in_checkout(), s.DATASET_CONFIG_DIR, p.work_root())"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    in_checkout, dataset_configs, work_root = where.stdout.split()
    assert in_checkout == "False" and dataset_configs.startswith(str(installed.parent))  # the installed copy
    assert work_root == str(tmp_path)  # data_cache/ goes where the command runs, not into site-packages


def test_a_shadowing_module_is_named_in_one_line(installed, tmp_path):
    (tmp_path / "shadow" / "data").mkdir(parents=True)
    (tmp_path / "shadow" / "data" / "__init__.py").write_text("")
    result = run_installed(installed, "neomesh-train", "--help", cwd=tmp_path,
                           env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert result.returncode == 2
    assert result.stderr.startswith("error: NeoMesh's top-level modules are shadowed by other files: data (")
