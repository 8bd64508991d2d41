"""Mixture of experts against plain numpy: slot assignment, outputs with and without dropped tokens, the dense MLP
as the one-expert case, no tokens x experts x capacity tensor, and expert-parallel training equal to one device."""

import warnings

import numpy as np
import pytest

import jax
import jax.extend
import jax.numpy as jnp
from flax import nnx

from jax.sharding import PartitionSpec

from models import aux_losses
from models.gpt_neo import GPTNeo
from models.mlp import Mlp
from models.moe import MoeMlp, assign_slots, expert_capacity
from models.spec import ExpertSpec, MlpSpec
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import abstract_train_state
from tests.common import random_batches, tiny_config, train_metrics
from training.optimizer import make_optimizer


def moe_spec(**moe_params) -> MlpSpec:
    experts = ExpertSpec(**{**dict(num_experts=8, top_k=2, capacity_factor=1.25, aux_loss_weight=0.01,
                                   z_loss_weight=0.001), **moe_params})
    return MlpSpec(kind="experts", n_embd=16, d_ff=64, activation="gelu", experts=experts)


def dense_spec() -> MlpSpec:
    return MlpSpec(kind="dense", n_embd=16, d_ff=64, activation="gelu")


def loop_slots(choices, num_experts, capacity):
    """Slot assignment one choice at a time: all first choices in token order, then all second choices."""
    b, t, k = choices.shape
    slot, kept = np.zeros_like(choices), np.zeros(choices.shape, bool)
    for row in range(b):
        used = [0] * num_experts
        for rank in range(k):
            for token in range(t):
                e = choices[row, token, rank]
                slot[row, token, rank] = e * capacity + used[e]
                kept[row, token, rank] = used[e] < capacity
                used[e] += 1
    return slot, kept


@pytest.mark.parametrize("top_k, capacity", [(1, 2), (2, 3), (2, 10)])
def test_slot_assignment_matches_a_loop(top_k, capacity):
    rng = np.random.default_rng(top_k + capacity)
    choices = np.stack([np.stack([rng.permutation(4)[:top_k] for _ in range(10)]) for _ in range(3)])  # (3,10,K)
    slot, kept = jax.jit(assign_slots, static_argnums=(1, 2))(jnp.asarray(choices), 4, capacity)
    want_slot, want_kept = loop_slots(choices, 4, capacity)
    np.testing.assert_array_equal(np.asarray(kept), want_kept)
    np.testing.assert_array_equal(np.asarray(slot)[want_kept], want_slot[want_kept])
    assert (capacity == 10) == bool(want_kept.all())


def test_expert_capacity():
    assert expert_capacity(64, 2, 8, 1.25) == 20  # ceil(2 * 64 * 1.25 / 8)
    assert expert_capacity(64, 1, 1, 1.25) == 64  # never more than the tokens in a group
    assert expert_capacity(4, 1, 64, 0.5) == 1


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def randomized(module, seed=0):
    """Every parameter random (biases too) so that a wrong expert, gate or bias shows."""
    rng = np.random.default_rng(seed)
    state = nnx.state(module, nnx.Param)
    nnx.update(module, jax.tree.map(lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape), jnp.float32), state))
    return module


def run(module, x):
    """(output, sown stats) from a jitted call on the split module."""
    graphdef, state = nnx.split(module)

    def call(state, x):
        out, sown = aux_losses.captured(nnx.merge(graphdef, state))(x)
        return out, aux_losses.collect(sown)

    out, (penalty, metrics) = jax.jit(call)(state, x)
    return np.asarray(out), float(penalty), {k: float(v) for k, v in metrics.items()}


def numpy_moe(p, x, top_k, activation=gelu):
    """Each token on its own: its top-k experts' MLP outputs weighted by the router's gates; float64."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    out = np.zeros(x.shape)
    logits = np.einsum("btd,de->bte", x, p["router"])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            experts = np.argsort(-probs[b, t])[:top_k]
            gates = probs[b, t, experts] / (probs[b, t, experts].sum() if top_k > 1 else 1.0)
            for e, g in zip(experts, gates):
                h = activation(x[b, t] @ p["w_in"][e] + p["b_in"][e])
                out[b, t] += g * (h @ p["w_out"][e] + p["b_out"][e])
    first = np.eye(probs.shape[-1])[probs.argmax(-1)]
    load_balance = probs.shape[-1] * np.sum(first.mean((0, 1)) * probs.mean((0, 1)))
    z_loss = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    return out, load_balance, z_loss


@pytest.mark.parametrize("top_k", [1, 2])
def test_nothing_dropped_equals_per_token_loop(top_k):
    spec = moe_spec(num_experts=4, top_k=top_k, capacity_factor=4.0, aux_loss_weight=0.5, z_loss_weight=0.25)
    moe = randomized(MoeMlp(spec, rngs=nnx.Rngs(0)))
    x = np.random.default_rng(1).standard_normal((2, 12, 16)).astype(np.float32)
    out, penalty, metrics = run(moe, jnp.asarray(x))
    want, load_balance, z_loss = numpy_moe(nnx.to_pure_dict(nnx.state(moe, nnx.Param)), x, top_k)
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
    assert metrics["dropped_tokens_fraction"] == 0.0
    np.testing.assert_allclose(metrics["aux_loss"], load_balance, rtol=1e-5)
    np.testing.assert_allclose(metrics["z_loss"], z_loss, rtol=1e-5)
    np.testing.assert_allclose(penalty, 0.5 * load_balance + 0.25 * z_loss, rtol=1e-5)


def test_outside_a_capture_nothing_is_sown_and_the_module_is_unchanged():
    """Generation and scoring run the model without collecting its losses: the layer sows nothing there (a flax
    module sowing outside nnx.capture would keep the values on itself, and flax deprecates it), and the same
    call under ``captured`` still collects them."""
    moe = randomized(MoeMlp(moe_spec(num_experts=4, top_k=2), rngs=nnx.Rngs(0)))
    before = nnx.state(moe)
    x = jnp.ones((2, 8, 16), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = nnx.jit(lambda moe, x: moe(x))(moe, x)  # state the call leaves on the module comes back out of jit
    assert jax.tree.structure(nnx.state(moe)) == jax.tree.structure(before)
    assert not nnx.state(moe, nnx.Intermediate)
    captured_out, sown = nnx.jit(lambda moe, x: aux_losses.captured(moe)(x))(moe, x)
    np.testing.assert_array_equal(captured_out, out)
    assert float(aux_losses.collect(sown)[0]) > 0


def test_dropped_tokens_are_counted_and_pass_through_as_zero():
    spec = moe_spec(num_experts=4, top_k=1, capacity_factor=0.5)  # 2 slots per expert for 16 tokens
    moe = randomized(MoeMlp(spec, rngs=nnx.Rngs(0)), seed=2)
    x = np.random.default_rng(3).standard_normal((2, 16, 16)).astype(np.float32)
    out, _, metrics = run(moe, jnp.asarray(x))
    want, _, _ = numpy_moe(nnx.to_pure_dict(nnx.state(moe, nnx.Param)), x, 1)
    kept = ~np.all(out == 0.0, axis=-1)  # (B, T): a dropped token's MLP output is exactly zero
    assert kept.sum(1).max() <= 4 * 2
    np.testing.assert_allclose(metrics["dropped_tokens_fraction"], 1 - kept.mean(), rtol=1e-6)
    assert metrics["dropped_tokens_fraction"] > 0.4
    np.testing.assert_allclose(out[kept], want[kept], atol=1e-4, rtol=1e-4)  # kept tokens are unchanged


def test_top1_with_one_expert_equals_the_dense_mlp():
    moe = MoeMlp(moe_spec(num_experts=1, top_k=1, capacity_factor=1.0), rngs=nnx.Rngs(0))
    mlp = randomized(Mlp(dense_spec(), rngs=nnx.Rngs(1)))
    moe.w_in[...] = mlp.c_fc.kernel[...][None]
    moe.b_in[...] = mlp.c_fc.bias[...][None]
    moe.w_out[...] = mlp.c_proj.kernel[...][None]
    moe.b_out[...] = mlp.c_proj.bias[...][None]
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 12, 16)), jnp.float32)
    out, _, metrics = run(moe, x)
    np.testing.assert_allclose(out, np.asarray(jax.jit(lambda x: mlp(x))(x)), atol=1e-5, rtol=1e-5)
    assert metrics["dropped_tokens_fraction"] == 0.0 and metrics["aux_loss"] == pytest.approx(1.0)


def test_dispatch_builds_no_tokens_by_experts_by_capacity_tensor():
    t, e = 256, 8
    spec = moe_spec(num_experts=e, top_k=2, capacity_factor=1.25)
    c = expert_capacity(t, 2, e, 1.25)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MoeMlp(spec, rngs=nnx.Rngs(0))))
    jaxpr = jax.make_jaxpr(lambda s, x: aux_losses.captured(nnx.merge(graphdef, s))(x))(
        state, jnp.zeros((1, t, 16)))

    def sizes(jaxpr):
        for eqn in jaxpr.eqns:
            yield from (np.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from sizes(sub)

    largest = max(sizes(jaxpr.jaxpr))
    assert largest < t * e * c / 2, (largest, t * e * c)  # GShard's dense dispatch mask would be t * e * c
    assert largest >= e * c * 4 * 16  # the (E, C, F) expert activations are in there: the walk sees them


def test_expert_parallel_training_equals_one_device():
    cfg = tiny_config(n_layer=2, attention_types=[[["global", "local"], 1]], moe_layers=[0, 1],
                      moe_params={"num_experts": 4, "top_k": 2, "capacity_factor": 1.0}, warmup_steps=0)
    batches = random_batches(cfg, 1, seed=7) * 2  # the second step sees the first step's update
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4", "batch:x,experts:x", devices=jax.devices()[:4])
    for key in ("loss", "aux_loss", "z_loss", "dropped_tokens_fraction", "grad_norm"):
        np.testing.assert_allclose([m[key] for m in sharded], [m[key] for m in single], rtol=0, atol=1e-5)
    assert single[1]["loss"] < single[0]["loss"]
    layout = Layout.from_config(make_mesh("x:4", jax.devices()[:4]), "batch:x,experts:x")
    _, _, shardings = abstract_train_state(lambda rngs: GPTNeo(cfg, rngs=rngs), make_optimizer(cfg), layout)
    assert shardings.params["blocks"][0]["mlp"]["w_in"].spec == PartitionSpec("x", None, None)  # (E, D, F)
    assert 0.0 < single[0]["dropped_tokens_fraction"] < 0.5 and single[0]["aux_loss"] >= 1.0


def test_expert_parallel_moves_tokens_by_all_to_all_only():
    """With batch and experts on one mesh axis the layer's forward pass exchanges tokens with all-to-alls and
    never gathers the batch (a naive partitioning of the scatter/gather or of top-k would all-gather it)."""
    layout = Layout.from_config(make_mesh("x:8"), "batch:x,experts:x")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MoeMlp(moe_spec(num_experts=8, top_k=2), rngs=nnx.Rngs(0))))

    def sharded(a, names):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=layout.sharding(names))

    logical = {"router": ("embd", None), "w_in": ("experts", "embd", "intermediate_expanded"),
               "b_in": ("experts", "intermediate_expanded"), "w_out": ("experts", "intermediate_expanded", "embd"),
               "b_out": ("experts", "embd")}
    state = nnx.State({name: sharded(leaf, logical[name]) for name, leaf in nnx.to_pure_dict(state).items()})

    def forward(state, x):
        with layout.active():
            return aux_losses.captured(nnx.merge(graphdef, state))(x)[0]

    x = sharded(jax.ShapeDtypeStruct((8, 32, 16), jnp.float32), ("batch", None, None))
    hlo = jax.jit(forward).lower(state, x).compile().as_text()
    assert " all-to-all(" in hlo
    assert " all-gather(" not in hlo and " all-reduce(" not in hlo, "tokens or routing left their devices"
