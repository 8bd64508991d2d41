"""The jitted train and eval steps: pure functions of (state, batch), compiled once with explicit shardings."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from config import ConfigError
from models.moe import moe_losses
from parallel.layout import Layout, constrain, replicated
from parallel.state import Params, TrainState

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
BATCH = ("batch", None)  # (B, T+1) token windows: inputs are [:, :-1], targets [:, 1:]


def batch_sharding(layout: Layout, batch_size: int, window: int, key: str = "train_batch_size"):
    """Batches are split over whatever mesh axis the layout gives ``batch``; the size must divide it."""
    ways = layout.axis_size("batch")
    if batch_size % ways:
        raise ConfigError(f"{key}: {batch_size} is not divisible by the {ways} ways the layout splits 'batch'")
    return layout.checked_sharding(key, (batch_size, window), BATCH)


def microbatch_count(cfg, layout: Layout) -> int:
    """GPT-Neo's ``tokens_per_mb_per_replica``: how many microbatches each replica's share of the batch is cut
    into for gradient accumulation (1 when unset)."""
    if cfg.tokens_per_mb_per_replica is None:
        return 1
    per_replica = cfg.train_batch_size // layout.axis_size("batch")
    rows = cfg.tokens_per_mb_per_replica / cfg.n_ctx
    if rows != int(rows) or per_replica % int(rows):
        raise ConfigError(f"tokens_per_mb_per_replica: {cfg.tokens_per_mb_per_replica} tokens is not a whole "
                          f"number of n_ctx={cfg.n_ctx} sequences dividing the {per_replica} sequences per replica")
    return per_replica // int(rows)


def token_losses(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, compute_dtype,
                 dropout_key: jax.Array | None = None) -> jax.Array:
    """(B, T+1) tokens -> (B, T) next-token cross-entropy in float32. Compute runs in ``compute_dtype`` on a cast
    copy of the float32 master parameters, so gradients land on the masters."""
    return losses_and_aux(graphdef, params, tokens, compute_dtype, dropout_key)[0]


def losses_and_aux(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, compute_dtype,
                   dropout_key: jax.Array | None = None) -> tuple[jax.Array, jax.Array, dict]:
    """``token_losses`` plus what the model sowed: (losses (B, T), auxiliary loss term, auxiliary metrics).
    Mixture-of-experts layers sow their load-balancing and z-losses (models/moe.py); without them the term is 0
    and the metrics are empty."""
    params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    model = nnx.merge(graphdef, nnx.State(params))
    logits, sown = nnx.capture(model, nnx.Intermediate)(tokens[:, :-1], dropout_key=dropout_key)  # (B, T, V)
    penalty, aux = moe_losses(sown)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:])
    return losses, penalty, aux


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    layout: Layout, state_shardings: TrainState, data_sharding, *, precision: str = "float32",
                    microbatches: int = 1, seed: int = 0) -> Callable[[TrainState, jax.Array], tuple]:
    """``(state, tokens) -> (state, metrics)`` jitted with explicit shardings; the input state is donated.

    With ``microbatches`` > 1 the batch is split into equal microbatches whose gradients are averaged in a
    ``lax.scan`` (gradient accumulation); microbatch m takes rows m, m+M, m+2M, ... so every microbatch stays
    spread over the whole data axis. Dropout keys are ``fold_in(seed, step)``: a resumed run draws the same.
    """
    compute_dtype = COMPUTE_DTYPES[precision]

    def loss_fn(params, tokens, key):
        losses, penalty, aux = losses_and_aux(graphdef, params, tokens, compute_dtype, key)
        loss = losses.mean()  # reported as "loss": cross-entropy alone, comparable with eval
        return loss + penalty, {"loss": loss, **aux}

    def grad_fn(params, tokens, key):  # -> (metrics with "loss", grads of loss + auxiliary losses)
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, key)
        return metrics, grads

    def accumulated(params, tokens, key):
        b, w = tokens.shape
        chunks = constrain(tokens.reshape(b // microbatches, microbatches, w).swapaxes(0, 1), (None, *BATCH))

        def body(carry, chunk_and_index):
            chunk, i = chunk_and_index
            metrics_and_grads = grad_fn(params, chunk, jax.random.fold_in(key, i))
            return jax.tree.map(jnp.add, carry, metrics_and_grads), None

        metrics_shapes = jax.eval_shape(grad_fn, params, chunks[0], key)[0]
        zeros = (jax.tree.map(jnp.zeros_like, metrics_shapes), jax.tree.map(jnp.zeros_like, params))
        (metrics, grads), _ = jax.lax.scan(body, zeros, (chunks, jnp.arange(microbatches)))
        return jax.tree.map(lambda x: x / microbatches, (metrics, grads))

    def train_step(state: TrainState, tokens: jax.Array):
        with layout.active():
            key = jax.random.fold_in(jax.random.key(seed), state.step)
            if microbatches == 1:
                metrics, grads = grad_fn(state.params, tokens, key)
            else:
                metrics, grads = accumulated(state.params, tokens, key)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            metrics = {**metrics, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
            return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return jax.jit(train_step, in_shardings=(state_shardings, data_sharding),
                   out_shardings=(state_shardings, replicated(layout.mesh)), donate_argnums=0)


def make_eval_step(graphdef: nnx.GraphDef, layout: Layout, param_shardings: Params, data_sharding, *,
                   precision: str = "float32") -> Callable[[Params, jax.Array], dict]:
    """``(params, tokens) -> {"loss_sum", "tokens"}``: sums, so batches of any count average exactly."""
    compute_dtype = COMPUTE_DTYPES[precision]

    def eval_step(params: Params, tokens: jax.Array):
        with layout.active():
            losses = token_losses(graphdef, params, tokens, compute_dtype)
            return {"loss_sum": losses.sum(), "tokens": jnp.asarray(losses.size, jnp.float32)}

    return jax.jit(eval_step, in_shardings=(param_shardings, data_sharding), out_shardings=replicated(layout.mesh))
