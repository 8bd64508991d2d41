"""alpha-entmax: a sparse alternative to softmax (Peters, Niculae & Martins, 2019), for GPT-Neo's ``entmax_loss``
(training/token_losses.entmax_loss) and entmax sampling.

    entmax(z) = argmax over the simplex of  p.z + sum_j (p_j - p_j^alpha) / (alpha (alpha - 1))
              = [(alpha - 1) z - tau]_+ ^ (1 / (alpha - 1)),   tau such that the p sum to 1.

Scores below the threshold get exactly zero probability; alpha -> 1 is softmax, alpha = 2 sparsemax. GPT-Neo used
alpha 1.3 (its models/utils.py) and found tau by bisection, as here: no exact sort-based form exists for 1.3.

GPT-Neo's loss was -log entmax(z)[target], which is infinite (NaN through its one-hot product) once any vocabulary
entry leaves the support. ``entmax_loss`` is the paper's entmax loss instead: finite, zero only when entmax(z) is
the target's one-hot, gradient entmax(z) - one_hot(target) (training/token_losses.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

GPT_NEO_ALPHA = 1.3
# Halvings of the bracket on tau (GPT-Neo's n_iter). The bracket starts under 1 wide: 2^-50 is far below float32's
# resolution of tau.
BISECTION_STEPS = 50


def _support_power(x: jax.Array, tau: jax.Array, alpha: float) -> jax.Array:
    return jnp.maximum(x - tau, 0.0) ** (1.0 / (alpha - 1.0))


def _entmax(z: jax.Array, alpha: float) -> jax.Array:
    x = z.astype(jnp.float32) * (alpha - 1.0)  # (..., V)
    top = jnp.max(x, axis=-1, keepdims=True)
    lo = top - 1.0  # the top score alone already has p = 1: the p sum to at least 1
    width = 1.0 - x.shape[-1] ** (1.0 - alpha)  # at top - V^(1-alpha) every p is at most 1/V: the sum is at most 1

    def halve(_, carry):
        lo, width, _ = carry
        width = width / 2
        mid = lo + width
        p = _support_power(x, mid, alpha)
        lo = jnp.where(jnp.sum(p, axis=-1, keepdims=True) >= 1.0, mid, lo)  # tau is above mid when p sums to >= 1
        return lo, width, p

    _, _, p = jax.lax.fori_loop(0, BISECTION_STEPS, halve, (lo, width, jnp.zeros_like(x)))
    return p / jnp.sum(p, axis=-1, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def entmax(z: jax.Array, alpha: float = GPT_NEO_ALPHA) -> jax.Array:
    """(..., V) scores -> (..., V) float32 probabilities over the last axis, exactly 0 outside the support.
    1 < alpha < 2; differentiable (the closed-form Jacobian, as GPT-Neo's entmax_backward)."""
    return _entmax(z, alpha)


def _entmax_forward(z, alpha):
    p = _entmax(z, alpha)
    return p, p


def _entmax_backward(alpha, p, g):
    # On the support dp/dz = diag(s) - s s^T / sum(s) with s = p^(2-alpha); off the support nothing moves.
    s = jnp.where(p > 0, p ** (2.0 - alpha), 0.0)
    gs = g * s
    return (gs - s * jnp.sum(gs, axis=-1, keepdims=True) / jnp.sum(s, axis=-1, keepdims=True),)


entmax.defvjp(_entmax_forward, _entmax_backward)


def sample(key: jax.Array, logits: jax.Array, alpha: float = GPT_NEO_ALPHA) -> jax.Array:
    """(B, V) logits -> (B,) tokens drawn from entmax(logits): tokens outside the support are never drawn."""
    return jax.random.categorical(key, jnp.log(entmax(logits, alpha)), axis=-1)
