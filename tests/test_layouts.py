"""Golden layouts: the PartitionSpecs of the named activations and of every parameter, for every shipped config
on its own mesh (8 devices where mesh_shape leaves the count open) and for pod-sized 2-D and 3-D meshes, must
equal the files under
tests/golden_layouts/. The meshes are abstract (jax.sharding.AbstractMesh), so a 256-device table needs no
devices. After an intended change, regenerate with
``NEOMESH_UPDATE_GOLDEN=1 python -m pytest tests/test_layouts.py`` and review the diff."""

import glob
import math
import os

import jax
import pytest

from config import load_config
from training.peft import build_model
from models.axes import HEADS, HIDDEN, LOGITS
from parallel.layout import Layout
from parallel.mesh import abstract_mesh
from parallel.state import abstract_model, param_shardings, path_name
from tests.common import ROOT

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.json")))
GOLDEN = os.path.join(ROOT, "tests", "golden_layouts")

ACTIVATIONS = {"residual": HIDDEN, "logits": LOGITS, "heads": HEADS}

# (config, mesh_shape, layout): GPT-Neo's own pod layouts and NeoMesh's multi-axis ones.
MESH_CASES = {
    "gpt_neo_2.7B@x128_y2": ("gpt_neo_2.7B", "x:128,y:2", "embd:y,batch:x"),  # GPT-Neo's 2.7B on a v3-256
    "gpt_neo_13B@fsdp_tensor": (  # 2-D: FSDP over x, Megatron over y, residual stream whole
        "gpt_neo_13B", "x:32,y:8",
        "batch:x,embd:x,heads:y,intermediate_expanded:y,activation_embd:none"),
    "gpt_neo_1.3B@data_fsdp_tensor": (  # 3-D: batch over data and fsdp, parameters over fsdp, heads over tensor
        "gpt_neo_1.3B", "data:4,fsdp:8,tensor:8",
        "batch:data+fsdp,embd:fsdp,heads:tensor,intermediate_expanded:tensor,activation_embd:none"),
    "moe@data_expert_tensor": (  # 3-D with experts over two axes
        "moe", "x:4,y:2,z:2", "batch:x+y,experts:x+y,heads:z,intermediate_expanded:z"),
    "t5_small_spans@data_tensor": (  # encoder, decoder, cross-attention and relative position bias over y
        "t5_small_spans", "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y"),
}


def device_count(mesh_shape: str) -> int:
    """The devices a mesh_shape asks for; 8 (the test machine's simulated count) when one axis is -1."""
    sizes = [int(part.split(":")[1]) for part in mesh_shape.split(",")]
    return 8 if -1 in sizes else math.prod(sizes)


def layout_table(config_path: str, mesh_shape: str | None = None, layout_text: str | None = None) -> str:
    cfg, _ = load_config(config_path)
    mesh_shape, layout_text = mesh_shape or cfg.mesh_shape, layout_text or cfg.layout
    layout = Layout.from_config(abstract_mesh(mesh_shape, device_count(mesh_shape)), layout_text)
    _, abstract, logical = abstract_model(lambda rngs: build_model(cfg, rngs))
    shardings = param_shardings(layout, abstract, logical)
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    header = f"# mesh_shape {mesh_shape} -> {dict(layout.mesh.shape)}; layout {layout_text}\n"
    activations = "".join(f"activation {name} {names}: {tuple(layout.spec(names))}\n"
                          for name, names in ACTIVATIONS.items())
    return header + activations + "".join(f"{path_name(path)}: {tuple(s.spec)}\n" for path, s in flat)


def check_golden(name: str, table: str) -> None:
    golden = os.path.join(GOLDEN, name + ".txt")
    if os.environ.get("NEOMESH_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(golden, "w") as f:
            f.write(table)
    with open(golden) as f:
        assert table == f.read(), f"layout {name} changed; see the module docstring to regenerate"


def test_every_shipped_config_has_a_golden_file():
    names = {os.path.basename(p)[:-5] for p in CONFIGS}
    assert {"quickstart", "gpt_neo_125M", "gpt_neo_1.3B", "gpt_neo_2.7B", "gpt_neo_13B", "moe", "par"} <= names
    for name in names:
        assert os.path.exists(os.path.join(GOLDEN, name + ".txt")), name


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: os.path.basename(p))
def test_layout_matches_golden(config_path):
    check_golden(os.path.basename(config_path)[:-5], layout_table(config_path))


@pytest.mark.parametrize("name", MESH_CASES)
def test_pod_mesh_layout_matches_golden(name):
    config, mesh_shape, layout = MESH_CASES[name]
    table = layout_table(os.path.join(ROOT, "configs", config + ".json"), mesh_shape, layout)
    check_golden(name, table)


def test_a_mesh_axis_no_rule_names_warns_once(capsys):
    """Its devices would repeat each other's work without a word; a size-1 axis repeats nothing."""
    Layout.from_config(abstract_mesh("x:4,y:2,z:1", 8), "batch:x")
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: layout: no rule names mesh axis 'y' (size 2), so its 2 devices each repeat the same work; name it "
        "in the layout (e.g. 'batch:x+y') or drop it from mesh_shape"]
    Layout.from_config(abstract_mesh("x:4,y:2", 8), "batch:x,sequence:y")
    Layout.from_config(abstract_mesh("x:4,y:2", 8), "batch:x+y,heads:none")
    assert capsys.readouterr().err == ""


def test_a_part_whose_logical_axis_is_no_dimension_name_is_one_line_naming_it():
    """A part swapped into a block with MaxText's 'embed' for 'embd' was left whole on every device, silently."""
    from flax import nnx

    from config import ConfigError
    from models.axes import axes
    from tests.common import tiny_config

    def swapped(rngs):
        model = build_model(tiny_config(), rngs)
        kernel = jax.numpy.zeros((64, 256))  # (D, F)
        model.blocks[0].mlp.c_fc.kernel = nnx.Param(kernel, **axes("embed", "intermediate_expanded"))
        return model

    layout = Layout.from_config(abstract_mesh("x:4,y:2", 8), "batch:x,embd:y")
    _, abstract, logical = abstract_model(swapped)
    with pytest.raises(ConfigError, match=r"^parameter blocks/0/mlp/c_fc/kernel: logical axis 'embed' is no "
                                          r"dimension name; did you mean 'embd'\?"):
        param_shardings(layout, abstract, logical)


def test_an_activation_constrained_by_a_name_that_is_no_dimension_is_one_line_on_one_device_too():
    """``constrain(x, ("batch", "sequence", "embed"))`` in a custom part was a no-op on one device and left the
    activation whole on a mesh, silently; a name for each dimension is checked too."""
    from config import ConfigError
    from models.axes import constrain

    x = jax.numpy.zeros((2, 3, 4))
    assert constrain(x, HIDDEN) is x  # one device: a no-op
    with pytest.raises(ConfigError, match=r"^constrain: logical axis 'embed' is no dimension name; did you mean "
                                          r"'embd'\?$"):
        constrain(x, ("batch", "sequence", "embed"))
    with pytest.raises(ValueError, match=r"^constrain: 2 dimension names \('batch', 'sequence'\) for an array of "
                                         r"shape \(2, 3, 4\)$"):
        constrain(x, ("batch", "sequence"))
