"""The feed-forward slot of a block: GPT-Neo's MLP (embd -> 4*embd -> embd), or a mixture of experts."""

from __future__ import annotations

import jax
from flax import nnx

from config import Config
from models.layers import ACTIVATIONS, dropout, projection
from parallel.layout import constrain

# GPT-Neo's `linear` layer init; scale_by_depth shrinks the residual output projection, scale_by_in divides by
# sqrt(fan_in).
BASE_STDDEV = 0.02


class Mlp(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        d, f = cfg.n_embd, 4 * cfg.n_embd
        fc_std = BASE_STDDEV * (d ** -0.5 if cfg.scale_by_in else 1.0)
        proj_std = BASE_STDDEV * (f ** -0.5 if cfg.scale_by_in else 1.0) * (
            cfg.n_layer ** -0.5 if cfg.scale_by_depth else 1.0)
        self.c_fc = projection("BTD,DF->BTF", (d, f), ("embd", "intermediate_expanded"), fc_std, rngs,
                               bias=("intermediate_expanded",))
        self.c_proj = projection("BTF,FD->BTD", (f, d), ("intermediate_expanded", "embd"), proj_std, rngs,
                                 bias=("embd",))
        self.activation = ACTIVATIONS[cfg.activation_function]
        self.res_dropout = cfg.res_dropout

    def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        h = constrain(self.activation(self.c_fc(x)), ("batch", "sequence", "intermediate_expanded"))  # (B, T, F)
        return dropout(self.res_dropout, self.c_proj(h), dropout_key)  # (B, T, D)


def make_mlp(cfg: Config, layer: int, *, rngs: nnx.Rngs) -> nnx.Module:
    """The MLP of block ``layer``: a mixture of experts for the layers in ``moe_layers``, else GPT-Neo's MLP."""
    if layer in (cfg.moe_layers or ()):
        from models.moe import MoeMlp  # moe.py builds on this file's init constants

        return MoeMlp(cfg, rngs=rngs)
    return Mlp(cfg, rngs=rngs)
