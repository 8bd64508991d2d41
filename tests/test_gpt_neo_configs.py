"""GPT-Neo's shipped configs (its 10 configs/, its README's example and its Colab notebook's, copied into
tests/data/gpt_neo_configs/ with GPT-Neo's dataset configs) load as shipped, and each trains 3 steps on 8
simulated devices shrunk only in size (layers, width, heads, context, vocabulary, batch, mesh axis sizes), with its own
layout, sampling mode and every other key, against tiny local TFRecords."""

import glob
import json
import math
import os

import pytest

from config import load_config
from tests.common import metrics_rows
from tests.data_common import use_dataset_configs

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt_neo_configs")
CONFIGS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(HERE, "*.json")))
# The dataset ids the shipped configs name; "" eval paths as in GPT-Neo's example.json.
DATASETS_WITH_EVAL = ("pile", "openwebtext2_new_inputs")
DATASETS_WITHOUT_EVAL = ("openwebtext-documents", "your_dataset_name")


def shipped(name: str) -> dict:
    with open(os.path.join(HERE, f"{name}.json")) as f:
        return json.load(f)


def test_all_twelve_are_here():
    assert len(CONFIGS) == 12
    assert {"colab_GPT3_XL", "readme_GPT3_XL", "gpt2_small", "gpt3_PAR_small_256"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_config_loads_as_shipped(name):
    raw = shipped(name)
    cfg, notes = load_config(os.path.join(HERE, f"{name}.json"))
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.layout) == (raw["n_layer"], raw["n_embd"], raw["n_head"],
                                                                raw["layout"])
    assert all(len(entry) == 4 for entry in cfg.datasets)
    assert any("'iterations' has no effect here" in note for note in notes)
    if "ada_epsilon1" in raw:
        assert (cfg.ada_epsilon1, cfg.ada_epsilon2) == (raw["ada_epsilon1"], raw["ada_epsilon2"])


def test_bare_dataset_names_and_the_model_key():
    cfg, _ = load_config(os.path.join(HERE, "gpt2_small.json"))
    assert cfg.datasets == [["openwebtext2_new_inputs", None, None, None]]
    cfg, notes = load_config(os.path.join(HERE, "colab_GPT3_XL.json"))
    assert cfg.model == "gpt_neo" and any("model 'GPT' is GPT-Neo's name for the gpt_neo family" in n for n in notes)


def shrunk(raw: dict, model_path: str) -> dict:
    """``raw`` shrunk only in size: one repeat of each attention pattern, width 32 over 4 heads, 16-token context,
    a 512-token vocabulary (the byte data needs 257; GPT-Neo's 50,257 took 40% of these runs), batches of 8, one
    eval batch, mesh axes of 4 and 2 (their names kept), microbatches of the same share of a replica's rows."""
    out = dict(raw)
    out["attention_types"] = [[kinds, 1] for kinds, _ in raw["attention_types"]]
    out["n_layer"] = sum(len(kinds) for kinds, _ in raw["attention_types"])
    out.update(n_embd=32, n_head=4, n_ctx=16, train_batch_size=8, eval_batch_size=min(raw["eval_batch_size"], 8),
               train_steps=3, model_path=model_path, sample_tokens=0, eval_steps=min(raw.get("eval_steps", 0), 1),
               n_vocab=512)
    axes = [part.split(":")[0] for part in raw["mesh_shape"].split(",")]
    out["mesh_shape"] = ",".join(f"{axis}:{size}" for axis, size in zip(axes, (8,) if len(axes) == 1 else (4, 2)))
    if raw.get("tokens_per_mb_per_replica"):
        out["tokens_per_mb_per_replica"] = raw["tokens_per_mb_per_replica"] * out["n_ctx"] // raw["n_ctx"]
    return out


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """Train and eval TFRecords (documents mode, byte tokenizer) for every dataset id the configs name."""
    from data.create_tfrecords import create

    root = tmp_path_factory.mktemp("gpt_neo_data")
    for split, count in (("train", 240), ("eval", 40)):
        lines = [json.dumps({"text": f"document {split} {i}: " + "word " * (i % 9)}) for i in range(count)]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        create([str(root / f"{split}.jsonl")], str(root / split), split, "bytes", mode="documents", workers=1)
    body = {"path": str(root / "train" / "train_*.tfrecords"), "tokenizer_path": "bytes", "n_vocab": 257,
            "eos_id": 256, "padding_id": 50257}
    configs = {name: {**body, "eval_path": str(root / "eval" / "eval_*.tfrecords")} for name in DATASETS_WITH_EVAL}
    configs.update({name: {**body, "eval_path": ""} for name in DATASETS_WITHOUT_EVAL})
    return root, configs


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_config_trains_three_steps(name, tiny_data, tmp_path, monkeypatch, capsys):
    import train

    _, dataset_configs = tiny_data
    use_dataset_configs(monkeypatch, tmp_path / "dataset_configs", **dataset_configs)
    raw = shipped(name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(shrunk(raw, str(tmp_path / "run"))))
    assert train.main(["--config", str(path), "--no-progress"]) == 0, capsys.readouterr().err
    rows = metrics_rows(str(tmp_path / "run"))
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
    printed = capsys.readouterr()
    if "vocab:n_vocab" in raw["layout"]:  # the Colab's rule for a mesh axis that does not exist
        assert "warning: layout: 'vocab:n_vocab' names mesh axis 'n_vocab'" in printed.err
    evals = metrics_rows(str(tmp_path / "run"), "eval")
    dataset = raw["datasets"][0] if isinstance(raw["datasets"][0], str) else raw["datasets"][0][0]
    if raw["eval_steps"] and dataset in DATASETS_WITH_EVAL:
        assert len(evals) == 1 and math.isfinite(evals[0]["loss"])
    elif raw["eval_steps"]:
        assert not evals and "evaluation is skipped" in printed.out + printed.err
