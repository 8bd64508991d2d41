"""The note for an eval split that one evaluation reads more than once, or only in part (training/eval_reads.py)."""

import neomesh.paths
from data.make_dataset import config_for_data
from data.source import make_source
from tests.common import tiny_config
from training.eval_reads import repeat_note


def test_an_eval_split_smaller_than_one_evaluation_is_named_with_its_repeats(tmp_path, monkeypatch):
    monkeypatch.setattr(neomesh.paths, "work_root", lambda: str(tmp_path))  # data_cache/ under tmp_path
    book = tmp_path / "book.txt"
    book.write_text("".join(f"line {i} of the book\n" for i in range(200)))  # eval: the last 10 lines, 208 bytes
    cfg = config_for_data(tiny_config(n_vocab=300, n_ctx=32, tokenizer_path="bytes", eval_steps=4,
                                      eval_batch_size=4), [str(book)])
    source = make_source(cfg, "eval")
    note = repeat_note(source, cfg)
    assert note is not None and note.startswith("note: the eval split holds ")
    tokens = int(note.split("holds ")[1].split(" tokens")[0].replace(",", ""))
    assert 200 <= tokens <= 230  # the held-out bytes (and an end of text)
    assert f"one evaluation reads 512 (eval_steps 4 x eval_batch_size 4 x 32 tokens): the same windows about " \
           f"{512 / tokens:.1f} times over" in note and "eval_steps 1 would read it about once" in note
    assert repeat_note(source, cfg.replace(eval_steps=1)) is None  # 128 tokens: read once at most
    assert "it is smaller than one eval batch" in repeat_note(source, cfg.replace(eval_batch_size=8))
    documents = cfg.replace(datasets=[[cfg.datasets[0][0], None, "documents_fixed", None]])
    assert repeat_note(source, documents) is None  # a window per document: tokens do not count windows


def test_labelled_examples_that_one_evaluation_does_not_reach_are_named(tmp_path, monkeypatch):
    # Classifier examples are read once in order: eval rows silently scored only the first eval_steps batches.
    import json

    from tests.data_common import use_dataset_configs

    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": f"review {i}", "label": i % 2}) + "\n" for i in range(10)))
    use_dataset_configs(monkeypatch, tmp_path / "dc", reviews={"path": str(path), "eval_path": str(path),
                                                               "tokenizer_path": "bytes"})
    cfg = tiny_config(n_vocab=300, n_ctx=16, datasets=[["reviews", None, None, None]],
                      task="sequence_classification", num_labels=2, eval_steps=2, eval_batch_size=4)
    source = make_source(cfg, "eval")
    assert repeat_note(source, cfg) == ("note: the eval split holds 10 examples, but one evaluation reads 8 "
                                        "(eval_steps 2 x eval_batch_size 4): eval rows score only its first 8; "
                                        "eval_steps 3 reads them all")
    assert repeat_note(source, cfg.replace(eval_steps=3)) is None  # the last batch's filler rows weigh 0
