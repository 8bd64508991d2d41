"""The feed-forward sub-layer: dense (embd -> d_ff -> embd) or gated (GPT-Neo's ``mlp_glu``, T5 v1.1's gated-GELU,
SwiGLU): ``c_proj(activation(c_gate(x)) * c_fc(x))``. Experts live in moe.py."""

from __future__ import annotations

import jax
from flax import nnx

from models.axes import constrain
from models.layers import feed_forward_activation, over_flat_positions, projection
from models.spec import MlpSpec

INTERMEDIATE = ("batch", "sequence", "intermediate_expanded")  # (B, T, F)


class Mlp(nnx.Module):
    def __init__(self, spec: MlpSpec, *, rngs: nnx.Rngs):
        d, f = spec.n_embd, spec.d_ff
        fc_std, proj_std = spec.init
        bias = ("intermediate_expanded",) if spec.bias else None
        self.c_fc = projection("PD,DF->PF", (d, f), ("embd", "intermediate_expanded"), fc_std, rngs, bias=bias)
        # GPT-Neo's mlp_glu splits one (D, 2F) projection into the value half and the gate half; two (D, F)
        # projections are the same map and keep every kernel's dimensions nameable.
        self.c_gate = projection("PD,DF->PF", (d, f), ("embd", "intermediate_expanded"), fc_std, rngs,
                                 bias=bias) if spec.kind == "glu" else None
        self.c_proj = projection("PF,FD->PD", (f, d), ("intermediate_expanded", "embd"), proj_std, rngs,
                                 bias=("embd",) if spec.bias else None)
        self.activation = feed_forward_activation(spec.activation)

    def __call__(self, x: jax.Array) -> jax.Array:
        """(B, T, D) -> (B, T, D)."""
        if self.c_gate is None:
            h = self.activation(over_flat_positions(self.c_fc, x))
        else:
            h = self.activation(over_flat_positions(self.c_gate, x)) * over_flat_positions(self.c_fc, x)
        return over_flat_positions(self.c_proj, constrain(h, INTERMEDIATE))  # (B, T, D)

