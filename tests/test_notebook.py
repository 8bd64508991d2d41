"""notebooks/neomesh_colab.ipynb runs end to end (CPU, small settings injected after its parameters cell, as
papermill does): the loss falls, a sample is printed, LAMBADA is evaluated, the export is written, and the run
resumes."""

import ast
import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.common import ROOT
from tests.xla_test_flags import fast_compile

NOTEBOOK = os.path.join(ROOT, "notebooks", "neomesh_colab.ipynb")


@pytest.mark.e2e
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", fast_compile())  # one CPU device, as a user's kernel sees it
    monkeypatch.setenv("PYTHONPATH", ROOT)  # a checkout, run from elsewhere (its files land in tmp_path)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (index,) = [i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", [])]
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(
        f"RUN_DIR = {str(tmp_path / 'run')!r}\nEXPORT_DIR = {str(tmp_path / 'export')!r}\n"
        "TRAIN_STEPS, EVAL_EVERY, LAMBADA_EXAMPLES = 30, 30, 8\n"
        'OVERRIDES = ["n_layer=2", \'attention_types=[[["global","local"],1]]\', "train_batch_size=8", '
        '"eval_batch_size=8", "eval_steps=2", "warmup_steps=5", "sample_tokens=16", "n_ctx=64"]'))
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(output.get("text", "") + output.get("data", {}).get("text/plain", "")
                        for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs)
    first, last = map(float, re.search(r"train loss ([\d.]+) -> ([\d.]+) over 30 steps", outputs).groups())
    assert last < first - 0.5, outputs[-3000:]
    assert "=== prompt 1, sample 2 ===\ndef " in outputs  # predict's two samples
    assert re.search(r"LAMBADA \(embedded corpus\): accuracy [\d.]+, perplexity [\d.]+ over 8 passages", outputs)
    assert "model.safetensors" in outputs and (tmp_path / "export" / "config.json").exists()
    assert "resumed from" in outputs and "at step 30" in outputs
    assert any("image/png" in output.get("data", {}) for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs)


def code_cell(notebook, snippet: str) -> str:
    (source,) = [c.source for c in notebook.cells if c.cell_type == "code" and snippet in c.source]
    return source


def run_cells(*sources: str) -> subprocess.CompletedProcess:
    """The cells in a fresh Python started where Jupyter starts a checkout's kernel: notebooks/, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "\n".join(sources)], cwd=os.path.join(ROOT, "notebooks"), env=env,
                          capture_output=True, text=True, timeout=300)


def test_setup_cell_finds_the_checkout_it_sits_in():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    settings = code_cell(notebook, "NEOMESH_SOURCE = ")
    result = run_cells(settings, code_cell(notebook, "NeoMesh is not importable here"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"NeoMesh from {ROOT}"


def test_resume_cell_needs_only_the_settings_cell():
    """After a restart only the settings cell and the resume cell run: the run's own config (what the TPU cell
    chose included) comes from its checkpoint, train_steps 20 beyond the saved one."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    fake_train = ("import sys, types\nsys.modules['train'] = types.SimpleNamespace(main=lambda argv: print(argv) or "
                  "0, newest_saved_config=lambda path: {'train_steps': 2000})")
    result = run_cells(fake_train, code_cell(notebook, "NEOMESH_SOURCE = "), code_cell(notebook, "20 more steps"))
    assert result.returncode == 0, result.stderr[-2000:]
    argv = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert argv == ["--model-path", "runs/notebook", "--set", "train_steps=2020", "--no-progress"]


@pytest.mark.parametrize("prompt", ["2024", '"quoted"', "def "])
def test_train_cell_passes_the_sample_prompt_as_text(prompt):
    """SAMPLE_PROMPT = "2024" went to --set as a JSON number (an error: sample_prompt expected str), and '"quoted"'
    lost its quotes."""
    from config import parse_override

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    fake_train = "import sys, types\nsys.modules['train'] = types.SimpleNamespace(main=lambda argv: print(argv) or 0)"
    result = run_cells(fake_train, code_cell(notebook, "NEOMESH_SOURCE = "), f"SAMPLE_PROMPT = {prompt!r}",
                       code_cell(notebook, "sample_prompt="))
    assert result.returncode == 0, result.stderr[-2000:]
    argv = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    (setting,) = [a for a in argv if a.startswith("sample_prompt=")]
    assert parse_override(setting) == ("sample_prompt", prompt)
