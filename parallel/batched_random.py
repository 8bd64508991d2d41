"""A model's random initialisers run as one batched call per kind and shape, with the same random values.

Initialising a model draws each parameter by itself: ``jax.random.normal(key, shape)`` is a jitted function, and on
CPU every call compiles its own threefry loop and its own normal transform, ~50 ms of XLA compile per parameter, so
initialising a small model compiled about as long as its train step. ``batch_random_draws(fn)`` is ``fn`` with the
identical jitted draws (one function, one shape: each layer's kernels of one kind), and the keys' ``fold_in``s, made
as one ``vmap`` over their stacked keys. Threefry is elementwise over key and counter, and the transforms after it
are elementwise, so every draw gives the values its own call gives, bit for bit (tests/test_batched_random.py holds
that). What a model does with a draw afterwards (``* stddev``) XLA may round apart by float32's last bit, as its
optimisation flags alone already do.

Each batched draw is made once, behind ``lax.optimization_barrier``, and then cut into the draws: without it XLA:GPU
fused the stacked draw into every slice of it, compiling threefry once per parameter after all. Compiled for an
H100 (jax's CUDA plugin, no GPU, this 2-core machine), GPT-Neo 125M's initialiser took 64.7 s drawn per parameter,
30.8 s batched without the barrier and 3.0 s with it (scanned layers: 8.6 s, 2.3 s); the 1.3B's, unrolled, 6.9 s,
where on an H200 it had not compiled 150 s in. On CPU it changes nothing measurable (125M: 5.0 s, 4.5 s).

It is a jaxpr interpreter (the pattern of JAX's "Writing custom Jaxpr interpreters"): ``fn`` is traced once, then
its equations run again in waves; in each wave every equation whose inputs are known runs, except the jitted draws,
which gather by function and run batched at the wave's end. Any order of a pure program's equations that respects
their inputs gives the same values. Draws are batched up to ``max_elements`` per call, so the transient stack stays
small beside the parameters of a large model (whose parameters are each larger than that, and drawn alone).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend import core

MAX_ELEMENTS = 1 << 26  # per batched draw: 256 MiB of float32, before sharding


def batch_random_draws(fn: Callable, max_elements: int = MAX_ELEMENTS) -> Callable:
    """``fn`` (of arrays, returning a pytree of arrays) with its identical jitted random draws batched; the same
    values. Meant under ``jax.jit``: each call traces ``fn`` again."""

    def batched(*args):
        flat_args, in_tree = jax.tree.flatten(args)
        closed, out_shape = jax.make_jaxpr(lambda *flat: fn(*jax.tree.unflatten(in_tree, flat)),
                                           return_shape=True)(*flat_args)
        if closed.effects:  # a debug print or a callback: equations run in their written order, unbatched
            return fn(*args)
        outputs = _run_in_waves(closed.jaxpr, closed.consts, flat_args, max_elements)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outputs)

    return batched


def _run_in_waves(jaxpr, consts, args, max_elements: int) -> list:
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args))
    known = lambda v: isinstance(v, core.Literal) or v in env  # noqa: E731
    waiting = list(jaxpr.eqns)
    while waiting:
        draws: dict[tuple, list] = {}
        still_waiting = []
        for eqn in waiting:
            if not all(known(v) for v in eqn.invars):
                still_waiting.append(eqn)
            elif _is_random_draw(eqn):
                draws.setdefault(_draw_kind(eqn), []).append(eqn)
            else:
                _run(eqn, env)
        for group in draws.values():
            per_call = max(1, max_elements // max(1, sum(math.prod(v.aval.shape) for v in group[0].outvars)))
            for start in range(0, len(group), per_call):
                _draw_together(group[start:start + per_call], env)
        waiting = still_waiting
    return _read(env, jaxpr.outvars)


def _draw_together(eqns: list, env: dict) -> None:
    """The jitted draws ``eqns`` (one function, one shape) as one call over their stacked inputs."""
    if len(eqns) == 1:
        return _run(eqns[0], env)
    stacked = [jnp.stack(values) for values in zip(*(_read(env, eqn.invars) for eqn in eqns))]
    drawn = jax.lax.optimization_barrier(jax.vmap(lambda *inputs: _bind(eqns[0], inputs))(*stacked))
    for i, eqn in enumerate(eqns):
        env.update((var, value[i]) for var, value in zip(eqn.outvars, drawn))


def _is_random_draw(eqn) -> bool:
    """A jitted function that draws random bits (``jax.random.normal``), or a key derivation (``fold_in``)."""
    if eqn.primitive.name in ("jit", "pjit"):
        return _draws_random_bits(eqn.params["jaxpr"].jaxpr)
    return eqn.primitive.name in ("random_bits", "random_fold_in")


def _draws_random_bits(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "random_bits":
            return True
        inner = eqn.params.get("jaxpr")
        if inner is not None and _draws_random_bits(getattr(inner, "jaxpr", inner)):
            return True
    return False


def _draw_kind(eqn) -> tuple:
    """Draws of one kind run as one: the same primitive or traced function (jax caches one jaxpr per function
    and shapes) with the same settings, on inputs of the same types."""
    settings = tuple(sorted((name, repr(value)) for name, value in eqn.params.items() if name != "jaxpr"))
    return eqn.primitive.name, id(eqn.params.get("jaxpr")), settings, tuple(str(v.aval) for v in eqn.invars)


def _run(eqn, env: dict) -> None:
    env.update(zip(eqn.outvars, _bind(eqn, _read(env, eqn.invars))))


def _read(env: dict, variables) -> list:
    return [v.val if isinstance(v, core.Literal) else env[v] for v in variables]


def _bind(eqn, inputs) -> list:
    with eqn.ctx.manager:  # what the equation was traced under (e.g. a compute type)
        out = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
    return list(out) if eqn.primitive.multiple_results else [out]
