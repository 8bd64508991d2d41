"""notebooks/neomesh_colab.ipynb runs end to end (CPU, small settings injected after its parameters cell, as
papermill does): the loss falls, a sample is printed, LAMBADA is evaluated, the export is written, and the run
resumes."""

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from tests.common import ROOT
from tests.xla_test_flags import FAST_COMPILE

NOTEBOOK = os.path.join(ROOT, "notebooks", "neomesh_colab.ipynb")


@pytest.mark.e2e
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)  # one CPU device, as a user's kernel sees it
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
