"""Bottleneck adapters (Houlsby et al.): ``h + up(act(down(dropout(h))))`` on a sub-layer's output, before the
block's residual sum (the seams ``attn_adapter`` / ``mlp_adapter`` of models/block.py). ``up`` starts at zero, so a
fresh adapter is the identity and the model computes what its base does."""

from __future__ import annotations

import jax
from flax import nnx

from models.layers import ACTIVATIONS, BASE_STDDEV, dropout, projection, scoped_dropout_key


class Adapter(nnx.Module):
    """(B, T, D) -> (B, T, D) through a ``size``-wide bottleneck."""

    def __init__(self, n_embd: int, size: int, activation: str, dropout_rate: float, salt: int, *, rngs: nnx.Rngs):
        self.down = projection("BTD,DA->BTA", (n_embd, size), ("embd", None), BASE_STDDEV, rngs, bias=(None,))
        self.up = projection("BTA,AD->BTD", (size, n_embd), (None, "embd"), 0.0, rngs, bias=("embd",))
        self.activation, self.dropout_rate, self.salt = ACTIVATIONS[activation], dropout_rate, salt

    def __call__(self, h: jax.Array) -> jax.Array:
        x = dropout(self.dropout_rate, h, scoped_dropout_key(self.salt))
        return h + self.up(self.activation(self.down(x)))  # (B, T, D)
