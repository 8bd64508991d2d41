"""BERT and RoBERTa on the backbone: word, position and token-type embeddings with a LayerNorm, post-LayerNorm
bidirectional blocks (registry defaults), and the head of the config's task: the masked-LM head (tied decoder plus
a bias; untied with ``no_weight_tie``), a classification head over the first token ([CLS] / <s>) through BERT's
pooler, or a per-token head (token classification; question answering's start and end logits).

RoBERTa differs by data only: its position table starts at ``position_offset`` 2 (rows 0 and 1 belong to padding),
and a padded row's positions count its real tokens, as transformers computes them from the padding mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import TOKEN_HEAD_TASKS, Config
from models.axes import HIDDEN, LOGITS, axes, constrain
from models.block import Block, run_blocks, share_parameters
from models.heads import ClassificationHead, MlmHead, TokenClassificationHead, token_head_dropout
from models.layers import BASE_STDDEV, Embed, dropout, dropout_keys, norm
from models.spec import block_spec

BERT_INIT = (BASE_STDDEV,) * 4, (BASE_STDDEV,) * 2  # transformers' initializer_range for every projection


class Bert(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(BASE_STDDEV)
        d = cfg.n_embd
        self.wte = Embed(cfg.n_vocab, d, embedding_init=init, embedding_metadata=axes("vocab", "embd"),
                         logits_multiple=cfg.logits_pad_multiple, rngs=rngs)
        self.wpe = Embed(cfg.position_rows + cfg.position_offset, d, embedding_init=init,
                         embedding_metadata=axes(None, "embd"), rngs=rngs)
        self.wtt = Embed(cfg.n_token_types, d, embedding_init=init, embedding_metadata=axes(None, "embd"),
                         rngs=rngs) if cfg.n_token_types else None
        self.ln_embed = norm("layernorm", d, cfg.layer_norm_epsilon, rngs)
        self.blocks = nnx.List([Block(block_spec(cfg, layer, *BERT_INIT), rngs=rngs) for layer in range(cfg.n_layer)])
        if cfg.share_parameters:  # ALBERT-style: one block's weights for every layer
            share_parameters(self.blocks)
        self.mlm = MlmHead(d, cfg.n_vocab, cfg.activation_function, cfg.layer_norm_epsilon, rngs=rngs,
                           untied=cfg.no_weight_tie, logits_multiple=cfg.logits_pad_multiple) \
            if cfg.task == "masked_lm" else None
        self.classifier = ClassificationHead(d, cfg.num_labels, pool="first", pooler=True, bias=True,
                                             dropout_rate=cfg.head_dropout, rngs=rngs, hidden=cfg.head_hidden,
                                             activation=cfg.activation_function) \
            if cfg.task == "sequence_classification" else None
        self.token_classifier = TokenClassificationHead(
            d, cfg.num_labels, hidden=cfg.head_hidden, activation=cfg.activation_function,
            dropout_rate=token_head_dropout(cfg), rngs=rngs) if cfg.task in TOKEN_HEAD_TASKS else None
        self.embed_dropout = cfg.embed_dropout
        self.position_offset = cfg.position_offset
        self.remat, self.scan = cfg.remat_policy, cfg.scan_layers

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, token_types: jax.Array | None = None,
                 dropout_key: jax.Array | None = None) -> tuple[jax.Array, None]:
        """(B, T) token ids -> ((B, T, V) masked-LM logits or (B, C) class logits, None: encoders keep no cache).
        ``segment_ids`` (B, T): 0 marks padding (transformers' attention_mask); ``token_types`` (B, T): sentence A/B."""
        hidden_key, head_key = dropout_keys(dropout_key, 2)
        x = self.hidden_states(tokens, positions=positions, segment_ids=segment_ids, token_types=token_types,
                               dropout_key=hidden_key)
        if self.classifier is not None:
            return self.classifier(x, segment_ids, head_key), None
        if self.token_classifier is not None:
            return self.token_classifier(x, head_key), None
        return constrain(self.mlm(x, self.wte), LOGITS), None

    def hidden_states(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                      segment_ids: jax.Array | None = None, token_types: jax.Array | None = None,
                      dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, T) token ids -> (B, T, D): the last block's output (transformers' last_hidden_state)."""
        if positions is None:
            positions = default_positions(tokens.shape, segment_ids, self.position_offset > 0)
        embed_key, blocks_key = dropout_keys(dropout_key, 2)
        x = self.wte(tokens) + self.wpe(positions + self.position_offset)  # (B, T, D)
        if self.wtt is not None:
            x = x + self.wtt(jnp.zeros_like(tokens) if token_types is None else token_types)
        x = constrain(dropout(self.embed_dropout, self.ln_embed(x), embed_key), HIDDEN)
        x, _ = run_blocks(self.blocks, x, positions, segment_ids, None, blocks_key, remat=self.remat,
                          scan=self.scan)
        return x


def default_positions(shape: tuple[int, int], segment_ids: jax.Array | None, count_real: bool) -> jax.Array:
    """(B, T) positions 0, 1, ... along each row; with ``count_real`` (RoBERTa) only real tokens count and padding
    sits at -1, the row just below the table's first position."""
    if not count_real or segment_ids is None:
        return jnp.broadcast_to(jnp.arange(shape[1])[None, :], shape)
    real = (segment_ids != 0).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real - 1
