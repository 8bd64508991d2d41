"""Evaluation: the scorer against a direct computation, LAMBADA on a model forced to know (or miss) the word,
multiple-choice metrics, eval.py, the config keys, and train.py running eval_tasks."""

import functools
import json

import jax
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer, models, pre_tokenizers

from config import ConfigError, from_dict
from data.tokenizer import HFTokenizer
from evaluation import lambada, multiple_choice
from evaluation.scorer import Scorer
from models import registry
from parallel.layout import Layout
from parallel.mesh import make_mesh
from tests.common import metrics_rows, run_command, tiny_config

WORDS = ["<|endoftext|>", "[UNK]"] + list("abcdefghijklmnopqrst") + [str(d) for d in range(10)]  # 32 tokens


def word_tokenizer() -> HFTokenizer:
    """Whitespace-separated words, digits one token each: " 12" is two tokens, so a target can span several."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    return HFTokenizer(tok, "words")


def forced_model(successor: dict[str, str], n_layer: int = 1):
    """A GPT-Neo whose blocks add nothing and whose next token is ``successor[current token]``: one-hot token
    embeddings, no positions, and an LM head that maps each token's normalised embedding to its successor."""
    cfg = tiny_config(n_layer=n_layer, n_vocab=len(WORDS), n_embd=len(WORDS), n_head=4, no_weight_tie=True,
                      attention_types=[[["global"], n_layer]], n_ctx=16)
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(0)))
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(state))
    for block in params["blocks"].values():
        for part, name in (("attn", "out"), ("mlp", "c_proj")):
            block[part][name] = {k: np.zeros_like(v) for k, v in block[part][name].items()}
    params["wte"]["embedding"] = np.eye(len(WORDS), dtype=np.float32)
    params["wpe"]["embedding"] = np.zeros_like(params["wpe"]["embedding"])
    head = np.zeros((len(WORDS), len(WORDS)), np.float32)
    for current, following in successor.items():
        head[WORDS.index(current), WORDS.index(following)] = 10.0
    params["lm_head"]["kernel"] = head
    return cfg, graphdef, params


@functools.cache
def _logits_of(graphdef):
    return jax.jit(lambda params, ids: nnx.merge(graphdef, nnx.State(params))(ids)[0])


def direct_logprobs(cfg, graphdef, params, ids: list[int], greedy: bool = False):
    """log p(ids[i+1] | ids[:i+1]) for every i, from one forward pass and numpy (and, with ``greedy``, whether
    argmax picks ids[i+1]). The inputs are right-padded to n_ctx, which no causal position reads: one program
    serves every length."""
    inputs = np.zeros((1, cfg.n_ctx), np.int32)
    inputs[0, :len(ids) - 1] = ids[:-1]
    logits = np.asarray(_logits_of(graphdef)(params, inputs)[0, :len(ids) - 1], np.float64)  # (T, V)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    picked = logp[np.arange(len(ids) - 1), ids[1:]]
    return (picked, logits.argmax(-1) == np.asarray(ids[1:])) if greedy else picked


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_lambada_accuracy_and_perplexity_on_a_model_forced_to_know_the_word(tmp_path):
    texts = ["a b c d", "e f g", "h i 12", "j k l 34"]
    forced = {"c": "d", "f": "g", "i": "1", "1": "2",  # the first three targets, every token of them
              "l": "3", "3": "5"}  # " 34": the first token right, the second wrong -> a miss
    path = write_jsonl(tmp_path / "lambada.jsonl", [{"text": t} for t in texts])
    tokenizer = word_tokenizer()
    cfg, graphdef, params = forced_model(forced)
    result = lambada.evaluate(Scorer(cfg, graphdef, params, tokenizer, batch_size=3), path)
    assert result["lambada_acc"] == 0.75 and result["lambada_examples"] == 4
    # Perplexity: exp(-mean log-likelihood of the targets), each computed directly from the model's logits.
    target_ll = []
    for text in texts:
        context, word = text.rsplit(" ", 1)
        ids = tokenizer.encode(text)
        target_ll.append(direct_logprobs(cfg, graphdef, params, ids)[-len(tokenizer.encode(word)):].sum())
    assert result["lambada_ppl"] == pytest.approx(np.exp(-np.mean(target_ll)), rel=1e-5)

    unforced = forced_model({"c": "e", "f": "e", "i": "e", "l": "e"})
    missed = lambada.evaluate(Scorer(*unforced, tokenizer), path)
    assert missed["lambada_acc"] == 0.0 and missed["lambada_ppl"] > result["lambada_ppl"]


def test_scorer_equals_a_direct_computation_with_truncation_and_batching():
    cfg = tiny_config(n_vocab=64, n_ctx=16)
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(3)))
    params = nnx.to_pure_dict(state)
    rng = np.random.default_rng(0)
    requests = [(list(rng.integers(1, 64, c)), list(rng.integers(1, 64, n))) for c, n in
                [(3, 1), (10, 4), (30, 2), (1, 16), (7, 3), (15, 1), (2, 2)]]  # (30, 2): context cut to 15

    class Ids:  # token ids as "text": the scorer's token path
        padding_id = eos_id = 0

    scores = Scorer(cfg, graphdef, params, Ids(), batch_size=3).score_tokens(requests)
    for (context, continuation), score in zip(requests, scores):
        ids = (context + continuation)[-(cfg.n_ctx + 1):]
        logp, hits = direct_logprobs(cfg, graphdef, params, ids, greedy=True)
        assert score.logprob == pytest.approx(logp[-len(continuation):].sum(), abs=1e-5)
        assert score.greedy == bool(hits[-len(continuation):].all()) and score.tokens == len(continuation)


def test_sharded_scorer_equals_one_device():
    cfg = tiny_config(n_vocab=64, n_ctx=16)
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(3)))
    params = nnx.to_pure_dict(state)
    tokenizer = word_tokenizer()
    requests = [("a b c", " d"), ("e", " 123"), ("i i i i", " j a")] * 3
    one = Scorer(cfg, graphdef, params, tokenizer, batch_size=8).loglikelihood(requests)
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,heads:y,embd:y")
    placed = jax.tree.map(lambda p, s: jax.device_put(p, s), params,
                          jax.tree.map(lambda _: layout.sharding(()), params))
    eight = Scorer(cfg, graphdef, placed, tokenizer, layout, batch_size=8).loglikelihood(requests)
    assert [s.greedy for s in eight] == [s.greedy for s in one]
    np.testing.assert_allclose([s.logprob for s in eight], [s.logprob for s in one], atol=1e-5)


def test_multiple_choice_metrics_follow_the_log_likelihoods(tmp_path):
    questions = [{"context": "a b", "choices": ["c", "d e f"], "label": 1},
                 {"context": "g", "choices": ["h", "i", "12"], "label": 2},
                 {"context": "c", "choices": ["d", "e"], "label": 0}]
    path = write_jsonl(tmp_path / "choices.jsonl", questions)
    tokenizer = word_tokenizer()
    cfg, graphdef, params = forced_model({"b": "d", "d": "e", "e": "f", "g": "1", "1": "2", "c": "d"})
    result = multiple_choice.evaluate(Scorer(cfg, graphdef, params, tokenizer), path)
    expected = dict.fromkeys(("acc", "acc_norm", "acc_bytes", "acc_per_token"), 0)
    for q in questions:
        lls, tokens = [], []
        for choice in q["choices"]:
            context_ids, ids = tokenizer.encode(q["context"]), tokenizer.encode(q["context"] + " " + choice)
            lls.append(direct_logprobs(cfg, graphdef, params, ids)[len(context_ids) - 1:].sum())
            tokens.append(len(ids) - len(context_ids))
        lengths = np.array([len(c) for c in q["choices"]], float)
        for metric, values in {"acc": lls, "acc_norm": lls / lengths, "acc_bytes": lls / lengths,
                               "acc_per_token": np.array(lls) / tokens}.items():
            expected[metric] += int(np.argmax(values)) == q["label"]
    assert result == {**{f"choice_{k}": v / 3 for k, v in expected.items()}, "choice_questions": 3}
    assert result["choice_acc"] == 1.0  # the forced model knows every answer


@pytest.mark.parametrize("line, message", [
    ("not json", "not a JSON line"),
    ('{"txt": "a b"}', 'an object with a "text" string'),
    ('{"text": "oneword"}', "words before its last space"),
])
def test_lambada_file_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine words here"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"{path}:2: .*{message}"):
        lambada.read_examples(str(path))


def test_multiple_choice_file_errors(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"context": "a", "choices": ["b", "c"], "label": 2}\n')
    with pytest.raises(ConfigError, match=r"q.jsonl:1: label 2 is not one of the 2 choices"):
        multiple_choice.read_questions(str(path))
    path.write_text('{"context": "a", "choices": ["b"], "label": 0}\n')
    with pytest.raises(ConfigError, match=r"q.jsonl:1: a question is an object with"):
        multiple_choice.read_questions(str(path))


def test_files_saved_with_a_byte_order_mark_and_crlf_read_as_without(tmp_path):
    """Windows editors save UTF-8 with a BOM and CRLF line ends: the first line was 'not a JSON line'."""
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"context": "a", "choices": ["b", "c"], "label": 1}\r\n'
                     b'{"context": "d", "choices": ["e", "f"], "label": 0}\r\n')
    assert [q["context"] for q in multiple_choice.read_questions(str(path))] == ["a", "d"]
    path.write_bytes(b'\xef\xbb\xbf{"text": "fine words here"}\r\n')
    assert len(lambada.read_examples(str(path))) == 1


def test_shipped_lambada_file_is_the_embedded_corpus_format():
    examples = lambada.read_examples(lambada.EMBEDDED)
    assert len(examples) >= 300
    assert all(word[0] == " " and word[1:].isalpha() and len(context) >= lambada.PASSAGE_CHARS - 1
               for context, word in examples)


@pytest.mark.parametrize("changes, message", [
    ({"eval_tasks": ["lambda"]}, 'eval_tasks: unknown task "lambda" (known: lambada, multiple_choice)'),
    ({"eval_tasks": ["lambada"], "task": "masked_lm"}, "eval_tasks: lambada score text with a language model"),
    ({"eval_tasks": ["multiple_choice"]}, "eval_tasks: multiple_choice needs multiple_choice_path"),
])
def test_config_errors(changes, message):
    with pytest.raises(ConfigError) as e:
        from_dict(changes)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("key", ["lambada_path", "multiple_choice_path"])
def test_a_task_file_gone_is_an_error_where_it_is_read_not_where_the_config_is(key):
    """A run whose task file moved after training could not be loaded at all (its checkpoint's config failed
    validation): predict.py, export and eval.py --lambada-path each stopped at 'lambada_path: ...: no such file'."""
    from evaluation.tasks import check_config_tasks

    cfg, _ = from_dict({"eval_tasks": ["lambada", "multiple_choice"], "multiple_choice_path": "q.jsonl",
                        key: "nowhere.jsonl"})
    with pytest.raises(ConfigError, match=f"^{key}: nowhere.jsonl: no such file$"):
        check_config_tasks(cfg)


@pytest.mark.e2e
def test_eval_cli_on_a_run_and_its_mistakes(tmp_path):
    from tests.test_train_cli import train

    model_path = tmp_path / "run"
    train(model_path, "train_steps=2", "eval_steps=0", 'eval_tasks=["lambada"]', "eval_task_examples=16")
    (row,) = metrics_rows(model_path, "eval")
    assert row["step"] == 2 and row["lambada_examples"] == 16 and 0 <= row["lambada_acc"] <= 1
    questions = write_jsonl(tmp_path / "q.jsonl", [{"context": "def", "choices": ["add", "x"], "label": 0}] * 3)
    result = run_command("eval.py", "--model-path", str(model_path), "--tasks", "lambada,multiple_choice",
                         "--multiple-choice-path", questions, "--limit", "16", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["lambada_acc"] == row["lambada_acc"] and printed["lambada_ppl"] == pytest.approx(row["lambada_ppl"])
    assert printed["choice_questions"] == 3
    for args, message in [(["--tasks", "lambda"], "error: --tasks: unknown task 'lambda'"),
                          (["--lambada-path", "nowhere.jsonl"], "error: --lambada-path nowhere.jsonl: no such file"),
                          (["--tasks", "multiple_choice"], "error: --tasks multiple_choice needs "
                                                           "--multiple-choice-path")]:
        result = run_command("eval.py", "--model-path", str(model_path), *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("task, key, line", [
    ("multiple_choice", "multiple_choice_path", '{"context": "a", "choices": ["b", "c"], "label": 2}'),
    ("lambada", "lambada_path", '{"text": "oneword"}'),
])
def test_train_reads_the_eval_task_files_before_its_first_step(tmp_path, task, key, line):
    """A line the evaluation cannot score stopped the run at its first evaluation, eval_every steps in."""
    from tests.test_train_cli import TINY_SETS

    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine words here", "context": "a", "choices": ["b", "c"], "label": 0}\n' + line + "\n")
    sets = [*TINY_SETS, "train_steps=2", "eval_every=2", f'eval_tasks=["{task}"]', f"{key}={path}"]
    result = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(tmp_path / "run"),
                         "--no-progress", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(f"error: {path}:2: "), \
        result.stderr[-2000:]
    assert "step 1" not in result.stdout + result.stderr  # no training before the error


def test_eval_refuses_a_set_that_would_place_nothing(tmp_path):
    """The mesh is --mesh-shape's: --set mesh_shape would change a key nothing reads, and run on one device."""
    result = run_command("eval.py", "--model-path", str(tmp_path / "run"), "--set", "mesh_shape=x:8")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == ("error: --set mesh_shape=x:8: eval.py places the model with --mesh-shape and "
                                     "--layout, not the config's mesh_shape; give --mesh-shape x:8"), result.stderr


def test_eval_refuses_a_set_eval_task_examples_it_would_ignore(tmp_path):
    """eval.py scores every example unless --limit: --set eval_task_examples=20 scored all 330 passages, silently."""
    result = run_command("eval.py", "--model-path", str(tmp_path / "run"), "--set", "eval_task_examples=20")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == ("error: --set eval_task_examples=20: eval.py scores every example of a task "
                                     "(eval_task_examples caps training's evaluations); give --limit 20")

def test_eval_refuses_a_layout_without_a_mesh_as_predict_does(tmp_path):
    """Without --mesh-shape the model runs on one device: --layout heads:x was ignored without a word."""
    run = str(tmp_path / "run")
    result = run_command("eval.py", "--model-path", run, "--layout", "heads:x")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == "error: --layout heads:x: give --mesh-shape too (without it the model runs on one device)\n"
    result = run_command("eval.py", "--model-path", run, "--layout", "batch:x")  # the default: one device's layout
    assert result.returncode == 2 and "--layout" not in result.stderr and run in result.stderr, result.stderr


@pytest.mark.parametrize("args, tasks", [
    (["--multiple-choice-path", "{q}"], ["multiple_choice"]),
    (["--lambada-path", "{q}", "--multiple-choice-path", "{q}"], ["lambada", "multiple_choice"]),
    ([], None),  # the run's eval_tasks, else lambada
])
def test_eval_runs_the_tasks_whose_files_are_given(tmp_path, args, tasks):
    """--multiple-choice-path without --tasks scored LAMBADA only and never read the questions, without a word."""
    import eval as eval_cli

    questions = write_jsonl(tmp_path / "q.jsonl", [{"context": "a", "choices": ["b", "c"], "label": 0}])
    parsed = eval_cli.build_parser().parse_args(["--model-path", "run", *[a.format(q=questions) for a in args]])
    eval_cli.check_options(parsed)
    assert parsed.tasks == tasks


def test_eval_refuses_a_file_for_a_task_it_leaves_out(tmp_path):
    import eval as eval_cli

    questions = write_jsonl(tmp_path / "q.jsonl", [{"context": "a", "choices": ["b", "c"], "label": 0}])
    parsed = eval_cli.build_parser().parse_args(["--model-path", "run", "--tasks", "lambada",
                                                 "--multiple-choice-path", questions])
    with pytest.raises(ConfigError, match="^--multiple-choice-path is for the multiple_choice task, which --tasks "
                                          "lambada leaves out; add it to --tasks, or drop --multiple-choice-path$"):
        eval_cli.check_options(parsed)
