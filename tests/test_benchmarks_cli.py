"""The benchmark scripts as a user runs them: a mistake in a flag is one line naming it (exit status 2), before
anything compiles; and the smallest T5 comparison prints its table."""

import subprocess
import sys

import pytest

from tests.common import ROOT


def one_line_error(module_name: str, argv: list[str], capsys) -> str:
    """The ``error: ...`` line ``module.main(argv)`` ends with under ``run_main`` (which must return 2)."""
    import importlib

    from neomesh.errors import run_main

    module = importlib.import_module(module_name)
    code = run_main(lambda: module.main(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("argv, message", [
    (["--heads", "3"], "--heads: --width 512 is not divisible by 3 heads"),
    (["--batch", "0"], "--batch: 0 is below the minimum 1"),
    (["--steps", "0"], "--steps: 0 is below the minimum 1"),
    (["--layers", "-1"], "--layers: -1 is below the minimum 1"),
])
def test_t5_train_step_mistakes(argv, message, capsys):
    assert message in one_line_error("benchmarks.t5_train_step", argv, capsys)


def test_t5_train_step_prints_its_table():
    """transformers 5 builds no T5 without decoder_start_token_id: the PyTorch row needs it set."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = subprocess.run([sys.executable, "benchmarks/t5_train_step.py", "--layers", "1", "--width", "32",
                             "--heads", "2", "--d-ff", "64", "--inputs", "16", "--targets", "4", "--batch", "1",
                             "--vocab", "64", "--steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if line.startswith(("| NeoMesh", "| transformers"))]  # | implementation | tokens/s | ms/step | first |
    assert [row[0] for row in rows] == ["NeoMesh (JAX)", "transformers (PyTorch)"]
    assert all(float(row[1].replace(",", "")) > 0 for row in rows)


@pytest.mark.parametrize("module_name", ["benchmarks.mlm_train_step", "benchmarks.t5_train_step",
                                         "benchmarks.vit_train_step"])
def test_a_zoo_train_step_benchmark_without_torch_says_what_to_install(module_name, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch fails as where it is not installed
    assert one_line_error(module_name, [], capsys) == ("error: the PyTorch peer needs the test requirements (torch "
                                                       "is missing): pip install -r requirements-test.txt")


@pytest.mark.parametrize("module_name, argv, message", [
    ("benchmarks.vit_train_step", ["--image", "30", "--patch", "8"], "--patch: --image 30 is not divisible into 8x8"),
    ("benchmarks.vit_train_step", ["--batch", "-1"], "--batch: -1 is below the minimum 1"),
    ("benchmarks.vit_train_step", ["--steps", "0"], "--steps: 0 is below the minimum 1"),
    ("benchmarks.vit_train_step", ["--heads", "5"], "--heads: --width 768 is not divisible by 5 heads"),
    ("benchmarks.mlm_train_step", ["--steps", "0"], "--steps: 0 is below the minimum 1"),
    ("benchmarks.mlm_train_step", ["--vocab", "100"], "--vocab: 100 has no id 103"),
    ("benchmarks.peft_memory", ["--layers", "0"], "--layers: 0 is below the minimum 1"),
    ("benchmarks.peft_memory", ["--width", "128", "--heads", "3"], "--heads: --width 128 is not divisible by 3"),
    ("benchmarks.peft_memory", ["--batch", "-2"], "--batch: -2 is below the minimum 1"),
    # the config's own key (n_vocab, peft.lora.rank) is not on this command line: the flag is
    ("benchmarks.peft_memory", ["--vocab", "1"], "error: --vocab: 1 is below the minimum 2"),
    ("benchmarks.peft_memory", ["--width", "4", "--heads", "4"], "error: --width: 4 is below the minimum 8, the LoRA"),
])
def test_train_step_benchmark_mistakes(module_name, argv, message, capsys):
    assert message in one_line_error(module_name, argv, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps: 0 is below the minimum 1"),
    (["--steps", "-1"], "--steps: -1 is below the minimum 1"),
    (["--layers", "0"], "--layers: 0 is not a positive even depth"),
    (["--layers", "-2"], "--layers: -2 is not a positive even depth"),
    (["--layers", "3"], "--layers: 3 is not a positive even depth"),
    (["--shape", "7B"], "--shape: unknown shape '7B' (known: cpu, 125M, 1.3B, 2.7B)"),
    (["--hf-flax", "/nonexistent"], "--hf-flax: /nonexistent holds no transformers; pip install"),
    # a value the config rejects names the flag that set it, not a --set the command line never had
    (["--loss-chunk", "-5"], "error: --loss-chunk -5: loss_chunk: -5 is below the minimum 0"),
    # --set reaches the config, but not the keys the flags, the shape or the benchmark set
    (["--set", "attention_kernel=nope"], "--set attention_kernel=\"nope\": attention_kernel: \"nope\" is not one of"),
    (["--set", "n_ctx=64"], "error: --set n_ctx=64: n_ctx is set by --seq"),
    (["--set", "n_embd=64"], "error: --set n_embd=64: n_embd is set by --shape cpu"),
    (["--set", "mesh_shape=x:2"], "error: --set mesh_shape=x:2: mesh_shape is fixed by this benchmark"),
    # flags --compile-only or --no-peer would have ignored without a word
    (["--compile-only", "--profile", "trace"], "error: --profile: not with --compile-only, which runs nothing"),
    (["--compile-only", "--torch-compile"], "error: --torch-compile: not with --compile-only"),
    (["--compile-only", "--hf-flax", "/tmp"], "error: --hf-flax: not with --compile-only"),
    (["--no-peer", "--torch-compile"], "error: --torch-compile: not with --no-peer, which leaves out the PyTorch"),
])
def test_train_step_benchmark_mistakes_exit_2(argv, message, capsys):
    assert message in one_line_error("benchmarks.train_step", argv, capsys)


def test_train_step_benchmark_sets_other_keys_of_the_shape():
    import argparse

    from benchmarks.train_step import shape_config

    flags = dict(seq=256, batch=8, precision="float32", remat="none", loss_chunk=None, scan=False, logits_pad=None,
                 vocab=None, layers=None)
    cfg = shape_config("125M", argparse.Namespace(**flags, set=["attention_kernel=xla", "z_loss=0.001"]))
    assert (cfg.attention_kernel, cfg.z_loss, cfg.n_ctx, cfg.n_embd) == ("xla", 0.001, 256, 768)
    assert shape_config("125M", argparse.Namespace(**flags, set=[])).attention_kernel == "auto"


def test_train_step_benchmark_shape_is_exit_status_2_from_the_command_line():
    result = subprocess.run([sys.executable, "benchmarks/train_step.py", "--shape", "7B"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("error: --shape: unknown shape '7B'"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_hf_flax_peer_says_how_it_is_used():
    result = subprocess.run([sys.executable, "benchmarks/hf_flax_peer.py", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and "train_step.py --hf-flax" in result.stdout and "stdin" in result.stdout
    result = subprocess.run([sys.executable, "benchmarks/hf_flax_peer.py"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, input="not json")
    assert result.returncode == 2 and result.stderr.startswith("error: hf_flax_peer.py: the request on stdin")
    assert len(result.stderr.strip().splitlines()) == 1


QUICKSTART = ["--neomesh-only", "--config", "configs/quickstart.json"]


@pytest.mark.parametrize("argv, message", [
    (["--new-tokens", "0"], "--new-tokens: 0 is below the minimum 1"),
    (["--new-tokens", "-2"], "--new-tokens: -2 is below the minimum 1"),
    (["--prompt-tokens", "0"], "--prompt-tokens: 0 is below the minimum 1"),
    (["--repeats", "0"], "--repeats: 0 is below the minimum 1"),
    (["--batch-sizes", "1,x"], "--batch-sizes: 'x' is not a positive whole number"),
    (["--batch-sizes", "0"], "--batch-sizes: '0' is not a positive whole number"),
    (["--prompt-tokens", "300", "--new-tokens", "2"], "--prompt-tokens 300 + --new-tokens 2 is more than the 128 "
                                                      "positions (n_ctx) of configs/quickstart.json"),
    (["--compile-only", "--batch-sizes", "0"], "--batch-sizes: '0' is not a positive whole number"),
    (["--compile-only", "--prompt-tokens", "127", "--new-tokens", "2"], "is more than the 128 positions"),
    (["--static-cache", "16", "--batch-sizes", "1,8"], "--static-cache: '16' is not one of --batch-sizes 1,8"),
    (["--compile-only", "--profile", "trace"], "--profile: not with --compile-only, which runs nothing to profile"),
    (["--static-cache"], "error: --static-cache: transformers' cache, not with --neomesh-only, which times NeoMesh"),
])
def test_generate_benchmark_mistakes(argv, message, capsys):
    assert message in one_line_error("benchmarks.generate", QUICKSTART + argv, capsys)


@pytest.mark.parametrize("extra", [[], ["--compile-only"]])
def test_generate_benchmark_refuses_a_model_that_does_not_generate(extra, capsys):
    line = one_line_error("benchmarks.generate", ["--neomesh-only", "--config", "configs/bert_mlm.json"] + extra,
                          capsys)
    assert line.startswith("error: --config configs/bert_mlm.json: model bert (masked_lm) does not generate text")


@pytest.mark.parametrize("argv, message", [
    (["--train-steps", "-1"], "--train-steps: -1 is below the minimum 0"),
    (["--batches", "0"], "--batches: 0 is below the minimum 1"),
    (["--resume-at", "-3"], "--resume-at: -3 is below the minimum 0"),
    (["--batch-size", "0"], "--batch-size: 0 is below the minimum 1"),
    (["--config", "bert_mlm"], "--config bert_mlm: model bert, task masked_lm; this benchmark times the "
                               "quickstart's data through a plain causal-LM train step"),
])
def test_input_pipeline_benchmark_mistakes(argv, message, capsys):
    assert message in one_line_error("benchmarks.input_pipeline", argv, capsys)


def test_a_failing_peer_is_one_table_cell():
    """A peer that fails (out of memory, a compile error) is a row saying so; a message of blanks was an IndexError."""
    from benchmarks.flags import failure

    assert failure(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail")) == \
        "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"
    assert failure(ValueError("  \n")) == "ValueError" and failure(KeyError()) == "KeyError"


def test_the_static_cache_runs_at_the_batch_sizes_it_names():
    """``--static-cache`` alone compiles transformers' static cache at every batch size, ``--static-cache 1`` at
    batch 1 only (each batch size is a compile of its own: on an H100 the one at batch 16 outran its budget)."""
    import argparse

    from benchmarks.generate import static_batch_sizes

    def sizes(static):
        return static_batch_sizes(argparse.Namespace(batch_sizes="1,16", static_cache=static, new_tokens=4,
                                                     prompt_tokens=4, repeats=1))

    assert sizes("all") == [1, 16] and sizes("1") == [1] and sizes("16,1") == [16, 1]


def test_train_step_benchmark_keeps_its_table_when_the_flax_peer_fails(tmp_path, monkeypatch, capsys):
    """A Flax peer that fails (a 4.x that does not import, out of memory) is a row, as a failing PyTorch peer is:
    the run used to end in an error after NeoMesh's row, without its table or the shapes after it."""
    from benchmarks import train_step

    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("raise ImportError('a broken install')\n")
    monkeypatch.setattr(train_step, "neomesh", lambda cfg, tokens: {"seconds": 0.5, "compile": 1.0, "peak": None})
    train_step.main(["--no-peer", "--seq", "8", "--batch", "1", "--steps", "1", "--layers", "2", "--vocab", "64",
                     "--hf-flax", str(tmp_path)])
    table = capsys.readouterr().out.split("| shape |", 1)[1]
    assert "| cpu (2x256) | NeoMesh (JAX) | 16 |" in table
    assert "| cpu (2x256) | transformers 4.x (Flax) | failed: ImportError: a broken install |" in table


def test_train_step_benchmark_refuses_an_hf_flax_directory_without_a_transformers_package(tmp_path, capsys):
    (tmp_path / "transformers").mkdir()  # a folder of that name, no package in it
    line = one_line_error("benchmarks.train_step", ["--hf-flax", str(tmp_path)], capsys)
    assert line.startswith(f"error: --hf-flax: {tmp_path} holds no transformers; pip install --no-deps --target")


def test_generate_benchmark_table_names_the_keys_set(capsys):
    """Two runs that differ in a ``--set`` key (decode_kernel=cudnn against the default, as gpu.sh's variants time)
    printed the same title; the key set now follows the model's shape."""
    from benchmarks import generate

    generate.main(["--config", "configs/quickstart.json", "--compile-only", "--batch-sizes", "1", "--new-tokens", "2",
                   "--prompt-tokens", "4", "--set", "decode_kernel=xla"])
    assert "4 layers x 192, decode_kernel=xla, float32, prompt 4 + 2 new tokens, greedy; compiled for cpu" in \
        capsys.readouterr().out


@pytest.mark.parametrize("module_name, argv", [
    ("benchmarks.train_step", ["--no-peer"]),
    ("benchmarks.generate", QUICKSTART),
])
def test_a_profile_directory_that_is_a_file_is_refused_before_timing(module_name, argv, tmp_path, capsys):
    """The trace's writer failed with a traceback after every step was timed."""
    (tmp_path / "trace").write_text("")
    line = one_line_error(module_name, argv + ["--profile", str(tmp_path / "trace")], capsys)
    assert line == f"error: --profile: {tmp_path / 'trace'} is a file, not a directory for the trace"


def test_train_step_benchmark_without_torch_says_so_and_times_neomesh(monkeypatch, capsys):
    """Without torch the PyTorch peer was a row of ModuleNotFoundError; now one note with the install line, as
    generate.py has, and NeoMesh's rows."""
    from benchmarks import train_step

    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch fails as where it is not installed
    monkeypatch.setattr(train_step, "neomesh", lambda cfg, tokens: {"seconds": 0.5, "compile": 1.0, "peak": None})
    train_step.main(["--seq", "8", "--batch", "1", "--steps", "1", "--layers", "2", "--vocab", "64"])
    out = capsys.readouterr().out
    assert "note: the PyTorch peer needs the test requirements (torch is missing): pip install -r " \
           "requirements-test.txt; timing NeoMesh alone" in out
    assert "PyTorch," not in out.split("| shape |", 1)[1] and "| cpu (2x256) | NeoMesh (JAX) | 16 |" in out
