"""The transformer block every family is built from, and the loop that runs a stack of them.

One ``Block`` per ``BlockSpec``: self-attention (any kind, or none), optional cross-attention, and a feed-forward
sub-layer, each wrapped in a residual connection whose norm placement the spec picks:

    pre (GPT):      x = x + dropout(f(norm(x)))
    post (BERT):    x = norm(x + dropout(f(x)))
    rezero:         x = x + g * dropout(f(x))          (g a learned scalar starting at 0, no norms)

GPT-Neo's macaron blocks add a half-step MLP on the raw x before attention and halve the final MLP's branch.
Parameter names follow GPT-Neo's checkpoints: ``attn``, ``ln_1``, ``ln_2``, ``mlp`` (and ``crossattention``,
``ln_cross``, ``mlp_macaron``, ``rezero_1/2``/``rezero_cross`` where the spec has them).

Seams for pluggable parts (training/peft/ fills them): ``attn_adapter`` and ``mlp_adapter``, modules applied to
the self-attention's and the MLP's output before the residual sum (bottleneck adapters); and the block's dropout
scope (models/layers.py), from which such parts draw their dropout keys.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
from flax import nnx

from models.attention import Attention
from models.axes import HIDDEN, axes, constrain
from models.layers import dropout, dropout_keys, dropout_scope, norm
from models.mlp import Mlp
from models.moe import MoeMlp
from models.spec import BlockSpec, MlpSpec


def make_mlp(spec: MlpSpec, *, rngs: nnx.Rngs) -> nnx.Module:
    """The feed-forward sub-layer of ``spec``: a mixture of experts for "experts", else the dense/gated MLP."""
    return MoeMlp(spec, rngs=rngs) if spec.kind == "experts" else Mlp(spec, rngs=rngs)


class Block(nnx.Module):
    def __init__(self, spec: BlockSpec, *, rngs: nnx.Rngs):
        def make_norm():
            return None if spec.rezero else norm(spec.norm, spec.mlp.n_embd, spec.norm_epsilon, rngs)

        def gate():
            return nnx.Param(jnp.zeros(()), **axes()) if spec.rezero else None

        self.spec = spec
        self.mlp_macaron = make_mlp(spec.mlp, rngs=rngs) if spec.macaron else None
        self.attn = Attention(spec.attention, rngs=rngs) if spec.attention is not None else None
        self.ln_1, self.rezero_1 = (make_norm(), gate()) if self.attn is not None else (None, None)
        self.crossattention = Attention(spec.cross_attention, rngs=rngs) if spec.cross_attention else None
        self.ln_cross, self.rezero_cross = (make_norm(), gate()) if self.crossattention is not None else (None, None)
        self.mlp = make_mlp(spec.mlp, rngs=rngs)
        self.ln_2, self.rezero_2 = make_norm(), gate()
        # pluggable: (B, T, D) -> (B, T, D) on a sub-layer's output
        self.attn_adapter = self.mlp_adapter = nnx.data(None)

    def _residual(self, x: jax.Array, branch: Callable[[jax.Array], jax.Array], norm_layer, gate, key,
                  factor: float = 1.0) -> jax.Array:
        """x plus one sub-layer's branch, with the spec's norm placement."""
        s = self.spec
        if s.rezero:
            return x + gate[...] * (factor * dropout(s.res_dropout, branch(x), key))
        if s.norm_position == "post":
            return norm_layer(x + factor * dropout(s.res_dropout, branch(x), key))
        return x + factor * dropout(s.res_dropout, branch(norm_layer(x)), key)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None, cache=None,
                 dropout_key: jax.Array | None = None, context: jax.Array | None = None,
                 context_segment_ids: jax.Array | None = None, attention_bias: jax.Array | None = None,
                 cross_cache=None) -> tuple[jax.Array, object]:
        """(B, T, D) -> (B, T, D) and this block's updated cache (see ``Attention.__call__`` for the arguments).
        ``attention_bias`` goes to the self-attention logits; ``cross_cache`` holds the cross-attention's keys and
        values when decoding (instead of ``context``)."""
        # Pluggable parts draw their dropout keys from the scope (fold_in keeps the six keys below unchanged).
        with dropout_scope(None if dropout_key is None else jax.random.fold_in(dropout_key, 6)):
            return self._call(x, positions, segment_ids, cache, dropout_key, context, context_segment_ids,
                              attention_bias, cross_cache)

    def _call(self, x, positions, segment_ids, cache, dropout_key, context, context_segment_ids, attention_bias,
              cross_cache):
        keys = dropout_keys(dropout_key, 6)
        half = 0.5 if self.spec.macaron else 1.0
        if self.mlp_macaron is not None:  # GPT-Neo: on the raw stream, no norm, no ReZero gate
            x = x + half * dropout(self.spec.res_dropout, self.mlp_macaron(x), keys[0])
        if self.attn is not None:
            def attend(h):
                nonlocal cache
                out, cache = self.attn(h, positions, segment_ids, cache, keys[1], bias=attention_bias)
                return out if self.attn_adapter is None else self.attn_adapter(out)

            x = constrain(self._residual(x, attend, self.ln_1, self.rezero_1, keys[2]), HIDDEN)
        if self.crossattention is not None:
            def cross(h):
                return self.crossattention(h, positions, segment_ids, cross_cache, keys[3], context,
                                           context_segment_ids)[0]

            x = constrain(self._residual(x, cross, self.ln_cross, self.rezero_cross, keys[4]), HIDDEN)
        mlp = self.mlp if self.mlp_adapter is None else (lambda h: self.mlp_adapter(self.mlp(h)))
        x = self._residual(x, mlp, self.ln_2, self.rezero_2, keys[5], half)
        return constrain(x, HIDDEN), cache  # (B, T, D)


def share_parameters(blocks) -> None:
    """GPT-Neo's ``share_parameters``: its blocks named their weights without the layer (``attn/q``, not
    ``h3/attn/q``), so every layer used the one weight of each name. Here every parameter of a later block becomes
    the parameter at the same path in the first block that has one: global, local and linear layers share q/k/v/out,
    global layers their memory slots, MoE layers one set of experts, dense layers one MLP. The blocks keep their own
    specs (window, kind) and run as before; only their parameters are the same objects."""
    owners: dict[tuple, nnx.Param] = {}
    for block in blocks:
        for path, variable in list(nnx.iter_graph(block)):
            if not isinstance(variable, nnx.Param):
                continue
            owner = owners.setdefault(path, variable)
            if owner is variable:
                continue
            if owner.shape != variable.shape:  # one config gives every layer the same widths; a bug otherwise
                raise ValueError(f"share_parameters: {'/'.join(map(str, path))} is {owner.shape} in one layer and "
                                 f"{variable.shape} in another")
            parent = block
            for name in path[:-1]:
                parent = getattr(parent, name)
            setattr(parent, path[-1], owner)


# recompute_grad's policies -> what jax.checkpoint may keep of a block's forward pass for the backward pass
# (None: only the block's inputs, everything else is recomputed).
REMAT_POLICIES = {"full": None, "dots_saveable": jax.checkpoint_policies.dots_saveable}

# Elementwise and layout primitives: XLA fuses them into their consumers, so an unrolled backward pass recomputes
# them from the values it keeps at no cost. A scan must stack every value its backward pass reads instead (GPT-2's
# tanh gelu alone leaves six (B, T, 4D) intermediates), so a scanned stack recomputes these explicitly even with
# recompute_grad "none": for GPT-Neo 1.3B at T=2048, batch 8, the step's memory falls from 201 GiB to 105 GiB.
# Random bits are recomputed from their (tiny) key rather than stacked at the size of the activations.
_FUSED_INTO_CONSUMERS = frozenset({
    "abs", "add", "add_any", "and", "bitcast_convert_type", "broadcast_in_dim", "clamp", "concatenate",
    "convert_element_type", "copy", "cos", "div", "eq", "erf", "exp", "exp2", "expand_dims", "expm1",
    "ge", "gt", "integer_pow", "iota", "le", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg",
    "not", "or", "pad", "pow", "random_bits", "reduce_precision", "reshape", "rsqrt", "select_n",
    "shift_left", "shift_right_logical", "sign", "sin", "slice", "sqrt", "square", "squeeze", "sub", "tanh",
    "threefry2x32", "transpose", "xor"})


def _saves_all_but_fused(primitive, *_, **__) -> bool:
    """The scan's policy for recompute_grad "none": keep every value but the elementwise and layout ones."""
    return primitive.name not in _FUSED_INTO_CONSUMERS


def run_blocks(blocks, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
               caches: tuple | None = None, dropout_key: jax.Array | None = None, remat: str = "none",
               cross_caches: tuple | None = None, scan: bool = False, **context) -> tuple[jax.Array, tuple | None]:
    """Runs ``blocks`` in order: (B, T, D) -> (B, T, D) and their updated caches (None when ``caches`` is None).
    ``remat`` ("none", "full", "dots_saveable": REMAT_POLICIES) recomputes each block's activations in the backward
    pass (training memory for compute). ``scan`` runs a stack without caches as one ``lax.scan`` over its repeating
    group of layers (``scanned_blocks``). ``context`` (keyword arguments of ``Block.__call__``) goes to every block:
    the encoder output and its segment ids, a stack's shared attention bias; ``cross_caches`` gives each block its
    own ``CrossCache``."""
    if scan and caches is None and cross_caches is None:
        return scanned_blocks(blocks, x, positions, segment_ids, dropout_key, remat, **context), None
    keys = dropout_keys(dropout_key, len(blocks))
    layer_caches = caches if caches is not None else (None,) * len(blocks)
    crosses = cross_caches if cross_caches is not None else (None,) * len(blocks)
    call = Block.__call__ if remat == "none" else nnx.remat(Block.__call__, policy=REMAT_POLICIES[remat])
    updated = []
    for block, cache, cross, key in zip(blocks, layer_caches, crosses, keys):
        extra = {"cross_cache": cross} if cross is not None else {}
        x, cache = call(block, x, positions, segment_ids, cache, key, **context, **extra)
        updated.append(cache)
    return x, (tuple(updated) if caches is not None else None)


def repeat_period(items: list) -> int:
    """The least p dividing ``len(items)`` such that every item equals the one p before it."""
    n = len(items)
    return next(p for p in range(1, n + 1) if n % p == 0 and all(items[i] == items[i % p] for i in range(n)))


def layer_period(blocks) -> int:
    """The length of a stack's repeating group: its blocks' ``repeat_period`` by structure (parameter shapes and
    spec). GPT-Neo's global/local pattern has p = 2."""
    return repeat_period([nnx.graphdef(block) for block in blocks])


# Stacks whose parameters a forward pass receives stacked already: {id of the stack's blocks: its states by
# storage group}. Set by ``prestacked`` around one forward pass.
_PRESTACKED: contextvars.ContextVar[dict] = contextvars.ContextVar("prestacked", default={})


@contextlib.contextmanager
def prestacked(stacks: Iterable[tuple]):
    """Within, ``scanned_blocks`` of the stacks in ``stacks`` ((the stack's blocks, its states by storage group))
    scans the given arrays in place of stacking its blocks' own parameters. Storage group p (a pure dict, one per
    layer of the stack's period) holds layers p, p + period, ... along its leaves' first axis. The train state
    stores a scanned stack so (training/layer_stack.py): its model is merged from slices of the stored arrays,
    which the scan then leaves unused (XLA drops them), and the gradients come out stacked as stored."""
    token = _PRESTACKED.set({**_PRESTACKED.get(), **{id(blocks): tuple(groups) for blocks, groups in stacks}})
    try:
        yield
    finally:
        _PRESTACKED.reset(token)


def scanned_blocks(blocks, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                   dropout_key: jax.Array | None, remat: str, **context) -> jax.Array:
    """``run_blocks`` without caches as a ``lax.scan`` over the stack's repeating group of layers: XLA compiles
    one group. The scan reads the stack's parameters stacked as the train state stores them (``prestacked``), or
    else stacks its layers' own (per-layer storage: peft, a forward pass outside training) on every call. Dropout
    keys are the unrolled loop's, layer for layer, so results are the same."""
    period = layer_period(blocks)
    groups = len(blocks) // period
    graphdefs = [nnx.graphdef(blocks[p]) for p in range(period)]
    stored = _PRESTACKED.get().get(id(blocks))
    if stored is None:
        stored = tuple(jax.tree.map(lambda *layers: jnp.stack(layers), *[nnx.state(blocks[g * period + p])
                                                                         for g in range(groups)])
                       for p in range(period))
    else:  # pure dicts -> the blocks' own state structure, holding the stacked arrays
        stored = tuple(_holding(nnx.state(blocks[q]), group) for q, group in enumerate(stored))
    if len(stored) != period:
        raise ValueError(f"layers stored in {len(stored)} groups for a stack repeating every {period} layers")
    keys = None if dropout_key is None else jax.random.split(dropout_key, len(blocks)).reshape(groups, period)

    def group(x, step_inputs):  # the scan's inputs are the layers' weights themselves: it saves no copy of them
        states, group_keys = step_inputs
        for p in range(period):
            block = nnx.merge(graphdefs[p], states[p])
            x, _ = block(x, positions, segment_ids, None, None if group_keys is None else group_keys[p], **context)
        return x, None

    policy = _saves_all_but_fused if remat == "none" else REMAT_POLICIES[remat]
    group = jax.checkpoint(group, policy=policy, prevent_cse=False)  # prevent_cse: no CSE across a scan anyway
    return jax.lax.scan(group, x, (stored, keys))[0]


def _holding(state: nnx.State, values: dict) -> nnx.State:
    nnx.replace_by_pure_dict(state, values)  # new variables in ``state``, a fresh container: nothing shared changes
    return state
