"""How much of the eval split one evaluation reads: the eval stream repeats its split without end, so an eval split
smaller than ``eval_steps`` batches is read several times over by every evaluation, silently; and examples held in
memory (classifiers, images) are read once, in order, so one larger than ``eval_steps`` batches is scored only in
part, silently too.

Evaluation is not capped to one pass: every evaluation reads the same windows, so eval losses stay comparable
within a run and with runs that evaluated before; a note at start says how often the split repeats instead.
"""

from __future__ import annotations


def split_tokens(source) -> int | None:
    """Tokens the eval split of ``source`` holds, where that says how many windows it gives (None otherwise)."""
    from data.source import WindowSource
    from data.tf_source import TFDataSource
    from data.tfrecords import read_indexes

    if isinstance(source, WindowSource):
        return len(source.tokens)
    if isinstance(source, TFDataSource):
        indexes = read_indexes(source.files)
        if len(indexes) == len(source.files):  # every file's token count is known
            return sum(entry["tokens"] for entry in indexes.values())
    return None


def repeat_note(source, cfg) -> str | None:
    """The note for an eval split that one evaluation reads more than once, or (examples held in memory) only in part;
    None when it reads it once, or the split's size in windows is not known (documents-mode windows)."""
    from data.labelled import ExampleStream
    from data.source import window_length

    if isinstance(source, ExampleStream):  # rows past the last example weigh 0: only too few rows miss any
        read, held = cfg.eval_steps * cfg.eval_batch_size, len(source)
        return None if read >= held else (
            f"note: the eval split holds {held:,} {source.row_name}, but one evaluation reads {read:,} (eval_steps "
            f"{cfg.eval_steps} x eval_batch_size {cfg.eval_batch_size}): eval rows score only its first {read:,}; "
            f"eval_steps {-(-held // cfg.eval_batch_size)} reads them all")
    if any(entry[2] not in (None, "chunks") for entry in cfg.datasets):
        return None  # a documents-mode window takes one group of documents, however many tokens it has
    tokens = split_tokens(source)
    window = window_length(cfg)
    per_batch = cfg.eval_batch_size * window
    read = cfg.eval_steps * per_batch
    if tokens is None or read <= tokens:
        return None
    fewer = (f"eval_steps {max(1, tokens // per_batch)} would read it about once" if tokens >= per_batch else
             "it is smaller than one eval batch")
    return (f"note: the eval split holds {tokens:,} tokens, but one evaluation reads {read:,} (eval_steps "
            f"{cfg.eval_steps} x eval_batch_size {cfg.eval_batch_size} x {window} tokens): the same windows about "
            f"{read / tokens:,.{1 if read < 10 * tokens else 0}f} times over, every evaluation alike (eval losses stay "
            "comparable, but rest on "
            f"those {tokens:,} tokens; {fewer})")
