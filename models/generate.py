"""Text generation with a KV cache: prefill and the decode loop run inside one jit, compiled once per
(batch, prompt length, new tokens) shape.

The loops know no model family. A generating model has two methods:

    prefill(prompts (B, P), pad (B,), max_new_tokens, dtype) -> (logits (B, V), cache, seen (B, V) bool)
    decode_step(tokens (B,), cache) -> (logits (B, V), cache)

``prefill`` takes the left-padded prompts and returns the first new token's logits, the cache (any pytree whose
batch-major leaves lead with B) and the tokens the repetition penalty already counts; ``decode_step`` feeds one
token per row. A decoder (GPT-Neo) prefills with the prompt; an encoder-decoder (T5) encodes the prompt once and
starts its decoder from the start token.

Sampling follows Hugging Face's order: the repetition penalty edits the logits (sign-aware, prompt included),
then temperature, top-k and top-p shape the distribution; temperature 0 is greedy. With ``entmax`` the token is
drawn from entmax of those logits instead of their softmax (GPT-Neo's entmax sampling, for models trained with
its entmax loss): tokens outside entmax's support are never drawn. Beam search keeps ``num_beams``
alive hypotheses and a pool of finished ones scored by ``sum log p / length ** length_penalty`` (length: the new
tokens), as transformers' ``generate`` does with its defaults (``early_stopping=False``): a row stops when its best
alive beam, scored at its present length, cannot beat the worst of a full pool. An optional host callback sees
each new token (streaming, stop strings) and can end a row.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import io_callback

from models import entmax

NEG_INF = -1e9


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off
    num_beams: int = 1
    length_penalty: float = 1.0
    eos_id: int | None = None
    entmax: bool = False  # sample from entmax (models/entmax.py) instead of softmax


def apply_repetition_penalty(logits: jax.Array, seen: jax.Array, penalty: float) -> jax.Array:
    """Hugging Face's rule for every token already seen: negative logits times ``penalty``, others divided."""
    if penalty == 1.0:
        return logits
    return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Masks everything outside the top-k tokens and outside the smallest set whose probability reaches top_p."""
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, NEG_INF, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]  # descending
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability mass strictly above each token
        cutoff = jnp.min(jnp.where(before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, NEG_INF, logits)
    return logits


def choose(logits: jax.Array, seen: jax.Array, s: Sampling, key: jax.Array) -> jax.Array:
    """(B, V) float32 logits -> (B,) next tokens."""
    logits = apply_repetition_penalty(logits, seen, s.repetition_penalty)
    if s.temperature == 0:
        return jnp.argmax(logits, axis=-1)
    logits = filter_logits(logits / s.temperature, s.top_k, s.top_p)
    if s.entmax:
        return entmax.sample(key, logits)
    return jax.random.categorical(key, logits, axis=-1)


def seen_tokens(tokens: jax.Array, real: jax.Array, vocab: int) -> jax.Array:
    """(B, L) token ids, (B, L) bool (which count) -> (B, V) bool: which ids each row holds."""
    b = tokens.shape[0]
    return jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], tokens].max(real)


def _host_check(callback, tokens, step):
    """Runs ``callback(tokens, step) -> stop flags`` on the host, in order, from inside the loop."""
    return io_callback(callback, jax.ShapeDtypeStruct(tokens.shape, jnp.bool_), tokens, step,
                                        ordered=True)


def sample(graphdef: nnx.GraphDef, params, prompts: jax.Array, pad: jax.Array, s: Sampling, key: jax.Array,
           on_tokens: Callable | None = None) -> jax.Array:
    """(B, P) left-padded prompts -> (B, max_new_tokens) new tokens; rows that ended (eos, or the callback said
    stop) are filled with eos (or 0) after their last token. ``on_tokens(tokens (B,), step) -> (B,) bool`` runs on
    the host after every step when given. Compiled once per (model, settings, shapes)."""
    return _sample(graphdef, s, on_tokens, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(pad, jnp.int32),
                   key)


def lower_sample(graphdef: nnx.GraphDef, params, prompts, pad, s: Sampling, key) -> jax.stages.Lowered:
    """``sample``'s program lowered for these arguments (arrays or ``jax.ShapeDtypeStruct``s placed on the
    device to compile for): ``.compile()`` gives its plan without running it."""
    return _sample.lower(graphdef, s, None, params, prompts, pad, key)


# XLA:GPU's while-loop double buffering (on by default: parallel/xla_flags.py) overlaps a scanned train step's
# collectives; in the decode loop it only adds copies of every layer's KV cache per token (1.3B at batch 1 on an
# H100, as XLA plans it: 53 more kernels and ~26 MB more traffic per token).
LOOP_OPTIONS = {"xla_gpu_enable_while_loop_double_buffering": False}


@functools.partial(jax.jit, static_argnums=(0, 1, 2), compiler_options=LOOP_OPTIONS)
def _sample(graphdef, s: Sampling, on_tokens, params, prompts, pad, key):
    b = prompts.shape[0]
    fill = 0 if s.eos_id is None else s.eos_id
    model = nnx.merge(graphdef, nnx.State(params))
    logits, cache, seen = model.prefill(prompts, pad, s.max_new_tokens, params_dtype(params))  # (B, V)
    out = jnp.full((b, s.max_new_tokens), fill, jnp.int32)

    def cond(carry):
        i, _, _, _, done, _ = carry
        return (i < s.max_new_tokens) & ~jnp.all(done)

    def body(carry):
        i, last_logits, cache, seen, done, out = carry
        model = nnx.merge(graphdef, nnx.State(params))  # per trace level: layers that sow (MoE) mutate it
        token = choose(last_logits.astype(jnp.float32), seen, s, jax.random.fold_in(key, i))
        token = jnp.where(done, fill, token).astype(jnp.int32)
        out = out.at[:, i].set(token)
        seen = seen.at[jnp.arange(b), token].set(True)
        done = done | ((token == s.eos_id) if s.eos_id is not None else False)
        if on_tokens is not None:
            done = done | _host_check(on_tokens, token, i)
        logits, cache = model.decode_step(token, cache)
        return i + 1, logits, cache, seen, done, out

    carry = (jnp.zeros((), jnp.int32), logits, cache, seen, jnp.zeros((b,), bool), out)
    return jax.lax.while_loop(cond, body, carry)[-1]


def beam_search(graphdef: nnx.GraphDef, params, prompts: jax.Array, pad: jax.Array, s: Sampling) -> jax.Array:
    """(B, P) left-padded prompts -> (B, max_new_tokens): the best hypothesis per row, eos-filled after it ends."""
    return _beam_search(graphdef, s, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(pad, jnp.int32))


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=LOOP_OPTIONS)
def _beam_search(graphdef, s: Sampling, params, prompts, pad):
    b = prompts.shape[0]
    k, n = s.num_beams, s.max_new_tokens
    eos = -1 if s.eos_id is None else s.eos_id
    fill = 0 if s.eos_id is None else s.eos_id

    def score(log_prob, length):
        return log_prob / length.astype(jnp.float32) ** s.length_penalty

    model = nnx.merge(graphdef, nnx.State(params))
    logits, cache, seen = model.prefill(prompts, pad, n, params_dtype(params))  # (B, V)
    # Every beam starts from the prompt: repeat rows, and let only beam 0 be alive at first.
    cache = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0) if x.ndim and x.shape[0] == b else x, cache)
    last, seen = jnp.repeat(logits, k, axis=0), jnp.repeat(seen, k, axis=0)  # (B*K, V)
    alive_seq = jnp.full((b, k, n), fill, jnp.int32)
    alive_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1))  # (B, K)
    fin_seq = jnp.full((b, k, n), fill, jnp.int32)
    fin_score = jnp.full((b, k), NEG_INF)
    open_ = jnp.ones((b,), bool)  # rows whose alive beams may still beat their finished pool

    def cond(carry):
        i, *_, open_ = carry
        return (i < n) & jnp.any(open_)

    def body(carry):
        i, last, cache, seen, alive_seq, alive_lp, fin_seq, fin_score, open_ = carry
        model = nnx.merge(graphdef, nnx.State(params))  # per trace level: layers that sow (MoE) mutate it
        v = last.shape[-1]
        # Hugging Face penalises the log probabilities (each beam's own tokens), which then add up as scores.
        log_p = jax.nn.log_softmax(last.astype(jnp.float32), axis=-1)
        log_p = apply_repetition_penalty(log_p, seen, s.repetition_penalty).reshape(b, k, v)
        candidates = (alive_lp[:, :, None] + log_p).reshape(b, k * v)
        top_lp, top_idx = jax.lax.top_k(candidates, 2 * k)  # (B, 2K): K spares for the ones that end
        beam, token = top_idx // v, (top_idx % v).astype(jnp.int32)
        seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1).at[:, :, i].set(token)  # (B, 2K, N)
        ends = (token == eos) | (i + 1 == n)  # eos, or the length limit
        # Finished pool: the best K of the old pool and the candidates that just ended, as Hugging Face keeps it:
        # only among the best K candidates (the spares are not hypotheses), and only while the row is open.
        finishing = ends & (jnp.arange(2 * k) < k) & open_[:, None]
        pool_scores = jnp.concatenate([fin_score, jnp.where(finishing, score(top_lp, i + 1), NEG_INF)], axis=1)
        pool_seqs = jnp.concatenate([fin_seq, seqs], axis=1)
        fin_score, keep = jax.lax.top_k(pool_scores, k)
        fin_seq = jnp.take_along_axis(pool_seqs, keep[:, :, None], axis=1)
        # Alive: the best K candidates that did not end.
        alive_lp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_lp), k)
        alive_seq = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
        # Hugging Face's default stop (early_stopping=False): a row closes once its best alive beam, scored at
        # the length it has now, no longer beats the worst of a full pool. Rows close on their own, so a prompt's
        # result does not depend on the prompts batched with it.
        open_ = open_ & (score(alive_lp[:, 0], i + 1) > fin_score[:, -1])
        parent = (jnp.take_along_axis(beam, keep, axis=1) + jnp.arange(b)[:, None] * k).reshape(-1)
        cache = jax.tree.map(lambda x: x[parent] if x.ndim and x.shape[0] == b * k else x, cache)
        tokens = jnp.take_along_axis(token, keep, axis=1).reshape(-1)
        seen = seen[parent].at[jnp.arange(b * k), tokens].set(True)
        logits, cache = model.decode_step(tokens, cache)
        return i + 1, logits, cache, seen, alive_seq, alive_lp, fin_seq, fin_score, open_

    carry = (jnp.zeros((), jnp.int32), last, cache, seen, alive_seq, alive_lp, fin_seq, fin_score, open_)
    # The length limit ends every open row's best K candidates, so each pool holds the answer.
    return jax.lax.while_loop(cond, body, carry)[6][:, 0]


def params_dtype(params) -> jnp.dtype:
    return jax.tree.leaves(params)[0].dtype


def complete(graphdef: nnx.GraphDef, params, tokenizer, prompt: str, max_new_tokens: int, n_ctx: int, *,
             temperature: float = 0.8, seed: int = 0, encoder_input: bool = False, entmax: bool = False) -> str:
    """The text that follows ``prompt`` (sampled, from entmax with ``entmax``; at most until eos or the context is
    full). ``encoder_input``: the prompt is an encoder-decoder's input, which ends with end-of-text (T5's
    template)."""
    ids = tokenizer.encode(prompt) + [tokenizer.eos_id] if encoder_input else tokenizer.encode(prompt) or \
        [tokenizer.eos_id]
    new = min(max_new_tokens, n_ctx - 1)
    ids = ids[-(n_ctx - new):]
    out = sample(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32),
                 Sampling(max_new_tokens=new, temperature=temperature, eos_id=tokenizer.eos_id, entmax=entmax),
                 jax.random.key(seed))
    tokens = [int(t) for t in jax.device_get(out)[0]]
    return tokenizer.decode(tokens[:tokens.index(tokenizer.eos_id)] if tokenizer.eos_id in tokens else tokens)
