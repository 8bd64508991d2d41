"""The tokenizer a run reads its text with: a pretrained model's own (``init_from``) or a run directory's, where
the task tokenizes its text as it reads it, with a note where data tokenized ahead holds another tokenizer's ids;
and the run's tokenizer written whole or not at all."""

from __future__ import annotations

import os

from training.run_dir import newest_saved_config


def tokenizes_as_read(cfg) -> bool:
    """Whether the task's text is tokenized as it is read (jsonl of labelled examples, questions or seq2seq pairs), so a
    run reads it with its model's tokenizer; text tokenized ahead (TFRecords) keeps its ids."""
    return cfg.task in ("sequence_classification", "token_classification", "question_answering") or (
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
        if own is not None and tokenizes_as_read(cfg):  # the dataset's ids may name other tokens than the model's
            notes.append(f"--init-from {cfg.init_from}: no tokenizer there (tokenizer.json, vocab.json + merges.txt, "
                         f"vocab.txt or spiece.model), so dataset {cfg.datasets[0][0]}'s tokenizer reads the text; "
                         "put the model's own there to fine-tune on its ids")
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


def tokenizer_of_run_for_data(cfg, model_path: str | None, inputs: list[str]) -> str | None:
    """The tokenizer ``train.py --data`` prepares text with where ``model_path`` holds a run that goes on: the run's
    own (its ``tokenizer/``), as its first run prepared its text, so new or changed text gets the ids its weights
    learned (a BPE trained anew on it gives ids to other tokens). A note says so; None for a new run, a run with no
    tokenizer saved, or a config naming its own ``tokenizer_path`` (a note where that is not the run's). A prepared
    folder given as ``--data`` keeps its own ids: a note where its tokenizer is not the run's."""
    from convert.hf_dir import has_tokenizer
    from data.make_dataset import given_dataset_file
    from neomesh.paths import run_tokenizer_dir
    from training.run_dir import has_checkpoint

    if not model_path or cfg.task == "image_classification" or not has_checkpoint(model_path):
        return None
    own = run_tokenizer_dir(model_path)
    if not has_tokenizer(own):  # nothing saved: a run that read bytes, or one whose tokenizer is unknown
        if not read_bytes(model_path):
            return None
        own = "bytes"
    prepared = given_dataset_file(inputs)
    if prepared:  # a prepared folder keeps its own ids
        other = dataset_tokenizer_other_than(cfg.replace(datasets=[[prepared, None, None, None]]), own)
        if other:
            say(f"--data {prepared}: holds the ids of its own tokenizer ({other[1]}), not those of the run's "
                f"({own}), which {model_path}'s weights learned; --data TEXT prepares text with the run's")
        return None
    if cfg.tokenizer_path is not None:
        if tokenizer_differs(cfg.tokenizer_path, own):
            say(f"tokenizer_path: {cfg.tokenizer_path} prepares the text, not the run's own tokenizer ({own}), "
                f"whose ids {model_path}'s weights learned")
        return None
    say(f"--data: the text is prepared with the run's own tokenizer ({own}), whose ids {model_path}'s weights "
        "learned (--new starts a fresh run with a new one)")
    return own


def read_bytes(model_path: str) -> bool:
    """Whether the run in ``model_path`` read its text with the byte tokenizer (a run saves no ``tokenizer/`` for
    it): its newest config's ``tokenizer_path``, else its dataset's, as the data read it."""
    from config import ConfigError
    from data.source import load_dataset_config

    saved = newest_saved_config(model_path) or {}
    path, datasets = saved.get("tokenizer_path"), saved.get("datasets") or []
    if path is None and datasets and not str(datasets[0][0]).startswith("tfds:"):
        try:
            path = load_dataset_config(datasets[0][0]).get("tokenizer_path", "bytes")
        except ConfigError:  # the dataset is gone: its tokenizer is unknown
            return False
    return path == "bytes"


def tokenizer_differs(path: str, other: str) -> bool:
    """Whether the tokenizers at ``path`` and ``other`` give their ids to other tokens."""
    from data.tokenizer import load_tokenizer, tokenizer_hash

    first, second = load_tokenizer(path), load_tokenizer(other)
    return first.vocab_size != second.vocab_size or tokenizer_hash(first) != tokenizer_hash(second)


def say(note: str) -> None:
    """A note printed at once: it explains the data preparation's lines that follow."""
    print(f"note: {note}", flush=True)


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
