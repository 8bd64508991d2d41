"""Objectives: what a run minimises, computed from a model and a batch dict.

Each objective reads the fields it needs from the batch, calls the model, and returns per-target losses and
per-target metric values; ``weights(batch)`` gives each target's weight (0 for targets that do not count: padding,
unmasked MLM positions) from the batch alone, so a step knows the whole batch's weight before any microbatch runs.
The jitted steps (parallel/steps.py) reduce them: the training loss is the weighted mean, and evaluation sums
losses and weights over batches so the mean is exact for any number of batches. Steps know no model and no task;
the config's ``task`` picks the objective here.

The language-model objectives take GPT-Neo's loss options (``token_loss``): ``entmax_loss`` replaces softmax
cross-entropy by the entmax loss (training/token_losses.py), and ``z_loss`` adds ``z_loss * mean(logsumexp(logits)^2)``
to the training loss, sown like a layer's auxiliary loss so that ``loss``, evaluation and perplexity stay the
cross-entropy and the mean squared log-normaliser is reported as ``logits_z_loss``.

Batches (all int32 unless noted), by task:
    causal_lm                {"tokens": (B, T+1)}: inputs are tokens[:, :-1], targets tokens[:, 1:]
    masked_lm                {"inputs", "targets": (B, T), "mask": (B, T) float: 1 where the loss counts}
    sequence_classification  {"inputs": (B, T), "segment_ids": (B, T) (0 = padding), "labels": (B,), "weights": (B,)
                             float (0: a row that does not count, such as the filler of a last, partial evaluation
                             batch; a batch without it counts every row)}, and "token_types" (B, T) for models
                             with token type embeddings; with num_labels 1 (regression) "labels" are float32 scores,
                             with multi_label (B, C) float32 multi-hot rows (1: the label applies)
    image_classification     {"images": (B, H, W, C) float32, "labels": (B,), "weights": (B,) float (as above)}
    token_classification     {"inputs", "segment_ids", "labels": (B, T)}: a label per token, -1 where none counts
                             (padding, a word's later sub-tokens), and "token_types" (B, T) as above
    question_answering       {"inputs", "segment_ids", "token_types": (B, T), "start_positions", "end_positions":
                             (B,) the answer's first and last token in the window (0, the first token, where the
                             window holds no answer), "weights": (B,) float (as above)}; a row is one window of an
                             example's context
    seq2seq                  {"inputs", "segment_ids": (B, S) encoder tokens, "targets", "target_segment_ids":
                             (B, T) decoder targets}; 0 segments are padding (weight 0); the decoder reads the
                             targets shifted right (teacher forcing)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from config import Config, ConfigError
from models.aux_losses import sow_aux_losses
from models.axes import LOGITS, constrain
from training.token_losses import cross_entropy, cross_entropy_and_normaliser, entmax_loss

Output = tuple[jax.Array, dict]  # (per-target losses, {metric: per-target values})


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    fields: dict  # batch field -> logical axes of its dimensions (for sharding)
    shapes: Callable  # (config) -> {batch field: shape of one row}: what a data source must provide
    compute: Callable  # (model, batch, dropout_key) -> Output
    weights: Callable  # batch -> per-target weights (float32), shaped like the losses
    per_token: bool  # the loss is nats per token: report perplexity (and bits per byte)
    loss_chunk: int = 0  # positions per chunk of a causal LM's loss (0: whole; objective_for decides)
    # Metrics an evaluation keeps row by row instead of summing: a correlation needs every prediction, an answer
    # every window of its context. ``row_metrics`` turns them into the reported ones: (mean metrics, {name: (N, ...)
    # values of the rows that count, in data order}, the eval data source) -> {metric: value}.
    rows: tuple[str, ...] = ()
    row_metrics: Callable | None = None

    def __call__(self, model, batch: dict, dropout_key: jax.Array | None = None) -> Output:
        return self.compute(model, batch, dropout_key)

    def check_batch(self, cfg: Config, batch: dict, source: str) -> None:
        """A one-line error when a data source's rows lack a field this objective reads, or have another shape."""
        for name, row in self.shapes(cfg).items():
            if name not in batch:
                raise ConfigError(f"task: {self.name} reads batch field '{name}', which {source} does not provide "
                                  f"(it gives {', '.join(sorted(batch))})")
            if tuple(batch[name].shape[1:]) != tuple(row):
                raise ConfigError(f"task: {self.name} reads '{name}' rows of shape {tuple(row)}, {source} gives "
                                  f"{tuple(batch[name].shape[1:])}")


SEQUENCE = ("batch", None)
PER_EXAMPLE = ("batch",)
MULTI_HOT = ("batch", None)  # (B, C): one example's labels stay together


@dataclasses.dataclass(frozen=True)
class TokenLoss:
    """How a language model's (..., V) logits are scored against (...) targets (GPT-Neo's loss options)."""

    z_loss: float = 0.0  # weight of mean(logsumexp(logits)^2), added to the training loss only
    entmax: bool = False  # the entmax loss instead of softmax cross-entropy

    chunk: int = 0  # causal_lm: positions per chunk of chunked_token_losses (0: the whole sequence at once)

    def __call__(self, model, logits: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
        """Per-target losses; sows the weighted z-loss on ``model`` (the steps add it to the training loss)."""
        if self.entmax:
            return entmax_loss(logits, targets)
        losses, normalisers = cross_entropy_and_normaliser(logits, targets)
        if self.z_loss:
            self.sow_z_loss(model, normalisers, weights)
        return losses

    def sow_z_loss(self, model, normalisers: jax.Array, weights: jax.Array) -> None:
        """Sows ``z_loss * mean(logsumexp(logits)^2)`` from the (B, T) log-normalisers."""
        mean_square = jnp.sum(weights * normalisers ** 2) / jnp.maximum(jnp.sum(weights), 1.0)
        sow_aux_losses(model, self.z_loss * mean_square, logits_z_loss=mean_square)


SOFTMAX = TokenLoss()


def chunked_token_losses(model, hidden: jax.Array, targets: jax.Array, weights: jax.Array,
                         token_loss: TokenLoss) -> jax.Array:
    """Softmax cross-entropy of ``model.logits(hidden)`` against ``targets``, ``token_loss.chunk`` positions at a
    time: (B, T, D) hidden states -> (B, T) losses. Each chunk's (B, C, V) logits live only inside a
    rematerialised scan step, so the whole (B, T, V) float32 logits (3.3 GB for GPT-Neo 125M at T=2048, batch 8)
    never exist; the backward pass recomputes one chunk's logits at a time."""
    b, t, d = hidden.shape
    c = token_loss.chunk
    n = -(-t // c)
    pad = n * c - t  # the last chunk is padded; its padded positions are cut off below
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)  # (N, B, C, D)
    chunks = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)  # (N, B, C)

    @jax.checkpoint
    def step(carry, chunk):
        h, y = chunk
        logits = constrain(model.logits(h), LOGITS)  # (B, C, V)
        return carry, cross_entropy_and_normaliser(logits, y)  # (B, C) each

    _, (losses, log_normalisers) = jax.lax.scan(step, None, (hidden, chunks))
    losses, log_normalisers = (x.swapaxes(0, 1).reshape(b, n * c)[:, :t] for x in (losses, log_normalisers))
    if token_loss.z_loss:
        token_loss.sow_z_loss(model, log_normalisers, weights)
    return losses  # (B, T)


def _causal_lm(model, batch: dict, dropout_key, token_loss: TokenLoss = SOFTMAX) -> Output:
    tokens = batch["tokens"]
    targets, weights = tokens[:, 1:], _causal_lm_weights(batch)
    if token_loss.chunk and not token_loss.entmax:
        hidden = model.hidden_states(tokens[:, :-1], dropout_key=dropout_key)  # (B, T, D)
        return chunked_token_losses(model, hidden, targets, weights, token_loss), {}
    logits, _ = model(tokens[:, :-1], dropout_key=dropout_key)  # (B, T, V)
    return token_loss(model, logits, targets, weights), {}


def _causal_lm_weights(batch: dict) -> jax.Array:
    tokens = batch["tokens"]
    return jnp.ones((tokens.shape[0], tokens.shape[1] - 1), jnp.float32)


def _masked_lm(model, batch: dict, dropout_key, token_loss: TokenLoss = SOFTMAX) -> Output:
    logits, _ = model(batch["inputs"], segment_ids=batch.get("segment_ids"), dropout_key=dropout_key)  # (B, T, V)
    targets = batch["targets"]
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return token_loss(model, logits, targets, batch["mask"].astype(jnp.float32)), {"accuracy": correct}


def _example_weights(batch: dict) -> jax.Array:
    if "weights" in batch:
        return batch["weights"].astype(jnp.float32)
    return jnp.ones(batch["labels"].shape[:1], jnp.float32)  # (B,): a multi-label row is one example


def _text_logits(model, batch: dict, dropout_key) -> jax.Array:
    """The head's logits of a batch of texts: (B, C) for a sequence's classes, (B, T, C) for every token's."""
    kwargs = {"token_types": batch["token_types"]} if "token_types" in batch else {}
    logits, _ = model(batch["inputs"], segment_ids=batch["segment_ids"], dropout_key=dropout_key, **kwargs)
    return logits


def _sequence_classification(model, batch: dict, dropout_key) -> Output:
    logits = _text_logits(model, batch, dropout_key)  # (B, C)
    labels = batch["labels"]
    predicted = jnp.argmax(logits, -1)
    metrics = {"accuracy": (predicted == labels).astype(jnp.float32)}
    if logits.shape[-1] == 2:  # F1 of class 1 is computed from these rates, whatever the batch count
        metrics.update(true_positive=((predicted == 1) & (labels == 1)).astype(jnp.float32),
                       false_positive=((predicted == 1) & (labels == 0)).astype(jnp.float32),
                       false_negative=((predicted == 0) & (labels == 1)).astype(jnp.float32))
    return cross_entropy(logits, labels), metrics


def _sequence_regression(model, batch: dict, dropout_key) -> Output:
    """num_labels 1 (Hugging Face's regression): the head's one logit is the score, its loss the squared error
    (transformers' MSELoss); the scores and labels go to the eval row's correlations."""
    scores = _text_logits(model, batch, dropout_key)[:, 0].astype(jnp.float32)  # (B,)
    labels = batch["labels"].astype(jnp.float32)
    return (scores - labels) ** 2, {"score": scores, "label": labels}


def _sequence_multi_label(model, batch: dict, dropout_key) -> Output:
    """multi_label (Hugging Face's multi_label_classification): one sigmoid per label, each row's loss the mean
    binary cross-entropy over its labels (transformers' BCEWithLogitsLoss); a label is predicted where its
    probability is >= 0.5. The predictions and labels go to the eval row's F1s, whose counts are per label."""
    logits = _text_logits(model, batch, dropout_key).astype(jnp.float32)  # (B, C)
    labels = batch["labels"].astype(jnp.float32)  # (B, C)
    predicted = (logits >= 0).astype(jnp.float32)  # sigmoid(x) >= 0.5
    exact = jnp.all(predicted == labels, -1).astype(jnp.float32)  # (B,)
    losses = optax.sigmoid_binary_cross_entropy(logits, labels).mean(-1)  # (B,)
    return losses, {"exact_match": exact, "predicted": predicted, "label": labels}


def _image_classification(model, batch: dict, dropout_key) -> Output:
    logits, _ = model(batch["images"], dropout_key=dropout_key)  # (B, C)
    correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
    return cross_entropy(logits, batch["labels"]), {"accuracy": correct}


def _token_classification(model, batch: dict, dropout_key) -> Output:
    logits = _text_logits(model, batch, dropout_key)  # (B, T, C)
    labels = batch["labels"]
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return cross_entropy(logits, jnp.maximum(labels, 0)), {"accuracy": correct}


def _token_weights(batch: dict) -> jax.Array:
    return ((batch["labels"] >= 0) & (batch["segment_ids"] != 0)).astype(jnp.float32)


def _question_answering(model, batch: dict, dropout_key) -> Output:
    """transformers' QA loss, the mean of the start and end positions' cross-entropies, over each window's real
    tokens: padding gets no probability (transformers scores every position of a padded row)."""
    logits = _text_logits(model, batch, dropout_key).astype(jnp.float32)  # (B, T, 2)
    logits = jnp.where((batch["segment_ids"] != 0)[..., None], logits, NO_ANSWER_HERE)
    start, end = logits[..., 0], logits[..., 1]  # (B, T) each
    losses = (cross_entropy(start, batch["start_positions"]) + cross_entropy(end, batch["end_positions"])) / 2
    return losses, {"start_logits": start, "end_logits": end}


NO_ANSWER_HERE = -1e9  # the logit of a padding position: no span starts or ends there


def _answer_scores(means: dict, rows: dict, data) -> dict:
    """SQuAD's exact match and F1 of the answers the windows' logits pick (the eval data's examples)."""
    return data.answer_scores(rows["start_logits"], rows["end_logits"])


def _correlations(means: dict, rows: dict, data) -> dict:
    """A regression's mean squared error and the Pearson and Spearman correlations of its scores with the labels
    (run_glue's STS-B row: pearson, spearmanr)."""
    import scipy.stats  # jax's own dependency

    scores, labels = (rows[name].astype(np.float64) for name in ("score", "label"))
    with warnings.catch_warnings():  # constant scores (an untrained head's) have no correlation: NaN, as scipy says
        warnings.simplefilter("ignore", scipy.stats.ConstantInputWarning)
        return dict(mse=means["loss"], pearson=float(scipy.stats.pearsonr(scores, labels)[0]),
                    spearmanr=float(scipy.stats.spearmanr(scores, labels)[0]))


def shift_right(targets: jax.Array, segment_ids: jax.Array, start_id: int) -> jax.Array:
    """(B, T) targets -> decoder inputs: each segment's targets one step later, its first input ``start_id``
    (T5's ``_shift_right``, segment by segment for packed rows)."""
    previous = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    continues = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1) == segment_ids
    return jnp.where(continues, previous, start_id).astype(targets.dtype)


def _seq2seq(model, batch: dict, dropout_key) -> Output:
    targets, target_segments = batch["targets"], batch["target_segment_ids"]
    logits, _ = model(batch["inputs"], segment_ids=batch["segment_ids"],
                      decoder_inputs=shift_right(targets, target_segments, model.decoder_start_token_id),
                      decoder_segment_ids=target_segments, dropout_key=dropout_key)  # (B, T, V)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return cross_entropy(logits, targets), {"accuracy": correct}


IMAGE = ("batch", None, None, None)  # (B, H, W, C): pixels are never split

OBJECTIVES = {
    "causal_lm": Objective(
        "causal_lm", {"tokens": SEQUENCE}, lambda cfg: {"tokens": (cfg.n_ctx + 1,)},
        _causal_lm, _causal_lm_weights, per_token=True),
    "masked_lm": Objective(
        "masked_lm", {"inputs": SEQUENCE, "targets": SEQUENCE, "mask": SEQUENCE},
        lambda cfg: {"inputs": (cfg.n_ctx,), "targets": (cfg.n_ctx,), "mask": (cfg.n_ctx,)},
        _masked_lm, lambda batch: batch["mask"].astype(jnp.float32), per_token=True),
    "sequence_classification": Objective(
        "sequence_classification", {"inputs": SEQUENCE, "segment_ids": SEQUENCE, "token_types": SEQUENCE,
                                    "labels": PER_EXAMPLE, "weights": PER_EXAMPLE},
        lambda cfg: {"inputs": (cfg.n_ctx,), "segment_ids": (cfg.n_ctx,), "labels": (), "weights": (),
                     **({"token_types": (cfg.n_ctx,)} if cfg.n_token_types else {})},
        _sequence_classification, _example_weights, per_token=False),
    "token_classification": Objective(
        "token_classification", {"inputs": SEQUENCE, "segment_ids": SEQUENCE, "token_types": SEQUENCE,
                                 "labels": SEQUENCE},
        lambda cfg: {"inputs": (cfg.n_ctx,), "segment_ids": (cfg.n_ctx,), "labels": (cfg.n_ctx,),
                     **({"token_types": (cfg.n_ctx,)} if cfg.n_token_types else {})},
        _token_classification, _token_weights, per_token=False),
    "question_answering": Objective(
        "question_answering", {"inputs": SEQUENCE, "segment_ids": SEQUENCE, "token_types": SEQUENCE,
                               "start_positions": PER_EXAMPLE, "end_positions": PER_EXAMPLE, "weights": PER_EXAMPLE},
        lambda cfg: {"inputs": (cfg.n_ctx,), "segment_ids": (cfg.n_ctx,), "start_positions": (), "end_positions": (),
                     "weights": (), **({"token_types": (cfg.n_ctx,)} if cfg.n_token_types else {})},
        _question_answering, lambda batch: batch["weights"].astype(jnp.float32), per_token=False,
        rows=("start_logits", "end_logits"), row_metrics=_answer_scores),
    "seq2seq": Objective(
        "seq2seq", {"inputs": SEQUENCE, "segment_ids": SEQUENCE, "targets": SEQUENCE, "target_segment_ids": SEQUENCE},
        lambda cfg: {"inputs": (cfg.n_ctx,), "segment_ids": (cfg.n_ctx,), "targets": (cfg.decoder_ctx,),
                     "target_segment_ids": (cfg.decoder_ctx,)},
        _seq2seq, lambda batch: (batch["target_segment_ids"] != 0).astype(jnp.float32), per_token=True),
    "image_classification": Objective(
        "image_classification", {"images": IMAGE, "labels": PER_EXAMPLE, "weights": PER_EXAMPLE},
        lambda cfg: {"images": (cfg.image_size, cfg.image_size, cfg.num_channels), "labels": (), "weights": ()},
        _image_classification, _example_weights, per_token=False),
}


def objective_for(cfg: Config, layout=None, memory: float | None = None) -> Objective:
    """The objective of ``cfg.task``, with the config's loss options for language models. The entmax loss is not
    nats per token, so no perplexity is reported for it. ``layout`` (the run's) and ``memory`` (bytes per device;
    default: what the layout's devices report) decide whether a causal LM's loss is chunked (``loss_chunk``)."""
    if cfg.task == "seq2seq" and not cfg.decoder_layers:
        raise ConfigError("task: seq2seq trains a decoder, and this t5 has none (n_decoder_layer 0, an encoder "
                          "alone: it gives hidden states through pretrained.Pretrained)")
    objective = OBJECTIVES[cfg.task]
    if cfg.regression:
        objective = dataclasses.replace(objective, compute=_sequence_regression, rows=("score", "label"),
                                        row_metrics=_correlations)
    if cfg.multi_label:
        shapes = objective.shapes
        objective = dataclasses.replace(
            objective, compute=_sequence_multi_label, rows=("predicted", "label"), row_metrics=_multi_label_f1,
            fields={**objective.fields, "labels": MULTI_HOT},
            shapes=lambda cfg: {**shapes(cfg), "labels": (cfg.num_labels,)})
    chunk = loss_chunk(cfg, layout, memory) if cfg.task == "causal_lm" else 0
    if cfg.task in ("causal_lm", "masked_lm") and (cfg.z_loss or cfg.entmax_loss or chunk):
        token_loss = TokenLoss(z_loss=cfg.z_loss, entmax=cfg.entmax_loss, chunk=chunk)
        objective = dataclasses.replace(objective, compute=functools.partial(objective.compute, token_loss=token_loss),
                                        per_token=not cfg.entmax_loss, loss_chunk=chunk)
    return objective


# causal_lm computes its loss in chunks by default once the (B, T, V) float32 logits one device holds would take
# more than this share of its memory. Not below: on one H100 (2026-11-27) the 125M step at T=2048, batch 8 ran
# 13% faster unchunked (its 3.3 GB of logits added 3.3 GiB to the peak), the 1.3B step at batch 4 3% faster:
# chunking computes the logits once more in the backward pass.
CHUNKED_LOSS_MEMORY_SHARE = 1 / 8
DEFAULT_LOSS_CHUNK = 512


def loss_chunk(cfg: Config, layout=None, memory: float | None = None) -> int:
    """Positions per chunk of a causal LM's loss (0: whole): ``loss_chunk``, or when null, chunks of
    DEFAULT_LOSS_CHUNK once one device's share of a microbatch's float32 logits (split as ``layout`` splits them)
    would pass CHUNKED_LOSS_MEMORY_SHARE of ``memory`` (default: what the layout's devices, or jax's, report)."""
    if cfg.loss_chunk is not None:
        return 0 if cfg.loss_chunk >= cfg.n_ctx else cfg.loss_chunk
    if cfg.n_ctx <= DEFAULT_LOSS_CHUNK:
        return 0
    from parallel.auto import device_memory
    from parallel.layout import ways
    from parallel.steps import microbatch_count

    shards = 1 if layout is None else math.prod(ways(layout.mesh, entry) for entry in layout.spec(LOGITS))
    if memory is None:
        memory = device_memory(jax.devices()[0] if layout is None else layout.mesh.devices.flat[0])
    rows = cfg.train_batch_size / (1 if layout is None else microbatch_count(cfg, layout))
    logits_bytes = 4 * rows * cfg.n_ctx * cfg.n_vocab / shards
    return DEFAULT_LOSS_CHUNK if logits_bytes > CHUNKED_LOSS_MEMORY_SHARE * memory else 0


def report(objective: Objective, means: dict, bytes_per_token: float | None = None, data=None) -> dict:
    """Mean loss and metrics over an evaluation -> the reported row: adds perplexity (and bits per byte when the
    data knows its bytes per token) for per-token losses, F1 where true/false positive rates are present, and the
    objective's ``row_metrics`` of the rows that count (a regression's correlations, question answering's exact
    match and F1 over the examples of ``data``, the eval source)."""
    out = dict(means)
    if objective.rows:
        counted = out.pop("row_weights") > 0
        out.update(objective.row_metrics(out, {name: out.pop(name)[counted] for name in objective.rows}, data))
    tp, fp, fn = (out.pop(k, None) for k in ("true_positive", "false_positive", "false_negative"))
    if tp is not None:
        out["f1"] = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0
    if objective.per_token:
        out["perplexity"] = math.exp(min(out["loss"], 80.0))
        if bytes_per_token:
            out["bits_per_byte"] = out["loss"] / math.log(2) / bytes_per_token
    return out


def _multi_label_f1(means: dict, rows: dict, data) -> dict:
    """{"micro_f1", "macro_f1"} of (N, C) 0/1 predictions against (N, C) 0/1 labels, as scikit-learn's f1_score
    (average "micro" / "macro") gives them: micro pools every label's counts, macro averages the labels' own F1s,
    a label never true nor predicted counting 0 (its zero_division default)."""
    predicted, labels = rows["predicted"] > 0.5, rows["label"] > 0.5
    tp, fp, fn = ((a & b).sum(0).astype(np.float64) for a, b in ((predicted, labels), (predicted, ~labels),
                                                                  (~predicted, labels)))  # (C,) each

    def f1(tp, fp, fn):
        wrong_or_right = 2 * tp + fp + fn
        return np.divide(2 * tp, wrong_or_right, out=np.zeros_like(tp), where=wrong_or_right > 0)

    return {"micro_f1": float(f1(tp.sum(), fp.sum(), fn.sum())), "macro_f1": float(f1(tp, fp, fn).mean())}
