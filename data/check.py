"""``train.py --check-dataset``: look at what the model would be fed before spending compute on it."""

from __future__ import annotations

import numpy as np

from config import Config


def check_dataset(cfg: Config, batch_size: int | None = None) -> None:
    """Builds the train source, decodes its first batch and prints the token id range, counts and first text.
    With ``mlm_training`` the batch is a dict: its ``inputs`` are described, with the masked share."""
    from data.source import make_source, with_mask_token

    source = make_source(cfg, "train")
    batch = source.batch(0, batch_size or cfg.train_batch_size)  # (B, n_ctx+1), or MLM's dict of (B, n_ctx)
    masked = None
    if isinstance(batch, dict):
        masked = batch["mask"]
        batch = batch["inputs"]
    tok = source.tokenizer
    if isinstance(batch, dict) and "labels" in batch:  # labelled examples (task sequence_classification)
        return _check_labelled(source, batch, cfg)
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
    label = int(batch["labels"][0])
    print(f"first example (label {label}: {source.label_names[label]}):\n{source.tokenizer.decode(inputs[0][real[0]])}")
