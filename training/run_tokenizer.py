"""The tokenizer a run reads its text with: a pretrained model's own (``init_from``) or a run directory's, where
the task tokenizes its text as it reads it, with a note where data tokenized ahead holds another tokenizer's ids;
and the run's tokenizer written whole or not at all."""

from __future__ import annotations

import os

from training.run_dir import newest_saved_config


def tokenizes_as_read(cfg) -> bool:
    """Whether the task's text is tokenized as it is read (jsonl of labelled examples or of seq2seq pairs), so a
    run reads it with its model's tokenizer; text tokenized ahead (TFRecords) keeps its ids."""
    return cfg.task in ("sequence_classification", "token_classification") or (
        cfg.task == "seq2seq" and not cfg.span_corruption)


SAMPLE_TEXT = "def add(a, b):\n    return a + b  # Hello, World! 42"


def with_tokenizer_of_init_from(cfg, notes: list):
    """Fine-tuning reads text with the pretrained model's own tokenizer: jsonl tokenized as it is read (a
    classifier's labelled text, seq2seq pairs) gets it as ``tokenizer_path``; data tokenized ahead (TFRecords)
    keeps its ids, and a note says so where its tokenizer is not the model's (the ids would name other tokens)."""
    from training.init_from import has_tokenizer, source_tokenizer

    if cfg.tokenizer_path is not None:
        return cfg
    own = source_tokenizer(cfg.init_from)
    if not has_tokenizer(own):
        return cfg
    if tokenizes_as_read(cfg):
        return cfg.replace(tokenizer_path=own)
    other = dataset_tokenizer_other_than(cfg, own)
    if other:
        notes.append(f"--init-from {cfg.init_from}: dataset {other[0]} holds the ids of its own tokenizer "
                     f"({other[1]}), not this model's; fine-tuning on them teaches other tokens (train.py --data "
                     "FOLDER --init-from prepares text with the model's tokenizer)")
    return cfg


def dataset_tokenizer_other_than(cfg, own: str) -> tuple[str, str] | None:
    """(dataset name, its tokenizer_path) where the config's dataset reads text with another tokenizer than
    ``own`` (their sizes or ids of a sample differ); None where they agree, or the dataset's is not there yet
    (prepared on first use) or is TFDS's."""
    from data.source import load_dataset_config
    from data.tokenizer import load_tokenizer

    name = cfg.datasets[0][0]
    theirs = None if name.startswith("tfds:") else load_dataset_config(name).get("tokenizer_path", "bytes")
    if theirs is None or (theirs != "bytes" and not os.path.exists(theirs)):
        return None
    data, model = load_tokenizer(theirs), load_tokenizer(own)
    differ = data.vocab_size != model.vocab_size or data.encode(SAMPLE_TEXT) != model.encode(SAMPLE_TEXT)
    return (name, theirs) if differ else None


def with_tokenizer_of_run(cfg, notes: list):
    """A classifier (or seq2seq on pairs) going on in a run directory reads its text with the run's own tokenizer
    (its ``tokenizer/``, written by training and by ``convert import``), as predict.py and export read it: the
    dataset config's would feed the weights other ids (an imported BERT trained on bytes). A note says so where
    they differ."""
    from convert.hf_dir import has_tokenizer
    from neomesh.paths import run_tokenizer_dir

    own = run_tokenizer_dir(cfg.model_path)
    if not tokenizes_as_read(cfg) or cfg.tokenizer_path is not None \
            or not has_tokenizer(own) or not newest_saved_config(cfg.model_path):
        return cfg
    other = dataset_tokenizer_other_than(cfg, own)
    if other:
        notes.append(f"{cfg.model_path}: its text is read with the run's own tokenizer ({own}), not dataset "
                     f"{other[0]}'s ({other[1]}), whose ids its weights never saw")
    return cfg.replace(tokenizer_path=own)


def save_tokenizer(tokenizer, path: str) -> None:
    """Writes the run's tokenizer whole or not at all (a full disk must not leave half a tokenizer.json)."""
    from config import ConfigError

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    try:
        tokenizer.save(tmp)
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions for I/O errors
        if os.path.exists(tmp):
            os.remove(tmp)
        raise ConfigError(f"{path}: could not write the tokenizer ({str(e).splitlines()[0][:160]})") from None
