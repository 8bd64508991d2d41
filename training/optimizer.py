"""optax optimizers with GPT-Neo semantics, the learning-rate schedule, and the guard against bad steps."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from config import Config
from models.axes import target_platform
from training.layer_stack import per_layer, stacked_layers

# GPT-Neo decays to 10% of the peak learning rate.
FINAL_LR_FRACTION = 0.1
DEFAULT_WEIGHT_DECAY = 0.01  # AdamW's when the config leaves weight_decay null


def learning_rate_schedule(cfg: Config) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then cosine or linear decay to 0.1*lr at lr_decay_end. Adafactor
    runs at the constant lr, as GPT-Neo's did (it passed the bare lr to mesh-tensorflow's Adafactor)."""
    if cfg.opt_name == "adafactor":
        return optax.constant_schedule(cfg.lr)
    end = FINAL_LR_FRACTION * cfg.lr
    warmup = optax.linear_schedule(0.0, cfg.lr, max(cfg.warmup_steps, 1))
    decay_steps = max(cfg.decay_end - cfg.warmup_steps, 1)
    if cfg.lr_decay == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=FINAL_LR_FRACTION)
    elif cfg.lr_decay == "linear":
        decay = optax.linear_schedule(cfg.lr, end, decay_steps)
    else:
        decay = optax.constant_schedule(cfg.lr)
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def decay_mask(params) -> object:
    """Weight decay on matrices (projections, embeddings) only: never on biases or LayerNorm parameters."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def adafactor(cfg: Config) -> optax.GradientTransformation:
    """Adafactor as GPT-Neo ran it (mesh-tensorflow's AdafactorOptimizer with lr=lr, decay_rate=weight_decay,
    beta1, epsilon1=ada_epsilon1, epsilon2=ada_epsilon2), from optax's Adafactor pieces in optax's order:
    factored second moments (decaying at the constant rate weight_decay, or Adafactor's 1-(step+1)^-0.8 when it
    is null), update clipping at RMS 1, the constant lr, scaling by the parameter RMS (at least ada_epsilon2),
    momentum beta1 without bias correction. No weight decay: GPT-Neo's weight_decay was this decay rate."""
    if cfg.weight_decay is None:
        second_moments = optax.scale_by_factored_rms(epsilon=cfg.ada_epsilon1)
    else:
        second_moments = optax.scale_by_factored_rms(decay_rate=cfg.weight_decay, epsilon=cfg.ada_epsilon1,
                                                     decay_rate_fn=lambda step, rate: rate)
    steps = [second_moments, optax.clip_by_block_rms(1.0), optax.scale(cfg.lr),
             optax.scale_by_param_block_rms(min_scale=cfg.ada_epsilon2)]
    if cfg.beta1:
        steps.append(optax.ema(cfg.beta1, debias=False))
    return optax.chain(*steps, optax.scale(-1.0))


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW (``adam``/``adamw``) or GPT-Neo's Adafactor (``adafactor``), wrapped by
    ``optax.apply_if_finite``: a step whose gradient's norm is not finite (a NaN or infinity in it, or values
    past float32's range) or spikes (see ``spike_to_nan``) leaves the parameters and the optimizer state as they
    were and is counted (``bad_step_counts``). The train loop stops the run after ``max_bad_steps`` such steps in
    a row, before apply_if_finite would give up and apply one. With scan_layers all of it runs on each stack's
    layers stacked (training/layer_stack.py), with the same per-layer meaning: the optimizer state is stored
    stacked."""
    if cfg.opt_name in ("adam", "adamw"):
        decay = DEFAULT_WEIGHT_DECAY if cfg.weight_decay is None else cfg.weight_decay
        opt = optax.adamw(learning_rate_schedule(cfg), b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon,
                          weight_decay=decay, mask=decay_mask)
    else:
        opt = adafactor(cfg)
    if cfg.scan_layers:
        opt = per_layer(opt)
    if cfg.gradient_clipping > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.gradient_clipping), opt)
    # The guard is there for every config, so the optimizer state (and the checkpoint) has one structure
    # whatever max_bad_steps and grad_spike_factor are: both may change on resume.
    opt = guarded(spike_to_nan(cfg.grad_spike_factor), opt, cfg.max_bad_steps)
    return stacked_layers(opt) if cfg.scan_layers else opt


class GuardedOptimizer(NamedTuple):
    """``optax.chain(spike, optax.apply_if_finite(inner, max_bad_steps))`` (its ``init`` and ``update``, so its
    state and checkpoints are that chain's) with ``update_and_apply``: the same step, with the guard's choice
    made around the update and the add, so that the parameters and the optimizer state are updated in place.
    optax's ``lax.cond`` returns the update as a buffer of its own: the whole update, a float32 copy of every
    parameter, existed before it was added. How the choice is spelt depends on the compiler: XLA:GPU gives a
    cond's outputs buffers of their own, but fuses a select into the update; XLA:CPU copies for a select (and
    runs the small GPT-Neo shape's step 5-9% slower with it) but updates in place through a cond; the TPU
    compiler does both in place. Temporaries of a donated AdamW step over 4 x 128 MiB of float32 parameters as
    each compiler plans it (GPU / TPU / CPU): no guard 0 / 0 / 0 MiB; optax's guard 0 / 512 / 512; a cond around
    the update and the add 1536 / 0 / 128; a select 0 / 0 / 896. GPT-Neo 2.7B, bfloat16, batch 4, scanned with
    ``full`` recomputation, one H100: 13.3 GB of temporaries with the select, 42.4 GB with the cond."""

    init: Callable
    update: Callable
    update_and_apply: Callable  # (grads, state, params) -> (new params, new state)


def guarded(spike: optax.GradientTransformation, inner: optax.GradientTransformation, max_bad_steps: int
            ) -> GuardedOptimizer:
    """``inner`` behind the bad-step guard; ``spike`` is ``spike_to_nan``'s, whose state counts the steps it accepts."""
    chain = optax.chain(spike, optax.apply_if_finite(inner, max_bad_steps))

    def update_and_apply(grads, state, params):
        seen, guard = state
        # The spike check's verdict is read from its state, which counts the steps it accepts (a finite norm and no
        # spike), and the update gets the gradient as it came, not the NaNs it makes of a spike for optax's guard
        # (``update``): the step is skipped either way. So the check, global-norm clipping and the guard all judge
        # one norm, computed once, rather than checking every element besides: XLA:GPU's plan of the 125M step
        # launches 1,024 kernels instead of 1,101, and 1,024 rather than 1,237 with grad_spike_factor set (clipping
        # took a second norm, of the NaN-substituted gradient). Finite values whose norm passes float32's range
        # are refused too: clipped they were a zero update, unclipped they made Adam's second moments infinite for
        # good.
        _, spike_state = spike.update(grads, seen, params)
        finite = spike_state.accepted > seen.accepted
        in_a_row = jnp.where(finite, 0, optax.safe_increment(guard.notfinite_count))
        accept = finite | (in_a_row > max_bad_steps)

        def step(operands):
            params, inner_state = operands
            updates, inner_state = inner.update(grads, inner_state, params)
            return optax.apply_updates(params, updates), inner_state

        operands = (params, guard.inner_state)
        if target_platform() == "gpu":
            params, inner_state = jax.tree.map(lambda new, old: jnp.where(accept, new, old), step(operands), operands)
        else:
            params, inner_state = jax.lax.cond(accept, step, lambda operands: operands, operands)
        total = jnp.where(finite, guard.total_notfinite, optax.safe_increment(guard.total_notfinite))
        return params, (spike_state, optax.ApplyIfFiniteState(notfinite_count=in_a_row, last_finite=finite,
                                                              total_notfinite=total, inner_state=inner_state))

    return GuardedOptimizer(chain.init, chain.update, update_and_apply)


def bad_step_counts(opt_state) -> tuple[jax.Array, jax.Array]:
    """(bad steps in a row, bad steps in all) from the state of ``make_optimizer``'s optimizer."""
    return optax.tree.get(opt_state, "notfinite_count"), optax.tree.get(opt_state, "total_notfinite")


class SpikeState(NamedTuple):
    mean_norm: jax.Array  # running mean of the gradient norms of accepted steps
    accepted: jax.Array  # how many steps went into it


SPIKE_WARMUP = 10  # accepted steps before spikes are judged: the first gradients of a run are the largest
SPIKE_DECAY = 0.95


def spike_to_nan(factor: float) -> optax.GradientTransformation:
    """Turns a gradient whose global norm is above ``factor`` times its running mean into NaNs, so that
    ``apply_if_finite`` skips and counts it like a non-finite one; 0 turns the check off. optax has absolute
    norm limits only; a spike is relative to the run."""

    def init(params):
        del params
        return SpikeState(mean_norm=jnp.zeros([], jnp.float32), accepted=jnp.zeros([], jnp.int32))

    def update(grads, state, params=None):
        del params
        norm = optax.tree.norm(grads).astype(jnp.float32)
        spike = (factor > 0) & (state.accepted >= SPIKE_WARMUP) & (norm > factor * state.mean_norm)
        accept = jnp.isfinite(norm) & ~spike
        mean = jnp.where(state.accepted == 0, norm, SPIKE_DECAY * state.mean_norm + (1 - SPIKE_DECAY) * norm)
        state = SpikeState(mean_norm=jnp.where(accept, mean, state.mean_norm),
                           accepted=state.accepted + accept.astype(jnp.int32))
        return jax.tree.map(lambda g: jnp.where(spike, jnp.nan, g), grads), state

    return optax.GradientTransformation(init, update)
