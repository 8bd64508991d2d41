"""The GPT-Neo decoder: learned positions (or rotary), pre-LayerNorm blocks, tied embeddings unless
``no_weight_tie``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import Config
from models import kv_cache
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

    def decode(self, x: jax.Array, cache, state: kv_cache.DecodeState):
        """The block for new tokens against its cache: (B, T, D) -> (B, T, D), updated cache."""
        if self.attn is not None:
            a, cache = self.attn.decode(self.ln_1(x), cache, state)
            x = x + a
        return x + self.mlp(self.ln_2(x)), cache


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
        return constrain(self.logits(x), ("batch", "sequence", "vocab"))

    def logits(self, x: jax.Array) -> jax.Array:
        """Final LayerNorm and output projection: (B, T, D) -> (B, T, V)."""
        x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else self.wte.attend(x)

    def init_cache(self, batch: int, length: int, pad: jax.Array, dtype=jnp.float32) -> kv_cache.DecodeState:
        """An empty cache for ``batch`` rows of up to ``length`` tokens, rows left-padded by ``pad`` (B,)."""
        layers = tuple(None if b.attn is None else b.attn.init_cache(batch, length, dtype) for b in self.blocks)
        return kv_cache.DecodeState(index=jnp.zeros((), jnp.int32), pad=pad.astype(jnp.int32), layers=layers)

    def decode(self, tokens: jax.Array, state: kv_cache.DecodeState) -> tuple[jax.Array, kv_cache.DecodeState]:
        """(B, T) new tokens -> (B, T, V) logits and the advanced cache. Prefill is one call with the whole
        (left-padded) prompt; each generated token is one call with T=1."""
        x = self.wte(tokens)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(state.positions(tokens.shape[1]))
        layers = []
        for block, cache in zip(self.blocks, state.layers):
            x, cache = block.decode(x, cache, state)
            layers.append(cache)
        state = state.replace(index=state.index + tokens.shape[1], layers=tuple(layers))
        return self.logits(x), state
