"""The custom attention hook: a function with ``models.attention.softmax_attention``'s signature replaces it in a
whole model or in chosen layers (the ``attention_fn`` seam of models/attention.py), without editing models/.

``alibi_attention`` is the worked example: ALiBi (Press et al.), a per-head linear distance penalty
``-slope_h * (i - j)`` added to the logits, slopes ``2^(-8h/N)`` for heads h = 1..N. It holds for calls over a whole
sequence (training, evaluation, scoring) and for cached decoding: a hooked layer's cache holds its keys in position
order (a local layer's too, instead of a ring), and a row's left padding shifts its distances by a constant, which
the softmax ignores.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from models.attention import CALL_KEYWORDS, Attention, softmax_attention


def set_attention_fn(model: nnx.Module, fn: Callable | None, layers: Sequence[int] | None = None) -> list[str]:
    """Makes ``fn`` (None: the built-in) the attention of every softmax self-attention layer of ``model``, or of
    the blocks numbered in ``layers``; returns the paths it set. In place."""
    if fn is not None:  # a mistake here would fail only when the model runs
        if not callable(fn):
            raise ConfigError(f"attention_fn: {fn!r:.60} is not a function (give one with softmax_attention's "
                              "signature, e.g. training.peft.hooks.alibi_attention, or None for the built-in)")
        _check_signature(fn)
    candidates = [(path, module) for path, module in nnx.iter_graph(model)
                  if isinstance(module, Attention) and (not path or path[-1] == "attn")
                  and module.spec.kind != "linear"]
    numbers = sorted({path[-2] for path, _ in candidates if len(path) >= 2})
    missing = [n for n in layers or () if n not in numbers]
    if missing:  # a layer number that chose nothing would leave the rest hooked without a word
        raise ConfigError(f"attention_fn: layers {missing}: no softmax self-attention layer there (this model's are "
                          f"blocks {', '.join(map(str, numbers)) or 'none'})")
    chosen = [("/".join(map(str, path)), module) for path, module in candidates
              if layers is None or (len(path) >= 2 and path[-2] in layers)]
    if not chosen:
        raise ConfigError(f"attention_fn: no softmax self-attention layer{'' if layers is None else f' in {layers}'}")
    for _, module in chosen:
        module.attention_fn = fn
    return [name for name, _ in chosen]


def attention_fn_named(name: str) -> Callable:
    """The function a config's ``attention_fn`` names, ``'module:function'``, imported."""
    import importlib

    module, function = name.split(":")
    try:
        found = getattr(importlib.import_module(module), function, None)
    except ImportError as e:  # the module, or one it imports
        raise ConfigError(f"attention_fn: {name}: cannot import {module} ({e})") from None
    if found is None:
        raise ConfigError(f"attention_fn: {name}: {module} has no {function}")
    return found


def _check_signature(fn: Callable) -> None:
    """A function the layers cannot call as they call softmax_attention is one line now, not the user's own
    TypeError when the model first runs."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without one: the call will tell
        return
    try:
        signature.bind(None, None, None, **dict.fromkeys(CALL_KEYWORDS))
    except TypeError as e:
        name = getattr(fn, "__name__", repr(fn))
        raise ConfigError(f"attention_fn: {name}{signature} cannot be called as the layers call attention, "
                          f"fn(q, k, v, {', '.join(k + '=...' for k in CALL_KEYWORDS)}) ({e}); take **options for "
                          "the keywords it does not use") from None


def alibi_bias(n_head: int, t: int, s: int) -> jax.Array:
    """(1, N, T, S): ``-slope_h * (i - j)`` for query i and key j, the T queries being the last T of S keys."""
    slopes = 2.0 ** (-8.0 * jnp.arange(1, n_head + 1) / n_head)  # (N,)
    distance = (jnp.arange(t)[:, None] + (s - t)) - jnp.arange(s)[None, :]  # (T, S)
    return (-slopes[:, None, None] * distance)[None].astype(jnp.float32)


def alibi_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: jax.Array | None = None,
                    **options) -> jax.Array:
    """``softmax_attention`` with ALiBi's bias added to the logits (and to any bias the layer already has)."""
    alibi = alibi_bias(q.shape[2], q.shape[1], k.shape[1])
    return softmax_attention(q, k, v, bias=alibi if bias is None else bias + alibi, **options)
