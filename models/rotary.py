"""Rotary position embedding (RoPE) in both of its forms, chosen by ``rotary_style``.

GPT-J (mesh-transformer-jax) rotates pairs of *adjacent* dimensions (0,1), (2,3), ... of the first ``rotary_dim``
features of each query and key head ("interleaved", rotate every two); GPT-Neo (its models/layers.py) and
GPT-NeoX pair dimension i with i + rotary_dim/2 ("halves", rotate half). The two are the same up to a fixed
permutation of q/k features, but weights trained with one do not load into the other. The remaining features
pass through unrotated, which is what ``rotary_emb_fraction`` < 1 means.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ROTARY_BASE = 10000.0


def rotary_angles(positions: jax.Array, rotary_dim: int, style: str = "interleaved"
                  ) -> tuple[jax.Array, jax.Array]:
    """(B, T) integer positions -> (sin, cos), each (B, T, 1, rotary_dim), every frequency at both features of
    its pair: repeated in place (interleaved) or the frequencies twice over (halves)."""
    inv_freq = ROTARY_BASE ** -(jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)  # (R/2,)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, R/2)
    if style == "halves":
        angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # (B, T, 1, R)
    else:
        angles = jnp.repeat(angles, 2, axis=-1)[:, :, None, :]  # (B, T, 1, R)
    return jnp.sin(angles), jnp.cos(angles)


def rotate_every_two(x: jax.Array) -> jax.Array:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) along the last axis."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def rotate_half(x: jax.Array) -> jax.Array:
    """(x1, x2) halves of the last axis -> (-x2, x1)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x: jax.Array, positions: jax.Array, rotary_dim: int, style: str = "interleaved") -> jax.Array:
    """Rotates the first ``rotary_dim`` features of (B, T, N, H) queries or keys by their positions (B, T), in
    ``style`` "interleaved" (GPT-J) or "halves" (GPT-Neo)."""
    if rotary_dim == 0:
        return x
    sin, cos = rotary_angles(positions, rotary_dim, style)
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    turn = rotate_half if style == "halves" else rotate_every_two
    rot = rot * cos + turn(rot) * sin  # (B, T, N, R)
    return jnp.concatenate([rot.astype(x.dtype), rest], axis=-1)
