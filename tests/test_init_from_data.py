"""Fine-tuning's data and base: text read with the pretrained model's tokenizer, data tokenized by another one
named, a resume on another base named, and a dataset's preparation never publishing into a folder it did not
build (it replaced the folder of a --set tokenizer_path); a run directory named without a config goes on with
the config its newest checkpoint holds."""

import json
import os

import pytest

import train
from training import init_from, run_dir, run_tokenizer
from config import ConfigError, load_config
from data.prepare import build_once
from tests import hf_fixtures


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return hf_fixtures.save(hf_fixtures.gpt2(), tmp_path_factory.mktemp("gpt2"))


def test_a_classifier_reads_its_text_with_the_models_tokenizer_and_other_ids_are_named(gpt2_dir):
    classify = load_config("finetune_lora_bert_classify")[0].replace(init_from=gpt2_dir)
    notes = []
    assert run_tokenizer.with_tokenizer_of_init_from(classify, notes).tokenizer_path == gpt2_dir and not notes
    tokenized = load_config("quickstart", ('datasets=[["embedded", null, null, null]]',))[0].replace(
        init_from=gpt2_dir)  # byte-level ids, not the model's BPE
    assert run_tokenizer.with_tokenizer_of_init_from(tokenized, notes).tokenizer_path is None
    assert notes == [f"--init-from {gpt2_dir}: dataset embedded holds the ids of its own tokenizer (bytes), not "
                     "this model's; fine-tuning on them teaches other tokens (train.py --data FOLDER --init-from "
                     "prepares text with the model's tokenizer)"]


def test_a_classifier_started_from_a_run_reads_its_text_with_the_runs_tokenizer(tmp_path, gpt2_dir):
    # --init-from a NeoMesh run: its tokenizer/ (there a copy of the model's, by convert import) reads the text.
    from convert.hf import import_hf
    from training.init_from import source_tokenizer

    run = str(tmp_path / "run")
    import_hf(gpt2_dir, run)
    classify = load_config("finetune_lora_bert_classify")[0].replace(init_from=run)
    assert run_tokenizer.with_tokenizer_of_init_from(classify, []).tokenizer_path == os.path.join(run, "tokenizer")
    # A Hugging Face directory is its own tokenizer's, even without one: --data names what is missing there,
    # rather than preparing the text with the default dataset's tokenizer.
    bare = tmp_path / "bare"
    hf_fixtures.gpt2().save_pretrained(str(bare))
    assert source_tokenizer(str(bare)) == str(bare)
    assert run_tokenizer.with_tokenizer_of_init_from(classify.replace(init_from=str(bare)), []).tokenizer_path is None


def saved_run(run, **saved):
    (run / "checkpoints" / "4" / "config").mkdir(parents=True)
    (run / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps(saved))
    return str(run)


def test_a_run_resumed_on_another_base_says_so(tmp_path, gpt2_dir):
    peft = saved_run(tmp_path / "peft", init_from="/models/first", peft={"lora": {}, "checkpoint": "trainable"})
    cfg = load_config("finetune_lora_gpt2")[0].replace(model_path=peft, init_from=gpt2_dir)
    notes = []
    run_dir.check_resume_base(cfg, notes)
    assert notes == [f"the run in {peft} was started with --init-from /models/first; its checkpoints hold only the "
                     f"trained parameters, which now go on {gpt2_dir}'s weights"]
    notes.clear()
    run_dir.check_resume_base(cfg.replace(init_from="/models/first"), notes)
    assert not notes
    full = saved_run(tmp_path / "full", init_from="/models/first")
    run_dir.check_resume_base(cfg.replace(model_path=full), notes)
    assert notes == [f"the run in {full} was started with --init-from /models/first; it resumes from its "
                     f"checkpoint, which holds every parameter: {gpt2_dir}'s weights are not used"]


def test_a_classifier_going_on_in_a_run_reads_its_text_with_the_runs_tokenizer(tmp_path, gpt2_dir):
    # An imported classifier (convert import keeps the model's tokenizer in tokenizer/) trained on the dataset's
    # byte ids without a word, and predict.py and export then read text with the BPE it never saw.
    import shutil

    run = saved_run(tmp_path / "imported", task="sequence_classification")
    shutil.copytree(gpt2_dir, os.path.join(run, "tokenizer"))
    cfg = load_config("bert_classify", ('datasets=[["embedded", null, null, null]]',))[0].replace(model_path=run)
    notes = []
    assert run_tokenizer.with_tokenizer_of_run(cfg, notes).tokenizer_path == os.path.join(run, "tokenizer")
    assert notes == [f"{run}: its text is read with the run's own tokenizer ({run}/tokenizer), not dataset "
                     "embedded's (bytes), whose ids its weights never saw"]
    fresh = cfg.replace(model_path=str(tmp_path / "new"))
    assert run_tokenizer.with_tokenizer_of_run(fresh, notes).tokenizer_path is None


def test_init_from_on_a_run_not_started_from_a_model_is_an_error(tmp_path, gpt2_dir):
    # it resumed that run from its own weights and never read the model's
    run = saved_run(tmp_path / "run", n_layer=4)
    cfg = load_config("quickstart")[0].replace(model_path=run, init_from=gpt2_dir)
    with pytest.raises(ConfigError, match=f"^--init-from: {run} already holds a run, not started from a model, "
                       "which would resume from its own checkpoint and never read .*'s weights; --new moves it "
                       "aside"):
        run_dir.check_resume_base(cfg, [])
    notes = []
    run_dir.check_resume_base(cfg.replace(model_path=str(tmp_path / "new")), notes)
    assert not notes


def test_preparation_never_replaces_a_folder_it_did_not_build(tmp_path):
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "weights.bin").write_text("precious")
    with pytest.raises(ConfigError, match="exists and is not a prepared dataset"):
        build_once(str(mine), lambda directory: os.makedirs(directory))
    assert (mine / "weights.bin").read_text() == "precious"


def test_a_labelled_dataset_prepares_in_its_own_folder_whatever_tokenizer_reads_it(tmp_path, monkeypatch, gpt2_dir):
    from data import labelled, prepare

    targets = []
    monkeypatch.setattr(prepare, "build_once", lambda target, *args, **kwargs: targets.append(target))
    cfg = load_config("bert_classify", (f"tokenizer_path={gpt2_dir}/tokenizer.json",))[0]
    dataset = labelled._dataset(cfg)
    assert dataset["tokenizer_path"] == f"{gpt2_dir}/tokenizer.json"  # read with it ...
    assert targets == [os.path.join(os.getcwd(), "data_cache", "stdlib_docstrings")]  # ... prepared in its own


def test_a_run_directory_without_a_config_goes_on_with_its_own(tmp_path):
    run = saved_run(tmp_path / "run", model="gpt_neo", n_layer=2, n_embd=64, n_head=4, lr=0.5)
    args = train.parse_args(["--model-path", run, "--set", "lr=0.25"])
    cfg, notes = run_dir.run_config(args)
    assert (cfg.n_layer, cfg.n_embd, cfg.lr) == (2, 64, 0.25)
    assert notes[0] == (f"config: the run's own, from its newest checkpoint in {run} (no --config given; "
                        "--config FILE would use another)")  # it read as if --config had been given
    for argv in (["--model-path", str(tmp_path / "none")], ["--model-path", run, "--new"], []):
        with pytest.raises(SystemExit):  # argparse's usage error: no config, and no run to go on with
            train.parse_args(argv)



def test_a_run_named_after_its_data_needs_its_init_from_again(tmp_path, monkeypatch, capsys):
    """--data FOLDER names the run directory runs/FOLDER: a peft run there resumes only on its base model."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "prepared" / "my_texts-1234abcd"
    data.mkdir(parents=True)
    (data / "dataset.json").write_text(json.dumps({"path": "train_*.tfrecords", "n_vocab": 300}))
    saved_run(tmp_path / "runs" / "my_texts-1234abcd", init_from="/models/gpt2",
              peft={"lora": {}, "checkpoint": "trainable"})
    assert train.main(["--config", "finetune_lora_gpt2", "--data", str(data)]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: --init-from: the run in {os.path.join('runs', 'my_texts-1234abcd')} was started with --init-from "
        "/models/gpt2 (its checkpoints hold only the trained parameters); pass it again to resume")


def test_a_run_whose_own_mesh_does_not_fit_the_devices_here_says_how_to_name_one(tmp_path, capsys):
    run = saved_run(tmp_path / "run", model="gpt_neo", n_layer=2, n_embd=64, n_head=4, mesh_shape="x:16")
    assert train.main(["--model-path", run, "--eval", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "error: mesh_shape: 'x:16' needs 16 devices but 8 are available; make its sizes multiply to 8 ('x:-1' "
        "sizes x to fit); on CPU, simulate 16 devices with XLA_FLAGS=--xla_force_host_platform_device_count=16 (the "
        "mesh of the run's own config, from its "
        "checkpoint; --set mesh_shape=... names one for the devices here: a run resumes on any mesh)\n")


def test_init_from_notes_only_the_keys_whose_model_changes(tmp_path):
    """An export of the quickstart spells d_ff as 768 where the config leaves it null (4 * n_embd): the same model,
    so no note; a wider model is noted with the keys that differ."""
    from convert.gpt_neo import config_to_hf

    quickstart = load_config("quickstart")[0]
    same, wider = tmp_path / "same", tmp_path / "wider"
    for folder, hf in [(same, config_to_hf(quickstart)),
                       (wider, config_to_hf(quickstart.replace(n_embd=240, d_ff=960)))]:
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf))
    notes = []
    cfg = init_from.with_architecture_of(quickstart.replace(init_from=str(same)), "--init-from", notes)
    assert notes == [] and cfg.intermediate == quickstart.intermediate
    cfg = init_from.with_architecture_of(quickstart.replace(init_from=str(wider)), "--init-from", notes)
    assert notes == [f"--init-from: the model's shape is {wider}'s: n_embd 240, d_ff 960"]
    assert (cfg.n_embd, cfg.intermediate) == (240, 960)


def test_a_task_head_the_model_lacks_is_named_on_its_own_line():
    """A GPT-2 LM into sequence classification with LoRA: its 16 LoRA factors sort before score/out/kernel, which a
    summary of 8 names and "and 9 more" hid, though the README promises a warning naming the head."""
    lora = [f"blocks/{i}/attn/{t}/lora_{f}" for i in range(2) for t in ("k", "out", "q", "v") for f in "ab"]
    lines = init_from.initialised_notes("hf/gpt2", [*lora, "score/out/kernel"], [])
    assert lines == [f"initialised from hf/gpt2; fresh (not in it): {', '.join(lora[:8])} and 8 more",
                     "warning: hf/gpt2 has no task head; initialised fresh (train it before use): score/out/kernel"]
    assert init_from.initialised_notes("bert", ["classifier/out/bias", "classifier/out/kernel"], ["mlm/bias"]) == [
        "initialised from bert; unused (this task has no place for them): mlm/bias",
        "warning: bert has no task head; initialised fresh (train it before use): classifier/out/bias, "
        "classifier/out/kernel"]
    assert init_from.initialised_notes("t5", [], []) == ["initialised from t5"]  # every weight, and only those


def test_a_peft_run_without_init_from_is_told_its_base_stays_random():
    """configs/finetune_lora_gpt2.json run without --init-from trained LoRA factors on a random GPT-2, silently."""
    template = load_config("finetune_lora_gpt2")[0]
    assert "--init-from DIR or ORG/NAME" in train.peft_base_note(template)
    assert train.peft_base_note(template.replace(init_from="hf/gpt2")) is None
    assert train.peft_base_note(load_config("quickstart")[0]) is None
    assert train.peft_base_note(template.replace(peft={"lora": {}, "trainable": ["all"]})) is None


def test_a_shorter_n_ctx_than_the_models_position_table_trains_on_it_and_keeps_the_table(gpt2_dir):
    """transformers' max_seq_length: --init-from a GPT-2 of 64 positions with n_ctx 16 trains on 16 tokens (it
    took the model's 64, 4x the compute per example), keeps the 64 rows (its export has them) and computes
    transformers' logits; an n_ctx beyond the table is the table's length, as before."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from convert.gpt_neo import config_to_hf
    from models import registry
    from parallel.state import abstract_model

    notes = []
    gpt2 = load_config("finetune_lora_gpt2", ("peft=null",))[0].replace(init_from=gpt2_dir)
    cfg = init_from.with_architecture_of(gpt2.replace(n_ctx=16), "--init-from", notes)
    assert (cfg.n_ctx, cfg.n_positions, cfg.position_rows) == (16, 64, 64)
    assert "n_positions 64" in notes[0] and "n_ctx" not in notes[0], notes
    graphdef, _, _ = abstract_model(lambda rngs: registry.build(cfg, rngs))
    tokens = np.random.default_rng(0).integers(0, hf_fixtures.VOCAB, (2, 16))
    got = nnx.merge(graphdef, nnx.State(init_from.imported_params(cfg, gpt2_dir)))(jnp.asarray(tokens))[0]
    with torch.no_grad():
        want = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()(torch.from_numpy(tokens)).logits.numpy()
    assert np.max(np.abs(np.asarray(got) - want)) <= 1e-4
    assert config_to_hf(cfg)["n_positions"] == 64
    longer = init_from.with_architecture_of(gpt2.replace(n_ctx=100), "--init-from", [])
    assert (longer.n_ctx, longer.n_positions) == (64, None)
