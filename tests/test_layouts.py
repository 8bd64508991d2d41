"""Golden layouts: for every shipped config, the {parameter path: PartitionSpec} table on 8 devices must equal
the file under tests/golden_layouts/. After an intended change, regenerate with
``NEOMESH_UPDATE_GOLDEN=1 python -m pytest tests/test_layouts.py`` and review the diff."""

import glob
import os

import jax
import pytest

from config import load_config
from models import registry
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import abstract_model, param_shardings, path_name
from tests.common import ROOT

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.json")))
GOLDEN = os.path.join(ROOT, "tests", "golden_layouts")


def layout_table(config_path: str) -> str:
    cfg, _ = load_config(config_path)
    layout = Layout.from_config(make_mesh(cfg.mesh_shape), cfg.layout)
    _, abstract, logical = abstract_model(lambda rngs: registry.build(cfg, rngs))
    shardings = param_shardings(layout, abstract, logical)
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    header = f"# mesh_shape {cfg.mesh_shape} -> {dict(layout.mesh.shape)}; layout {cfg.layout}\n"
    return header + "".join(f"{path_name(path)}: {tuple(s.spec)}\n" for path, s in flat)


def test_every_shipped_config_has_a_golden_file():
    names = {os.path.basename(p)[:-5] for p in CONFIGS}
    assert {"quickstart", "gpt_neo_125M", "gpt_neo_1.3B", "gpt_neo_2.7B", "moe", "par"} <= names
    assert os.path.exists(os.path.join(GOLDEN, "moe.txt")) and os.path.exists(os.path.join(GOLDEN, "par.txt"))


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: os.path.basename(p))
def test_layout_matches_golden(config_path):
    table = layout_table(config_path)
    golden = os.path.join(GOLDEN, os.path.basename(config_path)[:-5] + ".txt")
    if os.environ.get("NEOMESH_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(golden, "w") as f:
            f.write(table)
    with open(golden) as f:
        assert table == f.read(), f"layout of {config_path} changed; see the module docstring to regenerate"
