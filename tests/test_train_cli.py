"""train.py as a user runs it: the quickstart (shortened), exact resume, --eval, --new, kept checkpoints."""

import glob
import os
import re

import pytest

from tests.common import metrics_rows, run_cli, run_command

pytestmark = pytest.mark.e2e  # every test here runs train.py as a user would

TINY_SETS = ["n_layer=2", "n_embd=64", "n_head=4", "n_ctx=32", 'attention_types=[[["global","local"],1]]',
             "local_attention_radius=8", "train_batch_size=8", "eval_batch_size=8", "eval_steps=2",
             "warmup_steps=2", "sample_tokens=0"]


def train(model_path, *sets, extra=()):
    args = ["train.py", "--config", "configs/quickstart.json", "--model-path", str(model_path), "--no-progress"]
    for s in TINY_SETS + list(sets):
        args += ["--set", s]
    result = run_command(*args, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def checkpoint_steps(model_path):
    return sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(model_path, "checkpoints", "*"))
                  if os.path.basename(p).isdigit())


def test_quickstart_shortened(tmp_path):
    """The README's first command, 6 steps long, in the environment a user has (one CPU device, XLA's default
    optimisations: the suite's compile-light settings would run its 2,048-token steps 3.5x slower)."""
    model_path = tmp_path / "quickstart"
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--model-path", str(model_path),
                     "--no-progress", "--set", "train_steps=6", "--set", "warmup_steps=2", "--set", "eval_steps=1",
                     "--set", "sample_tokens=12", as_shipped=True, cache_home=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "over 1 cpu devices" in result.stdout, result.stdout
    # the train step, compiled for over a second, is kept for the next run
    assert any("train_step" in name for name in os.listdir(tmp_path / "cache" / "neomesh" / "jax"))
    first, last = map(float, re.search(r"train loss ([\d.]+) -> ([\d.]+)", result.stdout).groups())
    assert last < first - 0.5, result.stdout
    assert "sample:\ndef " in result.stdout
    rows = metrics_rows(model_path)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert {"loss", "lr", "grad_norm", "tokens_per_sec", "mfu"} <= set(rows[0])
    assert rows[0]["lr"] == 0.0 and rows[2]["lr"] == pytest.approx(0.003)  # warmup from 0 to lr
    (evaluation,) = metrics_rows(model_path, "eval")
    assert evaluation["step"] == 6 and evaluation["perplexity"] == pytest.approx(2.718281828 ** evaluation["loss"])
    assert 0 < evaluation["bits_per_byte"] < 9
    assert checkpoint_steps(model_path) == [6]
    assert glob.glob(str(model_path / "tensorboard" / "events.out.tfevents.*"))


def test_resume_is_exact_and_checkpoints_rotate(tmp_path):
    sets = ["train_steps=6", "steps_per_checkpoint=2", "keep_checkpoints=2", "embed_dropout=0.1",
            "res_dropout=0.1"]
    whole = tmp_path / "whole"
    train(whole, *sets)
    assert checkpoint_steps(whole) == [4, 6]

    parts = tmp_path / "parts"
    train(parts, *sets, extra=["--stop-at-step", "3"])
    assert [r["step"] for r in metrics_rows(parts)] == [1, 2, 3]
    resumed = train(parts, *sets)
    assert "resumed from" in resumed.stdout and "at step 3" in resumed.stdout
    assert "input: continues at step 3 from the saved position" in resumed.stdout  # nothing re-read
    losses = lambda path: [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in metrics_rows(path)]  # noqa
    assert losses(parts) == losses(whole)  # bit-identical, dropout included
    evals = lambda path: [(r["step"], r["loss"]) for r in metrics_rows(path, "eval")]  # noqa
    assert evals(parts) == evals(whole)


def test_eval_only_new_and_resume_errors(tmp_path):
    model_path = tmp_path / "run"
    result = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(model_path), "--resume")
    assert result.returncode == 2 and "error: model_path: no checkpoint to resume" in result.stderr
    train(model_path, "train_steps=2")
    # A save that died half-way (orbax writes into a temporary directory and renames it when complete) must
    # be ignored: the last complete checkpoint is what gets restored.
    os.makedirs(model_path / "checkpoints" / "7.orbax-checkpoint-tmp-1700000000000000")
    # The run directory alone names the config: its newest checkpoint's (the quickstart's shapes would not fit).
    evaluated = run_command("train.py", "--model-path", str(model_path), "--eval", "--no-progress")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "note: config: the run's own" in evaluated.stdout and "eval at step 2: loss" in evaluated.stdout
    # eval_batch_size shapes only eval_steps' batches: with none, one the mesh does not divide is no error
    finished = run_command("train.py", "--model-path", str(model_path), "--no-progress", "--set", "eval_steps=0",
                           "--set", "eval_batch_size=12")
    assert finished.returncode == 0 and "is finished: step 2" in finished.stdout, finished.stderr[-3000:]
    fresh = train(model_path, "train_steps=1", extra=["--new"])
    assert "moved the previous run to" in fresh.stdout
    assert [r["step"] for r in metrics_rows(model_path)] == [1]
    assert (model_path / "tokenizer" / "tokenizer.json").exists()  # the fresh run keeps its tokenizer
    assert len(glob.glob(str(model_path) + "-*")) == 1  # the old run is kept, not deleted


def test_eval_with_new_is_refused_before_the_run_is_moved(tmp_path):
    model_path = tmp_path / "run"
    (model_path / "checkpoints").mkdir(parents=True)
    (model_path / "metrics.jsonl").write_text("")
    result = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(model_path), "--eval",
                         "--new")
    assert result.returncode == 2 and result.stderr.startswith("error: --eval: not with --new"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "moved" not in result.stdout
    assert (model_path / "metrics.jsonl").exists() and not glob.glob(str(model_path) + "-*")


def test_eval_or_resume_of_a_directory_without_checkpoints_says_so(tmp_path):
    """Without --config it said that --config is required, as if the directory were not meant as a run."""
    for flag, verb in (("--eval", "evaluate"), ("--resume", "resume")):
        result = run_command("train.py", "--model-path", str(tmp_path), flag)
        assert result.returncode == 2 and result.stderr == (
            f"error: model_path: no checkpoint to {verb} in {tmp_path}/checkpoints\n"), result.stderr


def test_new_that_fails_before_its_first_step_puts_the_previous_run_back(tmp_path):
    """A layout that does not divide the model is found once the model is built, after --new moved the run aside:
    the run comes back."""
    model_path = tmp_path / "run"
    (model_path / "checkpoints").mkdir(parents=True)
    (model_path / "metrics.jsonl").write_text("")
    result = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(model_path), "--new",
                         "--no-progress", "--set", "layout=batch:x,heads:x")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == ("error: layout: parameter blocks/0/attn/k/kernel dimension 'heads' has size 6, "
                                     "not divisible by mesh axis 'x' of size 8"), result.stderr
    assert f"moved the previous run back to {model_path}" in result.stdout
    assert (model_path / "metrics.jsonl").exists() and not glob.glob(str(model_path) + "-*")


def test_a_resume_that_changes_the_model_but_not_its_shapes_says_so(tmp_path):
    model_path = tmp_path / "run"
    train(model_path, "train_steps=2", "eval_steps=1")
    resumed = train(model_path, "train_steps=3", "eval_steps=1", "lr=0.001", "activation_function=relu",
                    'attention_types=[[["global"],2]]')
    (note,) = [line for line in resumed.stdout.splitlines() if line.startswith("note: model keys differ")]
    assert 'attention_types [[["global", "local"], 1]] -> [[["global"], 2]]' in note, note
    assert 'activation_function "gelu" -> "relu"' in note and "lr" not in note and "train_steps" not in note
    assert "2 layers ['global', 'global']" in resumed.stdout  # the banner names the layers that run


def test_resuming_a_run_started_from_a_hugging_face_model_needs_it_again(tmp_path):
    """Checked before --data prepares anything: without --init-from the text would be tokenized another way."""
    import json

    from config import load_config

    model_path = tmp_path / "lora"
    saved = load_config("configs/finetune_lora_gpt2.json", ())[0].to_dict()
    saved.update(init_from=str(tmp_path / "hf gpt2"), n_embd=64, n_layer=2, n_head=4, n_vocab=1000)
    (model_path / "checkpoints" / "4" / "config").mkdir(parents=True)
    (model_path / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps(saved))
    args = ["train.py", "--config", "configs/finetune_lora_gpt2.json", "--model-path", str(model_path)]
    result = run_command(*args, "--data", str(tmp_path / "not prepared"))
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: --init-from: the run in {model_path} was started with --init-from '{tmp_path}/hf gpt2' (its "
        "checkpoints hold only the trained parameters); pass it again to resume (or --new for a fresh run)")
    saved["peft"] = None  # the whole model in its checkpoints: needed only where the shape is not the config's
    (model_path / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps(saved))
    result = run_command(*args, "--eval")
    assert result.returncode == 2 and "(the model's shape is that model's); pass it again" in result.stderr


def test_moe_config_logs_its_auxiliary_losses(tmp_path):
    model_path = tmp_path / "moe"
    sets = ["n_embd=64", "n_head=4", "n_ctx=32", "local_attention_radius=8", "train_batch_size=8",
            "eval_batch_size=8", "train_steps=4", "warmup_steps=2", "eval_steps=1", "sample_tokens=8"]
    result = run_command("train.py", "--config", "configs/moe.json", "--model-path", str(model_path), "--no-progress",
                     *[arg for s in sets for arg in ("--set", s)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "['global', 'local', 'linear', 'global']" in result.stdout and "sample:\ndef " in result.stdout
    rows = metrics_rows(model_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert 1.0 <= row["aux_loss"] < 8.0  # the load-balancing loss: 1 when balanced, num_experts at worst
        assert row["z_loss"] > 0.0 and 0.0 <= row["dropped_tokens_fraction"] < 1.0


def test_bert_mlm_config_trains_the_masked_lm_objective(tmp_path):
    """configs/bert_mlm.json as shipped but tiny: a BERT encoder on TFRecords through the MLM stage, its [MASK]
    id taken from the tokenizer, eval rows with masked-token accuracy, and export to a transformers BERT."""
    model_path = tmp_path / "bert"
    sets = ["n_layer=2", "n_embd=64", "n_head=4", "d_ff=128", "n_ctx=32", "train_batch_size=8",
            "eval_batch_size=8", "train_steps=3", "warmup_steps=1", "eval_steps=1"]
    result = run_command("train.py", "--config", "configs/bert_mlm.json", "--model-path", str(model_path),
                     "--no-progress", *[arg for s in sets for arg in ("--set", s)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sample:" not in result.stdout  # an encoder does not generate
    (evaluation,) = metrics_rows(model_path, "eval")
    assert 0.0 <= evaluation["accuracy"] <= 1.0 and evaluation["perplexity"] > 1.0
    assert "bits_per_byte" not in evaluation  # masked tokens' loss is not a next-token rate
    out = tmp_path / "hf"
    assert run_command("-m", "convert", "export", str(model_path), str(out)).returncode == 0
    import transformers
    assert transformers.AutoConfig.from_pretrained(str(out)).architectures == ["BertForMaskedLM"]
