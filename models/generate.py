"""Text generation with a KV cache: prefill and the decode loop run inside one jit, compiled once per program
structure (new tokens, beams, top-k, entmax, and which of greedy, top-p, repetition penalty and eos are on) and
(batch, prompt length) shape; the values of temperature, top-p, the penalties and eos are traced scalars.

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
each new token (streaming, stop strings) and can end a row; with one, the loop runs on the host, a compiled step per
token, as jax keeps no program that calls back to the host in its persistent compilation cache.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import axes, entmax

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


# A Sampling reaches the jitted loops in two parts. What shapes the program (lengths, beam count, top-k's static k,
# and which paths exist at all) is a static argument; the values that only enter arithmetic are traced scalars, so
# a notebook, server or harness that changes temperature or length penalty reuses the compiled loop.

@dataclasses.dataclass(frozen=True)
class _Program:
    max_new_tokens: int
    num_beams: int
    top_k: int
    entmax: bool
    greedy: bool  # temperature 0
    keeps_top_p: bool  # top_p < 1
    penalises_repeats: bool  # repetition_penalty != 1
    stops_at_eos: bool  # eos_id given
    twin_row: bool = False  # a single prompt runs through the model as two identical rows (model_rows)
    placement: object = None  # the layout the model code is traced under (models.axes.placement)


class _Knobs(NamedTuple):
    temperature: jax.Array  # float32 scalars, as the Python floats became in float32 arithmetic
    top_p: jax.Array
    repetition_penalty: jax.Array
    length_penalty: jax.Array
    eos_id: jax.Array  # int32; 0 without eos: what ended rows are filled with either way


def _program(s: Sampling) -> _Program:
    return _Program(max_new_tokens=s.max_new_tokens, num_beams=s.num_beams, top_k=s.top_k, entmax=s.entmax,
                    greedy=s.temperature == 0, keeps_top_p=s.top_p < 1.0, penalises_repeats=s.repetition_penalty != 1.0,
                    stops_at_eos=s.eos_id is not None, placement=axes.placement())


def _knobs(s: Sampling) -> _Knobs:
    as_float = functools.partial(jnp.asarray, dtype=jnp.float32)
    return _Knobs(temperature=as_float(s.temperature), top_p=as_float(s.top_p),
                  repetition_penalty=as_float(s.repetition_penalty), length_penalty=as_float(s.length_penalty),
                  eos_id=jnp.asarray(0 if s.eos_id is None else s.eos_id, jnp.int32))


# XLA turns a division by a constant into a multiplication by its float32 reciprocal; the traced knobs divide the
# same way, so their results stay bit-identical to those of the constants they were.

def _penalise_repeats(logits: jax.Array, seen: jax.Array, penalty: jax.Array) -> jax.Array:
    """Hugging Face's rule for every token already seen: negative logits times ``penalty``, others divided."""
    return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits * (1 / penalty)), logits)


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Masks everything outside the top-k tokens and outside the smallest set whose probability reaches top_p."""
    return _filtered(logits, top_k, top_p if top_p < 1.0 else None)


def _filtered(logits: jax.Array, top_k: int, top_p: jax.Array | float | None) -> jax.Array:
    """``filter_logits`` with top_p None for none (the sampling loop's top_p is traced: whether it filters at all
    is part of the program, ``_Program.keeps_top_p``)."""
    if top_k > 0:
        logits = _keep_top_k(logits, top_k)
    if top_p is not None:
        logits = _keep_top_p(logits, top_p)
    return logits


def _keep_top_k(logits: jax.Array, top_k: int) -> jax.Array:
    top_k = min(top_k, logits.shape[-1])  # a k of the vocabulary or more keeps every token, as in transformers
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    return jnp.where(logits < kth, NEG_INF, logits)


def _keep_top_p(logits: jax.Array, top_p: jax.Array | float) -> jax.Array:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]  # descending
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass strictly above each token
    cutoff = jnp.min(jnp.where(before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, NEG_INF, logits)


def choose(logits: jax.Array, seen: jax.Array, s: Sampling, key: jax.Array) -> jax.Array:
    """(B, V) float32 logits -> (B,) next tokens."""
    return _choose(logits, seen, _program(s), _knobs(s), key)


def _choose(logits: jax.Array, seen: jax.Array, program: _Program, knobs: _Knobs, key: jax.Array) -> jax.Array:
    if program.penalises_repeats:
        logits = _penalise_repeats(logits, seen, knobs.repetition_penalty)
    if program.greedy:
        return jnp.argmax(logits, axis=-1)
    logits = _filtered(logits * (1 / knobs.temperature), program.top_k, knobs.top_p if program.keeps_top_p else None)
    if program.entmax:
        return entmax.sample(key, logits)
    return jax.random.categorical(key, logits, axis=-1)


def seen_tokens(tokens: jax.Array, real: jax.Array, vocab: int) -> jax.Array:
    """(B, L) token ids, (B, L) bool (which count) -> (B, V) bool: which ids each row holds."""
    b = tokens.shape[0]
    return jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], tokens].max(real)


def sample(graphdef: nnx.GraphDef, params, prompts: jax.Array, pad: jax.Array, s: Sampling, key: jax.Array,
           on_tokens: Callable | None = None) -> jax.Array:
    """(B, P) left-padded prompts -> (B, max_new_tokens) new tokens; rows that ended (eos, or the callback said
    stop) are filled with eos (or 0) after their last token. ``on_tokens(tokens (B,), step) -> (B,) bool`` runs on
    the host after every step when given. Compiled once per (model, program structure, shapes)."""
    program = _sampling_program(s, len(prompts), jax.tree.leaves(params)[0])
    return _run(graphdef, program, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(pad, jnp.int32), _knobs(s),
                key, on_tokens)


def _run(graphdef, program: _Program, params, prompts, pad, knobs: _Knobs, key, on_tokens) -> jax.Array:
    """The loop on the device, or, with a host callback, one compiled step per token driven from here: jax keeps
    no program with a host callback in its persistent compilation cache, so a loop that called back (every
    streamed prompt, every --stop) was compiled again by each predict.py run."""
    if on_tokens is None:
        return _sample(graphdef, program, params, prompts, pad, knobs, key)
    carry = _prefill(graphdef, program, params, prompts, pad, knobs)
    step, stop = _stepper(graphdef, program), jnp.zeros((prompts.shape[0],), bool)
    for i in range(program.max_new_tokens):
        carry, token = step(params, knobs, key, carry, stop)
        token, done = jax.device_get((token, carry[4]))
        stop = np.asarray(on_tokens(token, i), bool)
        if (done | stop).all():
            break
    return carry[-1]


def lower_sample(graphdef: nnx.GraphDef, params, prompts, pad, s: Sampling, key) -> jax.stages.Lowered:
    """``sample``'s program lowered for these arguments (arrays or ``jax.ShapeDtypeStruct``s placed on the
    device to compile for): ``.compile()`` gives its plan without running it."""
    # The knobs are traced: only their shapes enter the program, placed where the key is (a topology's device).
    knobs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=key.sharding), _knobs(s))
    return _sample.lower(graphdef, _sampling_program(s, prompts.shape[0], key), params, prompts, pad, knobs, key)


def compiled_sample(graphdef: nnx.GraphDef, params, prompts: jax.Array, pad: jax.Array, s: Sampling, key: jax.Array,
                    compiler_options: dict | None = None) -> tuple[Callable[[], jax.Array], str]:
    """``sample`` on these arguments as a call without arguments, its program compiled with ``compiler_options``
    (XLA's, beside the loop's own LOOP_OPTIONS), and that program's optimized HLO text: what a profile runs and
    names its kernels by, compiled otherwise than ``sample``'s."""
    prompts, pad = jnp.asarray(prompts, jnp.int32), jnp.asarray(pad, jnp.int32)
    compiled = lower_sample(graphdef, params, prompts, pad, s, key).compile(
        compiler_options={**LOOP_OPTIONS, **(compiler_options or {})})
    return functools.partial(compiled, params, prompts, pad, _knobs(s), key), compiled.as_text()


def _sampling_program(s: Sampling, batch: int, placed) -> _Program:
    """The program for ``batch`` prompts on the devices where ``placed`` (an array or ShapeDtypeStruct) is."""
    sharding = getattr(placed, "sharding", None)  # a NumPy array: jax's default device
    platform = next(iter(sharding.device_set)).platform if sharding is not None else jax.default_backend()
    return dataclasses.replace(_program(s), twin_row=model_rows(batch, platform) != batch)


def model_rows(batch: int, platform: str) -> int:
    """The rows ``sample`` runs through the model for ``batch`` prompts on ``platform``: on GPUs a single prompt
    decodes as two identical rows. XLA:GPU turns a matmul of one row into a multiply and a sum, keeping transposed
    weight copies or writing products out whole before summing them; two rows make every projection a GEMM. For
    GPT-Neo 125M in bf16, as XLA plans it for an H100: 228 kernels per token instead of 239, 11.3 MB of
    temporaries instead of 49.6 (1.3B: 31.6 MB instead of 625); on an H100 a decode step of 16 rows took 0.55 ms
    against 0.66 for one. On CPUs two rows cost 1.6x one (125M, fp32), so a prompt stays one row there."""
    return 2 if batch == 1 and platform in ("gpu", "cuda", "rocm") else batch


# XLA:GPU's while-loop double buffering (on by default: parallel/xla_flags.py) overlaps a scanned train step's
# collectives; in the decode loop it only adds copies of every layer's KV cache per token (1.3B at batch 1 on an
# H100, as XLA plans it: 53 more kernels and ~26 MB more traffic per token).
LOOP_OPTIONS = {"xla_gpu_enable_while_loop_double_buffering": False}


def _begin(graphdef, program: _Program, params, prompts, pad, knobs: _Knobs):
    """The loop's first carry: (step, next token's logits (B, V), cache, seen (B, V), done (B,), out (B, N))."""
    b, n = prompts.shape[0], program.max_new_tokens
    model = nnx.merge(graphdef, nnx.State(params))
    logits, cache, seen = model.prefill(_twin(program, prompts), _twin(program, pad), n, params_dtype(params))
    out = jnp.full((b, n), knobs.eos_id, jnp.int32)  # a loop that ends early leaves the fill
    return jnp.zeros((), jnp.int32), logits[:b], cache, seen[:b], jnp.zeros((b,), bool), out


def _advance(graphdef, program: _Program, params, knobs: _Knobs, key, carry):
    """One step of the loop: each row's next token chosen (the fill once it is done), written and fed to the model;
    (the next carry, the tokens (B,))."""
    i, last_logits, cache, seen, done, out = carry
    b, fill = out.shape[0], knobs.eos_id
    model = nnx.merge(graphdef, nnx.State(params))  # per trace level: layers that sow (MoE) mutate it
    token = _choose(last_logits.astype(jnp.float32), seen, program, knobs, jax.random.fold_in(key, i))
    token = jnp.where(done, fill, token).astype(jnp.int32)
    out = out.at[:, i].set(token)
    seen = seen.at[jnp.arange(b), token].set(True)
    if program.stops_at_eos:
        done = done | (token == knobs.eos_id)
    logits, cache = model.decode_step(_twin(program, token), cache)
    return (i + 1, logits[:b], cache, seen, done, out), token


def _twin(program: _Program, x: jax.Array) -> jax.Array:
    """``x``'s rows as the model runs them (``model_rows``)."""
    return jnp.concatenate([x, x]) if program.twin_row else x


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=LOOP_OPTIONS)
def _sample(graphdef, program: _Program, params, prompts, pad, knobs: _Knobs, key):
    n = program.max_new_tokens

    def cond(carry):
        i, _, _, _, done, _ = carry
        return (i < n) & ~jnp.all(done)

    carry = _begin(graphdef, program, params, prompts, pad, knobs)
    return jax.lax.while_loop(cond, lambda c: _advance(graphdef, program, params, knobs, key, c)[0], carry)[-1]


_prefill = functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=LOOP_OPTIONS)(_begin)


@functools.lru_cache(maxsize=8)
def _stepper(graphdef, program: _Program) -> Callable:
    """``_advance`` for one model and program, jitted, after ending the rows the host callback stopped. Bound here
    rather than taking the model as a static argument: jax hashes those at every call, which for a model's graph
    took ten times as long as the step itself (quickstart model, CPU)."""

    def step(params, knobs: _Knobs, key, carry, stop):
        i, logits, cache, seen, done, out = carry
        return _advance(graphdef, program, params, knobs, key, (i, logits, cache, seen, done | stop, out))

    return jax.jit(step, donate_argnums=(3,), compiler_options=LOOP_OPTIONS)


def beam_search(graphdef: nnx.GraphDef, params, prompts: jax.Array, pad: jax.Array, s: Sampling) -> jax.Array:
    """(B, P) left-padded prompts -> (B, max_new_tokens): the best hypothesis per row, eos-filled after it ends."""
    # Beams are searched, never sampled: the sampling-only settings (ignored, as by transformers' generate without
    # do_sample) must not make another program.
    program = dataclasses.replace(_program(s), greedy=False, keeps_top_p=False, top_k=0, entmax=False)
    return _beam_search(graphdef, program, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(pad, jnp.int32),
                        _knobs(s))


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=LOOP_OPTIONS)
def _beam_search(graphdef, program: _Program, params, prompts, pad, knobs: _Knobs):
    b = prompts.shape[0]
    k, n = program.num_beams, program.max_new_tokens
    fill = knobs.eos_id

    def score(log_prob, length):
        return _length_normalised(log_prob, length.astype(jnp.float32), knobs.length_penalty)

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
        if program.penalises_repeats:
            log_p = _penalise_repeats(log_p, seen, knobs.repetition_penalty)
        log_p = log_p.reshape(b, k, v)
        candidates = (alive_lp[:, :, None] + log_p).reshape(b, k * v)
        top_lp, top_idx = jax.lax.top_k(candidates, 2 * k)  # (B, 2K): K spares for the ones that end
        beam, token = top_idx // v, (top_idx % v).astype(jnp.int32)
        seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1).at[:, :, i].set(token)  # (B, 2K, N)
        ends = jnp.broadcast_to(i + 1 == n, token.shape)  # the length limit
        if program.stops_at_eos:
            ends = ends | (token == knobs.eos_id)
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


def _length_normalised(log_prob: jax.Array, length: jax.Array, penalty: jax.Array) -> jax.Array:
    """``log_prob / length ** penalty``, exact for the usual penalties: XLA's ``pow`` of a traced exponent is a
    rounding step off for ``penalty`` 1 on about a quarter of lengths, so small integer powers are products (and
    -0.5 a square root), the forms XLA gave a constant penalty: beam scores stay bit-identical to those."""
    squared = length * length
    cubed = length * squared
    forms = {0.0: log_prob, 1.0: log_prob / length, -1.0: log_prob * length, 2.0: log_prob / squared,
             -2.0: log_prob * squared, 3.0: log_prob / cubed, -3.0: log_prob * cubed, -0.5: log_prob * jnp.sqrt(length)}
    return jnp.select([penalty == p for p in forms], list(forms.values()), log_prob * length ** -penalty)


def params_dtype(params) -> jnp.dtype:
    return jax.tree.leaves(params)[0].dtype


def complete(graphdef: nnx.GraphDef, params, tokenizer, prompt: str | list[int], max_new_tokens: int,
             positions: int, *, temperature: float = 0.8, seed: int = 0, entmax: bool = False, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0) -> str:
    """The text that follows ``prompt`` (sampled, from entmax with ``entmax``; at most until eos or the ``positions``
    the prompt and new tokens share, ``Config.generation_positions``, are full). ``prompt``: a decoder's text, whose
    end it continues, or an encoder-decoder's input ids as its encoder reads them (cut as training cut its inputs,
    ``data.pairs.ended``), for a decoder that starts empty."""
    new = min(max_new_tokens, positions - 1)
    if isinstance(prompt, str):  # a decoder continues the prompt's end
        ids = (tokenizer.encode(prompt) or [tokenizer.eos_id])[-(positions - new):]
    else:
        ids = list(prompt)
    out = sample(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32),
                 Sampling(max_new_tokens=new, temperature=temperature, top_k=top_k, top_p=top_p,
                          repetition_penalty=repetition_penalty, eos_id=tokenizer.eos_id, entmax=entmax),
                 jax.random.key(seed))
    tokens = [int(t) for t in jax.device_get(out)[0]]
    tokens = tokens[:tokens.index(tokenizer.eos_id)] if tokenizer.eos_id in tokens else tokens
    return tokenizer.decode([t for t in tokens if t != tokenizer.padding_id])  # padding is never text (T5's <pad>)
