"""Rotary position embedding (RoPE) in GPT-J's interleaved form.

GPT-J (mesh-transformer-jax) rotates pairs of *adjacent* dimensions (0,1), (2,3), ... of the first ``rotary_dim``
features of each query and key head ("rotate every two"); GPT-NeoX instead pairs dimension i with i + dim/2. The
two are the same up to a fixed permutation of q/k features, but weights trained with one do not load into the
other, so NeoMesh picks GPT-J's, the model family this option comes from. The remaining features pass through
unrotated, which is what ``rotary_emb_fraction`` < 1 means.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ROTARY_BASE = 10000.0


def rotary_angles(positions: jax.Array, rotary_dim: int) -> tuple[jax.Array, jax.Array]:
    """(B, T) integer positions -> (sin, cos), each (B, T, 1, rotary_dim) with every frequency repeated twice."""
    inv_freq = ROTARY_BASE ** -(jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)  # (R/2,)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, R/2)
    angles = jnp.repeat(angles, 2, axis=-1)[:, :, None, :]  # (B, T, 1, R): pairs share a frequency
    return jnp.sin(angles), jnp.cos(angles)


def rotate_every_two(x: jax.Array) -> jax.Array:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) along the last axis."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def apply_rotary(x: jax.Array, positions: jax.Array, rotary_dim: int) -> jax.Array:
    """Rotates the first ``rotary_dim`` features of (B, T, N, H) queries or keys by their positions (B, T)."""
    if rotary_dim == 0:
        return x
    sin, cos = rotary_angles(positions, rotary_dim)
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    rot = rot * cos + rotate_every_two(rot) * sin  # (B, T, N, R)
    return jnp.concatenate([rot.astype(x.dtype), rest], axis=-1)
