"""Bad input to every command is exit code 2 and exactly one line on stderr that names the culprit.

Each case runs the command's ``main(argv)`` in this process (no subprocess, no model built, no step trained):
config mistakes fail before jax is needed, the others at the first check that sees them. Argument-parser usage
errors (an unknown flag, a bad value) are one line too: tests/test_cli_help.py.
"""

import json
import os
import shutil
import signal

import numpy as np
import pytest
from safetensors.numpy import save_file

import predict
import train
from data import create_tfrecords, train_tokenizer
from convert.__main__ import main as convert_main
from training.run_lock import RunLock

CLIS = {"train": train.main, "predict": predict.main, "convert": convert_main, "tokenizer": train_tokenizer.main,
        "tfrecords": create_tfrecords.main}
EMBEDDED = ["--set", 'datasets=[["embedded",null,null,null]]', "--set", "n_vocab=257", "--set", "sample_tokens=0"]
NEO = {"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "max_position_embeddings": 16,
       "vocab_size": 257, "attention_types": [[["global"], 1]]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad files of every kind, named by what is wrong with them."""
    d = tmp_path_factory.mktemp("bad")
    (d / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    (d / "invalid.json").write_text('{"n_layer": 2,, }')
    (d / "array.json").write_text("[1, 2]")
    (d / "a_directory.json").mkdir()
    (d / "nan_lr.json").write_text('{"lr": NaN}')
    (d / "binary.txt").write_bytes(b"def \xff\xfe\n")
    (d / "empty.txt").write_text("\n\n")
    (d / "text.txt").write_text("def add(a, b):\n    return a + b\n")
    (d / "bad_line.jsonl").write_text('{"text": "ok"}\nnot json\n')
    (d / "empty_run").mkdir()
    (d / "a_run" / "checkpoints").mkdir(parents=True)
    (d / "tokenizer_file_run" / "checkpoints").mkdir(parents=True)
    (d / "tokenizer_file_run" / "tokenizer").write_text("{}")  # a tokenizer.json copied to the folder's name
    for name, config, weights in [
            ("hf_no_config", None, None), ("hf_bad_json", "{not json", None), ("hf_no_weights", NEO, None),
            ("hf_garbage_weights", NEO, b"\x00garbage" * 10), ("hf_nan_weights", NEO, "nan"),
            ("hf_t5", {**NEO, "model_type": "t5"}, "ok"), ("hf_binary_config", b"\xff\xd8\xff", None),
            ("hf_no_width", {k: v for k, v in NEO.items() if k != "hidden_size"}, "ok"),
            ("hf_null_ffn", {**NEO, "model_type": "t5", "d_model": 32, "d_ff": 64, "feed_forward_proj": None}, "ok")]:
        hf_dir = d / name
        hf_dir.mkdir()
        if isinstance(config, dict):
            (hf_dir / "config.json").write_text(json.dumps(config))
        elif isinstance(config, str):
            (hf_dir / "config.json").write_text(config)
        elif isinstance(config, bytes):
            (hf_dir / "config.json").write_bytes(config)
        if isinstance(weights, bytes):
            (hf_dir / "model.safetensors").write_bytes(weights)
        elif weights:
            value = np.full((4, 4), np.nan if weights == "nan" else 0.5, np.float32)
            save_file({"transformer.wte.weight": value}, str(hf_dir / "model.safetensors"))
    (d / "locked_run").mkdir()
    lock = RunLock(str(d / "locked_run"))
    lock.acquire()
    yield d
    lock.release()


def T(*args):
    """train.py arguments; a temporary run directory unless the case names its own, and a one-step run on the
    in-memory corpus, so that a case that wrongly passes costs seconds, not a quickstart."""
    return ["--config", "configs/quickstart.json", "--no-progress", "--model-path", "{d}/run", "--set",
            "train_steps=1", "--set", "eval_steps=0", *EMBEDDED, *args]


CASES = [
    # train.py: the config file itself.
    ("train", ["--config", "{d}/missing.json"], "{d}/missing.json: config file not found"),
    ("train", ["--config", "{d}/a_directory.json"], "{d}/a_directory.json: is a directory"),
    ("train", ["--config", "{d}/binary.json"], "{d}/binary.json: not a JSON text file"),
    ("train", ["--config", "{d}/invalid.json"], "{d}/invalid.json: invalid JSON at line 1"),
    ("train", ["--config", "{d}/array.json"], "{d}/array.json: expected a JSON object"),
    ("train", ["--config", "{d}/nan_lr.json"], "lr: nan is not a finite number"),
    # train.py: keys.
    ("train", T("--set", "n_embed=64"), "unknown key 'n_embed'; did you mean 'n_embd'"),
    ("train", T("--set", "n_layer=two"), "n_layer: expected int"),
    ("train", T("--set", "n_layer=0"), "n_layer: 0 is below the minimum 1"),
    ("train", T("--set", "opt_name=sgd"), "opt_name: \"sgd\" is not one of"),
    ("train", T("--set", "n_head=5"), "n_embd: 192 is not divisible by n_head 5"),
    ("train", T("--set", "lr=-Infinity"), "lr: -inf is not a finite number"),
    ("train", T("--set", "max_bad_steps=0"), "max_bad_steps: 0 is below the minimum 1"),
    ("train", T("--set", "grad_spike_factor=-2"), "grad_spike_factor: -2 is below the minimum 0"),
    ("train", T("--set", "attention_types=[[[\"global\"],3]]"), "attention_types: expands to 3 layers"),
    ("train", T("--set", "res_dropout=1.5"), "res_dropout: 1.5 is above the maximum 1.0"),
    ("train", T("--set", "keep_checkpoints=0"), "keep_checkpoints: 0 is below the minimum 1"),
    ("train", T("--set", "model=gpt_neox"), "model: unknown family \"gpt_neox\""),
    ("train", T("--set", "n_layer"), "--set n_layer: expected key=value"),
    ("train", T("--stop-at-step", "-1"), "--stop-at-step: -1"),
    ("train", T("--stop-at-step", "0"), "--stop-at-step: 0"),
    ("train", T("--set", "mlm_training=true", "--set", "mlm_mask_token_id=3"), "causal: a masked_lm model"),
    # train.py: mesh, layout, data, run directory (jax is imported by then; nothing is built).
    ("train", T("--set", "mesh_shape=x:3"), "mesh_shape: 'x:3'"),
    ("train", T("--set", "layout=batch:x+z"), "layout: 'batch:x+z' names mesh axis 'z'"),
    ("train", T("--set", "train_batch_size=12"), "train_batch_size: 12 is not divisible"),
    ("train", T("--set", 'datasets=[["nope",null,null,null]]'), "datasets: no dataset config"),
    ("train", T("--model-path", "{d}/fresh_resume", "--resume"), "no checkpoint to resume"),
    ("train", T("--model-path", "{d}/fresh_eval", "--eval"), "no checkpoint to evaluate"),
    ("train", T("--model-path", "{d}/fresh_init", "--init-from", "{d}/hf_no_config"),
     "{d}/hf_no_config: not a Hugging Face model directory"),
    ("train", T("--model-path", "{d}/fresh_init2", "--init-from", "{d}/hf_bad_json"),
     "{d}/hf_bad_json/config.json: invalid JSON"),
    ("train", T("--model-path", "{d}/fresh_init3", "--init-from", "{d}/hf_no_weights", "--data", "{d}/text.txt"),
     "{d}/hf_no_weights: no model.safetensors or pytorch_model.bin"),  # was: its missing tokenizer, text prepared
    ("train", T("--set", "init_new_head=true"), "init_new_head: only for a classifier"),
    ("train", T("--set", "task=sequence_classification", "--set", "init_new_head=true"),
     "init_new_head: only with --init-from"),
    ("train", T("--model-path", "{d}/locked_run"), "{d}/locked_run/run.lock: another run is using"),
    ("train", T("--model-path", "{d}/tokenizer_file_run"),  # "File exists", once the model was built
     "{d}/tokenizer_file_run/tokenizer: a file, not a folder: a run keeps its tokenizer in a folder of that name"),
    # train.py: multi-host options, checked where jax.distributed raised (or ran one process alone)
    ("train", T("--num-processes", "2", "--process-id", "1"), "--num-processes: only with --coordinator HOST:PORT"),
    ("train", T("--distributed", "--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "0"),
     "--distributed: not with --coordinator"),
    ("train", T("--coordinator", "localhost", "--num-processes", "1", "--process-id", "0"),
     "--coordinator localhost: not HOST:PORT"),
    ("train", T("--coordinator", "localhost:1234"), "--coordinator: give --num-processes N and --process-id I too"),
    ("train", T("--coordinator", "localhost:1234", "--num-processes", "0", "--process-id", "0"),
     "--num-processes: 0 is not a process count"),
    ("train", T("--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "2"),
     "--process-id: 2 is not in 0..1 (of --num-processes 2)"),
    # predict.py
    ("predict", ["--prompt", "x"], "give --config, --model, --model-path or --hf-model"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--temperature", "-1"], "--temperature"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--top-p", "0"], "--top-p"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--num-beams", "0"], "--num-beams"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt-file", "{d}/missing.txt"], "{d}/missing.txt"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt-file", "{d}/binary.txt"],
     "{d}/binary.txt: not UTF-8 text"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt-file", "{d}/empty.txt"], "{d}/empty.txt: no prompts"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x"], "no checkpoint in {d}/empty_run/checkpoints"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--set", "mesh_shape=x:8"],
     "--set mesh_shape=x:8: predict.py places the model with --mesh-shape and --layout, not the config's mesh_shape; "
     "give --mesh-shape x:8"),
    ("predict", ["--model-path", "{d}/empty_run", "--prompt", "x", "--set", "layout=batch:x,heads:y"],
     "give --layout batch:x,heads:y"),
    ("predict", ["--model-path", "{d}/never_trained", "--prompt", "x"],
     "model_path: {d}/never_trained: no such run directory (nothing trained there yet)"),
    ("predict", ["--model-path", "{d}/empty.txt", "--prompt", "x"], "model_path: {d}/empty.txt is a file"),
    ("predict", ["--model-path", "{d}/tokenizer_file_run", "--prompt", "x"],  # read with the config's tokenizer
     "{d}/tokenizer_file_run/tokenizer: a file, not a folder"),
    ("predict", ["--model-path", "{d}/hf_no_weights", "--prompt", "x"],
     "model_path: {d}/hf_no_weights is a Hugging Face model directory (config.json, no checkpoints/): predict.py and "
     "eval.py read it with --hf-model"),
    ("predict", ["--hf-model", "{d}/a_run", "--prompt", "x"], "{d}/a_run: a NeoMesh run directory (checkpoints/, no "
     "config.json), not a Hugging Face model directory: predict.py and eval.py read it with --model-path"),
    ("predict", ["--config", "{d}/binary.json", "--prompt", "x"], "{d}/binary.json: not a JSON text file"),
    ("predict", ["--hf-model", "{d}/hf_no_config", "--prompt", "x"], "{d}/hf_no_config: not a Hugging Face"),
    ("predict", ["--hf-model", "{d}/hf_bad_json", "--prompt", "x"], "{d}/hf_bad_json/config.json: invalid JSON"),
    ("predict", ["--hf-model", "{d}/hf_binary_config", "--prompt", "x"],
     "{d}/hf_binary_config/config.json: not a JSON text file"),
    ("predict", ["--hf-model", "{d}/hf_no_weights", "--prompt", "x"], "{d}/hf_no_weights: no model.safetensors"),
    ("predict", ["--hf-model", "{d}/hf_garbage_weights", "--prompt", "x"],
     "{d}/hf_garbage_weights/model.safetensors: not a readable safetensors file"),
    ("predict", ["--hf-model", "{d}/hf_nan_weights", "--prompt", "x"],
     "weight transformer.wte.weight holds NaN or infinity"),
    ("predict", ["--hf-model", "{d}/hf_t5", "--prompt", "x"], "hf_t5/config.json: no 'd_model'"),
    ("predict", ["--hf-model", "{d}/hf_no_width", "--prompt", "x"],  # a KeyError traceback
     "{d}/hf_no_width/config.json: no 'hidden_size' (a gpt_neo config.json has it"),
    ("convert", ["import", "{d}/hf_null_ffn", "{d}/imported"],  # an AttributeError traceback
     "{d}/hf_null_ffn/config.json: a value of another type than transformers writes"),
    # python -m convert
    ("convert", ["import", "{d}/hf_no_config", "{d}/imported"], "{d}/hf_no_config: not a Hugging Face"),
    ("convert", ["import", "{d}/hf_bad_json", "{d}/imported"], "{d}/hf_bad_json/config.json: invalid JSON"),
    ("convert", ["import", "{d}/hf_nan_weights", "{d}/imported"], "holds NaN or infinity"),
    ("convert", ["export", "{d}/empty_run", "{d}/exported"], "no checkpoint in {d}/empty_run/checkpoints"),
    ("convert", ["export", "{d}/missing_run", "{d}/exported"], "{d}/missing_run: no such directory"),
    ("convert", ["export", "{d}/empty_run", "{d}"], "export: {d} is not empty and not a previous export"),
    ("convert", ["export", "{d}/tokenizer_file_run", "{d}/exported"],  # exported without a tokenizer
     "{d}/tokenizer_file_run/tokenizer: a file, not a folder"),
    # the data tools
    ("tokenizer", ["--input", "{d}/nothing_*.txt", "--output-dir", "{d}/tok", "--vocab-size", "300"],
     "--input {d}/nothing_*.txt: matches no"),
    ("tokenizer", ["--output-dir", "{d}/tok", "--vocab-size", "100"], "vocab_size: 100 is below 258"),
    ("tokenizer", ["--output-dir", "{d}/tok", "--vocab-size", "300", "--file_type", "jsonl"],
     "--file_type jsonl: only with --base_dir DIR"),
    ("tokenizer", ["--output-dir", "{d}/tok", "--vocab-size", "300", "--min-frequency", "-1"],
     "--min-frequency: -1 must be zero or more"),
    ("tfrecords", ["--input", "{d}/nothing_*.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer",
                   "bytes"], "--input {d}/nothing_*.txt: matches no"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer",
                   "{d}/no_tokenizer"], "error: --tokenizer: '{d}/no_tokenizer' does not exist"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output_dir", "{d}/rec", "--name", "x", "--encoder_path",
                   "{d}/no_tokenizer"], "error: --encoder_path: '{d}/no_tokenizer' does not exist"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--chunk-size", "-1"], "--chunk-size: -1"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--chunk-size", "0"], "--chunk-size: 0 must be positive"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--n-ctx", "0"], "--n-ctx: 0 must be positive"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--n-ctx", "-5"], "--n-ctx: -5 must be positive"),
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--chunk_size=0"], "--chunk_size: 0 must be positive"),  # GPT-Neo's name for --n-ctx
    ("tfrecords", ["--input", "{d}/empty.txt", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer", "bytes",
                   "--processes", "-1"], "--processes: -1 must be zero or more"),
    ("tfrecords", ["--input", "{d}/bad_line.jsonl", "--output-dir", "{d}/rec", "--name", "x", "--tokenizer",
                   "{d}/binary.json"], "{d}/binary.json: not a tokenizers JSON file"),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 40 and {cli for cli, _, _ in CASES} == set(CLIS)


@pytest.mark.parametrize("cli,argv,culprit", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_naming_the_culprit(files, capsys, cli, argv, culprit):
    d = str(files)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    code = CLIS[cli]([a.replace("{d}", d) for a in argv])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # put back
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, f"exit code {code}, stderr:\n{err}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line:\n{err}"
    assert culprit.replace("{d}", d) in lines[0]


def test_failed_resume_and_init_from_leave_no_run_directory(files, capsys):
    d = str(files)
    for name, extra in (("gone_resume", ["--resume"]), ("gone_init", ["--init-from", f"{d}/hf_bad_json"])):
        assert train.main([a.replace("{d}", d) for a in T("--model-path", f"{d}/{name}", *extra)]) == 2
        assert not os.path.exists(f"{d}/{name}"), f"{name} was left behind: {os.listdir(f'{d}/{name}')}"
    assert os.path.exists(f"{d}/locked_run/run.lock")  # a refused run leaves another run's lock alone
    capsys.readouterr()


def test_a_hugging_face_model_directory_as_model_path_is_named_and_left_as_it_is(files, capsys):
    """A Hugging Face user's --model-path of the model to fine-tune: train.py wrote a fresh run beside its weights
    (and --new moved the model aside); it is named instead, with --init-from."""
    model = files / "hf_model_as_run"
    shutil.copytree(files / "hf_t5", model)  # config.json and weights
    before = sorted(os.listdir(model))
    message = (f"error: model_path: {model} is a Hugging Face model directory (config.json and weights, no "
               f"checkpoints/), not a run directory: --init-from {model} fine-tunes it")
    for argv in (T("--model-path", str(model)), T("--model-path", str(model), "--new")):
        assert train.main(argv) == 2
        assert capsys.readouterr().err.startswith(message)
    with pytest.raises(SystemExit) as e:  # no --config: the run there to go on with
        train.main(["--model-path", str(model), "--set", "train_steps=1"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(message)
    assert sorted(os.listdir(model)) == before  # nothing written there
    assert not [name for name in os.listdir(files) if name.startswith("hf_model_as_run-")]  # nor moved


def test_a_gpt_neo_checkpoint_directory_as_model_path_names_the_converter(tmp_path, capsys):
    """GPT-Neo's model_path held its mesh-tensorflow checkpoints: train.py there started a fresh model at step 0
    beside them (GPT-Neo resumed from them), and predict.py called the folder a Hugging Face model's."""
    import eval as eval_cli

    model = tmp_path / "GPT3_XL"
    model.mkdir()
    for name in ("checkpoint", "config.json", "graph.pbtxt", "model.ckpt-1000.index", "model.ckpt-362000.index",
                 "model.ckpt-362000.data-00000-of-00001"):
        (model / name).write_text("{}")
    before = sorted(os.listdir(model))
    message = (f"error: model_path: {model} holds GPT-Neo's mesh-tensorflow checkpoint model.ckpt-362000, which "
               f"NeoMesh does not read in place; python -m convert.gpt_neo_mtf {model} NEW_DIR [--keep-step] "
               "converts it to a run that --model-path NEW_DIR trains, samples and evaluates\n")
    for main, argv in ((train.main, T("--model-path", str(model))), (predict.main, ["--model-path", str(model),
                        "--prompt", "x"]), (eval_cli.main, ["--model-path", str(model)])):
        assert main(argv) == 2
        assert capsys.readouterr().err == message
    for extra in ([], ["--eval"]):  # no --config: the run there to go on with
        with pytest.raises(SystemExit) as e:
            train.main(["--model-path", str(model), *extra])
        assert e.value.code == 2 and capsys.readouterr().err == message
    assert sorted(os.listdir(model)) == before  # nothing written there


def test_a_url_as_model_path_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """--model-path gs://bucket/run (GPT-Neo's configs' model_path) made a local folder gs:/bucket/run, wrote its
    lock and metrics there, then stopped in a traceback from tensorboardX's GCS writer."""
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--resume"]):
        assert train.main(T("--model-path", "gs://bucket/runs/x", *extra)) == 2
        assert capsys.readouterr().err == ("error: model_path: gs://bucket/runs/x: a run is written to a local or "
                                           "mounted directory, not a URL; mount the bucket (gcsfuse on a TPU VM) "
                                           "and name a folder in it\n")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("extra, hint", [
    (["--eval"], ""), (["--resume"], ""), ([], "; --config (or --model NAME) starts a new run there")])
def test_a_mistyped_run_directory_without_a_config_is_named(tmp_path, capsys, extra, hint):
    """Without --config, train.py goes on with the run in --model-path: one that is no directory is named, as
    eval.py and predict.py name it, not taken for a missing --config."""
    with pytest.raises(SystemExit) as e:
        train.main(["--model-path", str(tmp_path / "nope"), *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (f"error: model_path: {tmp_path}/nope: no such run directory (nothing "
                                         f"trained there yet){hint}\n"), err


def test_eval_with_new_is_refused_without_a_config_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--model-path", str(tmp_path / "nope"), "--eval", "--new"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == ("error: --eval: not with --new (--new moves the run aside and starts a "
                                         "fresh one; --eval evaluates the run in model_path as it is)\n"), err


@pytest.mark.parametrize("override, message", [
    ("layout=batch:x,hedas:x", "error: layout: unknown dimension 'hedas'; did you mean 'heads'?"),
    ("mesh_shape=x4", "error: mesh_shape: 'x4' is not axis:size (e.g. 'x:4,y:2')"),
])
def test_a_mesh_or_layout_typo_is_found_before_data_is_prepared(files, capsys, override, message):
    text = files / "words.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 200)
    code = train.main(["--data", str(text), "--model-path", str(files / "typo_run"), "--set", override])
    out, err = capsys.readouterr()
    assert code == 2 and err.strip() == message, err
    assert "prepar" not in out, out


@pytest.mark.parametrize("cli, argv, target, said", [
    ("convert", ["export", "{d}/run", "{d}/hf"], "convert.hf.export_hf", "interrupted; {d}/hf is as it was"),
    ("convert", ["import", "{d}/hf", "{d}/run"], "convert.hf.import_hf", "interrupted"),
    ("make_dataset", ["--input", "{d}"], "data.make_dataset.make_dataset", "interrupted"),
    ("tfrecords", ["--input", "{d}", "--output-dir", "{d}/out", "--name", "x", "--tokenizer", "bytes"],
     "data.create_tfrecords.create", "interrupted"),
    ("tokenizer", ["--input", "{d}", "--output-dir", "{d}/out", "--vocab-size", "300"], "data.tokenizer.train_bpe",
     "interrupted"),
    ("plot", ["{d}"], "tools.plot.plot_runs", "interrupted"),
    ("predict", ["--model", "{d}/run", "--prompt", "x"], "predict.check_options", "interrupted"),
    ("harness", ["--model", "neomesh", "--model_args", "path={d}", "--tasks", "x"], "lm_eval.__main__.cli_evaluate",
     "interrupted"),
])
def test_ctrl_c_is_one_line(tmp_path, capsys, monkeypatch, cli, argv, target, said):
    """Ctrl-C during the work is 'interrupted' and exit status 130, as train.py says it (the conversion, data and
    plot tools and the lm-eval harness printed KeyboardInterrupt's traceback, dozens of lines deep)."""
    from data import make_dataset
    from evaluation import harness
    from tools import plot

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    (tmp_path / "a.txt").write_text("some text\n")
    main = {**CLIS, "make_dataset": make_dataset.main, "plot": plot.main, "harness": harness.main}[cli]
    assert main([a.format(d=tmp_path) for a in argv]) == 130
    assert capsys.readouterr().err == said.format(d=tmp_path) + "\n"


def test_mesh_and_layout_flags_of_predict_and_eval_are_named_as_flags():
    """They were named as the config keys mesh_shape and layout, and 'auto' (train.py's) was 'not axis:size'."""
    from config import ConfigError
    from pretrained import layout_for

    flags = ("--mesh-shape", "--layout")
    with pytest.raises(ConfigError, match=r"^--mesh-shape: 'auto' chooses a mesh and layout for training"):
        layout_for("auto", "batch:x", flags)
    with pytest.raises(ConfigError, match=r"^--mesh-shape: 'x:16' needs 16 devices but 8 are available"):
        layout_for("x:16", "batch:x", flags)
    with pytest.raises(ConfigError, match=r"^--layout: unknown dimension 'hedas'; did you mean 'heads'\?$"):
        layout_for("x:8", "batch:x,hedas:x", flags)
    with pytest.raises(ConfigError, match=r"^mesh_shape: 'x:16' needs"):  # the harness's model_args keep the keys
        layout_for("x:16")
    with pytest.raises(ConfigError, match=r"^layout heads:x: give mesh_shape too \(without it the model runs on one "):
        layout_for(None, "heads:x")  # the harness's model_args: it ran on one device, the layout unread
    assert dict(layout_for("x:-1", "batch:x", flags).mesh.shape) == {"x": 8}


def test_a_collective_that_lost_its_peer_is_one_line_and_other_runtime_errors_keep_their_traceback():
    """What gloo raised in process 0 when process 1 was killed (kill -9) mid-run, and what jax's coordination
    service says of a dead task: one line; a runtime error of another kind is a bug's, kept whole."""
    import jax

    from neomesh.errors import one_line

    lost = jax.errors.JaxRuntimeError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:"
                                      "538] Read error [127.0.0.1]:17795: Connection reset by peer\nmore")
    assert one_line(lost) == (
        "another process of this run stopped (Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] "
        "Read error [127.0.0.1]:17795: Connection reset by peer); this process stops too: start every process again "
        "to resume from the last checkpoint")
    assert one_line(jax.errors.JaxRuntimeError("UNAVAILABLE: Task 1 heartbeat timeout.")).startswith(
        "another process of this run stopped (UNAVAILABLE: Task 1 heartbeat timeout.)")
    assert one_line(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes differ")) is None


def test_ctrl_c_that_python_drops_in_a_finalizer_still_stops_the_command(capsys):
    """Python runs a SIGINT handler wherever the main thread is, a finalizer included (jax's gc callback), and drops
    the KeyboardInterrupt raised there ("Exception ignored in ..."): predict.py and eval.py went on. run_main
    delivers it to the main thread again: 'interrupted', 130."""
    import time

    from neomesh.errors import run_main

    class DiesOnCtrlC:
        def __del__(self):
            raise KeyboardInterrupt

    def body():
        DiesOnCtrlC()  # collected at once: its KeyboardInterrupt is unraisable
        for _ in range(500):
            time.sleep(0.01)
        return 0

    assert run_main(body, "interrupted") == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_eval_of_an_init_from_without_a_run_says_how_to_evaluate_its_weights(files, capsys, tmp_path):
    """train.py --init-from HF --eval (run_qa's --do_eval alone) found no checkpoint and said only that."""
    from tests import hf_fixtures

    model = hf_fixtures.save(hf_fixtures.gpt_neo(n_embd=32, n_layer=2, n_ctx=32), tmp_path / "neo")
    d = str(files)
    capsys.readouterr()  # transformers' saving progress
    argv = [a.replace("{d}", d) for a in T("--model-path", f"{d}/eval_init", "--init-from", model, "--eval")]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checkpoint to evaluate" in err[0] and \
        "train from --init-from first (--set train_steps=1 and --set lr=0 evaluates its weights" in err[0], err
    assert not os.path.exists(f"{d}/eval_init")
