"""Multi-axis layouts: a dimension over several mesh axes (``batch:x+y``), ``none``, activation dimensions placed
apart from the parameters', and data x FSDP x tensor (and sequence-parallel) runs equal to one device."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from config import ConfigError
from parallel.layout import Layout
from parallel.mesh import abstract_mesh, parse_mesh_shape
from tests.common import random_batches, tiny_config, train_losses

RESIDUAL = ("batch", "sequence", "activation_embd")
LOGITS = ("batch", "sequence", "activation_vocab")


def layout(text: str, mesh_shape: str = "x:2,y:2,z:2") -> Layout:
    return Layout.from_config(abstract_mesh(mesh_shape, 8), text)


def test_a_dimension_over_several_axes():
    lay = layout("batch:x+y,embd:z")
    assert lay.spec(("batch", None)) == P(("x", "y"), None)
    assert lay.axis_size("batch") == 4
    assert lay.spec(RESIDUAL) == P(("x", "y"), None, "z")  # the residual stream follows embd by default


def test_a_dimension_gets_all_its_axes_or_none():
    # batch takes x first, so embd (x+y) cannot have x and stays whole rather than taking y alone.
    assert layout("batch:x,embd:x+y").spec(RESIDUAL) == P("x", None, None)
    assert layout("batch:x,embd:x+y").spec(("embd", "heads")) == P(("x", "y"), None)


def test_activation_dimensions_placed_apart_from_parameters():
    lay = layout("batch:x,embd:y,heads:z,activation_embd:none,vocab:z,activation_vocab:y")
    assert lay.spec(("embd", "heads", "features_per_head")) == P("y", "z", None)  # weights: 2-D sharded
    assert lay.spec(RESIDUAL) == P("x", None, None)  # residual stream: whole on the model dimension
    assert lay.spec(("vocab", "embd")) == P("z", "y")
    assert lay.spec(LOGITS) == P("x", None, "y")


def test_sequence_parallelism_is_rule_order():
    # Megatron-style sequence parallelism: y splits heads / intermediate inside the sub-layers (named first)
    # and the sequence of the residual stream between them.
    lay = layout("batch:x,heads:y,intermediate_expanded:y,sequence:y", "x:2,y:4")
    assert lay.spec(("batch", "sequence", "heads", "features_per_head")) == P("x", None, "y", None)
    assert lay.spec(("batch", "sequence", "intermediate_expanded")) == P("x", None, "y")
    assert lay.spec(RESIDUAL) == P("x", "y", None)


@pytest.mark.parametrize("text, message", [
    ("batch:x+q", "names mesh axis 'q', which is not in mesh_shape"),
    ("batch:x+x", "names a mesh axis twice"),
    ("activation_emb:none", "did you mean 'activation_embd'"),
    ("batch:", "is not dimension:mesh_axis"),
    ("batch:x+", "is not dimension:mesh_axis"),
])
def test_bad_layouts_are_one_line_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        layout(text)


@pytest.mark.parametrize("text, message", [
    ("batch:x;heads:y", "layout: 'batch:x;heads:y': 'x;heads:y' cannot name a mesh axis (mesh_shape's axis names are "
     "letters, digits and _); rules are separated by ',' (e.g. 'batch:x,heads:y')"),
    ("batch:x y", "layout: 'batch:x y': 'x y' cannot name a mesh axis (mesh_shape's axis names are letters, digits "
     "and _)"),
    ("batch:x+y=2", "layout: 'batch:x+y=2': 'y=2' cannot name a mesh axis (mesh_shape's axis names are letters, "
     "digits and _)"),
])
def test_a_layout_axis_no_mesh_can_have_is_an_error_not_a_warning(text, message, capsys):
    """A rule naming an axis missing from mesh_shape is dropped with a warning (GPT-Neo's meaning); one naming
    something mesh_shape could never call an axis is a typo ('; ' for ','), refused before any device exists."""
    from parallel.layout import check_text
    with pytest.raises(ConfigError) as e:
        check_text("x:4,y:2", text)
    assert str(e.value) == message and capsys.readouterr().err == ""


def test_none_cannot_name_a_mesh_axis():
    with pytest.raises(ConfigError, match="'none' cannot name a mesh axis"):
        parse_mesh_shape("none:8", 8)


def test_multi_axis_split_must_divide():
    lay = layout("batch:x+y+z")
    with pytest.raises(ConfigError, match="has size 6, not divisible by mesh axes 'x\\+y\\+z' of size 8"):
        lay.checked_sharding("train_batch_size", (6, 33), ("batch", None))


MULTI_AXIS_LAYOUTS = [
    # data x FSDP x tensor: batch over x and y, parameters over y (FSDP), heads and MLP over z (Megatron);
    # the residual stream stays whole on the model dimension.
    ("x:2,y:2,z:2", "batch:x+y,embd:y,heads:z,intermediate_expanded:z,activation_embd:none"),
    # 2-D weight sharding (embd over y+z), vocabulary-parallel logits.
    ("x:2,y:2,z:2", "batch:x,embd:y+z,vocab:z,activation_vocab:z"),
    # tensor parallelism with sequence parallelism on the residual stream.
    ("x:2,y:4", "batch:x,heads:y,intermediate_expanded:y,sequence:y"),
]


@pytest.fixture(scope="module")
def reference():
    cfg = tiny_config(warmup_steps=1, lr=3e-3)
    batches = random_batches(cfg, 1, seed=7) * 3  # one batch again and again: the loss must fall
    return cfg, batches, train_losses(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])


@pytest.mark.parametrize("mesh_shape, text", MULTI_AXIS_LAYOUTS)
def test_multi_axis_losses_match_one_device(reference, mesh_shape, text):
    cfg, batches, single = reference
    assert single[-1] < single[0] - 0.1
    np.testing.assert_allclose(train_losses(cfg, batches, mesh_shape, text), single, rtol=0, atol=1e-5)


def test_an_embedding_lookup_reaches_a_residual_stream_kept_whole_without_replicating_it(capfd):
    """With embd split (FSDP over y) and the residual stream whole on it (activation_embd:none), XLA looked the rows
    up split over y and then, to split them over the batch (x+y), replicated them whole ("Involuntary full
    rematerialization", logged at every compile of the documented data x FSDP x tensor layout); the table is now
    gathered whole for the lookup, as FSDP gathers every weight."""
    from flax import nnx

    from models.axes import HIDDEN, axes, constrain
    from models.layers import Embed
    from parallel.mesh import make_mesh

    lay = Layout.from_config(make_mesh("x:2,y:2,z:2"), MULTI_AXIS_LAYOUTS[0][1])
    graphdef, state = nnx.split(Embed(128, 64, embedding_metadata=axes("vocab", "embd"), rngs=nnx.Rngs(0)))
    placed = jax.tree.map(lambda _: lay.sharding(("vocab", "embd")), state)

    def look_up(state, tokens):  # (B, T) -> (B, T, D)
        with lay.active():
            return constrain(nnx.merge(graphdef, state)(tokens), HIDDEN)

    tokens = np.arange(8 * 32).reshape(8, 32) % 128
    rows = jax.jit(look_up, in_shardings=(placed, lay.sharding(("batch", "sequence"))))(
        jax.device_put(state, placed), tokens)
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(state["embedding"][...])[tokens])
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
