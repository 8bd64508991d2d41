"""``--init-from`` a NeoMesh run directory: the new model takes the run's shape, including what no Hugging Face
config holds (rotary positions here), and its weights with LoRA merged in, so it computes what the run did."""

import os

import jax
import numpy as np

from config import from_dict
from tests.common import run_command

TINY = ['datasets=[["embedded", null, null, null]]', "n_vocab=257", "n_layer=1", 'attention_types=[[["global"],1]]',
        "n_embd=32", "n_head=2", "n_ctx=16", "train_batch_size=8", "train_steps=1", "warmup_steps=1", "eval_every=0",
        "eval_steps=1", "sample_tokens=0"]


def test_a_run_started_from_a_lora_run_computes_what_it_computed(tmp_path):
    from training import init_from
    from parallel.state import init_params, place_params, sharded_abstract_params
    from pretrained import Pretrained, default_layout
    from training.peft import build_model

    source = str(tmp_path / "source")
    sets = TINY + ["rotary_emb=true", 'peft={"lora": {"targets": ["q", "v"]}, "trainable": ["lora"]}', "lr=0.05",
                   "train_steps=2"]  # step 1 has lr 0 (warmup)
    trained = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", source, "--no-progress",
                          *[arg for s in sets for arg in ("--set", s)])
    assert trained.returncode == 0, trained.stderr[-2000:]
    cfg = from_dict(dict(n_vocab=257, n_layer=1, attention_types=[[["global"], 1]], n_embd=32, n_head=2, n_ctx=16,
                         init_from=source))[0]
    notes = []
    cfg = init_from.with_architecture_of(cfg, "--init-from", notes)
    assert cfg.rotary_emb and "rotary_emb true" in notes[0], notes
    params = init_from.imported_params(cfg, source)
    assert not any("lora" in str(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0])
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    graphdef, abstract = sharded_abstract_params(make_model, default_layout())
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    placed = place_params(params, abstract, lambda: init_params(make_model, cfg.seed, shardings))
    theirs = Pretrained.from_pretrained(source)
    ours = Pretrained(cfg, graphdef, placed, theirs.tokenizer)
    text = ["def add(a, b):\n    return a + b"]
    lora_b = [np.asarray(v) for path, v in jax.tree_util.tree_flatten_with_path(
        Pretrained.from_pretrained(source).params)[0] if "lora_b" in str(path)]
    assert lora_b and any(np.abs(b).max() > 0 for b in lora_b)  # the LoRA update is there to be merged
    np.testing.assert_allclose(np.asarray(ours(text)), np.asarray(theirs(text)), rtol=0, atol=1e-5)


def test_init_from_a_run_with_a_prefix_is_one_line(tmp_path):
    """Prefixes change the computation, not a weight: a run started from one would silently compute another model."""
    source, new = str(tmp_path / "source"), str(tmp_path / "new")
    sets = [arg for s in TINY for arg in ("--set", s)]
    trained = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", source, "--no-progress",
                          *sets, "--set", 'peft={"prefix": {"length": 2}}')
    assert trained.returncode == 0, trained.stderr[-2000:]
    refused = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", new, "--no-progress",
                          "--init-from", source, *sets)
    assert refused.returncode != 0 and refused.stderr.splitlines() == [
        f"error: --init-from {source}: it trains peft.prefix, which changes the computation rather than a weight, so "
        f"a new run cannot start from it (only LoRA merges into the weights); go on with it in its own directory "
        f"(--model-path {source})"], refused.stderr
    assert not (tmp_path / "new").exists()


def test_a_base_fingerprint_tells_another_model_and_names_what_changed(tmp_path):
    """init_from.json's fingerprint: sizes and sampled pieces of a Hugging Face directory's weights and config, a
    Hub snapshot's revision, a run's newest checkpoint step; each difference in words."""
    from training.base_identity import PIECE, PIECES, changes, fingerprint

    hf = tmp_path / "hub" / "snapshots" / "abc123"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text('{"n_embd": 32}')
    (hf / "model.safetensors").write_bytes(bytes(3 * PIECES * PIECE))
    (hf / "tokenizer.json").write_text("{}")  # not the model's weights: not taken
    then = fingerprint(str(hf))
    assert then["revision"] == "abc123" and sorted(then["files"]) == ["config.json", "model.safetensors"]
    assert changes(then, fingerprint(str(hf))) == []
    with open(hf / "model.safetensors", "r+b") as f:  # one byte of the first piece
        f.write(b"\1")
    (hf / "config.json").write_text('{"n_embd": 33}')
    assert changes(then, fingerprint(str(hf))) == ["config.json has other contents",
                                                   "model.safetensors has other contents"]
    (hf / "model.safetensors").write_bytes(bytes(10))
    assert changes(then, fingerprint(str(hf)))[1] == f"model.safetensors has 10 bytes, not {3 * PIECES * PIECE}"
    run = tmp_path / "run"
    (run / "checkpoints" / "2" / "params").mkdir(parents=True)
    (run / "checkpoints" / "2" / "params" / "data").write_bytes(b"weights")
    then = fingerprint(str(run))
    assert then["step"] == 2 and list(then["files"]) == [os.path.join("params", "data")]
    (run / "checkpoints" / "4").mkdir()
    assert changes(then, fingerprint(str(run))) == ["its newest checkpoint was step 2, now 4"]


def test_init_from_a_sibling_family_names_set_model(tmp_path):
    """A RoBERTa checkpoint given to configs/bert_classify.json was told only to name a roberta config, and none
    ships: bert and roberta (as gpt_neo and gpt2) are one module, so --set model=roberta is the short way."""
    import pytest

    from config import ConfigError
    from tests import hf_fixtures
    from training.init_from import with_architecture_of

    source = hf_fixtures.save(hf_fixtures.encoder(kind="roberta", head="sequence_classification"), tmp_path / "hf")
    cfg = from_dict(dict(model="bert", task="sequence_classification", num_labels=3, init_from=source))[0]
    with pytest.raises(ConfigError, match=rf"^--init-from {source}: a roberta model, but the config's model is bert; "
                                          r"--set model=roberta keeps this config's task and data, or name a config "
                                          r"of the roberta family with --config$"):
        with_architecture_of(cfg, "--init-from", [])
    assert with_architecture_of(cfg.replace(model="roberta"), "--init-from", []).model == "roberta"
