"""Plain autoregressive sampling without a KV cache: the whole generation is one compiled ``fori_loop`` over a
fixed (1, n_ctx) buffer, so it compiles once. Used for the sample at the end of training."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


def sample(graphdef: nnx.GraphDef, params, prompt: Sequence[int], max_new_tokens: int, n_ctx: int, *,
           temperature: float = 0.8, seed: int = 0) -> list[int]:
    """Continues ``prompt`` by up to ``max_new_tokens`` tokens (fewer if the context fills); returns new ids.
    ``temperature`` 0 is greedy."""
    prompt = list(prompt)[-(n_ctx - 1):] or [0]
    new = min(max_new_tokens, n_ctx - len(prompt))
    buffer = jnp.zeros((1, n_ctx), jnp.int32).at[0, :len(prompt)].set(jnp.asarray(prompt, jnp.int32))

    @jax.jit
    def generate(params, buffer, key):
        def step(i, buffer):
            # Merged inside the loop body: layers that sow (mixture of experts) may only mutate a module
            # created at the trace level they run in.
            model = nnx.merge(graphdef, nnx.State(params))
            position = len(prompt) + i
            logits = model(buffer)[0, position - 1].astype(jnp.float32)  # (V,)
            if temperature == 0:
                token = jnp.argmax(logits)
            else:
                token = jax.random.categorical(jax.random.fold_in(key, i), logits / temperature)
            return buffer.at[0, position].set(token.astype(jnp.int32))

        return jax.lax.fori_loop(0, new, step, buffer)

    out = generate(params, buffer, jax.random.key(seed))
    return [int(t) for t in jax.device_get(out)[0, len(prompt):len(prompt) + new]]
