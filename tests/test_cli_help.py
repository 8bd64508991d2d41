"""Every command line: help texts with defaults, no abbreviations, and the mistakes that need no training caught
before jax starts (a typo'd config file or key, a bad --set, a missing Hugging Face model)."""

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from tests.common import ROOT

MAIN_MODULES = ["train", "predict", "data.train_tokenizer", "data.create_tfrecords", "data.make_dataset",
                "convert.__main__", "benchmarks.generate", "benchmarks.input_pipeline",
                "benchmarks.mlm_train_step", "benchmarks.t5_train_step", "benchmarks.vit_train_step",
                "benchmarks.train_step", "benchmarks.peft_memory", "eval", "tools.plot", "evaluation.lambada"]


class Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(module_name: str, monkeypatch) -> argparse.ArgumentParser:
    """The ArgumentParser a command's ``main`` builds (taken at parse time, before it runs anything)."""
    def capture(self, args=None, namespace=None):
        raise Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    module = importlib.import_module(module_name)
    with pytest.raises(Captured) as caught:
        module.main([])
    return caught.value.parser


def all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_parsers(sub)


@pytest.mark.parametrize("module_name", MAIN_MODULES)
def test_every_option_has_help_its_default_and_no_abbreviation(module_name, monkeypatch):
    for parser in all_parsers(parser_of(module_name, monkeypatch)):
        assert parser.allow_abbrev is False, parser.prog
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{parser.prog} {action.dest}: no help text"
            shown = formatter._get_help_string(action) % {"default": action.default}
            worth_showing = not (action.default is None or action.default is False or action.default == []
                                 or action.default is argparse.SUPPRESS)
            if worth_showing and not action.required and action.option_strings:
                assert f"{action.default}" in shown, f"{parser.prog} {action.dest}: default not shown: {shown}"


@pytest.mark.parametrize("module_name", MAIN_MODULES)
def test_a_usage_mistake_is_one_line(module_name, monkeypatch, capsys):
    """An unknown flag (or a missing argument, a bad value) is one line, not argparse's usage block and a second
    line."""
    parser = parser_of(module_name, monkeypatch)
    monkeypatch.undo()
    for parser in all_parsers(parser):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["--no-such-flag"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err


@pytest.mark.parametrize("module_name, argv, hint", [
    ("train", ["--confg", "quickstart"], "unrecognized arguments: --confg quickstart; did you mean --config?"),
    ("train", ["--model_path", "runs/x"], "did you mean --model-path?"),
    ("train", ["--model_name_or_path", "gpt2"], "did you mean --init-from?"),  # Hugging Face's examples' flag
    ("predict", ["--prompt", "x", "--model_name_or_path", "gpt2"], "did you mean --hf-model?"),
    ("predict", ["--prompt", "x", "--max_new_tokens=5"], "did you mean --max-new-tokens?"),
    ("predict", ["--promt", "x"], "unrecognized arguments: --promt; did you mean --prompt?"),  # was: one of the
    # arguments --prompt ... is required
    ("train", ["--config", "quickstart", "--train_steps", "10"], "did you mean --set train_steps=10?"),  # a key
    ("train", ["--model", "x", "--steps_per_checkpoint", "500"], "did you mean --set steps_per_checkpoint=500?"),
    ("predict", ["--prompt", "x", "--precision=bfloat16"], "did you mean --set precision=bfloat16?"),
    ("train", ["--model", "x", "--save_steps", "500"], "did you mean --set steps_per_checkpoint=500?"),  # Hugging
    ("train", ["--model", "x", "--save_total_limit=2"], "did you mean --set keep_checkpoints=2?"),  # Face's names
    # GPT-Neo's main.py flags that train.py does not take (each was a bare "unrecognized arguments")
    ("train", ["--model", "x", "--tpu", "colab"], "GPT-Neo's --tpu: JAX finds the TPU itself; run train.py on the"),
    ("train", ["--model", "x", "--predict", "--prompt", "p.txt"], "GPT-Neo's --predict: python predict.py "
     "--model-path DIR --prompt-from-file FILE samples a run"),
    ("train", ["--model", "x", "--sacred_id", "3"], "GPT-Neo's --sacred_id: NeoMesh has no Sacred; each run writes"),
    ("train", ["--model", "x", "--entmax_sampling"], "GPT-Neo's --entmax_sampling: python predict.py --model-path "
     "DIR --entmax-sampling"),
    ("train", ["--model", "x", "--gpu_ids", "device:GPU:0"], "choose them with CUDA_VISIBLE_DEVICES"),
    ("train", ["--model", "x", "--auto_layout_and_mesh_shape"], "--set mesh_shape=auto layout=auto"),
    ("train", ["--model", "x", "--export"], "GPT-Neo's --export: python -m convert export RUN_DIR HF_DIR"),
])
def test_an_unknown_flag_gets_the_closest_one(module_name, argv, hint, capsys):
    module = importlib.import_module(module_name)
    with pytest.raises(SystemExit) as e:
        module.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and hint in err, err


@pytest.mark.parametrize("module_name", ["train", "predict", "eval"])
def test_several_key_values_follow_one_set(module_name):
    """``--set n_layer=2 lr=1e-3`` as the usage line ``[--set KEY=VALUE [KEY=VALUE ...]]`` reads, and repeated."""
    parser = importlib.import_module(module_name).build_parser()
    args = parser.parse_args(["--set", "n_layer=2", "lr=1e-3", "--set", "seed=3", "--model-path", "runs/x"]
                             + (["--prompt", "x"] if module_name == "predict" else []))
    assert args.set == ["n_layer=2", "lr=1e-3", "seed=3"]


def test_model_is_not_taken_for_model_path():
    """GPT-Neo's --model NAME names a config; no abbreviation turns it into --model-path."""
    import train
    args = train.parse_args(["--model", "quickstart"])
    assert args.model == "quickstart" and args.model_path is None
    with pytest.raises(SystemExit):  # a config named twice
        train.parse_args(["--config", "quickstart", "--model", "gpt-neo-125M"])
    import predict
    args = predict.parse_args(["--model", "x", "--prompt", "y"])
    assert args.model == "x" and args.model_path is None


def run_without_jax(module: str, argv: list[str], env: dict | None = None) -> tuple[int, str, bool]:
    """Runs ``module.main(argv)`` in a fresh interpreter: (exit code, stderr, whether jax was imported)."""
    code = (f"import sys, {module}; code = {module}.main({argv!r}); "
            "print('JAX_IMPORTED' if 'jax' in sys.modules else 'NO_JAX'); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=env)
    return result.returncode, result.stderr, "JAX_IMPORTED" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--config", "configs/quickstat.json"],
     "error: configs/quickstat.json: config file not found; did you mean configs/quickstart.json?"),
    (["--config", "quikstart"], "did you mean quickstart?"),
    (["--config", "quickstart", "--set", "n_embed=256"], "error: --set n_embed=256: unknown key 'n_embed'; did you "
                                                         "mean 'n_embd'?"),
    (["--config", "quickstart", "--set", "n_embd=250"], "error: --set n_embd=250: n_embd: 250 is not divisible"),
    (["--config", "quickstart", "--set", "log_every=0"], "log_every: 0 is below the minimum 1"),
    (["--config", "quickstart", "--init-from", "EleutherAI/gpt-neo-125M"], "huggingface-cli download"),
    (["--config", "t5_small_spans", "--set", "span_corruption=false"], "error: span_corruption: false, so task "
     "seq2seq reads (input, target) pairs from jsonl files, but configs/dataset_configs/embedded_bpe_spans.json names "
     "text ("),
    (["--config", "t5_reverse_words", "--set", "span_corruption=true"], "error: span_corruption: true cuts spans out "
     "of plain text, but configs/dataset_configs/reverse_words.json names (input, target) pairs"),
    (["--config", "bert_mlm", "--set", "mlm_training=false"], "error: mlm_training: false, but task masked_lm"),
])
def test_train_mistakes_are_one_line_before_jax(argv, message, tmp_path):
    import os
    code, stderr, jax_imported = run_without_jax("train", argv, env={**os.environ, "HF_HUB_CACHE": str(tmp_path)})
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not jax_imported


def test_predict_mistakes_are_one_line_before_jax(tmp_path):
    import os
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path)}
    code, stderr, jax_imported = run_without_jax("predict", ["--hf-model", "EleutherAI/gpt-neo-125M", "--prompt", "x"],
                                                 env)
    assert code == 2 and "huggingface-cli download EleutherAI/gpt-neo-125M" in stderr and str(tmp_path) in stderr
    assert not jax_imported
    code, stderr, jax_imported = run_without_jax("predict", ["--config", "configs/quickstat.json", "--prompt", "x"],
                                                 env)
    assert code == 2 and "did you mean configs/quickstart.json?" in stderr and not jax_imported


def test_a_config_in_another_folder_gets_a_did_you_mean_from_that_folder(tmp_path):
    from config import ConfigError, load_config
    (tmp_path / "mymodel.json").write_text(json.dumps({"n_layer": 2}))
    with pytest.raises(ConfigError, match=f"did you mean {tmp_path}/mymodel.json"):
        load_config(str(tmp_path / "mymodle.json"))
    assert load_config(str(tmp_path / "mymodel.json"))[0].model_path == "runs/mymodel"


def test_shipped_configs_load_by_name_from_any_directory(tmp_path, monkeypatch):
    from config import load_config
    monkeypatch.chdir(tmp_path)
    by_name, _ = load_config("moe")
    by_path, _ = load_config("configs/moe.json")  # the README's spelling, from outside the repository
    assert by_name == by_path and by_name.moe_layers == [1, 3]


def test_legacy_key_in_set_is_a_note_naming_set():
    from config import load_config
    _, notes = load_config("quickstart", ("iterations=5",))
    assert notes and notes[0].startswith("--set iterations=5: 'iterations' has no effect")


def test_mesh_needing_more_devices_says_how_to_simulate_them_on_cpu():
    from config import ConfigError
    from parallel.mesh import make_mesh, parse_mesh_shape
    with pytest.raises(ConfigError, match="xla_force_host_platform_device_count=16"):
        make_mesh("x:8,y:2")  # tests run on 8 simulated CPU devices
    with pytest.raises(ConfigError) as accelerator:
        parse_mesh_shape("x:16", 8, platform="tpu")
    assert "XLA_FLAGS" not in str(accelerator.value)


@pytest.mark.parametrize("text, platform, fix", [
    ("x:3", "cpu", "needs 3 devices but 8 are available; make its sizes multiply to 8 ('x:-1' sizes x to fit); "
                   "on CPU, simulate 3 devices with XLA_FLAGS=--xla_force_host_platform_device_count=3"),
    ("x:3,y:2", "gpu", "needs 6 devices but 8 are available; make its sizes multiply to 8 ('x:-1,y:2' sizes x to "
                       "fit); on GPUs, use 6 with CUDA_VISIBLE_DEVICES=0,1,2,3,4,5"),
    ("x:3,y:3", "tpu", "needs 9 devices but 8 are available; make its sizes multiply to 8"),  # no axis sizes to fit
])
def test_mesh_needing_fewer_devices_says_how_to_fit_them(text, platform, fix):
    """Too many devices was a bare count: the line now says how to fit them, as the line for too few does."""
    from config import ConfigError
    from parallel.mesh import parse_mesh_shape
    with pytest.raises(ConfigError) as e:
        parse_mesh_shape(text, 8, platform=platform)
    assert str(e.value) == f"mesh_shape: '{text}' {fix}"


@pytest.mark.parametrize("text, platform, fix", [
    ("x:16", "cpu", "needs 16 devices but 8 are available; make its sizes multiply to 8 ('x:-1' sizes x to fit); "
                    "on CPU, simulate 16 devices with XLA_FLAGS=--xla_force_host_platform_device_count=8 in each "
                    "of the 2 processes"),
    ("x:2,y:2", "gpu", "needs 4 devices but 8 are available; make its sizes multiply to 8 ('x:-1,y:2' sizes x to "
                       "fit); on GPUs, use 4 with CUDA_VISIBLE_DEVICES=0,1 in each of the 2 processes"),
])
def test_mesh_device_hints_count_per_process(text, platform, fix):
    """XLA_FLAGS and CUDA_VISIBLE_DEVICES count one process's devices: on 2 processes of 4 the hint for 16 devices
    said '=16', which makes 32."""
    from config import ConfigError
    from parallel.mesh import parse_mesh_shape
    with pytest.raises(ConfigError) as e:
        parse_mesh_shape(text, 8, platform=platform, processes=2)
    assert str(e.value) == f"mesh_shape: '{text}' {fix}"


def test_generate_benchmark_without_torch_says_what_to_install_times_neomesh_alone_and_profiles_it(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; from benchmarks import generate; generate.main(['--config', "
            "'quickstart', '--batch-sizes', '1', '--new-tokens', '2', '--prompt-tokens', '4', '--repeats', '1', "
            f"'--profile', {str(tmp_path)!r}])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("note: the transformers side needs torch and transformers (torch is missing: pip "
                               "install -r requirements-test.txt)")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines
            if line.startswith(("| NeoMesh", "| transformers"))]  # | implementation | batch | tokens/s | ms/token |
    assert [row[:2] for row in rows] == [["NeoMesh (JAX)", "1"]] and float(rows[0][2].replace(",", "")) > 0
    # --profile: the generation's ops by time (its decode loop's among them), and their sum per new token
    ops = [line.split("|")[2].strip() for line in lines if line.startswith("| ") and line.split("|")[1].strip()
           .replace(".", "").replace(",", "").isdigit()]
    assert any(op.startswith("while/body/") for op in ops), ops
    summary = next(line for line in lines if line.startswith("batch 1: the traced ops add up to "))
    assert float(summary.split("add up to ")[1].split()[0]) > 0 and list(tmp_path.rglob("perfetto_trace.json.gz"))


def test_generate_benchmark_compile_only_plans_one_device_without_running(capsys, tmp_path):
    import argparse

    from benchmarks import generate
    from config import ConfigError

    hlo = tmp_path / "plan.hlo"
    args = argparse.Namespace(config="quickstart", precision="float32", new_tokens=4, prompt_tokens=4,
                              batch_sizes="1,2", topology=None, set=[], hlo=str(hlo))
    generate.compile_plan(args)
    assert "ENTRY" in hlo.read_text() and "while(" in hlo.read_text()  # --hlo: the program, its decode loop
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("quickstart: 4 layers x 192, float32, prompt 4 + 4 new tokens, greedy; compiled for "
                               "cpu (cpu); weights 7.99 MB")  # 2.00M parameters in float32
    assert lines[1] == "| batch | KV cache | temporaries | compile s |"  # kernels per token: GPUs only
    (one, cache_one, temp_one, _), (two, cache_two, _, _) = ([cell.strip() for cell in line.strip("|").split("|")]
                                                             for line in lines[3:])
    size = lambda text: float(text.split()[0]) * {"B": 1, "kB": 1e3, "MB": 1e6}[text.split()[1]]  # noqa: E731
    assert (one, two) == ("1", "2") and size(cache_two) == pytest.approx(2 * size(cache_one), rel=0.01)
    assert size(temp_one) > 0
    with pytest.raises(ConfigError, match="--topology: only with --compile-only"):
        generate.main(["--config", "quickstart", "--topology", "h100"])
    with pytest.raises(ConfigError, match="--hlo: only with --compile-only"):
        generate.main(["--config", "quickstart", "--hlo", str(hlo)])


def test_the_gpu_table_script_says_in_one_line_that_it_needs_a_gpu():
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is here: the script would run the whole table")  # tests/test_attention_gpu.py's machine
    result = subprocess.run(["bash", "benchmarks/gpu.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"error: benchmarks/gpu.sh fills the GPU table and needs a GPU; jax here runs on: "
                             f"{jax.default_backend()}\n")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_gpu_table_script_prints_its_usage_without_a_gpu(flag):
    """``--help`` was refused as an unknown part; it prints the script's parts and budgets, on any machine."""
    result = subprocess.run(["bash", "benchmarks/gpu.sh", flag], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: bash benchmarks/gpu.sh [PART ...]\nThe GPU table in one command")
    assert "bash benchmarks/gpu.sh decode scale" in result.stdout and "goals:" in result.stdout
    assert "set -uo" not in result.stdout and "\n#" not in result.stdout
