"""Layers stacked, for scan_layers: the train state's storage and the optimizer run on it.

With scan_layers the forward and backward passes run a stack's repeating group of layers as one ``lax.scan``;
anything that still touched the layers one by one (the optimizer's update, the clipping norm, the bad-step guard,
cutting the stack's weights out of per-layer arrays and back) would compile once per layer, growing with depth.
So the train state stores every dict of repeating layers stacked, one array per weight with a leading layers axis:

    {"blocks": {0: {...}, 1: {...}, ..., 11: {...}}}  ->  {"blocks": Stacked(layers=(group_0, group_1))}

where ``group_p`` holds layers p, p + period, p + 2 period, ... The period is the stack's own (``storage_plan``:
2 for GPT-Neo's global/local pair), so the scan takes each layer's weights straight from its inputs; the
optimizer alone, stacking per-layer weights (peft), uses the period of the weights' shapes (``layer_plan``: 1 for
GPT-Neo). The parameters, their gradients and the optimizer state all live stacked in the step (the scan reads
them in place: ``models.block.prestacked``). Readers of the model's parameters (generation, export, a loaded
checkpoint) see them per layer under their usual paths (``unstack_layers``), and ``as_stored`` / ``unstack_layers``
move parameters between the two storages. With peft the parameters stay per layer (a trainable filter may pick
single layers) and the optimizer alone runs stacked (``stacked_layers``).
``per_layer(tx)`` keeps an optimizer's per-weight meaning on stacked weights by vmapping it over the layers axis:
AdamW's decay mask by a layer weight's rank, Adafactor's factored and block-RMS statistics per layer, exactly as
unstacked. ``convert_opt_state`` moves an optimizer state between the two storages (a run resumed with
scan_layers flipped).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from models.block import layer_period, repeat_period


@flax.struct.dataclass
class Stacked:
    """A stack's layers: leaf g of ``layers[p]`` along its first axis is layer g * len(layers) + p's."""
    layers: tuple


def _signature(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), x.dtype) for x in leaves)  # arrays, tracers or ShapeDtypeStructs


def _period(node: dict) -> int | None:
    """The repeating period of a dict of layers (keys 0..n-1, each layer shaped like the one ``period`` before),
    or None when ``node`` is not such a dict or nothing repeats."""
    n = len(node)
    if n < 2 or set(node) != set(range(n)):
        return None
    period = repeat_period([_signature(node[i]) for i in range(n)])
    return period if period < n else None


def layer_plan(tree: Any, prefix: tuple = ()) -> dict[tuple, int]:
    """{path of a dict of repeating layers: its period} for the nested dict ``tree`` (parameters or gradients)."""
    if not isinstance(tree, dict):
        return {}
    period = _period(tree)
    if period is not None:
        return {prefix: period}
    plan = {}
    for key, value in tree.items():
        plan.update(layer_plan(value, prefix + (key,)))
    return plan


def stack_layers(tree: Any, plan: dict[tuple, int], combine: Callable = lambda *layers: jnp.stack(layers),
                 prefix: tuple = ()) -> Any:
    """``tree`` with every dict of layers that ``plan`` names replaced by its ``Stacked`` form; ``combine`` joins
    one leaf's layers (a stack by default; shardings and shapes have their own)."""
    if prefix in plan:
        period, n = plan[prefix], len(tree)
        return Stacked(tuple(jax.tree.map(combine, *[tree[g * period + p] for g in range(n // period)])
                             for p in range(period)))
    if not isinstance(tree, dict):
        return tree
    return {key: stack_layers(value, plan, combine, prefix + (key,)) for key, value in tree.items()}


def unstack_layers(tree: Any, take: Callable = lambda x, g: x[g]) -> Any:
    """The inverse of ``stack_layers``: every ``Stacked`` back to its dict of layers (``take(leaf, g)``: row g of
    a stacked leaf; abstract trees have their own)."""
    if isinstance(tree, Stacked):
        period, groups = len(tree.layers), jax.tree.leaves(tree.layers)[0].shape[0]
        return {g * period + p: jax.tree.map(lambda x: take(x, g), tree.layers[p])
                for g in range(groups) for p in range(period)}
    if not isinstance(tree, dict):
        return tree
    return {key: unstack_layers(value, take) for key, value in tree.items()}


def storage_plan(graphdef, params: Any, tx: optax.GradientTransformation,
                 trainable: Callable | None) -> dict[tuple, int]:
    """How a train state of ``tx`` stores ``params`` (per layer, abstract or not) of the model ``graphdef``: per
    layer ({}) unless ``stores_params_stacked``; else every stack of ``layer_plan``, its layers grouped by the
    period of the stack's own layers (``models.block.layer_period``: 2 for GPT-Neo's global/local pair, whose
    weights' shapes repeat every layer), so the scan takes each layer's weights straight from its inputs and saves
    no copy of them for the backward pass."""
    plan = layer_plan(params) if stores_params_stacked(tx, trainable) else {}
    if not plan:
        return plan
    model = nnx.merge(graphdef, nnx.State(params))
    for path, period in plan.items():
        node = _module_at(model, path)
        if isinstance(node, nnx.List):
            plan[path] = math.lcm(period, layer_period(node))
    return plan


def _module_at(model, path: tuple):
    """The submodule at a parameter path's prefix (``("encoder", "blocks")`` -> ``model.encoder.blocks``)."""
    for key in path:
        model = model[key] if isinstance(key, int) else getattr(model, key)
    return model


def stacked_plan(tree: Any, prefix: tuple = ()) -> dict[tuple, int]:
    """{path of a ``Stacked`` node: its period} in a tree of the stored form (``layer_plan`` of what it stores)."""
    if isinstance(tree, Stacked):
        return {prefix: len(tree.layers)}
    if not isinstance(tree, dict):
        return {}
    plan = {}
    for key, value in tree.items():
        plan.update(stacked_plan(value, prefix + (key,)))
    return plan


def as_stored(params: Any, like: Any) -> Any:
    """Per-layer ``params`` in the storage of ``like`` (any tree of it: abstract parameters, shardings): stacked
    where ``like`` holds ``Stacked`` nodes, unchanged where it holds none."""
    return stack_layers(params, stacked_plan(like))


def stored_stacks(model, params: Any) -> list[tuple]:
    """(the module holding a stack's layers, such as ``model.blocks``, its ``Stacked`` groups) for every stack that
    ``params`` stores stacked: what ``models.block.prestacked`` takes for a model merged from ``params``."""
    stacks = []
    for path in stacked_plan(params):
        stored = params
        for key in path:
            stored = stored[key]
        stacks.append((_module_at(model, path), stored.layers))
    return stacks


def stores_params_stacked(tx: optax.GradientTransformation, trainable: Callable | None) -> bool:
    """Whether a train state keeps its parameters stacked: with scan_layers (the optimizer runs stacked) unless
    a peft filter chooses what trains (it may pick single layers: those parameters stay per layer)."""
    return isinstance(tx, StackedLayers) and trainable is None


def _stacked_sharding(layer: NamedSharding) -> NamedSharding:
    return NamedSharding(layer.mesh, PartitionSpec(None, *layer.spec))  # the layers axis whole on every device


def stack_abstract(tree: Any, plan: dict[tuple, int]) -> Any:
    """``stack_layers`` for a tree of ShapeDtypeStructs (with or without shardings) or of NamedShardings."""
    def combine(*layers):
        first = layers[0]
        if isinstance(first, NamedSharding):
            return _stacked_sharding(first)
        sharding = None if first.sharding is None else _stacked_sharding(first.sharding)
        return jax.ShapeDtypeStruct((len(layers), *first.shape), first.dtype, sharding=sharding)

    return stack_layers(tree, plan, combine)


def unstack_abstract(tree: Any) -> Any:
    """``unstack_layers`` for a tree of ShapeDtypeStructs (shardings follow: the layers axis dropped)."""
    def take(leaf, _):
        sharding = leaf.sharding
        if sharding is not None:
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
        return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=sharding)

    return unstack_layers(tree, take)


class StackedLayers(NamedTuple):
    """An optax GradientTransformation running ``inner`` on stacked layers (see the module's docstring)."""
    init: Callable
    update: Callable
    inner: optax.GradientTransformation


def stacked_layers(tx: optax.GradientTransformation) -> StackedLayers:
    """``tx`` run on stacked layers: its state is ``tx``'s state of the stacked tree; updates come back per layer
    (``optimizer_step`` applies them stacked instead, as the train step does)."""

    def init(params):
        return tx.init(stack_layers(params, layer_plan(params)))

    def update(updates, state, params=None):
        plan = layer_plan(updates)
        stacked_params = None if params is None else stack_layers(params, plan)
        updates, state = tx.update(stack_layers(updates, plan), state, stacked_params)
        return unstack_layers(updates), state

    return StackedLayers(init, update, tx)


def optimizer_step(tx, grads, opt_state, params) -> tuple[Any, Any, jax.Array]:
    """(updated parameters, optimizer state, gradient norm) of one step of ``tx``. For ``StackedLayers`` the update
    runs on the stacked trees: parameters stored stacked are updated in place; per-layer ones (peft) are stacked
    and cut back into layers once, after the update."""
    if not isinstance(tx, StackedLayers):
        return *_update_and_apply(tx, grads, opt_state, params), optax.tree.norm(grads)
    plan = layer_plan(grads)  # empty when the parameters are stored stacked
    grads, params = stack_layers(grads, plan), stack_layers(params, plan)
    params, opt_state = _update_and_apply(tx.inner, grads, opt_state, params)
    return (unstack_layers(params) if plan else params), opt_state, optax.tree.norm(grads)


def _update_and_apply(tx, grads, opt_state, params) -> tuple[Any, Any]:
    """(new parameters, new state): ``tx``'s own ``update_and_apply`` where it has one (the bad-step guard's,
    training/optimizer.py), else its update added to the parameters."""
    if hasattr(tx, "update_and_apply"):
        return tx.update_and_apply(grads, opt_state, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _is_stacked(x) -> bool:
    return isinstance(x, Stacked)


def _parts(tree) -> tuple[Any, list]:
    """(``tree`` without its ``Stacked`` nodes, [``tree`` with only its i-th ``Stacked`` node] per node): the
    trees keep their paths, with None where a part is left out."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_stacked)
    stacks = [i for i, leaf in enumerate(leaves) if _is_stacked(leaf)]
    rest = treedef.unflatten([None if _is_stacked(leaf) else leaf for leaf in leaves])
    return rest, [treedef.unflatten([leaf if i == j else None for j, leaf in enumerate(leaves)]) for i in stacks]


def _merge(parts: list) -> Any:
    """The tree whose parts ``_parts`` made (each leaf position is filled in exactly one part)."""
    flat = [jax.tree.flatten(part, is_leaf=lambda x: x is None or _is_stacked(x)) for part in parts]
    leaves = [next(leaf for leaf in column if leaf is not None) for column in zip(*(f[0] for f in flat))]
    return flat[0][1].unflatten(leaves)


class PerLayerState(flax.struct.PyTreeNode):
    rest: optax.OptState  # the state of the weights outside any stack
    stacks: tuple  # per Stacked node: the state of its layers, with a leading layers axis


def per_layer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` applied to each layer of every ``Stacked`` node on its own (vmapped over the layers axis) and to the
    other weights as usual. ``tx`` must treat weights independently (no global norm inside)."""

    def init(params):
        rest, stacks = _parts(params)
        return PerLayerState(rest=tx.init(rest), stacks=tuple(jax.vmap(tx.init)(stack) for stack in stacks))

    def update(updates, state, params=None):
        rest, stacks = _parts(updates)
        rest_params, stack_params = _parts(params) if params is not None else (None, [None] * len(stacks))
        rest, rest_state = tx.update(rest, state.rest, rest_params)
        stacked = [jax.vmap(tx.update)(u, s, p) for u, s, p in zip(stacks, state.stacks, stack_params)]
        return _merge([rest] + [u for u, _ in stacked]), PerLayerState(rest=rest_state,
                                                                        stacks=tuple(s for _, s in stacked))

    return optax.GradientTransformation(init, update)


_REST, _STACKS, _LAYERS = (jax.tree_util.GetAttrKey(name) for name in ("rest", "stacks", "layers"))


def _position(path: tuple, key) -> int | None:
    return next((i for i, k in enumerate(path) if k == key), None)


def _periods(paths) -> dict[tuple, int]:
    """{path up to a stack's "layers": its period} for the paths of a stacked optimizer state."""
    periods: dict[tuple, int] = {}
    for path in paths:
        at = _position(path, _LAYERS)
        if at is not None:
            periods[path[:at]] = max(periods.get(path[:at], 0), path[at + 1].idx + 1)
    return periods


def _per_layer_paths(path: tuple, periods: dict, groups: int) -> tuple[tuple, list[tuple] | None]:
    """For a leaf of either storage: (its path per layer, or that of its shared value, and for a stacked slot the
    per-layer paths of its rows, else None)."""
    at = _position(path, _REST)
    if at is not None:
        return path[:at] + path[at + 1:], None
    at = _position(path, _STACKS)
    if at is None:
        return path, None
    plain = path[:at] + path[at + 2:]  # without stacks[i]
    layers = _position(path, _LAYERS)
    if layers is None:  # a step count kept per layer: all layers share the one count
        return plain, None
    period, p = periods[path[:layers]], path[layers + 1].idx
    before, after = path[:at] + path[at + 2:layers], path[layers + 2:]
    rows = [before + (jax.tree_util.DictKey(g * period + p),) + after for g in range(groups)]
    return rows[0], rows


def convert_opt_state(source: Any, target: Any) -> Any:
    """An optimizer state of ``make_optimizer`` moved between its storages per layer (scan_layers false) and
    stacked (true); ``target`` is the abstract state of the storage wanted (``jax.eval_shape`` of its init).
    Slots move between per-layer paths (``mu/blocks/3/attn/...``) and stacked ones (row 1 of
    ``mu/blocks/layers/1/attn/...`` with a period of 2); per-layer step counts take the shared count. Traceable:
    jit it to place the result."""
    flat = jax.tree_util.tree_flatten_with_path(source)[0]
    periods = _periods(path for path, _ in flat)
    per_layer = {}
    for path, leaf in flat:
        shared, rows = _per_layer_paths(tuple(path), periods, jnp.shape(leaf)[0] if jnp.ndim(leaf) else 0)
        if rows is None:
            per_layer.setdefault(shared, leaf[0] if _position(path, _STACKS) is not None else leaf)
        else:
            per_layer.update({row: leaf[g] for g, row in enumerate(rows)})
    target_periods = _periods(path for path, _ in jax.tree_util.tree_flatten_with_path(target)[0])

    def value(path, wanted):
        shared, rows = _per_layer_paths(tuple(path), target_periods, wanted.shape[0] if wanted.ndim else 0)
        if rows is not None:
            return jnp.stack([per_layer[row] for row in rows])
        return jnp.broadcast_to(per_layer[shared], wanted.shape).astype(wanted.dtype)

    return jax.tree_util.tree_map_with_path(value, target)
