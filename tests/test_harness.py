"""The lm-evaluation-harness model "neomesh": its loglikelihoods against a direct computation, rolling
windows, greedy generation, and a tiny local task run through the harness itself (no downloads)."""

import json
import os

import pytest
from lm_eval.api.instance import Instance

from evaluation.harness import NeoMeshLM
from evaluation.scorer import Scorer
from tests import hf_fixtures
from tests.common import run_command
from tests.test_eval import direct_logprobs, write_jsonl


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model = hf_fixtures.gpt_neo(n_ctx=32)
    hf_fixtures.randomize(model)
    return hf_fixtures.save(model, tmp_path_factory.mktemp("hf") / "gpt_neo")


@pytest.fixture(scope="module")
def lm(hf_dir):
    return NeoMeshLM(path=hf_dir, batch_size=4, max_gen_toks=8)


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_loglikelihood_and_rolling_equal_a_direct_computation(lm):
    s = lm.scorer
    pairs = [("def add(a, b):", " return a + b"), ("", "import os"), ("x = 1  ", "# one"),
             ("class " * 20, "Point:")]  # the last one's context is cut to n_ctx
    got = lm.loglikelihood(requests("loglikelihood", pairs))
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        context_ids, continuation_ids = s.encode_pair(context, continuation)
        ids = (context_ids + continuation_ids)[-(s.max_length + 1):]
        direct = direct_logprobs(s.cfg, s.graphdef, s.params, ids)[-len(continuation_ids):].sum()
        assert logprob == pytest.approx(direct, abs=1e-5) and isinstance(greedy, bool)
    assert s.encode_pair("x = 1  ", "# one")[1] == s.tokenizer.encode("x = 1  # one")[len(s.tokenizer.encode("x = 1")):]

    short, long = "def f(x):\n    return x", "import os\n" * 30
    rolled = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(short,), (long,)]))
    n = s.max_length
    assert len(s.tokenizer.encode(long)) > 2 * n > n > len(s.tokenizer.encode(short))  # 3+ windows, and 1
    for text, value in zip((short, long), rolled):
        ids = [s.tokenizer.eos_id] + s.tokenizer.encode(text)  # every token once, after end-of-text
        total = 0.0
        for start in range(0, len(ids) - 1, n):  # chunks of n predicted tokens, each read with n inputs
            end = min(start + n, len(ids) - 1)
            window = ids[max(0, end - n):end + 1]
            total += direct_logprobs(s.cfg, s.graphdef, s.params, window)[-(end - start):].sum()
        assert value == pytest.approx(total, abs=1e-4)


def test_generate_until_is_greedy_and_stops(lm):
    from models.generate import complete

    s = lm.scorer
    prompts = ["def ", "import "]
    full = [complete(s.graphdef, s.params, s.tokenizer, p, 6, s.max_length, temperature=0.0) for p in prompts]
    out = lm.generate_until(requests("generate_until", [(p, {"max_gen_toks": 6}) for p in prompts]))
    assert out == full and all(full)
    stop = full[0][1:3]
    (cut,) = lm.generate_until(requests("generate_until", [("def ", {"until": [stop], "max_gen_toks": 6})]))
    assert cut == full[0][:full[0].index(stop)]


@pytest.mark.e2e  # lm_eval's own command line, as a user runs it
def test_a_local_multiple_choice_task_through_the_harness(tmp_path, hf_dir, lm, monkeypatch):
    """lm_eval's own command line and task machinery (a YAML task on a local jsonl) with the neomesh model score
    the same as evaluation.multiple_choice."""
    from evaluation import multiple_choice

    questions = [{"context": "def add(a, b):\n    return", "choices": ["a + b", "import os"], "label": 0},
                 {"context": "import", "choices": ["os", "def", "class x"], "label": 0},
                 {"context": "x = [1, 2,", "choices": ["3]", "x"], "label": 0}]
    data = write_jsonl(tmp_path / "questions.jsonl", questions)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny.yaml").write_text(
        "task: neomesh_tiny_choice\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{{{context}}}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the task's data is a local file: nothing to fetch
    ours = multiple_choice.evaluate(Scorer(lm.scorer.cfg, lm.scorer.graphdef, lm.scorer.params, lm.tokenizer),
                                    data)
    out = tmp_path / "results"
    result = run_command("-m", "evaluation.harness", "--model", "neomesh", "--model_args",
                         f"path={hf_dir},batch_size=4", "--tasks", "neomesh_tiny_choice", "--include_path",
                         str(tasks), "--output_path", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = [os.path.join(d, f) for d, _, files in os.walk(out) for f in files if f.startswith("results")]
    with open(written) as f:
        results = json.load(f)["results"]["neomesh_tiny_choice"]
    assert results["acc,none"] == pytest.approx(ours["choice_acc"])
    assert results["acc_norm,none"] == pytest.approx(ours["choice_acc_norm"])


def test_model_args_are_checked_and_the_command_lines_other_options_left_out(hf_dir):
    """A misspelt --model_args key (mesh_shape) would otherwise run unsharded without a word."""
    from config import ConfigError

    with pytest.raises(ConfigError, match="--model_args mesh_shap: not an argument of the neomesh model"):
        NeoMeshLM.create_from_arg_string(f"path={hf_dir},mesh_shap=x:2")
    with pytest.raises(ConfigError, match="--model_args: give path=DIR"):
        NeoMeshLM.create_from_arg_string("batch_size=2")
    lm = NeoMeshLM.create_from_arg_string(f"path={hf_dir},max_gen_toks=4",
                                          {"batch_size": 2, "max_batch_size": None, "device": "cuda"})
    assert lm.max_gen_toks == 4 and lm.scorer.batch_size == 2


def test_a_missing_include_path_or_an_unknown_task_is_one_line(tmp_path, monkeypatch, capsys):
    """The README's harness command run before my_tasks/ exists, or with a task name lm_eval does not know, ended
    in lm_eval's ValueError traceback."""
    from evaluation import harness

    argv = ["--model", "neomesh", "--model_args", "path=runs/quickstart", "--tasks", "my_task"]
    assert harness.main([*argv, "--include_path", str(tmp_path / "my_tasks")]) == 2
    assert capsys.readouterr().err == (f"error: --include_path {tmp_path / 'my_tasks'}: no such folder (it holds the "
                                       "YAML files of your own tasks)\n")

    def unknown_task():
        raise ValueError("Tasks not found: my_task")

    monkeypatch.setattr("lm_eval.__main__.cli_evaluate", unknown_task)
    assert harness.main([*argv, f"--include_path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tasks: Tasks not found: my_task (") and len(err.splitlines()) == 1


def test_model_args_whose_values_hold_commas_are_sent_to_the_json_form(monkeypatch, capsys):
    """lm_eval splits key=value --model_args at every comma: mesh_shape=x:4,y:2 ended in lm_eval's "expected
    `key=value`, got 'y:2'", which names neither the key nor the JSON form that keeps the commas."""
    from evaluation import harness

    ran = []
    monkeypatch.setattr("lm_eval.__main__.cli_evaluate", lambda: ran.append(True))
    meant = ["path=RUN,mesh_shape=x:4,y:2,layout=batch:x,heads:y"]
    assert harness.main(["--model", "neomesh", "--model_args", *meant, "--tasks", "my_task"]) == 2
    assert capsys.readouterr().err == (
        "error: --model_args: 'y:2' is not key=value: lm_eval splits --model_args at commas, so values holding commas "
        "(mesh_shape, layout) go in its JSON form: --model_args "
        """'{"path": "RUN", "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y"}'\n""")
    assert harness.main(["--model=neomesh", "-a", "x:2,path=RUN", "--tasks", "my_task"]) == 2
    assert capsys.readouterr().err.endswith(
        """--model_args '{"path": "RUN", "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y"}'\n""")
    json_form = '{"path": "RUN", "mesh_shape": "x:4,y:2"}'
    for model, model_args in (("neomesh", json_form), ("neomesh", "path=RUN,batch_size=4"), ("hf", "a=1,b")):
        assert harness.main(["--model", model, "--model_args", model_args, "--tasks", "my_task"]) == 0
    assert len(ran) == 3 and capsys.readouterr().err == ""


def test_the_command_runs_under_the_xla_defaults_of_the_other_commands(monkeypatch):
    """predict.py and eval.py start jax under NeoMesh's XLA defaults (GPU flags measured for decoding and
    scoring); the harness's command ran without them."""
    from evaluation import harness
    from parallel.xla_flags import DEFAULT_XLA_FLAGS, flag_names

    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # both restored after the test
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setattr("lm_eval.__main__.cli_evaluate", lambda: None)
    assert harness.main(["--model", "neomesh", "--model_args", "path=RUN", "--tasks", "my_task"]) == 0
    assert set(DEFAULT_XLA_FLAGS) <= flag_names(os.environ["XLA_FLAGS"])


def test_a_task_whose_data_set_cannot_be_fetched_is_one_line(monkeypatch, capsys):
    """python -m evaluation.harness --tasks lambada_openai offline ended in datasets' ConnectionError traceback."""
    from evaluation import harness

    def offline():
        raise ConnectionError("Couldn't reach 'EleutherAI/lambada_openai' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr("lm_eval.__main__.cli_evaluate", offline)
    argv = ["--model", "neomesh", "--model_args", "path=runs/quickstart", "--tasks", "lambada_openai"]
    assert harness.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tasks: Couldn't reach 'EleutherAI/lambada_openai' on the Hub") and \
        "HF_DATASETS_OFFLINE=1" in err and len(err.splitlines()) == 1


def test_without_lm_eval_the_commands_say_what_to_install(monkeypatch, capsys):
    """requirements.txt leaves lm_eval out (the [eval] extra): python -m evaluation.harness and neomesh-lm-eval
    ended in an ImportError traceback."""
    import importlib.util
    import subprocess
    import sys

    from neomesh import cli

    code = ("import sys, runpy; sys.modules['lm_eval'] = None; sys.argv = ['harness', '--help']; "
            "runpy.run_module('evaluation.harness', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 2 and result.stderr == (
        "error: python -m evaluation.harness runs lm-evaluation-harness, which is not installed: pip install lm_eval "
        "(or NeoMesh's [eval] extra)\n"), result.stderr
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else find_spec(name, *a))
    assert cli.lm_eval(["--help"]) == 2
    assert "neomesh-lm-eval runs lm-evaluation-harness, which is not installed" in capsys.readouterr().err
