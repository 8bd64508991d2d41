"""Log-likelihoods of continuations under a causal language model: the one scoring path of every evaluation.

A request is (context ids, continuation ids). The model reads context + continuation (all but the last token)
and the scorer sums the log-probabilities of the continuation's tokens and says whether greedy decoding would
have produced every one of them, as lm-evaluation-harness defines ``loglikelihood``. A context too long for
``n_ctx`` loses its oldest tokens; the continuation is always scored whole.

Requests run in batches of ``batch_size`` rows, longest first, right-padded to a multiple of ``LENGTH_STEP``
tokens, so a whole evaluation compiles a handful of programs. Parameters may be sharded on any layout; a batch's rows
are split over the layout's batch axes (held whole where the batch size does not divide them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from config import Config, ConfigError
from parallel.layout import replicated

LENGTH_STEP = 32  # padded lengths are multiples of this (or n_ctx): few shapes, little padding


@dataclasses.dataclass(frozen=True)
class Score:
    logprob: float  # sum of the continuation tokens' log-probabilities (nats)
    greedy: bool  # argmax decoding produces every continuation token
    tokens: int  # continuation tokens scored


class Scorer:
    """Scores (context, continuation) requests with a loaded model:

        scorer = Scorer.from_pretrained("runs/quickstart")           # a run or a Hugging Face directory
        scorer.loglikelihood([("The cat sat on the", " mat")])        # [Score(logprob=-3.2, greedy=True, ...)]

    ``params`` may be replaced between calls (the train loop scores its current parameters); the compiled
    programs are kept."""

    def __init__(self, cfg: Config, graphdef: nnx.GraphDef, params, tokenizer, layout=None, batch_size: int = 8):
        from pretrained import default_layout

        if cfg.task != "causal_lm":
            raise ConfigError(f"evaluation: a {cfg.model} model trained for {cfg.task} does not score text; "
                              "language-model tasks need a causal_lm model")
        if batch_size < 1:
            raise ConfigError(f"evaluation: batch size {batch_size} must be at least 1")
        self.cfg, self.graphdef, self.params, self.tokenizer = cfg, graphdef, params, tokenizer
        self.layout = layout or default_layout()
        self.batch_size = batch_size
        # Rows split over the layout's batch axes where they divide; the (B,) results come back whole.
        split = batch_size % self.layout.axis_size("batch") == 0
        self._sharding = self.layout.sharding(("batch", None)) if split else replicated(self.layout.mesh)
        self._scores = jax.jit(partial(_continuation_scores, graphdef, self.layout, cfg.precision),
                               out_shardings=replicated(self.layout.mesh))

    @classmethod
    def from_pretrained(cls, path: str, layout=None, batch_size: int = 8, overrides: tuple[str, ...] = (),
                        kind: str = "auto", adapter: str | None = None) -> "Scorer":
        """A NeoMesh run directory (``kind`` "run") or a Hugging Face directory ("hf"); "auto" tells them apart
        (see ``pretrained.load``); ``adapter``: a peft LoRA adapter directory put on it."""
        from pretrained import default_layout, load

        layout = layout or default_layout()
        cfg, graphdef, params, tokenizer = load(path, layout, overrides, kind=kind, adapter=adapter)
        return cls(cfg, graphdef, params, tokenizer, layout, batch_size)

    @property
    def max_length(self) -> int:
        """Tokens a model reads at once: its whole position table (``Config.generation_positions``)."""
        return self.cfg.generation_positions

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of ``context`` and ``continuation`` as the harness splits them: the pair is encoded whole
        (so a merge across the boundary is what the model would see) and the continuation is what the context's
        own ids leave; spaces that end the context move to the continuation. An empty context is end-of-text."""
        spaces = len(context) - len(context.rstrip(" "))
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:
            return [self.tokenizer.eos_id], self.tokenizer.encode(continuation)
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        return context_ids, whole[len(context_ids):]

    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[Score]:
        """``[(context, continuation), ...]`` texts -> one ``Score`` each."""
        return self.score_tokens([self.encode_pair(c, x) for c, x in requests])

    def score_tokens(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Score]:
        """``[(context ids, continuation ids), ...]`` -> one ``Score`` each, in order."""
        rows = []
        for i, (context, continuation) in enumerate(requests):
            if not continuation:
                raise ConfigError(f"evaluation: request {i} has an empty continuation: nothing to score")
            if len(continuation) > self.max_length:
                raise ConfigError(f"evaluation: request {i}'s continuation has {len(continuation)} tokens; "
                                  f"{self.max_length} positions are the most this model scores at once")
            ids = (list(context) + list(continuation))[-(self.max_length + 1):]
            rows.append((ids[:-1], ids[1:], len(continuation)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: similar lengths batch
        scores: list[Score | None] = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for i, score in zip(chunk, self._score_batch([rows[i] for i in chunk])):
                scores[i] = score
        return scores  # type: ignore[return-value]

    def _score_batch(self, rows: list[tuple[list[int], list[int], int]]) -> list[Score]:
        width = min(self.max_length, -(-max(len(r[0]) for r in rows) // LENGTH_STEP) * LENGTH_STEP)
        inputs = np.full((self.batch_size, width), self.tokenizer.padding_id, np.int32)  # (B, T)
        targets = np.zeros((self.batch_size, width), np.int32)
        segment_ids = np.zeros((self.batch_size, width), np.int32)
        scored = np.zeros((self.batch_size, width), bool)  # the continuation's positions
        for row, (ids, next_ids, n) in enumerate(rows):
            inputs[row, :len(ids)], targets[row, :len(ids)], segment_ids[row, :len(ids)] = ids, next_ids, 1
            scored[row, len(ids) - n:len(ids)] = True
        batch = {name: _global(value, self._sharding) for name, value in
                 dict(inputs=inputs, targets=targets, segment_ids=segment_ids, scored=scored).items()}
        logprob, greedy = jax.device_get(self._scores(self.params, batch))
        return [Score(float(logprob[row]), bool(greedy[row]), rows[row][2]) for row in range(len(rows))]


def _global(value: np.ndarray, sharding) -> jax.Array:
    """A host array as one global array placed by ``sharding`` (every process holds the same whole value, so
    this works across hosts too)."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _continuation_scores(graphdef, layout, precision: str, params, batch: dict) -> tuple[jax.Array, jax.Array]:
    """-> (B,) summed log-probabilities of the scored targets, (B,) whether argmax hits every scored target."""
    from parallel.steps import COMPUTE_DTYPES
    from training.token_losses import cross_entropy

    with layout.active():
        params = jax.tree.map(lambda p: p.astype(COMPUTE_DTYPES[precision]), params)
        model = nnx.merge(graphdef, nnx.State(params))
        logits, _ = model(batch["inputs"], segment_ids=batch["segment_ids"])  # (B, T, V)
    logprobs = -cross_entropy(logits, batch["targets"])  # (B, T), as the training loss computes it
    hit = jnp.argmax(logits, axis=-1) == batch["targets"]
    scored = batch["scored"]
    return jnp.sum(jnp.where(scored, logprobs, 0.0), axis=-1), jnp.all(hit | ~scored, axis=-1)
