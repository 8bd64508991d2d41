"""Auxiliary losses that layers add to the training objective, by sowing them.

A layer calls ``sow_aux_losses(self, penalty, **metrics)`` (mixture-of-experts layers sow their load-balancing
and router z-losses). Whoever runs the model through ``captured`` (the train and eval steps) passes what was sown
to ``collect``: the penalties are summed into one term for the loss, each metric is averaged over the layers that
sowed it. The train step knows nothing of which layers these are. Elsewhere (generation, scoring) nothing is
sown: there is no loss to add it to, and a module sowing outside ``nnx.capture`` would keep the value on itself.
"""

from __future__ import annotations

import collections
import contextvars
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

NAME = "aux_losses"  # the sown collection
PENALTY = "penalty"

_CAPTURING: contextvars.ContextVar[bool] = contextvars.ContextVar("capturing_aux_losses", default=False)


def captured(fn: Callable) -> Callable:
    """``fn`` (a model, or a function calling one) -> a function returning (``fn``'s result, what its layers
    sowed), for ``collect``."""
    capture = nnx.capture(fn, nnx.Intermediate)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        token = _CAPTURING.set(True)
        try:
            return capture(*args, **kwargs)
        finally:
            _CAPTURING.reset(token)

    return run


def sow_aux_losses(module: nnx.Module, penalty: jax.Array, **metrics: jax.Array) -> None:
    """Records ``penalty`` (added to the training loss) and ``metrics`` (reported) for this call of ``module``
    when it runs under ``captured``."""
    if _CAPTURING.get():
        module.sow(nnx.Intermediate, NAME, {PENALTY: penalty, **metrics})


def collect(intermediates) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Captured intermediates -> (sum of every sown penalty, {metric: mean over the calls that sowed it}).
    Nothing sown: (0, {})."""
    values = collections.defaultdict(list)
    for path, leaf in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
        keys = [getattr(k, "key", None) for k in path]
        if NAME in keys:
            values[keys[-1]].append(leaf)
    penalty = sum(values.pop(PENALTY, []), jnp.zeros((), jnp.float32))
    return penalty, {name: jnp.mean(jnp.stack(v)) for name, v in values.items()}
