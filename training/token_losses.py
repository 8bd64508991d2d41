"""Per-target losses of (..., V) logits against (...) integer targets: softmax cross-entropy, its parts (the
log-normaliser and the targets' logits, each computed as suits the compiler it is built for) and GPT-Neo's entmax
loss. All in float32 whatever the logits' dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.axes import splits, target_platform
from models.entmax import GPT_NEO_ALPHA, entmax


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Softmax cross-entropy in float32 of (..., V) logits against (...) integer targets (in range)."""
    return cross_entropy_and_normaliser(logits, targets)[0]


def cross_entropy_and_normaliser(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``cross_entropy`` and the (...) log-normalisers it subtracts the targets' logits from (what z-loss reads)."""
    logits = logits.astype(jnp.float32)
    normalisers = log_normaliser(logits)
    return normalisers - target_logits(logits, targets), normalisers


# Where ``log_normaliser`` reads the logits once (benchmarks/train_step.py --normaliser two-pass empties it: an A/B).
ONE_PASS_PLATFORMS = frozenset({"gpu"})


def log_normaliser(logits: jax.Array) -> jax.Array:
    """(..., V) logits -> (...) float32 logsumexp over the vocabulary. On GPUs in one pass over the logits
    (``one_pass_logsumexp``) where ``jax.nn.logsumexp`` makes two, the maximum and then the sum: XLA:GPU's plan of
    GPT-Neo 125M's train step (T=2048, batch 8, one H100) moves 53.9 GB of kernel inputs and outputs instead of
    55.5, one read of the (16384, 50304) bfloat16 logits less (1.3B at batch 4: 149.1 GB instead of 150.0); not
    yet timed on a GPU. Elsewhere, and where the layout splits the vocabulary (a pass over one device's part would
    need the others' maxima), in two."""
    logits = logits.astype(jnp.float32)
    if target_platform() in ONE_PASS_PLATFORMS and not (splits("vocab") or splits("activation_vocab")):
        return one_pass_logsumexp(logits)
    return jax.nn.logsumexp(logits, axis=-1)


def _merge_sums(a, b):
    """Two partial (maximum, sum of exp(x - maximum)) pairs -> the pair of both: one exp per merge."""
    (max_a, sum_a), (max_b, sum_b) = a, b
    scale = jnp.exp(-jnp.abs(max_a - max_b))  # the smaller maximum's sum, rescaled to the larger one
    return jnp.maximum(max_a, max_b), jnp.where(max_a >= max_b, sum_a + sum_b * scale, sum_a * scale + sum_b)


@jax.custom_jvp
def one_pass_logsumexp(x: jax.Array) -> jax.Array:
    """(..., V) float32 -> (...) logsumexp over the last axis as one reduction of (maximum, sum) pairs (the online
    softmax's normaliser). Its derivative is the softmax, computed from x and the result; the rule is linear in
    the tangent, so reverse mode transposes it."""
    lowest = jnp.array(jnp.finfo(x.dtype).min, x.dtype)  # not -inf: merging two empty pairs gives 0, not NaN
    maximum, total = jax.lax.reduce((x, jnp.ones_like(x)), (lowest, jnp.zeros((), x.dtype)), _merge_sums,
                                    (x.ndim - 1,))
    return maximum + jnp.log(total)


@one_pass_logsumexp.defjvp
def _one_pass_jvp(primals, tangents):
    (x,), (tangent,) = primals, tangents
    normaliser = one_pass_logsumexp(x)
    return normaliser, jnp.sum(jnp.exp(x - normaliser[..., None]) * tangent, axis=-1)


def target_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """(..., V) logits, (...) targets -> (...) the targets' logits. On GPUs they are picked by comparing the
    vocabulary's positions with the target rather than gathered: a gather's gradient is a scatter into a float32
    (..., V) array of zeros (3.3 GB for GPT-Neo 125M at T=2048, batch 8), written and read again, where the
    comparison's is elementwise and fuses into the softmax's gradient. XLA:GPU's plan of that 125M step for an
    H100 moves 58.4 GB instead of 73.2 (9.61 GB of temporaries instead of 11.3); 1.3B at batch 4 155.6 GB instead
    of 163.0. On a CPU the comparison made the 4 x 256 step 14% slower (892-988 against 1,025-1,134 tokens/s,
    three runs each), so CPUs, and TPUs (unmeasured), gather."""
    if target_platform() == "gpu":
        vocab = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
        return jnp.sum(jnp.where(vocab == targets[..., None], logits, 0), axis=-1)
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]


def entmax_loss(logits: jax.Array, targets: jax.Array, alpha: float = GPT_NEO_ALPHA) -> jax.Array:
    """(..., V) logits and (...) integer targets -> (...) float32 entmax losses

        (p - one_hot(y)).z + (1 - sum_j p_j^alpha) / (alpha (alpha - 1)),   p = entmax(z),

    the Fenchel-Young loss of the Tsallis entropy: >= 0, zero only when p is y's one-hot. p maximises the
    regularised score, so the gradient is p - one_hot(y) with p held constant. The target's score is picked as
    cross-entropy's is (``target_logits``)."""
    z = logits.astype(jnp.float32)
    p = jax.lax.stop_gradient(entmax(z, alpha))  # (..., V)
    target_score = target_logits(z, targets)  # (...)
    return jnp.sum(p * z, axis=-1) - target_score + (1.0 - jnp.sum(p ** alpha, axis=-1)) / (alpha * (alpha - 1.0))
