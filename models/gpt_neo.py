"""GPT-Neo and GPT-2 on the backbone: token embeddings, positions (learned, axial or rotary), blocks from the
config's block specs, a final LayerNorm and tied (or untied) output logits.

Both families share this file: GPT-2 is GPT-Neo with every layer global, q/k/v biases and logits scaled by
1/sqrt(head_dim) (registry defaults). With ``causal: false`` and ``task: masked_lm`` it is GPT-Neo's bidirectional
MLM model; with ``task: sequence_classification`` a linear head reads each row's last real token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import TOKEN_HEAD_TASKS, Config
from models import kv_cache
from models.axes import HIDDEN, LOGITS, axes, constrain
from models.block import Block, run_blocks, share_parameters
from models.generate import seen_tokens
from models.heads import ClassificationHead, TokenClassificationHead, token_head_dropout
from models.layers import Embed, VocabEinsum, dropout, dropout_keys, norm, over_flat_positions
from models.spec import block_spec, gpt_neo_attention_init, gpt_neo_mlp_init


def _gpt2_init(cfg: Config) -> tuple[tuple, tuple]:
    """GPT-2's init: 0.02 everywhere, residual output projections scaled by 1/sqrt(2 * n_layer)."""
    out = 0.02 * (2 * cfg.n_layer) ** -0.5
    return (0.02, 0.02, 0.02, out), (0.02, out)


class AxialPositions(nnx.Module):
    """GPT-Neo's ``axial_pos_emb`` [A, B]: position a*B + b is embedded as (row_a + column_b) / 2."""

    def __init__(self, shape: list[int], n_embd: int, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(0.01)
        self.axial_wpe_1 = nnx.Param(init(rngs.params(), (shape[0], n_embd)), **axes(None, "embd"))  # (A, D)
        self.axial_wpe_2 = nnx.Param(init(rngs.params(), (shape[1], n_embd)), **axes(None, "embd"))  # (B, D)

    def __call__(self, positions: jax.Array) -> jax.Array:
        """(B, T) positions -> (B, T, D)."""
        columns = self.axial_wpe_2.shape[0]
        return (self.axial_wpe_1[...][positions // columns] + self.axial_wpe_2[...][positions % columns]) / 2


class GPTNeo(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal
        attention_init, mlp_init = (_gpt2_init(cfg) if cfg.model == "gpt2" else
                                    (gpt_neo_attention_init(cfg), gpt_neo_mlp_init(cfg)))
        self.wte = Embed(cfg.n_vocab, cfg.n_embd, embedding_init=init(0.02),
                         embedding_metadata=axes("vocab", "embd"), logits_multiple=cfg.logits_pad_multiple, rngs=rngs)
        # Positions: a learned table, GPT-Neo's axial table, or none (rotary puts positions into q and k).
        self.wpe = Embed(cfg.position_rows + cfg.position_offset, cfg.n_embd, embedding_init=init(0.01),
                         embedding_metadata=axes(None, "embd"), rngs=rngs) if cfg.learned_position_table else None
        self.axial_wpe = AxialPositions(cfg.axial_pos_emb, cfg.n_embd, rngs) if cfg.axial_pos_emb else None
        self.blocks = nnx.List([Block(block_spec(cfg, layer, attention_init, mlp_init), rngs=rngs)
                                for layer in range(cfg.n_layer)])
        if cfg.share_parameters:
            share_parameters(self.blocks)
        self.ln_f = norm("layernorm", cfg.n_embd, cfg.layer_norm_epsilon, rngs)  # GPT-Neo's ln_f is always a LayerNorm
        self.lm_head = VocabEinsum(cfg.n_embd, cfg.n_vocab, 0.02, rngs, cfg.logits_pad_multiple) \
            if cfg.no_weight_tie else None
        self.score = ClassificationHead(cfg.n_embd, cfg.num_labels, pool="last", pooler=False, bias=False,
                                        dropout_rate=0.0, rngs=rngs, hidden=cfg.head_hidden,
                                        activation=cfg.activation_function) \
            if cfg.task == "sequence_classification" else None
        self.token_classifier = TokenClassificationHead(
            cfg.n_embd, cfg.num_labels, hidden=cfg.head_hidden, activation=cfg.activation_function,
            dropout_rate=token_head_dropout(cfg), rngs=rngs) if cfg.task in TOKEN_HEAD_TASKS else None
        self.embed_dropout = cfg.embed_dropout
        self.position_offset = cfg.position_offset
        self.remat, self.scan = cfg.remat_policy, cfg.scan_layers

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, cache: kv_cache.DecodeState | None = None,
                 dropout_key: jax.Array | None = None) -> tuple[jax.Array, kv_cache.DecodeState | None]:
        """(B, T) token ids -> ((B, T, V) logits, or (B, C) / (B, T, C) with a sequence / token classification head;
        the advanced cache).

        Training and evaluation pass no cache (``dropout_key`` None means deterministic). Decoding passes the
        ``init_cache`` state: prefill is one call with the whole (left-padded) prompt, then one call per token."""
        backbone_key, head_key = dropout_keys(dropout_key, 2) if self.token_classifier is not None else \
            (dropout_key, None)
        x, cache = self._backbone(tokens, positions, segment_ids, cache, backbone_key)
        if self.score is not None:
            return self.score(x, segment_ids), cache
        if self.token_classifier is not None:
            return self.token_classifier(x, head_key), cache
        return constrain(self.logits(x), LOGITS), cache

    def hidden_states(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                      segment_ids: jax.Array | None = None, dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, T) token ids -> (B, T, D) final hidden states (after ln_f)."""
        return self._backbone(tokens, positions, segment_ids, None, dropout_key)[0]

    def _backbone(self, tokens, positions, segment_ids, cache, dropout_key):
        """Embeddings, blocks and ln_f: (B, T) -> (B, T, D) and the advanced cache."""
        t = tokens.shape[1]
        if cache is not None:
            positions, segment_ids = cache.positions(t), cache.segment_ids(t)
        elif positions is None:
            positions = jnp.broadcast_to(jnp.arange(t)[None, :], tokens.shape)
        embed_key, blocks_key = dropout_keys(dropout_key, 2)
        x = self.wte(tokens)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(positions + self.position_offset)
        elif self.axial_wpe is not None:
            x = x + self.axial_wpe(positions)
        x = constrain(dropout(self.embed_dropout, x, embed_key), HIDDEN)
        x, layers = run_blocks(self.blocks, x, positions, segment_ids, None if cache is None else cache.layers,
                               blocks_key, remat=self.remat if cache is None else "none", scan=self.scan)
        if cache is not None:
            cache = cache.replace(index=cache.index + t, layers=layers)
        return self.ln_f(x), cache

    def logits(self, x: jax.Array) -> jax.Array:
        """Output projection of final hidden states: (B, T, D) -> (B, T, V)."""
        return over_flat_positions(self.lm_head if self.lm_head is not None else self.wte.attend, x)

    def prefill(self, prompts: jax.Array, pad: jax.Array, max_new_tokens: int, dtype
                ) -> tuple[jax.Array, kv_cache.DecodeState, jax.Array]:
        """Generation's start (models/generate.py): the (B, P) left-padded prompts through a fresh cache ->
        ((B, V) logits of the first new token, the cache, (B, V) the prompt tokens the repetition penalty counts)."""
        b, p = prompts.shape
        logits, cache = self(prompts, cache=self.init_cache(b, p + max_new_tokens, pad, dtype))  # (B, P, V)
        return logits[:, -1], cache, seen_tokens(prompts, jnp.arange(p)[None, :] >= pad[:, None], logits.shape[-1])

    def decode_step(self, tokens: jax.Array, cache: kv_cache.DecodeState) -> tuple[jax.Array, kv_cache.DecodeState]:
        """(B,) new tokens -> ((B, V) logits of the next, the advanced cache)."""
        logits, cache = self(tokens[:, None], cache=cache)
        return logits[:, -1], cache

    def init_cache(self, batch: int, length: int, pad: jax.Array, dtype=jnp.float32) -> kv_cache.DecodeState:
        """An empty cache for ``batch`` rows of up to ``length`` tokens, rows left-padded by ``pad`` (B,)."""
        layers = tuple(None if b.attn is None else b.attn.init_cache(batch, length, dtype, pad) for b in self.blocks)
        return kv_cache.DecodeState(index=jnp.zeros((), jnp.int32), pad=pad.astype(jnp.int32), layers=layers)
