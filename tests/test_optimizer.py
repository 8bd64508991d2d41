"""Schedule, weight-decay mask and both optimizers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import registry
from parallel.state import abstract_model
from tests.common import random_batches, tiny_config, train_losses
import training.optimizer
from training.optimizer import decay_mask, guarded, learning_rate_schedule, spike_to_nan


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_warmup_then_decay_to_a_tenth(kind):
    cfg = tiny_config(lr=1.0, warmup_steps=10, train_steps=200, lr_decay_end=110, lr_decay=kind)
    lr = learning_rate_schedule(cfg)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5) and float(lr(10)) == pytest.approx(1.0)
    midpoint = 0.55 if kind == "cosine" else 0.55  # both pass 0.55 halfway between 1.0 and 0.1
    assert float(lr(60)) == pytest.approx(midpoint, abs=1e-6)
    assert float(lr(110)) == pytest.approx(0.1) and float(lr(199)) == pytest.approx(0.1)
    assert float(lr(30)) > float(lr(31))


def test_no_decay_schedule_is_constant_after_warmup():
    lr = learning_rate_schedule(tiny_config(lr=0.5, warmup_steps=4, lr_decay="none"))
    assert [float(lr(s)) for s in (4, 7, 9)] == [0.5, 0.5, 0.5]


def test_weight_decay_skips_biases_and_norms():
    _, params, _ = abstract_model(lambda rngs: registry.build(tiny_config(), rngs))
    mask = dict((jax.tree_util.keystr(p), m) for p, m in jax.tree_util.tree_flatten_with_path(decay_mask(params))[0])
    decayed = sorted(k for k, m in mask.items() if m)
    kept = sorted(k for k, m in mask.items() if not m)
    assert all("kernel" in k or "embedding" in k for k in decayed)
    assert all(k.endswith(("['bias']", "['scale']")) for k in kept) and kept


def test_adafactor_trains_and_is_sharding_invariant():
    cfg = tiny_config(opt_name="adafactor", lr=0.01, beta1=0.0, weight_decay=0.0, warmup_steps=0)
    batches = random_batches(cfg, 3)
    single = train_losses(cfg, batches, "x:1", devices=jax.devices()[:1])
    sharded = train_losses(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y")
    assert single[-1] < single[0]
    np.testing.assert_allclose(sharded, single, atol=1e-5)


def step_both(ours, theirs, grads, mine: tuple, their: tuple, what: str) -> tuple[tuple, tuple]:
    """One step of the guarded update and of optax's chain with apply_updates, from (params, state) each: the new
    pairs, asserted equal."""
    mine = jax.jit(ours.update_and_apply)(grads, mine[1], mine[0])
    updates, state = theirs.update(grads, their[1], their[0])
    their = (optax.apply_updates(their[0], updates), state)
    for got, want in zip(jax.tree.leaves(mine), jax.tree.leaves(their)):
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=what)
    return mine, their


@pytest.mark.parametrize("platform", ["cpu", "gpu"])  # a cond elsewhere, a select on GPUs
def test_the_bad_step_guard_applies_optax_apply_if_finite_in_place(platform, monkeypatch):
    """The train step's guarded update (the choice made around the update and the add) against optax's chain and
    apply_updates: same state structure (checkpoints keep theirs), same parameters and state step by step over
    finite steps, rejected ones, and the one accepted after max_bad_steps in a row."""
    monkeypatch.setattr(training.optimizer, "target_platform", lambda: platform)
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    ours = guarded(spike_to_nan(0.0), optax.adamw(0.1, weight_decay=0.01), 2)
    theirs = optax.chain(spike_to_nan(0.0), optax.apply_if_finite(optax.adamw(0.1, weight_decay=0.01), 2))
    state_ours, state_theirs = ours.init(params), theirs.init(params)
    assert jax.tree.structure(state_ours) == jax.tree.structure(state_theirs)
    params_ours = params_theirs = params
    rng = np.random.default_rng(0)
    for step, bad in enumerate([False, True, False, True, True, True, False]):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
        if bad:
            grads["w"] = grads["w"].at[0, 1].set(jnp.nan)
        (params_ours, state_ours), (params_theirs, state_theirs) = step_both(
            ours, theirs, grads, (params_ours, state_ours), (params_theirs, state_theirs), f"step {step}")
    assert int(state_ours[1].total_notfinite) == 4 and int(state_ours[1].notfinite_count) == 0
    primitives = {e.primitive.name for e in jax.make_jaxpr(ours.update_and_apply)(grads, state_ours, params).eqns}
    assert ("cond" in primitives) == (platform != "gpu")


def test_with_spike_checking_the_guard_skips_what_optaxs_chain_skips():
    """With grad_spike_factor set, the guarded update takes the spike check's verdict from its state and updates
    with the gradient as it came (one norm for the check and clipping): the same parameters and state as optax's
    chain, whose spike check turns a spike into NaNs for apply_if_finite, over ordinary steps, spikes (after the
    check's warm-up) and non-finite steps."""
    from training.optimizer import SPIKE_WARMUP

    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.1))
    ours = guarded(spike_to_nan(3.0), inner, 2)
    theirs = optax.chain(spike_to_nan(3.0), optax.apply_if_finite(inner, 2))
    state_ours, state_theirs = ours.init(params), theirs.init(params)
    params_ours = params_theirs = params
    rng = np.random.default_rng(1)
    kinds = ["ordinary"] * SPIKE_WARMUP + ["spike", "ordinary", "nan", "spike", "ordinary"]
    for step, kind in enumerate(kinds):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
        if kind == "spike":
            grads = jax.tree.map(lambda g: 100 * g, grads)
        if kind == "nan":
            grads["b"] = grads["b"].at[1].set(jnp.nan)
        (params_ours, state_ours), (params_theirs, state_theirs) = step_both(
            ours, theirs, grads, (params_ours, state_ours), (params_theirs, state_theirs), f"step {step} ({kind})")
    assert int(state_ours[1].total_notfinite) == 3 and int(state_ours[0].accepted) == SPIKE_WARMUP + 2


def test_a_gradient_whose_norm_passes_float32s_range_is_a_bad_step():
    """The guard judges a gradient by its norm: finite values whose squares sum past float32's range are skipped
    and counted, where optax's element check let them through and, without clipping, left Adam's second moment
    infinite (that parameter never moved again)."""
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = {"w": jnp.full(3, 1e30), "b": jnp.ones(2)}
    ours = guarded(spike_to_nan(0.0), optax.adamw(0.1), 2)
    state = ours.init(params)
    new, state = jax.jit(ours.update_and_apply)(grads, state, params)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, new, params))
    assert int(state[1].total_notfinite) == 1 and int(state[1].notfinite_count) == 1
    theirs = optax.chain(spike_to_nan(0.0), optax.apply_if_finite(optax.adamw(0.1), 2))
    _, their_state = theirs.update(grads, theirs.init(params), params)
    assert int(their_state[1].total_notfinite) == 0
    assert not np.isfinite(their_state[1].inner_state[0].nu["w"]).all()
