"""Mixture of experts: the MLP slot of the layers listed in ``moe_layers``.

Routing is GShard/Switch style with a fixed expert capacity, so every shape is static. Each sequence is one
routing group: its T tokens pick their top-k experts (k = 1 or 2) from a float32 softmax router; expert e takes
at most C = min(T, ceil(k * T * capacity_factor / E)) of them and the rest are dropped (their MLP output is zero,
the residual carries them). First choices are placed before any second choice, in token order. So with top-1, or
whenever nothing is dropped, a token's output never depends on later tokens; with top-2 and drops, a later
token's first choice can take the slot an earlier token's second choice wanted (GShard's routing has the same
property), which a capacity_factor large enough to drop nothing rules out.

Dispatch never builds GShard's dense (tokens, experts, capacity) one-hot. Token choices are sorted by expert
(a stable argsort), their rank inside their expert's run is their slot, and the tokens are scattered into a
(B, E*C, D) buffer and gathered back from it: memory is O(B*T*k) indices plus O(B*E*C*D) activations. The
expert MLPs are one batched einsum over (B, E, C, D); with a layout ``experts:x`` that buffer is split over
experts (see ``constrain(..., prefer=("experts",))``) and XLA moves tokens with an all-to-all.

Each MoE layer sows its auxiliary losses the way every layer does (models/aux_losses.py): the penalty added to the
training loss, and as metrics the Switch load-balancing loss (E * sum_e f_e * p_e, where f_e is the fraction of
tokens whose first choice is e and p_e the mean router probability of e; 1.0 when balanced), the router z-loss
(mean squared logsumexp of the logits) and the fraction of token choices dropped.

Seams for pluggable parts (training/peft/ fills them; the model knows none of them): ``router_lora``, ``w_in_lora``
and ``w_out_lora``, each None or a module that adds an update to the output of its weight's einsum (``EINSUMS``):
``lora(x, y)`` -> y plus the update (LoRA on the router and the experts).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models.aux_losses import sow_aux_losses
from models.axes import axes, constrain
from models.layers import BASE_STDDEV, feed_forward_activation
from models.spec import MlpSpec

# Letters beyond the shared dimension names: C the capacity slots of one expert, K a token's top_k choices.
EXPERT_BUFFER = ("batch", "experts", None, "embd")  # (B, E, C, D)
EXPERT_HIDDEN = ("batch", "experts", None, "intermediate_expanded")  # (B, E, C, F)


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert per routing group of ``tokens``; never more than ``tokens`` (no token picks an expert
    twice)."""
    return max(1, min(tokens, math.ceil(top_k * tokens * capacity_factor / num_experts)))


def assign_slots(choices: jax.Array, num_experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """(B, T, K) expert ids -> (slot (B, T, K) = expert * capacity + position, kept (B, T, K) bool).

    Position is the choice's rank among the choices of its expert, choice-major (every first choice ranks before
    any second choice) and then in token order; choices at position >= capacity are dropped."""
    b, t, k = choices.shape
    flat = choices.transpose(0, 2, 1).reshape(b, k * t)  # (B, K*T), choice-major
    order = jnp.argsort(flat, axis=-1, stable=True)  # (B, K*T): grouped by expert, original order inside
    sorted_experts = jnp.take_along_axis(flat, order, axis=-1)
    counts = jax.vmap(lambda f: jnp.bincount(f, length=num_experts))(flat)  # (B, E)
    starts = jnp.cumsum(counts, axis=-1) - counts  # (B, E): where each expert's run begins in sorted order
    rank = jnp.arange(k * t)[None, :] - jnp.take_along_axis(starts, sorted_experts, axis=-1)  # (B, K*T)
    position = jax.vmap(lambda o, r: jnp.zeros_like(o).at[o].set(r))(order, rank)  # back to choice-major order
    position = position.reshape(b, k, t).transpose(0, 2, 1)  # (B, T, K)
    return choices * capacity + position, position < capacity


def top_k(probs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(..., E) -> the k largest (values, indices), (..., K), by k argmaxes: reductions that XLA partitions along
    the batch sharding (its TopK gathers the whole batch first). Ties go to the lower index."""
    values, indices = [], []
    for _ in range(k):
        index = jnp.argmax(probs, axis=-1)
        values.append(jnp.take_along_axis(probs, index[..., None], axis=-1)[..., 0])
        indices.append(index)
        probs = jnp.where(jax.nn.one_hot(index, probs.shape[-1], dtype=bool), -jnp.inf, probs)
    return jnp.stack(values, -1), jnp.stack(indices, -1).astype(jnp.int32)


class MoeMlp(nnx.Module):
    """E expert MLPs (embd -> d_ff -> embd, the dense MLP's init) behind a top-k router."""

    EINSUMS = {"router": "BTD,DE->BTE", "w_in": "BECD,EDF->BECF", "w_out": "BECF,EFD->BECD"}  # weight -> its einsum

    def __init__(self, spec: MlpSpec, *, rngs: nnx.Rngs):
        moe = spec.experts
        e, d, f = moe.num_experts, spec.n_embd, spec.d_ff
        self.num_experts, self.top_k, self.capacity_factor = e, moe.top_k, moe.capacity_factor
        self.aux_loss_weight, self.z_loss_weight = moe.aux_loss_weight, moe.z_loss_weight
        fc_std, proj_std = spec.init
        normal = jax.nn.initializers.normal
        # The router is small and every device needs all of it to route its tokens: it stays whole.
        self.router = nnx.Param(normal(BASE_STDDEV)(rngs.params(), (d, e)), **axes("embd", None))  # (D, E)
        self.w_in = nnx.Param(normal(fc_std)(rngs.params(), (e, d, f)),
                              **axes("experts", "embd", "intermediate_expanded"))  # (E, D, F)
        self.b_in = nnx.Param(jnp.zeros((e, f)), **axes("experts", "intermediate_expanded"))  # (E, F)
        self.w_out = nnx.Param(normal(proj_std)(rngs.params(), (e, f, d)),
                               **axes("experts", "intermediate_expanded", "embd"))  # (E, F, D)
        self.b_out = nnx.Param(jnp.zeros((e, d)), **axes("experts", "embd"))  # (E, D)
        self.activation = feed_forward_activation(spec.activation)
        self.router_lora, self.w_in_lora, self.w_out_lora = nnx.data(None), nnx.data(None), nnx.data(None)

    def _einsum(self, name: str, x: jax.Array, weight: jax.Array, **options) -> jax.Array:
        """``x`` through weight ``name``'s einsum, plus the update its pluggable ``name_lora`` adds, if any."""
        y = jnp.einsum(self.EINSUMS[name], x, weight, **options)
        update = getattr(self, f"{name}_lora")
        return y if update is None else update(x, y)

    def __call__(self, x: jax.Array) -> jax.Array:
        """(B, T, D) -> (B, T, D); sows this layer's routing statistics."""
        b, t, d = x.shape
        e, k = self.num_experts, self.top_k
        c = expert_capacity(t, k, e, self.capacity_factor)

        # Route in float32: near-ties between experts must not flip with the compute dtype.
        logits = self._einsum("router", x, self.router[...].astype(x.dtype),
                              preferred_element_type=jnp.float32)  # (B, T, E)
        probs = jax.nn.softmax(logits, axis=-1)
        gates, choices = top_k(probs, k)  # (B, T, K)
        if k > 1:  # GShard renormalises the top-2 gates; Switch (top-1) keeps the router probability
            gates = gates / gates.sum(-1, keepdims=True)
        slot, kept = assign_slots(choices, e, c)  # (B, T, K)
        slot = jnp.where(kept, slot, e * c)  # dropped choices land in one spare row that is never read back

        # Dispatch: (B, T, D) -> (B, E*C+1, D) by scatter; each kept (expert, position) is written once. Written
        # per sequence (vmap) so the scatter and gather carry batch as a batching dimension, which XLA partitions
        # along the batch sharding instead of gathering every device's tokens.
        buffer = jax.vmap(lambda x, slot: jnp.zeros((e * c + 1, d), x.dtype).at[slot].set(
            jnp.broadcast_to(x[:, None, :], (t, k, d))))(x, slot)
        buffer = constrain(buffer[:, :-1].reshape(b, e, c, d), EXPERT_BUFFER)  # tokens where they came from
        buffer = constrain(buffer, EXPERT_BUFFER, prefer=("experts",))  # all-to-all onto the experts' devices
        h = self._einsum("w_in", buffer, self.w_in[...]) + self.b_in[...][None, :, None, :]  # (B, E, C, F)
        h = constrain(self.activation(h), EXPERT_HIDDEN, prefer=("experts",))  # (B, E, C, F)
        y = self._einsum("w_out", h, self.w_out[...]) + self.b_out[...][None, :, None, :]  # (B, E, C, D)
        y = constrain(constrain(y, EXPERT_BUFFER, prefer=("experts",)), EXPERT_BUFFER)  # all-to-all back
        y = jnp.concatenate([y.reshape(b, e * c, d), jnp.zeros((b, 1, d), y.dtype)], axis=1)  # (B, E*C+1, D)

        # Combine: gather each choice's expert output and weight it by its gate (zero when dropped).
        weights = (gates * kept).astype(y.dtype)  # (B, T, K)
        out = jnp.einsum("BTKD,BTK->BTD", jax.vmap(lambda y, slot: y[slot])(y, slot), weights)  # (B, T, D)

        first = jax.nn.one_hot(choices[..., 0], e, dtype=jnp.float32)  # (B, T, E): O(tokens x experts)
        load_balance = e * jnp.sum(first.mean((0, 1)) * probs.mean((0, 1)))
        z_loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
        dropped = jnp.sum(~kept, dtype=jnp.float32) / kept.size  # exactly 0 when nothing is dropped
        sow_aux_losses(self, self.aux_loss_weight * load_balance + self.z_loss_weight * z_loss,
                       aux_loss=load_balance, z_loss=z_loss, dropped_tokens_fraction=dropped)
        return out
