"""T5 on the backbone: an encoder stack and a decoder stack built from block specs, sharing one token embedding.

Registry defaults make the blocks T5's: pre-norm RMSNorm, no biases, unscaled logits (mesh-tensorflow folds
1/sqrt(head_dim) into the query init), a ReLU MLP (original T5) or, with ``mlp_glu`` and ``gelu``, T5 v1.1's
gated-GELU. Neither stack has absolute positions: each computes one bucketed relative position bias
(models/relative_position.py; bidirectional buckets in the encoder, causal in the decoder) and every one of its
layers adds it to the self-attention logits. Decoder blocks cross-attend to the encoder output. Each stack ends
with its own final RMSNorm. Logits come from the tied embedding on the decoder output scaled by n_embd**-0.5 (T5's
rescaling), or from an untied ``lm_head`` (``no_weight_tie``: T5 v1.1) without it.

Decoding runs the encoder once; the decoder keeps a self-attention KV cache and, per layer, a cross-attention
cache of the encoder output's keys and values computed once (``prefill``), then advances one token per
``decode_step``. ``n_decoder_layer: 0`` is an encoder alone (Hugging Face's ``T5EncoderModel``): it gives hidden
states.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from config import Config
from models import kv_cache
from models.axes import HIDDEN, LOGITS, axes, constrain
from models.block import Block, run_blocks
from models.generate import seen_tokens
from models.layers import Embed, VocabEinsum, dropout, dropout_keys, norm, over_flat_positions
from models.relative_position import RelativePositionBias
from models.spec import block_spec, gpt_neo_attention_init

BIAS = (None, "heads", None, None)  # (B or 1, N, T, S): the relative position bias


def t5_mlp_init(cfg: Config) -> tuple[float, float]:
    """mesh-tensorflow's T5 init: stddev n_embd**-0.5 into the MLP, d_ff**-0.5 out of it."""
    return cfg.n_embd ** -0.5, cfg.intermediate ** -0.5


class T5Stack(nnx.Module):
    """One side of T5: blocks, the stack's relative position bias table, and a final norm."""

    def __init__(self, cfg: Config, n_layer: int, decoder: bool, *, rngs: nnx.Rngs):
        base = block_spec(cfg, 0, gpt_neo_attention_init(cfg), t5_mlp_init(cfg))
        spec = dataclasses.replace(base, attention=dataclasses.replace(base.attention, causal=decoder),
                                   cross_attention=dataclasses.replace(base.attention, causal=False)
                                   if decoder else None)
        self.blocks = nnx.List([Block(spec, rngs=rngs) for _ in range(n_layer)])
        self.relative_attention_bias = RelativePositionBias(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.n_head,
            bidirectional=not decoder, stddev=cfg.n_embd ** -0.5, rngs=rngs)
        self.ln_f = norm(cfg.norm_kind, cfg.n_embd, cfg.layer_norm_epsilon, rngs)
        self.dropout_rate, self.remat, self.scan = cfg.res_dropout, cfg.remat_policy, cfg.scan_layers

    def __call__(self, x: jax.Array, positions: jax.Array | None, segment_ids: jax.Array | None,
                 dropout_key: jax.Array | None = None, cache: kv_cache.DecodeState | None = None,
                 context: jax.Array | None = None, context_segment_ids: jax.Array | None = None
                 ) -> tuple[jax.Array, tuple | None]:
        """(B, T, D) embedded tokens -> (B, T, D) after the final norm, and the updated self-attention caches.
        ``positions`` (B, T) default to 0..T-1; ``context`` is the encoder output (decoder, training) unless the
        ``cache`` holds its keys and values (decoding)."""
        t = x.shape[1]
        if cache is not None:
            # Buffer indices: a row's left padding shifts queries and keys alike, so key - query is unchanged.
            # Global layers cache every index, so the keys are the whole buffer 0..L-1.
            query = cache.index + jnp.arange(t)[None, :]  # (1, T)
            keys = jnp.arange(cache.layers[0].length)[None, :]  # (1, L)
            bias = self.relative_attention_bias(query, keys)  # (1, N, T, L)
            positions = cache.positions(t)
        else:
            if positions is None:
                positions = jnp.arange(t)[None, :]  # (1, T): one bias for every row
            bias = self.relative_attention_bias(positions, positions)  # (B or 1, N, T, T)
            positions = jnp.broadcast_to(positions, x.shape[:2])
        blocks_key, out_key = dropout_keys(dropout_key, 2)
        x, layers = run_blocks(self.blocks, x, positions, segment_ids, None if cache is None else cache.layers,
                               blocks_key, remat=self.remat if cache is None else "none", scan=self.scan,
                               cross_caches=None if cache is None else cache.cross,
                               attention_bias=constrain(bias, BIAS), context=context,
                               context_segment_ids=context_segment_ids)
        return dropout(self.dropout_rate, self.ln_f(x), out_key), layers


class T5(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        d = cfg.n_embd
        self.wte = Embed(cfg.n_vocab, d, embedding_init=jax.nn.initializers.normal(1.0),
                         embedding_metadata=axes("vocab", "embd"), logits_multiple=cfg.logits_pad_multiple,
                         rngs=rngs)  # T5's "shared"
        self.encoder = T5Stack(cfg, cfg.n_layer, decoder=False, rngs=rngs)
        self.decoder = T5Stack(cfg, cfg.decoder_layers, decoder=True, rngs=rngs) if cfg.decoder_layers else None
        self.lm_head = VocabEinsum(d, cfg.n_vocab, d ** -0.5, rngs, cfg.logits_pad_multiple) \
            if cfg.no_weight_tie and self.decoder is not None else None
        self.embed_dropout, self.n_embd = cfg.embed_dropout, d
        self.decoder_start_token_id = cfg.decoder_start_token_id

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, decoder_inputs: jax.Array | None = None,
                 decoder_segment_ids: jax.Array | None = None, dropout_key: jax.Array | None = None
                 ) -> tuple[jax.Array, None]:
        """(B, S) encoder token ids -> ((B, T, V) logits for (B, T) ``decoder_inputs`` (default: the start token
        alone, so T = 1: the first output token's distribution), None). ``segment_ids`` and
        ``decoder_segment_ids``: 0 marks padding; a decoder token sees the encoder tokens of its own segment. An
        encoder-only T5 returns its (B, S, D) hidden states instead of logits."""
        encode_key, decode_key = dropout_keys(dropout_key, 2)
        encoded = self.encode(tokens, positions=positions, segment_ids=segment_ids, dropout_key=encode_key)
        if self.decoder is None:
            return encoded, None
        if decoder_inputs is None:
            decoder_inputs = jnp.full((tokens.shape[0], 1), self.decoder_start_token_id, jnp.int32)
        return self.decode(decoder_inputs, encoded, segment_ids=decoder_segment_ids,
                           encoder_segment_ids=segment_ids, dropout_key=decode_key)

    def embed(self, tokens: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
        return constrain(dropout(self.embed_dropout, self.wte(tokens), dropout_key), HIDDEN)  # (B, T, D)

    def encode(self, tokens: jax.Array, *, positions: jax.Array | None = None, segment_ids: jax.Array | None = None,
               dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, S) token ids -> (B, S, D): the encoder's output (transformers' encoder last_hidden_state)."""
        embed_key, stack_key = dropout_keys(dropout_key, 2)
        return self.encoder(self.embed(tokens, embed_key), positions, segment_ids, stack_key)[0]

    hidden_states = encode  # the Python API's embeddings of a text are the encoder's

    def decode(self, tokens: jax.Array, encoded: jax.Array | None = None, *, segment_ids: jax.Array | None = None,
               encoder_segment_ids: jax.Array | None = None, cache: kv_cache.DecodeState | None = None,
               dropout_key: jax.Array | None = None) -> tuple[jax.Array, kv_cache.DecodeState | None]:
        """(B, T) decoder token ids -> ((B, T, V) logits, the advanced cache). Training passes the ``encoded``
        (B, S, D) output; decoding passes the ``cache`` from ``prefill`` instead."""
        t = tokens.shape[1]
        if cache is not None:
            segment_ids = cache.segment_ids(t)
        embed_key, stack_key = dropout_keys(dropout_key, 2)
        x, layers = self.decoder(self.embed(tokens, embed_key), None, segment_ids, stack_key, cache, encoded,
                                 encoder_segment_ids)
        if cache is not None:
            cache = cache.replace(index=cache.index + t, layers=layers)
        return constrain(self.logits(x), LOGITS), cache

    def logits(self, x: jax.Array) -> jax.Array:
        """Decoder output (B, T, D) -> (B, T, V): the tied embedding on x * n_embd**-0.5, or the untied head."""
        if self.lm_head is not None:
            return over_flat_positions(self.lm_head, x)
        return over_flat_positions(self.wte.attend, x * self.n_embd ** -0.5)

    def prefill(self, prompts: jax.Array, pad: jax.Array, max_new_tokens: int, dtype
                ) -> tuple[jax.Array, kv_cache.DecodeState, jax.Array]:
        """Generation's start: encodes the (B, P) left-padded ``prompts`` once, computes every decoder layer's
        cross-attention keys and values from it, and runs the start token. Returns the (B, V) logits of the first
        output token, the cache, and the (B, V) tokens the repetition penalty counts (the start token)."""
        if self.decoder is None:
            raise ValueError("an encoder-only T5 (n_decoder_layer 0) does not generate")
        b, p = prompts.shape
        segment_ids = (jnp.arange(p)[None, :] >= pad[:, None]).astype(jnp.int32)  # (B, P)
        encoded = self.encode(prompts, positions=jnp.maximum(jnp.arange(p)[None, :] - pad[:, None], 0),
                              segment_ids=segment_ids)  # (B, P, D)
        blocks = self.decoder.blocks
        cache = kv_cache.DecodeState(
            index=jnp.zeros((), jnp.int32), pad=jnp.zeros((b,), jnp.int32),
            layers=tuple(block.attn.init_cache(b, max_new_tokens + 1, dtype) for block in blocks),
            cross=tuple(block.crossattention.cross_cache(encoded, segment_ids) for block in blocks))
        start = jnp.full((b, 1), self.decoder_start_token_id, jnp.int32)
        logits, cache = self.decode(start, cache=cache)
        return logits[:, -1], cache, seen_tokens(start, jnp.ones(start.shape, bool), logits.shape[-1])

    def decode_step(self, tokens: jax.Array, cache: kv_cache.DecodeState) -> tuple[jax.Array, kv_cache.DecodeState]:
        """(B,) new tokens -> ((B, V) logits of the next, the advanced cache)."""
        logits, cache = self.decode(tokens[:, None], cache=cache)
        return logits[:, -1], cache
