"""The jitted train and eval steps: pure functions of (state, batch), compiled once with explicit shardings.

They take an objective (training/objectives.py) and a graph definition and know neither the model nor the task:
the objective reads the batch dict and calls the model; whatever auxiliary losses the model's layers sow (mixture
of experts) are added to the loss generically (models/aux_losses.py).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from config import ConfigError
from models import aux_losses
from models.axes import constrain, target_platform
from models.block import prestacked
from parallel.layout import Layout, replicated
from parallel.state import Params, TrainState, join_params, split_params
from parallel.unreduced import per_device_accumulation
from parallel.xla_flags import step_options
from training.layer_stack import optimizer_step, stored_stacks, unstack_layers

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

Batch = dict  # {field: (B, ...) array}; the objective names its fields


def batch_shapes(objective, cfg, batch_size: int) -> dict[str, tuple[int, ...]]:
    """The global shape of every batch field the objective reads."""
    return {name: (batch_size, *row) for name, row in objective.shapes(cfg).items()}


def batch_shardings(layout: Layout, objective, shapes: dict, key: str = "train_batch_size") -> dict:
    """A NamedSharding per batch field. Batches are split over whatever mesh axis the layout gives ``batch``;
    the batch size must divide it."""
    ways = layout.axis_size("batch")
    for shape in shapes.values():
        if shape[0] % ways:
            raise ConfigError(f"{key}: {shape[0]} is not divisible by the {ways} ways the layout splits 'batch'")
    return {name: layout.checked_sharding(f"{key} field '{name}'", shape, objective.fields[name])
            for name, shape in shapes.items()}


def microbatch_count(cfg, layout: Layout) -> int:
    """GPT-Neo's ``tokens_per_mb_per_replica``: how many microbatches each replica's share of the batch is cut
    into for gradient accumulation (1 when unset, or when the share fits in one microbatch: a layout over more
    data-parallel devices leaves each replica fewer rows, and mesh-tensorflow then ran one microbatch too)."""
    if cfg.tokens_per_mb_per_replica is None:
        return 1
    per_replica = cfg.train_batch_size // layout.axis_size("batch")
    if cfg.tokens_per_mb_per_replica >= per_replica * cfg.n_ctx:
        return 1
    rows = cfg.tokens_per_mb_per_replica / cfg.n_ctx
    if rows != int(rows) or per_replica % int(rows):
        raise ConfigError(f"tokens_per_mb_per_replica: {cfg.tokens_per_mb_per_replica} tokens is not a whole "
                          f"number of n_ctx={cfg.n_ctx} sequences dividing the {per_replica} sequences per replica")
    return per_replica // int(rows)


def objective_sums(graphdef: nnx.GraphDef, objective, params: Params, batch: Batch, compute_dtype,
                   dropout_key: jax.Array | None = None, keep_rows: bool = False) -> tuple[dict, jax.Array, dict]:
    """One forward pass -> ({"loss": sum of weighted losses, "weight": sum of weights, metric: weighted sum},
    sown penalty, sown metrics). Compute runs in ``compute_dtype`` on a cast copy of the float32 master
    parameters, so gradients land on the masters. The objective's ``rows`` metrics are not summed: with
    ``keep_rows`` they come as (B,) values, with the rows' weights as "row_weights"."""
    params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    # Stacks stored stacked (scan_layers) run from the stored arrays; the per-layer slices the model is merged
    # from go unused there (XLA drops them).
    model = nnx.merge(graphdef, nnx.State(unstack_layers(params)))
    with prestacked(stored_stacks(model, params)):
        (losses, metrics), sown = aux_losses.captured(objective.compute)(model, batch, dropout_key)
    weights = objective.weights(batch)
    penalty, aux = aux_losses.collect(sown)
    sums = {"loss": jnp.sum(losses * weights), "weight": jnp.sum(weights)}
    sums.update({name: jnp.sum(values * weights) for name, values in metrics.items() if name not in objective.rows})
    if keep_rows and objective.rows:
        sums.update({name: metrics[name] for name in objective.rows}, row_weights=weights)
    return sums, penalty, aux


def _nonzero(weight: jax.Array) -> jax.Array:
    """A total weight safe to divide by: a batch in which nothing counts has loss 0, not NaN."""
    return jnp.where(weight > 0, weight, 1.0)


def dropout_key(seed: int, step: jax.Array) -> jax.Array:
    """The dropout key of ``step``: ``fold_in(seed, step)``, so a resumed run draws the same masks. On TPUs it comes
    from XLA's RngBitGenerator ("rbg", the TPU's own generator, as MaxText uses there) rather than threefry, whose
    hash made GPT-2's LoRA fine-tuning step (48 dropout masks) take 270 s to compile for a v5e chip instead of
    48 s (planned memory 4.66 GB instead of 4.29). Its masks differ from other platforms' and may change with the
    layout, where threefry's do not."""
    impl = "rbg" if target_platform() == "tpu" else "threefry2x32"
    return jax.random.fold_in(jax.random.key(seed, impl=impl), step)


def make_train_step(graphdef: nnx.GraphDef, objective, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    layout: Layout, state_shardings: TrainState, data_shardings: dict, *,
                    precision: str = "float32", microbatches: int = 1, accumulate_unreduced: bool = False,
                    seed: int = 0, trainable: Callable[[str], bool] | None = None
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """``(state, batch) -> (state, metrics)`` jitted with explicit shardings; the input state is donated.

    The loss is the weighted mean over the whole batch plus the sown penalties. With ``microbatches`` > 1 the batch
    is split into equal microbatches whose gradients are summed in a ``lax.scan`` (gradient accumulation); each
    microbatch's weighted loss is divided by the whole batch's weight, so the result equals one big batch even
    when microbatches count different numbers of targets. Microbatch m takes rows m, m+M, m+2M, ... so every
    microbatch stays spread over the whole data axis. Dropout keys are ``fold_in(seed, step)``: a resumed run
    draws the same. Only the parameters ``trainable`` accepts (a path-name predicate; None: all) are
    differentiated and updated: the rest (frozen) pass through bit for bit and have no optimizer state.

    ``accumulate_unreduced``: with microbatches, each device accumulates the gradients of its own rows and the
    mesh axes that split ``batch`` reduce them once per step (parallel/unreduced.py), where otherwise they are
    reduced after every microbatch.
    """
    compute_dtype = COMPUTE_DTYPES[precision]

    def grad_fn(params, frozen, batch, key, total_weight):  # -> ((sums, sown metrics), grads of params)
        def loss_fn(params):
            sums, penalty, aux = objective_sums(graphdef, objective, join_params(params, frozen), batch,
                                                compute_dtype, key)
            return sums["loss"] / total_weight + penalty / microbatches, (sums, aux)

        (_, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return out, grads

    def accumulated(params, frozen, batch, key, total_weight):
        def split(x):  # (B, ...) -> (M, B/M, ...): microbatch m holds rows m, m+M, ...
            chunks = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)
            return constrain(chunks, (None, "batch") + (None,) * (x.ndim - 1))

        def body(carry, chunk_and_index):
            chunk, i = chunk_and_index
            out_and_grads = grad_fn(params, frozen, chunk, jax.random.fold_in(key, i), total_weight)
            return jax.tree.map(jnp.add, carry, out_and_grads), None

        chunks = jax.tree.map(split, batch)
        first = jax.tree.map(lambda x: x[0], chunks)
        shapes = jax.eval_shape(grad_fn, params, frozen, first, key, total_weight)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        ((sums, aux), grads), _ = jax.lax.scan(body, zeros, (chunks, jnp.arange(microbatches)))
        return (sums, jax.tree.map(lambda x: x / microbatches, aux)), grads

    per_device = per_device_accumulation(accumulated, layout, split_params(state_shardings.params, trainable)[0]) \
        if accumulate_unreduced else None  # None too where no axis splits the batch: nothing to reduce

    def train_step(state: TrainState, batch: Batch):
        with layout.active():
            key = dropout_key(seed, state.step)
            total_weight = _nonzero(objective.weights(batch).sum())
            step_fn = grad_fn if microbatches == 1 else per_device or accumulated
            params, frozen = split_params(state.params, trainable)
            (sums, aux), grads = step_fn(params, frozen, batch, key, total_weight)
            params, opt_state, grad_norm = optimizer_step(tx, grads, state.opt_state, params)
            params = join_params(params, frozen)
            metrics = {name: value / total_weight for name, value in sums.items() if name != "weight"}
            metrics.update(aux, grad_norm=grad_norm, lr=schedule(state.step))
            return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return jax.jit(train_step, in_shardings=(state_shardings, data_shardings),
                   out_shardings=(state_shardings, replicated(layout.mesh)), donate_argnums=0,
                   compiler_options=step_options(layout.platform))


def make_eval_step(graphdef: nnx.GraphDef, objective, layout: Layout, param_shardings: Params,
                   data_shardings: dict, *, precision: str = "float32") -> Callable[[Params, Batch], dict]:
    """``(params, batch) -> {"loss": sum, "weight": sum, metric: sum}``: sums, so batches of any count average
    exactly (see ``mean_of``); and the objective's per-row metrics, which ``mean_of`` joins."""
    compute_dtype = COMPUTE_DTYPES[precision]

    def eval_step(params: Params, batch: Batch):
        with layout.active():
            return objective_sums(graphdef, objective, params, batch, compute_dtype, keep_rows=True)[0]

    return jax.jit(eval_step, in_shardings=(param_shardings, data_shardings), out_shardings=replicated(layout.mesh),
                   compiler_options=step_options(layout.platform))


def mean_of(sums: list[dict]) -> dict:
    """Eval sums of several batches -> {"loss": mean, metric: mean} (weighted by each batch's weight); per-row
    metrics ((B,) arrays) are joined into one (N,) numpy array each, batch after batch."""
    weight = sum(float(s["weight"]) for s in sums)
    weight = weight if weight > 0 else 1.0
    return {name: np.concatenate([np.asarray(s[name]) for s in sums]) if np.ndim(sums[0][name])
            else sum(float(s[name]) for s in sums) / weight for name in sums[0] if name != "weight"}
