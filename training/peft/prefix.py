"""Prefix tuning / P-tuning v2: learned keys and values that every query of a layer sees before the sequence.

They generalise GPT-Neo's memory key/value slots (models/attention.py concatenates both in front of the keys, with
no position and no rotary, in training, prefill and every decoding step alike). A ``Prefix`` gives (P, N, H) keys
and values either directly (P-tuning v2) or through a reparameterisation MLP from P learned embeddings (Li & Liang's
prefix tuning: ``hidden`` > 0), which trains more stably; after training the MLP's output is all that matters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import axes
from models.layers import BASE_STDDEV, projection

KEY_VALUE_SLOTS = ("memory_length", "heads", "features_per_head")


class Prefix(nnx.Module):
    """() -> ((P, N, H) keys, (P, N, H) values) of one layer."""

    def __init__(self, length: int, n_embd: int, n_head: int, head_dim: int, hidden: int, *, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(BASE_STDDEV)
        if hidden:
            self.prefix_embedding = nnx.Param(init(rngs.params(), (length, n_embd)), **axes("memory_length", "embd"))
            self.prefix_down = projection("PD,DE->PE", (n_embd, hidden), ("embd", None), BASE_STDDEV, rngs,
                                          bias=(None,))
            self.prefix_up = projection("PE,EKNH->PKNH", (hidden, 2, n_head, head_dim),
                                        (None, None, "heads", "features_per_head"), BASE_STDDEV, rngs,
                                        bias=(None, "heads", "features_per_head"))
            self.prefix_k = self.prefix_v = None
        else:
            self.prefix_embedding = self.prefix_down = self.prefix_up = None
            self.prefix_k = nnx.Param(init(rngs.params(), (length, n_head, head_dim)), **axes(*KEY_VALUE_SLOTS))
            self.prefix_v = nnx.Param(init(rngs.params(), (length, n_head, head_dim)), **axes(*KEY_VALUE_SLOTS))

    def __call__(self) -> tuple[jax.Array, jax.Array]:
        if self.prefix_k is not None:
            return self.prefix_k[...], self.prefix_v[...]
        kv = self.prefix_up(jnp.tanh(self.prefix_down(self.prefix_embedding[...])))  # (P, 2, N, H)
        return kv[:, 0], kv[:, 1]
