"""``train.py --check-dataset``: look at what the model would be fed before spending compute on it."""

from __future__ import annotations

import numpy as np

from config import Config


def check_dataset(cfg: Config, batch_size: int | None = None) -> None:
    """Builds the train source, decodes its first batch and prints the token id range, counts and first text; then
    reads the first eval batch, as train.py does at start (a missing or bad eval_path passed the check and stopped
    the run). With ``mlm_training`` the batch is a dict: its ``inputs`` are described, with the masked share."""
    _check_train(cfg, batch_size)
    _check_eval(cfg)


def _check_eval(cfg: Config) -> None:
    from data.source import NoEvalSet, make_source

    if not cfg.eval_steps:
        print("eval: none (eval_steps 0)")
        return
    try:
        source = make_source(cfg, "eval")
    except NoEvalSet as e:
        print(f"note: {e}; train.py skips evaluation")
        return
    source.batch(0, cfg.eval_batch_size)
    print(f"{source.description}; its first batch of {cfg.eval_batch_size} was read")
    from training.eval_reads import repeat_note  # the note train.py prints at start, here before a run

    repeats = repeat_note(source, cfg)
    if repeats:
        print(repeats)


def _check_train(cfg: Config, batch_size: int | None) -> None:
    from data.source import make_source, with_mask_token

    source = make_source(cfg, "train")
    batch = source.batch(0, batch_size or cfg.train_batch_size)  # (B, n_ctx+1), or a dict of fields
    masked = None
    if isinstance(batch, dict):  # every task but causal_lm: dispatch on the fields the batch has
        if "images" in batch:
            return _check_images(source, batch)
        if "labels" in batch:  # labelled examples (sequence or token classification)
            return _check_labelled(source, batch, cfg)
        if "mask" not in batch:  # seq2seq (span corruption or pairs): inputs and targets
            return _check_seq2seq(source, batch, cfg)
        masked = batch["mask"]
        batch = batch["inputs"]
    tok = source.tokenizer
    counts = np.bincount(batch.ravel(), minlength=1)
    print(source.description)
    print(f"batch 0{' inputs' if masked is not None else ''}: shape {batch.shape} {batch.dtype}; token ids min "
          f"{batch.min()} max {batch.max()} (n_vocab {cfg.n_vocab}, tokenizer {tok.vocab_size}); "
          f"{int((counts > 0).sum())} distinct ids; <|endoftext|> ({tok.eos_id}) x{int((batch == tok.eos_id).sum())}; "
          f"{source.bytes_per_token:.2f} bytes/token")
    if masked is not None:
        mask_id = with_mask_token(cfg, tok).mlm_mask_token_id
        print(f"masked-LM: {masked.mean():.1%} of positions selected (mlm_mask_prob {cfg.mlm_mask_prob}), "
              f"{int((batch == mask_id).sum())} set to the mask id {mask_id}")
    text = tok.decode(batch[0])
    print(f"first text ({len(text)} characters):\n{text}")


def _check_labelled(source, batch: dict, cfg: Config) -> None:
    """The labelled counterpart: fields and shapes, token id range, and the first example with its label."""
    inputs, real = batch["inputs"], batch["segment_ids"].astype(bool)
    print(source.description)
    print("batch 0: " + ", ".join(f"{k} {v.shape} {v.dtype}" for k, v in batch.items())
          + f"; token ids min {inputs.min()} max {inputs.max()} (n_vocab {cfg.n_vocab}, tokenizer "
          f"{source.tokenizer.vocab_size}); {real.sum(1).mean():.1f} real tokens per example of {inputs.shape[1]}")
    text = source.tokenizer.decode(inputs[0][real[0]])
    labels = batch["labels"][0]
    if labels.ndim == 0 and source.label_names is None:  # a regression's score
        print(f"first example (label {float(labels):.4g}):\n{text}")
        return
    if labels.ndim == 1 and labels.dtype.kind == "f":  # a multi-label example's multi-hot row
        applies = ", ".join(source.label_names[i] for i in np.flatnonzero(labels)) or "none"
        print(f"first example (labels: {applies}):\n{text}")
        return
    if labels.ndim == 0:
        label = int(labels)
        print(f"first example (label {label}: {source.label_names[label]}):\n{text}")
        return
    names = getattr(source, "label_names", None)  # a label per token, -1 where none is scored
    tagged = [f"{source.tokenizer.decode([int(t)])!r}/{names[int(n)] if names else int(n)}"
              for t, n in zip(inputs[0], labels) if n >= 0]
    print(f"first example:\n{text}\nits labelled tokens: {' '.join(tagged)}")


def _check_seq2seq(source, batch: dict, cfg: Config) -> None:
    """Encoder inputs and decoder targets (span corruption or pairs): fields, token id range, the first pair as
    text."""
    inputs, targets = batch["inputs"], batch["targets"]
    print(source.description)
    print("batch 0: " + ", ".join(f"{k} {v.shape} {v.dtype}" for k, v in batch.items())
          + f"; token ids min {min(inputs.min(), targets.min())} max {max(inputs.max(), targets.max())} (n_vocab "
          f"{cfg.n_vocab}, tokenizer {source.tokenizer.vocab_size})")
    tok = source.tokenizer
    print(f"first inputs:\n{tok.decode(inputs[0][batch['segment_ids'][0] > 0])}")
    print(f"first targets:\n{tok.decode(targets[0][batch['target_segment_ids'][0] > 0])}")


def _check_images(source, batch: dict) -> None:
    """Images and their labels: shapes, value range, labels of the batch."""
    images, labels = batch["images"], batch["labels"]
    print(source.description)
    names = getattr(source, "label_names", None) or []
    names = names if len(names) > labels.max() else [str(i) for i in range(int(labels.max()) + 1)]
    print(f"batch 0: images {images.shape} {images.dtype}, values {images.min():.3g} .. {images.max():.3g}; labels "
          f"{labels.shape} {labels.dtype}, per label: "
          + ", ".join(f"{names[i]} {c}" for i, c in enumerate(np.bincount(labels)) if c))
    first = int(labels[0])
    print(f"first image: label {first}{f' ({names[first]})' if names[first] != str(first) else ''}")
