"""T5's bucketed relative position bias: a learned (bucket, head) table added to the attention logits.

The distance ``key position - query position`` falls into one of ``num_buckets`` buckets: half of them hold
exact small distances, the other half logarithmically wider ranges up to ``max_distance`` (farther keys share the
last bucket). Bidirectional layers (T5's encoder) split the buckets between keys before and after the query;
causal layers (the decoder) use them all for keys at or before it. The bias is computed once per stack and every
layer of the stack adds the same one, through the attention's ``bias`` argument.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import axes


def relative_position_bucket(relative: jax.Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """Integer ``key - query`` distances -> bucket ids in [0, num_buckets) (mesh-tensorflow's rule)."""
    bucket = jnp.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).astype(relative.dtype) * num_buckets
        distance = jnp.abs(relative)
    else:
        distance = jnp.maximum(-relative, 0)  # keys after the query (masked anyway) share bucket 0
    max_exact = num_buckets // 2
    # float32 log as in mesh-tensorflow and transformers, so the same distances land in the same buckets
    scaled = jnp.log(jnp.maximum(distance, max_exact).astype(jnp.float32) / max_exact) / math.log(
        max_distance / max_exact) * (num_buckets - max_exact)
    large = jnp.minimum(max_exact + scaled.astype(relative.dtype), num_buckets - 1)
    return bucket + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nnx.Module):
    """The (num_buckets, N) bias table of one stack; ``__call__`` gives the logits bias of a query/key grid."""

    def __init__(self, num_buckets: int, max_distance: int, n_head: int, bidirectional: bool, stddev: float,
                 rngs: nnx.Rngs):
        self.embedding = nnx.Param(jax.nn.initializers.normal(stddev)(rngs.params(), (num_buckets, n_head)),
                                   **axes(None, "heads"))  # (buckets, N)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional

    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """(B, T) query and (B, S) key positions (B may be 1) -> (B, N, T, S) float32 bias."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # (B, T, S)
        bucket = relative_position_bucket(relative.astype(jnp.int32), self.bidirectional, self.num_buckets,
                                          self.max_distance)
        values = jnp.take(self.embedding[...].astype(jnp.float32), bucket, axis=0)  # (B, T, S, N)
        return values.transpose(0, 3, 1, 2)
