"""The train state, its shardings from the layout, and sharded initialisation.

Recipe (flax lm1b/gemma): build the model abstractly with ``nnx.eval_shape``, read the logical axes off every
parameter, turn them into NamedShardings with the layout, then run the real initialiser under
``jax.jit(out_shardings=...)`` so every parameter and optimizer slot is born on its devices, never whole on one
host. Optimizer slots take the sharding of the parameter they shadow (matched by tree path); anything else
(counters, Adafactor's factored moments) is replicated.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from config import ConfigError
from parallel.batched_random import batch_random_draws
from parallel.layout import Layout, replicated
from training.layer_stack import (as_stored, layer_plan, stack_abstract, stacked_plan, storage_plan,
                                   unstack_abstract, unstack_layers)

Params = dict  # nested {name: {...: jax.Array}}: the pure-dict form of the model's nnx.Param state


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Params
    opt_state: optax.OptState


def path_name(path) -> str:
    """``(DictKey('blocks'), DictKey(0), ...)`` -> ``"blocks/0/..."``."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def split_params(params: Params, keep: Callable[[str], bool] | None, prefix: tuple = ()) -> tuple[Params, Params]:
    """(the parameters whose path name ``keep`` accepts, the rest), as two nested dicts without empty branches;
    ``keep`` None keeps everything."""
    if keep is None:
        return params, {}
    kept, rest = {}, {}
    for key, value in params.items():
        path = prefix + (key,)
        if isinstance(value, dict):
            a, b = split_params(value, keep, path)
            kept.update({key: a} if a else {})
            rest.update({key: b} if b else {})
        elif keep("/".join(map(str, path))):
            kept[key] = value
        else:
            rest[key] = value
    return kept, rest


def join_params(a: Params, b: Params) -> Params:
    """The union of two parameter trees that ``split_params`` made."""
    out = dict(b)
    for key, value in a.items():
        out[key] = join_params(value, out[key]) if isinstance(value, dict) and key in out else value
    return out


class _TracedStream(nnx.RngStream):
    """flax's RngStream, drawing the same keys (``fold_in(key, count)``, then ``count + 1``) with a whole-value
    count update: flax's indexed one (``count[...] += 1``) asks the traced count for its sharding, and the
    tracer's error message walks the whole trace so far, so building a model under a trace took time quadratic in
    its size (1.3B: 1.15 s -> 0.28 s to build abstractly, 13B: 2.72 s -> 0.71 s)."""

    def __call__(self) -> jax.Array:
        self.count._check_can_update()
        count = self.count.get_value()
        self.count.set_value(count + 1)
        return jax.random.fold_in(self.key.get_value(), count)


def traced_rngs(seed: int) -> nnx.Rngs:
    """``nnx.Rngs(params=seed)`` (its keys, key for key) for building a model under ``eval_shape`` or ``jit``."""
    rngs = nnx.Rngs(params=seed)
    rngs.params = _TracedStream(seed, tag="params")
    return rngs


def abstract_model(make_model: Callable[[nnx.Rngs], nnx.Module]) -> tuple[nnx.GraphDef, Params, dict]:
    """The graph definition, abstract parameters and per-parameter logical axes, without allocating anything."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: make_model(traced_rngs(0))))
    logical = jax.tree.map(lambda v: v.get_metadata().get("logical_axes"), state,
                           is_leaf=lambda x: isinstance(x, nnx.Variable))
    return graphdef, nnx.to_pure_dict(state), nnx.to_pure_dict(logical)


def param_shardings(layout: Layout, abstract: Params, logical: dict) -> Params:
    """A NamedSharding per parameter; a parameter without logical axes is a model bug, not a user error."""
    flat_logical = dict(jax.tree_util.tree_flatten_with_path(logical, is_leaf=lambda x: isinstance(x, tuple))[0])

    def sharding(path, leaf):
        names = flat_logical.get(path)
        if names is None:
            raise ValueError(f"parameter {path_name(path)} has no logical_axes metadata")
        return layout.checked_sharding(f"parameter {path_name(path)}", leaf.shape, names)

    return jax.tree_util.tree_map_with_path(sharding, abstract)


def shardings_like(tree: Any, params: Params, shardings: Params, layout: Layout) -> Any:
    """Shardings for a tree of optimizer slots: each leaf whose path ends with a parameter's path and has its
    shape takes that parameter's sharding, a slot of stacked layers (training/layer_stack.py) the sharding of
    its layers' parameter with the layers axis whole; everything else is replicated."""
    plan = layer_plan(params)  # per-layer parameters (peft): the optimizer's slots are stacked all the same
    stacked_params, stacked_shardings = stack_abstract(params, plan), stack_abstract(shardings, plan)
    by_path = {}
    for tree_of_params, tree_of_shardings in ((params, shardings), (stacked_params, stacked_shardings)):
        by_path.update({path: (leaf.shape, sh) for (path, leaf), sh in zip(
            jax.tree_util.tree_flatten_with_path(tree_of_params)[0], jax.tree.leaves(tree_of_shardings))})

    def pick(path, leaf):
        for start in range(len(path)):
            shape_and_sharding = by_path.get(tuple(path[start:]))
            if shape_and_sharding and shape_and_sharding[0] == leaf.shape:
                return shape_and_sharding[1]
        return replicated(layout.mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def sharded_abstract_params(make_model: Callable[[nnx.Rngs], nnx.Module], layout: Layout
                            ) -> tuple[nnx.GraphDef, Params]:
    """(graphdef, abstract parameters carrying their layout shardings): the target to restore or place weights."""
    graphdef, abstract, logical = abstract_model(make_model)
    shardings = param_shardings(layout, abstract, logical)
    return graphdef, jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def abstract_train_state(make_model: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
                         layout: Layout, trainable: Callable[[str], bool] | None = None,
                         stacking: dict[tuple, int] | None = None) -> tuple[nnx.GraphDef, TrainState, TrainState]:
    """(graphdef, abstract state, state shardings) with nothing allocated: the init and restore target. The
    optimizer state covers only the parameters ``trainable`` accepts (all when None): frozen ones have none. With
    scan_layers the parameters are stored stacked as ``storage_plan`` says (training/layer_stack.py), or as
    ``stacking`` says when given (a checkpoint's own: ``{}`` per layer)."""
    graphdef, abstract_params, logical = abstract_model(make_model)
    p_shardings = param_shardings(layout, abstract_params, logical)
    if stacking is None:
        stacking = storage_plan(graphdef, abstract_params, tx, trainable)
    abstract_params, p_shardings = stack_abstract(abstract_params, stacking), stack_abstract(p_shardings, stacking)
    trained = split_params(abstract_params, trainable)[0]
    abstract_opt = jax.eval_shape(tx.init, trained)
    opt_shardings = shardings_like(abstract_opt, trained, split_params(p_shardings, trainable)[0], layout)
    shardings = TrainState(step=replicated(layout.mesh), params=p_shardings, opt_state=opt_shardings)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    return graphdef, abstract, shardings


def create_train_state(make_model: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
                       layout: Layout, seed: int, params: Params | None = None,
                       trainable: Callable[[str], bool] | None = None,
                       abstract: tuple[nnx.GraphDef, TrainState, TrainState] | None = None
                       ) -> tuple[nnx.GraphDef, TrainState, TrainState]:
    """Initialises a sharded ``TrainState``, from ``params`` (imported weights, per layer; fresh optimizer state) if
    given; returns (graphdef, state, state shardings). Parameters the weights lack (a task head a checkpoint does
    not have) start from their init, as transformers does; ``match_params`` names them. Only the parameters
    ``trainable`` accepts get optimizer state. ``abstract``: what ``abstract_train_state`` returned for the same
    arguments, when the caller has it (building it again takes a second for a 1.3B model)."""
    graphdef, abstract, shardings = abstract or abstract_train_state(make_model, tx, layout, trainable)
    if params is None:
        params = init_params(make_model, seed, shardings.params)
    else:
        per_layer = unstack_abstract(abstract.params)
        params = place_params(params, per_layer, lambda: init_params(
            make_model, seed, jax.tree.map(lambda a: a.sharding, per_layer)))
        if stacked_plan(shardings.params):
            params = jax.jit(lambda p: as_stored(p, shardings.params), out_shardings=shardings.params)(params)
    def with_optimizer_state(p: Params) -> TrainState:  # named, as compile logs and profiles show it
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(split_params(p, trainable)[0]))

    init = jax.jit(with_optimizer_state, in_shardings=(shardings.params,), out_shardings=shardings)
    return graphdef, init(params), shardings


def per_layer_params(params: Params, abstract_params: Params) -> Params:
    """Parameters in the storage of ``abstract_params`` (a train state's) cut back into layers, placed like per-layer
    parameters: what generation and scoring read. Per-layer storage is returned as it is."""
    if not stacked_plan(abstract_params):
        return params
    shardings = jax.tree.map(lambda a: a.sharding, unstack_abstract(abstract_params))
    return jax.jit(unstack_layers, out_shardings=shardings)(params)


def init_params(make_model: Callable[[nnx.Rngs], nnx.Module], seed: int, shardings: Params) -> Params:
    """Freshly initialised parameters, each born on its devices, in the storage of ``shardings`` (per layer, or
    stacked where the shardings are: ``as_stored``). The random draws of parameters of one shape are made together
    (``batch_random_draws``): on one CPU device at XLA's defaults the 1.3B init compiles in 7.7 s instead of 15.5 s,
    the quickstart's in 3.1 s instead of 3.5 s (0.8 s instead of 1.9 s under the tests' flags)."""
    build = batch_random_draws(lambda: nnx.to_pure_dict(nnx.state(make_model(traced_rngs(seed)), nnx.Param)))

    def initialised_params() -> Params:  # named, as compile logs and profiles show it
        return as_stored(build(), shardings)

    return jax.jit(initialised_params, out_shardings=shardings)()


def match_params(given: Params, abstract: Params) -> tuple[dict, list[str], list[str]]:
    """Weights against the model's parameters: ({path: weight} for the model's parameters the weights have,
    paths the weights lack, paths of weights the model does not use). A shape mismatch is a one-line error."""
    flat = {path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(given)[0]}
    wanted = {path_name(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    for name, shape in wanted.items():
        if name in flat and tuple(np.shape(flat[name])) != shape:
            raise ConfigError(f"parameter {name}: the weights have shape {tuple(np.shape(flat[name]))}, the "
                              f"config's model {shape}")
    found = {name: flat[name] for name in wanted if name in flat}
    return found, sorted(set(wanted) - set(flat)), sorted(set(flat) - set(wanted))


def place_params(given: Params, abstract: Params, fresh: Callable[[], Params]) -> Params:
    """``given`` weights placed with the shardings of ``abstract``; parameters they lack come from ``fresh()``
    (called only then)."""
    found, missing, _ = match_params(given, abstract)
    filler = fresh() if missing else abstract
    return jax.tree_util.tree_map_with_path(
        lambda path, a, f: jax.device_put(jnp.asarray(found[path_name(path)], a.dtype), a.sharding)
        if path_name(path) in found else f, abstract, filler)
