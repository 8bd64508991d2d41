"""The GPT-Neo decoder: learned positions (or rotary), pre-LayerNorm blocks, tied embeddings unless
``no_weight_tie``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import Config
from models.attention import make_attention
from models.layers import axes, dropout, dropout_keys, layer_norm
from models.mlp import make_mlp
from parallel.layout import constrain

HIDDEN = ("batch", "sequence", "embd")


class Block(nnx.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(x)). The attention and MLP slots take any kind of layer; a ``none``
    layer has no attention sub-layer (and no ln_1): it is feed-forward only."""

    def __init__(self, cfg: Config, layer: int, *, rngs: nnx.Rngs):
        self.attn = make_attention(cfg, cfg.attention_layers[layer], rngs=rngs)
        self.ln_1 = layer_norm(cfg.n_embd, rngs) if self.attn is not None else None
        self.ln_2 = layer_norm(cfg.n_embd, rngs)
        self.mlp = make_mlp(cfg, layer, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        attn_key, mlp_key = dropout_keys(dropout_key, 2)
        if self.attn is not None:
            x = constrain(x + self.attn(self.ln_1(x), positions, attn_key), HIDDEN)
        return constrain(x + self.mlp(self.ln_2(x), mlp_key), HIDDEN)  # (B, T, D)


class GPTNeo(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal
        self.wte = nnx.Embed(cfg.n_vocab, cfg.n_embd, embedding_init=init(0.02),
                             embedding_metadata=axes("vocab", "embd"), rngs=rngs)
        self.wpe = None if cfg.rotary_emb else nnx.Embed(  # rotary puts positions into q and k instead
            cfg.n_ctx, cfg.n_embd, embedding_init=init(0.01), embedding_metadata=axes(None, "embd"), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, layer, rngs=rngs) for layer in range(cfg.n_layer)])
        self.ln_f = layer_norm(cfg.n_embd, rngs)
        self.lm_head = nnx.Einsum("BTD,DV->BTV", (cfg.n_embd, cfg.n_vocab), kernel_init=init(0.02),
                                  kernel_metadata=axes("embd", "vocab"), rngs=rngs) if cfg.no_weight_tie else None
        self.embed_dropout = cfg.embed_dropout
        self.remat = cfg.recompute_grad

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, T) token ids -> (B, T, V) logits. ``dropout_key`` None means deterministic (eval)."""
        if positions is None:
            positions = jnp.arange(tokens.shape[1])[None, :]
        embed_key, *block_keys = dropout_keys(dropout_key, 1 + len(self.blocks))
        x = self.wte(tokens)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(positions)
        x = constrain(dropout(self.embed_dropout, x, embed_key), HIDDEN)
        run_block = nnx.remat(Block.__call__) if self.remat else Block.__call__
        for block, key in zip(self.blocks, block_keys):
            x = run_block(block, x, positions, key)
        x = self.ln_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else self.wte.attend(x)  # (B, T, V)
        return constrain(logits, ("batch", "sequence", "vocab"))
