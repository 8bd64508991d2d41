"""scan_layers: a stack run as a lax.scan over its repeating group of layers computes what the unrolled stack
computes (losses and gradients, dropout included), keeps the parameter paths, does so sharded, hands XLA the
same program at any depth, and keeps less for the backward pass than the unrolled stack."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from config import ConfigError
from models import registry
from models.block import layer_period
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import abstract_train_state
from parallel.steps import batch_shapes, batch_shardings, make_train_step, objective_sums
from tests.common import random_batches, tiny_config, train_losses
from training.objectives import objective_for
from training.optimizer import learning_rate_schedule, make_optimizer

GPT_NEO = dict(n_layer=4, attention_types=[[["global", "local"], 2]], res_dropout=0.1, attn_dropout=0.1)


def loss_function(cfg, batch):
    """(the loss as a function of the parameters, the parameters as a pure dict)"""
    graphdef, params = nnx.split(registry.build(cfg, nnx.Rngs(0)), nnx.Param)

    def loss(params):
        sums, _, _ = objective_sums(graphdef, objective_for(cfg), params, batch, jnp.float32, jax.random.key(3))
        return sums["loss"] / sums["weight"]

    return loss, nnx.to_pure_dict(params)


def loss_and_grads(cfg, batch):
    loss, params = loss_function(cfg, batch)
    return jax.jit(jax.value_and_grad(loss))(params)


def residual_bytes(cfg, batch) -> int:
    """Bytes of everything the forward pass keeps for the backward pass (traced only, nothing computed)."""
    loss, params = loss_function(cfg, batch)
    kept = jax.eval_shape(lambda params: jax.tree.leaves(jax.vjp(loss, params)[1]), params)
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in kept)


@pytest.mark.parametrize("remat", ["none", "dots_saveable"])
def test_scanned_gpt_neo_equals_unrolled_with_dropout_and_remat(remat):
    cfg = tiny_config(**GPT_NEO, recompute_grad=remat)
    batch = {"tokens": jnp.asarray(random_batches(cfg, 1)[0]["tokens"])}
    loss, grads = loss_and_grads(cfg, batch)
    scanned_loss, scanned_grads = loss_and_grads(cfg.replace(scan_layers=True), batch)
    np.testing.assert_allclose(float(scanned_loss), float(loss), rtol=1e-6)
    assert jax.tree.structure(scanned_grads) == jax.tree.structure(grads)  # the same per-layer parameter paths
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), scanned_grads, grads)


def test_the_scan_recomputes_elementwise_values_instead_of_stacking_them():
    """A scan stacks whatever its backward pass reads, where XLA would fuse the elementwise ops of an unrolled
    stack into their consumers (GPT-2's tanh gelu alone leaves six (B, T, 4D) intermediates): with
    recompute_grad "none" the scanned stack keeps dot products and reductions but recomputes elementwise values,
    and keeps less than half of what the unrolled stack hands XLA."""
    cfg = tiny_config(**GPT_NEO, n_ctx=128)
    batch = {"tokens": jnp.asarray(random_batches(cfg, 1)[0]["tokens"])}
    unrolled = residual_bytes(cfg, batch)
    assert residual_bytes(cfg.replace(scan_layers=True), batch) < unrolled / 2


def test_scanned_t5_with_cross_attention_equals_unrolled():
    cfg = tiny_config(model="t5", n_layer=2, n_decoder_layer=2, n_ctx=16, d_ff=64, n_vocab=64, attention_types=None,
                      span_corruption=False, n_decoder_ctx=8)
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(2, 64, (2, 16)), "segment_ids": np.ones((2, 16), np.int32),
             "targets": rng.integers(2, 64, (2, 8)), "target_segment_ids": np.ones((2, 8), np.int32)}
    batch = jax.tree.map(lambda x: jnp.asarray(x, jnp.int32), batch)
    loss, grads = loss_and_grads(cfg, batch)
    scanned_loss, scanned_grads = loss_and_grads(cfg.replace(scan_layers=True), batch)
    np.testing.assert_allclose(float(scanned_loss), float(loss), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), scanned_grads, grads)


def test_scanned_training_on_8_devices_matches_one_device():
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local"], 2]], warmup_steps=0)
    batches = random_batches(cfg, 2)
    single = train_losses(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    scanned = train_losses(cfg.replace(scan_layers=True), batches, "x:4,y:2", "batch:x,heads:y,embd:y")
    np.testing.assert_allclose(scanned, single, rtol=0, atol=1e-5)


def test_the_scanned_train_step_is_the_same_program_at_any_depth():
    """Parameters and optimizer state stored stacked: nothing in the step runs once per layer, so the program JAX
    hands XLA differs between 4 and 8 layers only in the numbers (the layers axis), and its compile time cannot
    grow with depth. Unrolled, the program grows with every layer."""
    def program(n_layer, scan):
        cfg = tiny_config(n_layer=n_layer, attention_types=[[["global", "local"], n_layer // 2]], scan_layers=scan)
        layout = Layout.from_config(make_mesh("x:2", jax.devices()[:2]), "batch:x")
        tx, objective = make_optimizer(cfg), objective_for(cfg)
        graphdef, abstract, shardings = abstract_train_state(lambda rngs: registry.build(cfg, rngs), tx, layout)
        shapes = batch_shapes(objective, cfg, cfg.train_batch_size)
        data = batch_shardings(layout, objective, shapes)
        step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data)
        batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=data[name]) for name, shape in shapes.items()}
        return re.sub(r"\d+", "N", step.lower(abstract, batch).as_text())

    assert program(4, True) == program(8, True)
    assert program(2, False) != program(4, False)


def test_layer_period_and_the_moe_error():
    blocks = lambda **c: registry.build(tiny_config(**c), nnx.Rngs(0)).blocks  # noqa: E731
    assert layer_period(blocks(n_layer=4, attention_types=[[["global", "local"], 2]])) == 2
    assert layer_period(blocks(n_layer=3, attention_types=[[["global"], 3]])) == 1
    assert layer_period(blocks(n_layer=3, attention_types=[[["global", "local", "local"], 1]])) == 3
    with pytest.raises(ConfigError, match="scan_layers: the mixture-of-experts"):
        tiny_config(scan_layers=True, moe_layers=[1])
