"""Heads that turn a backbone's hidden states into what a task needs.

Language-model logits come from the embedding matrix itself (tied) or a separate projection, inside each family.
Here: the masked-LM head (BERT/RoBERTa: dense + activation + LayerNorm, then the tied decoder plus a bias), the
sequence-classification head (a pooled token, optionally through BERT's pooler, then a linear classifier), the
token-classification head (a label per token; question answering's is the same head with two labels, each token's
answer start and end logits) and the MLP head either classifier can end in (SwissArmyTransformer's
``MLPHeadMixin``: hidden layers with an activation between them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import axes
from models.layers import ACTIVATIONS, BASE_STDDEV, VocabEinsum, dropout, norm, over_flat_positions, projection


class MlmHead(nnx.Module):
    """(B, T, D) -> (B, T, V): ``decode(LayerNorm(act(dense(x)))) + bias``, decode being the tied embedding, or its
    own ``decoder`` kernel when ``untied`` (a checkpoint saved with tie_word_embeddings false)."""

    def __init__(self, n_embd: int, n_vocab: int, activation: str, epsilon: float, *, rngs: nnx.Rngs,
                 untied: bool = False, logits_multiple: int = 0):
        self.dense = projection("BTD,DE->BTE", (n_embd, n_embd), ("embd", None), BASE_STDDEV, rngs, bias=(None,))
        self.layer_norm = norm("layernorm", n_embd, epsilon, rngs)
        self.bias = nnx.Param(jnp.zeros((n_vocab,)), **axes("vocab"))
        self.decoder = VocabEinsum(n_embd, n_vocab, BASE_STDDEV, rngs, logits_multiple) if untied else None
        self.activation = ACTIVATIONS[activation]

    def __call__(self, x: jax.Array, embedding: nnx.Embed) -> jax.Array:
        h = self.layer_norm(self.activation(self.dense(x)))  # (B, T, D)
        decode = embedding.attend if self.decoder is None else self.decoder
        return over_flat_positions(decode, h) + self.bias[...].astype(h.dtype)  # (B, T, V)


class MlpHead(nnx.Module):
    """(B, [T,] D) -> (B, [T,] C) through ``sizes`` = [hidden..., C] layers, ``activation`` between them (a single
    size: one linear layer)."""

    def __init__(self, n_embd: int, sizes, activation: str, per_token: bool, *, bias: bool = True, rngs: nnx.Rngs):
        lead = "BT" if per_token else "B"
        widths = [n_embd, *sizes]
        self.layers = nnx.List([projection(f"{lead}I,IO->{lead}O", (i, o), ("embd" if n == 0 else None, None),
                                           BASE_STDDEV, rngs, bias=(None,) if bias else None)
                                for n, (i, o) in enumerate(zip(widths[:-1], widths[1:]))])
        self.activation = ACTIVATIONS[activation]

    def __call__(self, x: jax.Array) -> jax.Array:
        for n, layer in enumerate(self.layers):
            x = layer(x if n == 0 else self.activation(x))
        return x


class TokenClassificationHead(nnx.Module):
    """(B, T, D) -> (B, T, C): a label's logits for every token, ``mlp(dropout(x))``."""

    def __init__(self, n_embd: int, num_labels: int, *, hidden=(), activation: str = "gelu", dropout_rate: float = 0.0,
                 rngs: nnx.Rngs):
        self.mlp = MlpHead(n_embd, [*hidden, num_labels], activation, per_token=True, rngs=rngs)
        self.dropout_rate = dropout_rate

    def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        return self.mlp(dropout(self.dropout_rate, x, dropout_key))  # (B, T, C)


def token_head_dropout(cfg) -> float:
    """The dropout on a per-token head's input: the classifier's, none for question answering (transformers'
    *ForQuestionAnswering feed ``qa_outputs`` the hidden states as they are)."""
    return 0.0 if cfg.task == "question_answering" else cfg.head_dropout


def pooled_token(x: jax.Array, segment_ids: jax.Array | None, pool: str) -> jax.Array:
    """(B, T, D) -> (B, D): the first token (BERT's [CLS]) or each row's last real token (decoders)."""
    if pool == "first":
        return x[:, 0]
    if segment_ids is None:
        return x[:, -1]
    last = x.shape[1] - 1 - jnp.argmax((segment_ids != 0)[:, ::-1], axis=1)  # (B,)
    return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]


class ClassificationHead(nnx.Module):
    """(B, T, D) -> (B, C) logits from one pooled token: ``out(dropout(tanh(dense(token))))`` with BERT's pooler,
    ``out(token)`` without it (GPT-style sequence classification)."""

    def __init__(self, n_embd: int, num_labels: int, *, pool: str, pooler: bool, bias: bool, dropout_rate: float,
                 rngs: nnx.Rngs, hidden=(), activation: str = "gelu"):
        self.dense = projection("BD,DE->BE", (n_embd, n_embd), ("embd", None), BASE_STDDEV, rngs,
                                bias=(None,)) if pooler else None
        # ``hidden`` widths make the classifier an MLP head (its parameters then live under out/layers/).
        self.out = MlpHead(n_embd, [*hidden, num_labels], activation, per_token=False, bias=bias, rngs=rngs) \
            if hidden else projection("BD,DC->BC", (n_embd, num_labels), ("embd", None), BASE_STDDEV, rngs,
                                      bias=(None,) if bias else None)
        self.pool, self.dropout_rate = pool, dropout_rate

    def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None,
                 dropout_key: jax.Array | None = None) -> jax.Array:
        h = pooled_token(x, segment_ids, self.pool)  # (B, D)
        if self.dense is not None:
            h = jnp.tanh(self.dense(h))
        return self.out(dropout(self.dropout_rate, h, dropout_key))  # (B, C)
