"""optax optimizers with GPT-Neo semantics, the learning-rate schedule, and the guard against bad steps."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from config import Config
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
    ``optax.apply_if_finite``: a step whose gradient is non-finite (or spikes, see ``spike_to_nan``) leaves the
    parameters and the optimizer state as they were and is counted (``bad_step_counts``). The train loop stops
    the run after ``max_bad_steps`` such steps in a row, before apply_if_finite would give up and apply one.
    With scan_layers all of it runs on each stack's layers stacked (training/layer_stack.py), with the same
    per-layer meaning: the optimizer state is stored stacked."""
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
    opt = optax.chain(spike_to_nan(cfg.grad_spike_factor), skip_if_not_finite(opt, cfg.max_bad_steps))
    return stacked_layers(opt) if cfg.scan_layers else opt


def skip_if_not_finite(inner: optax.GradientTransformation, max_consecutive_errors: int
                       ) -> optax.GradientTransformation:
    """``optax.apply_if_finite`` (the same state, the same updates and counts), choosing with ``jnp.where``
    instead of ``lax.cond``. A cond's outputs are buffers of their own, so the chosen updates existed whole, a
    float32 copy of every parameter, before being added to them (GPT-Neo 2.7B, bfloat16, one v5p chip, on the TPU
    compiler's plan: 22.0 GB of temporaries with the cond, 9.5 GB without); elementwise, the update fuses into the
    parameters' in-place add. A rejected step still computes its update, which is then dropped: the inner state
    stays as it was."""

    def init(params):
        return optax.ApplyIfFiniteState(notfinite_count=jnp.zeros([], jnp.int32),
                                        last_finite=jnp.array(True, jnp.bool_),
                                        total_notfinite=jnp.zeros([], jnp.int32), inner_state=inner.init(params))

    def update(updates, state, params=None):
        isfinite = jnp.all(jnp.array([jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates)]))
        notfinite_count = jnp.where(isfinite, 0, optax.safe_increment(state.notfinite_count))
        apply = isfinite | (notfinite_count > max_consecutive_errors)
        new_updates, new_inner = inner.update(updates, state.inner_state, params)
        return (jax.tree.map(lambda u: jnp.where(apply, u, jnp.zeros_like(u)), new_updates),
                optax.ApplyIfFiniteState(
                    notfinite_count=notfinite_count, last_finite=isfinite,
                    total_notfinite=jnp.where(isfinite, state.total_notfinite,
                                              optax.safe_increment(state.total_notfinite)),
                    inner_state=jax.tree.map(lambda new, old: jnp.where(apply, new, old), new_inner,
                                             state.inner_state)))

    return optax.GradientTransformation(init, update)


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
