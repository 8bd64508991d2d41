"""GPT-Neo's keys, tools and habits in NeoMesh: aliases and translated keys, Adafactor as GPT-Neo ran it (against
a numpy transcription of mesh-tensorflow's AdafactorOptimizer), GPT-Neo's activations (against numpy transcriptions
of its formulas), layouts naming missing mesh axes, dataset config rules, --check-dataset with MLM, --model NAME,
and GPT-Neo's flags on the data tools and predict.py."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train
from config import ConfigError, from_dict, model_config_path
from data.source import NoEvalSet, make_source
from data.tf_import import tensorflow
from models.layers import ACTIVATIONS
from parallel.layout import Layout
from parallel.mesh import make_mesh
from tests.common import ROOT, TINY
from tests.data_common import config, use_dataset_configs, write_tf_records
from training.optimizer import learning_rate_schedule, make_optimizer

tf = tensorflow()  # as the data code imports it (quiet, without Keras)


# ---------------------------------------------------------------------------------------------------------------
# Config keys.

def test_gpt_neo_spellings_and_moe_params_translate():
    cfg, notes = from_dict({**TINY, "activation_fn": "mish", "n_heads": 4, "mlm_mask_id": 5,
                            "datasets": ["pile", ["other", None, None, 2.0]], "moe_layers": [1],
                            "moe_params": {"moe_num_experts": 4, "moe_gating": "switch", "moe_loss_coef": 0.1,
                                           "moe_capacity_factor_train": 2.0, "moe_z_loss": 0.0,
                                           "moe_dropout_rate": 0.0, "moe_group_size": 1024}})
    assert (cfg.activation_function, cfg.n_head, cfg.mlm_mask_token_id) == ("mish", 4, 5)
    assert cfg.datasets == [["pile", None, None, None], ["other", None, None, 2.0]]
    assert cfg.moe == {"num_experts": 4, "top_k": 1, "capacity_factor": 2.0, "aux_loss_weight": 0.1,
                       "z_loss_weight": 0.0}
    assert any("'moe_params.moe_group_size' has no effect here (mesh-tensorflow routed tokens in groups" in n
               for n in notes)
    assert cfg.replace(lr=0.1).moe == cfg.moe  # the translated form is a valid config itself


def test_new_keys_load_with_their_notes():
    cfg, notes = from_dict({**TINY, "ada_epsilon1": 1e-30, "ada_epsilon2": 1e-3, "predict_max_steps": 7,
                            "eval_tasks": ["lambada"], "opt_name": "adafactor", "share_parameters": False,
                            "z_loss": 0.0, "entmax_loss": False, "moe_activation": None, "input_fn": "x"})
    assert cfg.predict_max_steps == 7 and cfg.eval_tasks == ["lambada"]
    text = " ".join(notes)
    assert "eval_tasks" not in text  # evaluated now: no note
    assert "opt_name adafactor runs at the constant lr 0.001, as GPT-Neo's Adafactor did" in text
    assert "'input_fn' has no effect here" in text


# ---------------------------------------------------------------------------------------------------------------
# Adafactor.

def mesh_tf_adafactor(params, grads_per_step, lr, decay, beta1, eps1, eps2):
    """mesh-tensorflow's AdafactorOptimizer.apply_grad (optimize.py there) in numpy: factored second moments for
    tensors whose two largest dims are >= 128, update clipping at RMS 1, parameter-scaled steps, momentum."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    state = {}
    for step, grads in enumerate(grads_per_step):
        rate = 1 - (step + 1) ** -0.8 if decay is None else decay
        for name, p in params.items():
            g = grads[name].astype(np.float64)
            g2 = g * g + eps1
            s = state.setdefault(name, {})
            if p.ndim == 2 and min(p.shape) >= 128:
                s["vr"] = rate * s.get("vr", 0) + (1 - rate) * g2.mean(1)
                s["vc"] = rate * s.get("vc", 0) + (1 - rate) * g2.mean(0)
                x = g / np.sqrt(s["vr"] / s["vr"].mean())[:, None] / np.sqrt(s["vc"])[None, :]
            else:
                s["v"] = rate * s.get("v", 0) + (1 - rate) * g2
                x = g / np.sqrt(s["v"])
            x = x / max(1.0, np.sqrt(np.mean(x * x)))
            update = x * max(np.sqrt(np.mean(p * p)), eps2) * lr
            if beta1:
                s["m"] = beta1 * s.get("m", 0) + (1 - beta1) * update
                update = s["m"]
            params[name] = p - update
    return params


@pytest.mark.parametrize("decay, beta1", [(0.1, 0.9), (None, 0.0)])
def test_adafactor_is_mesh_tensorflows(decay, beta1):
    cfg, _ = from_dict({**TINY, "opt_name": "adafactor", "lr": 0.05, "weight_decay": decay, "beta1": beta1,
                        "ada_epsilon1": 1e-30, "ada_epsilon2": 1e-3, "gradient_clipping": 0.0})
    rng = np.random.default_rng(0)
    params = {"matrix": rng.normal(size=(256, 128)).astype(np.float32),
              "vector": (1e-4 * rng.normal(size=(64,))).astype(np.float32)}  # tiny: the eps2 floor applies
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()} for _ in range(3)]
    tx = make_optimizer(cfg)
    ours, state = {k: jnp.asarray(v) for k, v in params.items()}, None
    state = tx.init(ours)
    for g in grads:
        updates, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, ours)
        ours = {k: ours[k] + updates[k] for k in ours}
    theirs = mesh_tf_adafactor(params, grads, 0.05, decay, beta1, 1e-30, 1e-3)
    for k in params:
        np.testing.assert_allclose(np.asarray(ours[k]), theirs[k], rtol=2e-5, atol=1e-7)
    assert [float(learning_rate_schedule(cfg)(s)) for s in (0, 10, 9999)] == pytest.approx([0.05] * 3)


def test_adam_weight_decay_default():
    cfg, _ = from_dict({**TINY, "lr_decay": "none", "warmup_steps": 0, "lr": 0.1, "gradient_clipping": 0.0})
    params = {"w": jnp.ones((2, 2))}
    tx = make_optimizer(cfg)
    updates, _ = tx.update({"w": jnp.zeros((2, 2))}, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.1 * 0.01, rtol=1e-6)  # null weight_decay: 0.01


# ---------------------------------------------------------------------------------------------------------------
# Activations, from GPT-Neo's models/activations.py formulas.

def _softplus(x):
    return np.log1p(np.exp(x))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


NUMPY_ACTIVATIONS = {
    "abs": np.abs, "sin": np.sin, "cos": np.cos, "sign": np.sign,
    "lrelu001": lambda x: np.where(x > 0, x, 0.01 * x), "lrelu020": lambda x: np.where(x > 0, x, 0.2 * x),
    "id": lambda x: x,
    "triangle_relax": lambda x: np.sin(x) - np.sin(3 * x) / 9 + np.sin(5 * x) / 25 - np.sin(7 * x) / 49,
    "square_relax": lambda x: np.cos(x) - np.cos(3 * x) / 3 + np.cos(5 * x) / 5 - np.cos(7 * x) / 7,
    "spike": lambda x: 1 / (1 + x ** 2), "spike2": lambda x: np.exp(-x ** 2),
    "tanhshrink": lambda x: x - np.tanh(x), "softsign": lambda x: x / (np.abs(x) + 1),
    "softmax": lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True),
    "logsoftmax": lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True)),
    "bipolarsigmoid": lambda x: _sigmoid(x) * 2 - 1,
    "rrelu": lambda x: (0.5 * np.abs(x) + x) / (1 + 0.5),
    "elish": lambda x: (x > 0) * x / (1 + np.exp(x)) + (x <= 0) * (np.exp(x) - 1) / (1 / np.exp(x) + 1),
    "arcsinh": lambda x: np.log(x + np.sqrt(1 + x ** 2)),
    "maxsig": lambda x: np.maximum(x, _sigmoid(x)), "cosid": lambda x: np.cos(x) - x,
    "minsin": lambda x: np.minimum(x, np.sin(x)), "maxtanh": lambda x: np.maximum(x, np.tanh(x)),
    "mish": lambda x: x * np.tanh(_softplus(x)), "tanhexp": lambda x: x * np.tanh(np.exp(x)),
    "lisht": lambda x: x * np.tanh(x), "seagull": lambda x: np.log(1 + x ** 2), "snake": lambda x: x + np.sin(x) ** 2,
    "roottanh": lambda x: (x ** 2 + 1) ** (1 / 3) * np.tanh(x), "softplusmone": lambda x: _softplus(x) - 1,
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
}


@pytest.mark.parametrize("name", sorted(NUMPY_ACTIVATIONS))
def test_gpt_neo_activation_matches_its_formula(name):
    x = np.random.default_rng(0).normal(scale=2.0, size=(3, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(ACTIVATIONS[name](jnp.asarray(x))), NUMPY_ACTIVATIONS[name](x),
                               rtol=1e-5, atol=1e-5)


def test_a_config_trains_with_a_gpt_neo_activation():
    from tests.common import random_batches, tiny_config, train_losses
    cfg = tiny_config(activation_fn="snake", n_layer=1, attention_types=None)
    losses = train_losses(cfg, random_batches(cfg, 1), "x:1", devices=jax.devices()[:1])
    assert np.isfinite(losses).all()


# ---------------------------------------------------------------------------------------------------------------
# Layouts.

def test_layout_rule_for_a_missing_mesh_axis_warns_and_is_dropped(capsys):
    layout = Layout.from_config(make_mesh("x:4,y:2"), "intermediate_expanded:x,heads:x,vocab:n_vocab,embd:y")
    assert dict(layout.rules) == {"intermediate_expanded": ("x",), "heads": ("x",), "embd": ("y",)}
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: layout: 'vocab:n_vocab' names mesh axis 'n_vocab', which is not in mesh_shape "
                   "(axes: x, y); 'vocab' stays whole"]


# ---------------------------------------------------------------------------------------------------------------
# Dataset configs.

@pytest.fixture
def neo_records(tmp_path):
    return write_tf_records(str(tmp_path / "neo_0.tfrecords"), [[5, 6, 7] * 7 + [256]] * 8)


def test_empty_eval_path_means_no_eval_set(neo_records, tmp_path, monkeypatch):
    use_dataset_configs(monkeypatch, tmp_path / "dc", neo={"path": neo_records, "eval_path": "",
                                                           "tokenizer_path": "bytes"},
                        wiki={"path": "", "eval_path": neo_records, "tokenizer_path": "bytes"})
    with pytest.raises(NoEvalSet, match=r"datasets: no eval set \('eval_path' is empty in "
                                        r"configs/dataset_configs/neo.json\)"):
        make_source(config([["neo", None, None, None]]), "eval")
    by_path = str(tmp_path / "dc" / "neo.json")  # the file read, not a name under configs/dataset_configs/
    with pytest.raises(NoEvalSet, match=rf"^datasets: no eval set \('eval_path' is empty in {by_path}\)$"):
        make_source(config([[by_path, None, None, None]]), "eval")
    assert make_source(config([["neo", None, None, None], ["wiki", None, None, None]]), "eval").files == [
        neo_records]  # the dataset with an eval set is evaluated, the other left out
    with pytest.raises(ConfigError, match="wiki.json: 'path' is empty: an eval-only dataset config"):
        make_source(config([["wiki", None, None, None]]), "train")


def test_eos_id_and_hub_tokenizer_names_are_one_line_errors(neo_records, tmp_path, monkeypatch):
    use_dataset_configs(monkeypatch, tmp_path / "dc", example={"path": neo_records, "tokenizer_path": "bytes",
                                                               "eos_id": 1},
                        pile={"path": neo_records, "tokenizer_path": "gpt2", "tokenizer_is_pretrained": True})
    with pytest.raises(ConfigError, match="example.json: eos_id 1 is not the tokenizer's end-of-text id 256"):
        make_source(config([["example", None, None, None]]), "train")
    with pytest.raises(ConfigError, match=r"^configs/dataset_configs/pile.json tokenizer_path: '.*gpt2' does not "
                                          r"exist; a hub name like 'gpt2' works only as a local folder with "
                                          r"tokenizer.json, vocab.json \+ merges.txt or vocab.txt"):
        make_source(config([["example", None, None, None], ["pile", None, None, None]]), "train")


def test_check_dataset_with_mlm_training(neo_records, tmp_path, monkeypatch, capsys):
    use_dataset_configs(monkeypatch, tmp_path / "dc", neo={"path": neo_records, "eval_path": neo_records,
                                                           "tokenizer_path": "bytes"})
    args = ["--config", os.path.join(ROOT, "configs/quickstart.json"), "--check-dataset", "--set",
            'datasets=[["neo", null, null, null]]', "--set", "n_ctx=16", "--set", "mlm_training=true",
            "--set", "mlm_mask_token_id=3", "--set", "mlm_mask_prob=0.5", "--set", "train_batch_size=8",
            "--set", "causal=false"]
    assert train.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "batch 0 inputs: shape (8, 16) int32" in out and "masked-LM: " in out and "first text (" in out
    assert "its first batch of 16 was read" in out  # the eval split, read as train.py reads it at start


# ---------------------------------------------------------------------------------------------------------------
# Command lines.

def test_model_name_resolves_configs_name_json(capsys):
    assert model_config_path("quickstart") in ("configs/quickstart.json",
                                                os.path.join(ROOT, "configs", "quickstart.json"))
    assert model_config_path("x/y.json") == "x/y.json"
    with pytest.raises(ConfigError, match=r"--model quickstrat: no configs/quickstrat.json; did you mean --model "
                                          r"quickstart\? \(known: .*quickstart"):
        model_config_path("quickstrat")
    args = train.parse_args(["--model", "quickstart"])
    assert (args.model, args.model_path, args.config) == ("quickstart", None, None)  # not --model-path
    assert train.main(["--model", "quickstrat"]) == 2
    assert capsys.readouterr().err.startswith("error: --model quickstrat: no configs/quickstrat.json")


def test_model_name_finds_the_shipped_configs_of_an_installed_copy(tmp_path, monkeypatch):
    """Installed, the shipped configs are package data (neomesh/configs), not a configs/ beside config.py."""
    shipped = tmp_path / "site-packages" / "neomesh" / "configs"
    shipped.mkdir(parents=True)
    (shipped / "quickstart.json").write_text("{}")
    monkeypatch.setattr("neomesh.paths.configs_dir", lambda: str(shipped))
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert model_config_path("quickstart") == str(shipped / "quickstart.json")
    with pytest.raises(ConfigError, match=r"--model quickstat: .*did you mean --model quickstart\? \(known: "
                                          r"quickstart;"):
        model_config_path("quickstat")


def read_records(path):
    parse = lambda r: tf.io.parse_single_example(r, {"text": tf.io.VarLenFeature(tf.int64)})["text"].values  # noqa
    return [parse(r).numpy().tolist() for r in tf.data.TFRecordDataset(str(path))]


def test_create_tfrecords_takes_gpt_neo_flags(tmp_path, monkeypatch, capsys):
    from data import create_tfrecords
    import data.source

    monkeypatch.setattr(data.source, "DATASET_CONFIG_DIR", str(tmp_path))
    (tmp_path / "in").mkdir()
    texts = ["Mo @-@ del ( a ) ok", "x", "Ã©tÃ© = = Heading = = done"]  # mojibake for ftfy, WikiText spacing
    (tmp_path / "in" / "wiki.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    argv = ["--input_dir", str(tmp_path / "in"), "--name", "wiki", "--output_dir", str(tmp_path / "out"),
            "--encoder_path", "bytes", "--chunk_size", "4", "--processes", "1", "--files_per", "3",
            "--minimum_size", "2", "--separator", "0", "--ftfy", "--wikitext-detokenize", "--write_dataset_config"]
    assert create_tfrecords.main(argv) == 0, capsys.readouterr().err
    cleaned = ["Mo-del (a) ok", "été == Heading == done"]  # "x" is under --minimum_size 2
    stream = [t for text in cleaned for t in list(text.encode()) + [0]]
    files = sorted((tmp_path / "out").glob("wiki_*.tfrecords"))
    records = [r for f in files for r in read_records(f)]
    assert [t for r in records for t in r] == stream
    assert all(len(r) == 5 for r in records[:-1])  # GPT-Neo's --chunk_size is n_ctx: records of chunk_size + 1
    assert [len(read_records(f)) for f in files[:-1]] == [3] * (len(files) - 1)
    index = json.loads((tmp_path / "out" / "wiki.index").read_text())
    assert index["totals"]["dropped_documents"] == 1 and index["separator"] == [0]
    assert "1 documents under --minimum-size 2 were dropped" in capsys.readouterr().out
    dataset = json.loads((tmp_path / "wiki.json").read_text())
    assert dataset["path"] == str(tmp_path / "out" / "wiki_*.tfrecords") and dataset["n_vocab"] == 257


def test_create_tfrecords_writes_no_empty_file(tmp_path, capsys):
    """An input left with no record (every document under --minimum_size, a .jsonl of blank lines) gets no
    0-byte file, which training refuses as a failed write; it is counted, and with nothing at all to write the
    command fails naming the input."""
    from data import create_tfrecords
    from data.tfrecords import list_files

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a long enough document")
    (tmp_path / "in" / "b.txt").write_text("x")
    (tmp_path / "in" / "c.jsonl").write_text("\n\n")
    argv = ["--input_dir", str(tmp_path / "in"), "--name", "n", "--output_dir", str(tmp_path / "out"),
            "--encoder_path", "bytes", "--processes", "1", "--minimum_size", "2"]
    assert create_tfrecords.main(argv) == 0, capsys.readouterr().err
    assert [os.path.basename(f) for f in list_files(str(tmp_path / "out" / "n_*.tfrecords"), "path")] == \
        ["n_00000.tfrecords"]
    index = json.loads((tmp_path / "out" / "n.index").read_text())
    assert index["no_records"] == [{"input": str(tmp_path / "in" / "b.txt"), "dropped_documents": 1},
                                   {"input": str(tmp_path / "in" / "c.jsonl"), "dropped_documents": 0}]
    assert index["totals"]["dropped_documents"] == 1
    assert "2 input file(s) gave no record, so no file" in capsys.readouterr().out
    argv[1] = str(tmp_path / "in" / "b.txt")
    assert create_tfrecords.main(argv + ["--output_dir", str(tmp_path / "out2")]) == 2
    assert capsys.readouterr().err == (f"error: --input: no record to write from 1 file(s) ({tmp_path}/in/b.txt): "
                                       "every document is under --minimum-size 2 (1 dropped)\n")
    assert not list((tmp_path / "out2").glob("*.tfrecords*"))


def test_create_tfrecords_rerun_leaves_no_file_of_the_run_before(tmp_path, capsys):
    """Run again under the same name with fewer files, the files the replaced index listed are removed: they matched
    NAME_*.tfrecords and were trained on, unlisted and unchecked, beside this run's."""
    from data import create_tfrecords

    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt").write_text(f"document {i}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "n_99999.tfrecords").write_bytes(b"the user's own")  # not in the index: kept
    argv = ["--output_dir", str(tmp_path / "out"), "--name", "n", "--encoder_path", "bytes", "--processes", "1"]
    assert create_tfrecords.main(["--input_dir", str(tmp_path / "in"), *argv, "--files_per", "1"]) == 0
    assert create_tfrecords.main(["--input_dir", str(tmp_path / "in" / "0.txt"), *argv]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["n.index", "n_00000.tfrecords", "n_99999.tfrecords"]
    assert ("removed 3 file(s) the previous n.index listed and this run did not write (n_00000_00000.tfrecords, "
            "...), so that n_*.tfrecords matches only this run's files") in capsys.readouterr().out


def test_create_tfrecords_errors(tmp_path, monkeypatch, capsys):
    from data import create_tfrecords

    (tmp_path / "a.txt").write_text("hello")
    base = ["--input", str(tmp_path / "a.txt"), "--output_dir", str(tmp_path / "o"), "--name", "n"]
    assert create_tfrecords.main(base) == 2
    assert "--tokenizer (GPT-Neo's --encoder_path) is required" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ftfy", None)  # as if ftfy were not installed
    assert create_tfrecords.main(base + ["--tokenizer", "bytes", "--ftfy"]) == 2
    assert capsys.readouterr().err == "error: --ftfy needs the ftfy package (pip install ftfy)\n"
    assert create_tfrecords.main(base + ["--tokenizer", "bytes", "--separator", "300"]) == 2
    assert "--separator: id 300 is outside the tokenizer's [0, 257)" in capsys.readouterr().err


def test_train_tokenizer_takes_gpt_neo_flags(tmp_path, capsys):
    from data import train_tokenizer
    from data.tokenizer import load_tokenizer

    (tmp_path / "txt").mkdir()
    for i in range(3):
        (tmp_path / "txt" / f"{i}.txt").write_text(f"some text number {i} " * 50)
    (tmp_path / "txt" / "skip.jsonl").write_text('{"text": "not a txt file"}\n')
    argv = ["--base_dir", str(tmp_path / "txt"), "--file_type", "txt", "--output_dir", str(tmp_path / "tok"),
            "--vocab_size", "270"]
    assert train_tokenizer.main(argv) == 0
    assert "trained on 3 documents" in capsys.readouterr().out
    assert load_tokenizer(str(tmp_path / "tok")).vocab_size == 270
    assert train_tokenizer.main(argv[:3] + ["xz"] + argv[4:]) == 2
    assert "--file_type xz: lm_dataformat archives are not read here" in capsys.readouterr().err


def test_predict_prompt_files_output_and_predict_max_steps(tmp_path, capsys, monkeypatch):
    import predict
    from convert.hf import import_hf
    from tests import hf_fixtures

    run = str(tmp_path / "run")
    import_hf(hf_fixtures.save(hf_fixtures.gpt_neo(n_layer=2), tmp_path / "hf"), run)
    (tmp_path / "p1.txt").write_text("def add(a, b):\n    return")
    (tmp_path / "p2.txt").write_text("class A:\n")
    argv = ["--model-path", run, "--prompt-from-file", str(tmp_path / "p1.txt"), "--prompt-from-file",
            str(tmp_path / "p2.txt"), "--output", str(tmp_path / "out.txt"), "--set", "predict_max_steps=3",
            "--temperature", "0"]
    assert predict.main(argv) == 0, capsys.readouterr().err
    written = (tmp_path / "out.txt").read_text()
    assert written.startswith("=== prompt 1 ===\ndef add(a, b):\n    return")
    assert "=== prompt 2 ===\nclass A:\n" in written
    assert written.strip() in capsys.readouterr().out
    explicit = argv[:6] + ["--output", str(tmp_path / "explicit.txt"), "--temperature", "0"]
    assert predict.main(explicit + ["--max-new-tokens", "3"]) == 0  # predict_max_steps: the default
    assert (tmp_path / "explicit.txt").read_text() == written
    assert predict.main(explicit + ["--max-new-tokens", "8"]) == 0
    assert len((tmp_path / "explicit.txt").read_text()) > len(written)
    monkeypatch.chdir(tmp_path)  # a short name: the prompt is the name's text, and must fit the tiny model's n_ctx
    assert predict.main(["--model-path", run, "--prompt", "p2.txt", "--max-new-tokens", "1"]) == 0, \
        capsys.readouterr().err
    assert "is used as text; for that file's contents use --prompt-from-file" in capsys.readouterr().err


def test_export_refuses_activations_hugging_face_lacks(tmp_path):
    from convert.hf import export_params
    with pytest.raises(ConfigError, match="export: activation_function 'snake' has no Hugging Face equivalent"):
        export_params(from_dict({**TINY, "activation_function": "snake"})[0], {}, str(tmp_path / "hf"))
