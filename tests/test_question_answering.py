"""Extractive question answering (task question_answering): SQuAD jsonl and TFDS squad cut into windows with their
answer labels as transformers' run_qa makes them, the QA loss, run_qa's span choice and SQuAD's exact match and
F1, an evaluation exact over weight-0 filler rows, sharded training equal to one device, parity with transformers'
*ForQuestionAnswering (import, export, --init-from), predict.py."""

import json

import jax
import numpy as np
import pytest

from config import ConfigError, from_dict
from data.squad import AnswerSource, answer_source, answer_tokens, read_jsonl
from data.tokenizer import load_tokenizer
from evaluation.squad import NOT_CONTEXT, best_answer, f1, normalize_answer, squad_scores

CONTEXT = "The letter was sent from Paris in 1901. It was written by Ada Lovelace, who lived in London."


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def squad_row(question, context, *answers):
    return {"question": question, "context": context,
            "answers": {"text": list(answers), "answer_start": [context.index(a) for a in answers]}}


def qa_config(**changes):
    return from_dict(dict(model="bert", task="question_answering", n_ctx=48, doc_stride=8, n_vocab=300, n_layer=1,
                          n_embd=32, n_head=2, train_batch_size=8, eval_batch_size=8) | changes)[0]


def source_of(rows, tmp_path, tokenizer="bytes", **changes):
    examples = read_jsonl(write(tmp_path / "qa.jsonl", rows), "test")
    return AnswerSource(examples, load_tokenizer(tokenizer), qa_config(**changes), shuffle=False, seed=0,
                        description="test")


def test_windows_share_doc_stride_and_label_the_answer_where_a_window_holds_it(tmp_path):
    source = source_of([squad_row("Who wrote it?", CONTEXT, "Ada Lovelace"), squad_row("Why?", CONTEXT)], tmp_path)
    first = source.example_of == 0
    assert first.sum() > 2 and (source.example_of == 1).sum() > 2  # the context needs several windows of 48
    context_of = [source.offsets[w][source.offsets[w][:, 0] != NOT_CONTEXT] for w in range(len(source.inputs))]
    for a, b in zip(np.flatnonzero(first)[:-1], np.flatnonzero(first)[1:]):  # consecutive windows share 8 tokens
        np.testing.assert_array_equal(context_of[a][-8:], context_of[b][:8])
    assert context_of[np.flatnonzero(first)[0]][0, 0] == 0 and context_of[np.flatnonzero(first)[-1]][-1, 1] == \
        len(CONTEXT)
    labelled = 0
    answer = (CONTEXT.index("Ada"), CONTEXT.index("Ada") + len("Ada Lovelace"))
    for w in np.flatnonzero(first):
        start, end = source.starts[w], source.ends[w]
        spans = source.offsets[w][source.offsets[w][:, 0] != NOT_CONTEXT]
        holds = spans[0, 0] <= answer[0] and spans[-1, 1] >= answer[1]
        assert (start > 0) == holds and (end > 0) == holds  # else [CLS], the first token, for start and end
        if holds:  # the answer's own tokens, from its first character to its last
            labelled += 1
            assert CONTEXT[source.offsets[w][start, 0]:source.offsets[w][end, 1]] == "Ada Lovelace"
    assert labelled >= 1
    assert not source.starts[source.example_of == 1].any() and not source.ends[source.example_of == 1].any()
    batch = source.batch(0, len(source.inputs) + 3)  # an eval batch past the last window: weight-0 filler
    assert batch["weights"].tolist() == [1.0] * len(source.inputs) + [0.0] * 3
    assert batch["inputs"].shape == (len(source.inputs) + 3, 48) and batch["segment_ids"][0, -1] in (0, 1)
    assert "2 questions (1 without an answer) in" in source.description


def test_answer_tokens_are_run_qas_labels():
    offsets = [None, None, (0, 3), (4, 9), (10, 12), None]  # [CLS] q [SEP]? "The quick ox" [SEP]
    assert answer_tokens(offsets, ("quick", 4)) == (3, 3)
    assert answer_tokens(offsets, ("uick o", 5)) == (3, 4)  # tokens holding a part of the answer count
    assert answer_tokens(offsets, ("The quick ox", 0)) == (2, 4)
    assert answer_tokens(offsets, ("elsewhere", 20)) == (0, 0)  # past the window
    assert answer_tokens(offsets, None) == (0, 0)  # unanswerable


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_windows_and_labels_match_transformers_run_qa_tokenization(kind, tmp_path):
    """The question then the context, truncation only_second, stride, overflowing windows with offsets: the ids,
    token types and context offsets of transformers' fast tokenizer, and run_qa's start and end labels."""
    transformers = pytest.importorskip("transformers")
    from tests.test_tokenizer_encoders import roberta_vocab, wordpiece_vocab

    vocab = wordpiece_vocab(tmp_path / "v", True) if kind == "bert" else roberta_vocab(tmp_path / "v")
    reference = (transformers.BertTokenizerFast if kind == "bert" else transformers.RobertaTokenizerFast
                 ).from_pretrained(vocab)
    reference.save_pretrained(str(tmp_path / "saved"))
    context = "Hello world, this is a small corpus! " * 3 + "The cat sat on the mat; the dog did not."
    rows = [squad_row("Where did the cat sit?", context, "on the mat"), squad_row("Who?", context)]
    source = source_of(rows, tmp_path, str(tmp_path / "saved"), n_ctx=24, doc_stride=6)
    windows = 0
    for e, row in enumerate(rows):
        encoded = reference(row["question"], row["context"], truncation="only_second", max_length=24, stride=6,
                            return_overflowing_tokens=True, return_offsets_mapping=True)
        ours = np.flatnonzero(source.example_of == e)
        assert len(ours) == len(encoded["input_ids"]) > 2
        for i, w in enumerate(ours):
            ids = encoded["input_ids"][i]
            assert source.inputs[w, :len(ids)].tolist() == ids and source.lengths[w] == len(ids)
            if kind == "bert":
                assert source.token_types[w, :len(ids)].tolist() == encoded["token_type_ids"][i]
            sequence = encoded.sequence_ids(i)
            want = [list(o) if s == 1 else [NOT_CONTEXT] * 2 for o, s in zip(encoded["offset_mapping"][i], sequence)]
            assert source.offsets[w, :len(ids)].tolist() == want
            assert (source.starts[w], source.ends[w]) == run_qa_labels(encoded["offset_mapping"][i], sequence,
                                                                       row["answers"])
            windows += source.starts[w] > 0
    assert windows >= 1


def run_qa_labels(offsets, sequence_ids, answers):
    """transformers' examples/pytorch/question-answering/run_qa.py prepare_train_features, for one window."""
    if len(answers["answer_start"]) == 0:
        return 0, 0
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    token_start_index = 0
    while sequence_ids[token_start_index] != 1:
        token_start_index += 1
    token_end_index = len(offsets) - 1
    while sequence_ids[token_end_index] != 1:
        token_end_index -= 1
    if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
        return 0, 0
    while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
        token_start_index += 1
    while offsets[token_end_index][1] >= end_char:
        token_end_index -= 1
    return token_start_index - 1, token_end_index + 1


@pytest.mark.parametrize("row, message", [
    ({"question": "q", "context": "abc"}, "has no 'answers' field (a SQuAD row has question, context and answers"),
    ({"question": "q", "context": "abc", "answers": {"text": ["b"], "answer_start": [0]}},
     "answer 'b' is not at answer_start 0 of the context (it reads 'a' there)"),
    ({"question": "q", "context": "abc", "answers": {"text": ["b"], "answer_start": []}},
     "'answers' is not {\"text\": [...], \"answer_start\": [...]} with a start for each text"),
    ({"question": 3, "context": "abc", "answers": {"text": [], "answer_start": []}}, "'question' is not a string"),
    ({"question": "why " * 30, "context": "abc", "answers": {"text": [], "answer_start": []}},
     "a question of 120 tokens leaves 0 of max_length 48 for context, not more than the stride 8; raise n_ctx, "
     "lower doc_stride or shorten the question"),
])
def test_bad_squad_lines_are_one_line_errors_naming_the_line(row, message, tmp_path):
    with pytest.raises(ConfigError) as e:
        source_of([squad_row("q", "abc", "b"), row], tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'qa.jsonl'}: line 2") and message in str(e.value), str(e.value)


@pytest.mark.parametrize("changes, message", [
    (dict(num_labels=3), "num_labels: 3, but question_answering's head gives two logits per token"),
    (dict(model="t5"), "task: question_answering does not fit model t5"),
    (dict(head_hidden=[0]), "head_hidden: 0 is not a layer width"),
])
def test_config_errors_are_one_line(changes, message):
    with pytest.raises(ConfigError, match="^" + message):
        from_dict(dict(task="question_answering", model="bert") | changes)


def tiny_model_and_batch(tmp_path, **changes):
    from flax import nnx

    from models import registry

    cfg = qa_config(**changes)
    source = source_of([squad_row("Who wrote it?", CONTEXT, "Ada Lovelace"), squad_row("Where?", CONTEXT, "Paris")],
                       tmp_path, **changes)
    return cfg, registry.build(cfg, nnx.Rngs(0)), source


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_the_loss_is_the_mean_of_start_and_end_cross_entropy_over_real_tokens(model, tmp_path):
    from training.objectives import objective_for

    cfg, network, source = tiny_model_and_batch(tmp_path, model=model, n_ctx=64)
    objective = objective_for(cfg)
    batch = {k: v for k, v in source.batch(0, 6).items() if k in objective.shapes(cfg)}  # what train.py places
    losses, rows = objective(network, {k: jax.numpy.asarray(v) for k, v in batch.items()})
    args = {"token_types": batch["token_types"]} if cfg.n_token_types else {}
    logits = np.asarray(network(batch["inputs"], segment_ids=batch["segment_ids"], **args)[0], np.float64)
    assert logits.shape == (6, 64, 2)
    assert (batch["segment_ids"] == 0).any()  # a padded last window: padding must take no probability
    want = []
    for row in range(6):
        real = batch["segment_ids"][row] == 1

        def nll(x, target):
            return np.log(np.exp(x[real]).sum()) - x[target]
        want.append((nll(logits[row, :, 0], batch["start_positions"][row]) +
                     nll(logits[row, :, 1], batch["end_positions"][row])) / 2)
    np.testing.assert_allclose(np.asarray(losses), want, rtol=1e-5)
    assert (batch["start_positions"] > 0).any()
    np.testing.assert_array_equal(objective.weights(batch), batch["weights"])
    assert set(rows) == {"start_logits", "end_logits"} and rows["start_logits"].shape == (6, 64)


def test_span_choice_is_run_qas():
    context = "abcdefghij"
    offsets = np.array([[[NOT_CONTEXT] * 2] * 2 + [[i, i + 1] for i in range(6)] + [[NOT_CONTEXT] * 2]])  # (1, 9, 2)
    start = np.array([[9.0, 0, 8, 1, 2, 3, 0, 0, 0]])  # index 0: [CLS]; 1: a question token
    end = np.array([[9.0, 0, 0, 1, 5, 0, 0, 7, 0]])
    # the best start (2) and end (7) make the span "abcdef"; 8 (padding) and the question are never chosen
    assert best_answer(start, end, offsets, context, 30, False) == ("abcdef", 15.0)
    assert best_answer(start, end, offsets, context, 3, False) == ("abc", 13.0)  # max_answer_length 3 tokens
    assert best_answer(start, end, offsets, context, 30, True) == ("", 18.0)  # SQuAD v2: the null score wins
    # the likeliest end (3) is before the likeliest start (5): the best span that ends after its start
    assert best_answer(np.array([[0.0, 0, 0, 0, 0, 9, 0, 0, 0]]), np.array([[0.0, 0, 0, 4, 0, 1, 0, 0, 0]]), offsets,
                       context, 30, False) == ("d", 10.0)
    # several windows: the best span of any of them, its text from the context
    second = np.array([[[NOT_CONTEXT] * 2] * 2 + [[i, i + 1] for i in range(4, 10)] + [[NOT_CONTEXT] * 2]])
    both = np.concatenate([offsets, second])
    starts, ends = np.concatenate([start, [[0, 0, 0, 0, 0, 20, 0, 0, 0]]]), np.concatenate([end, [[0] * 6 + [2, 1, 0]]])
    assert best_answer(starts, ends, both, context, 30, False) == ("hi", 22.0)
    # a byte-level BPE token (" Ada") spans the space before its word: the answer is the word
    spaced = np.array([[[NOT_CONTEXT] * 2, [0, 2], [2, 6], [6, 7], [NOT_CONTEXT] * 2]])  # "By", " Ada", "."
    assert best_answer(np.array([[0.0, 0, 5, 0, 0]]), np.array([[0.0, 0, 5, 0, 0]]), spaced, "By Ada.", 30,
                       False) == ("Ada", 10.0)


def test_squad_normalisation_exact_match_and_f1():
    assert normalize_answer("  The  Cat's, (big)  hat!") == "cats big hat"
    assert normalize_answer("an apple and a theory") == "apple and theory"
    assert f1("the big red cat", "red cat") == pytest.approx(0.8)
    assert f1("", "") == 1.0 and f1("cat", "") == 0.0 and f1("dog", "cat") == 0.0
    scores = squad_scores(["The Cat", "red dog", ""], [["cat", "a dog"], ["big red dog", "dog"], []])
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)  # "" answers an unanswerable question
    assert scores["f1"] == pytest.approx(100 * (1 + 0.8 + 1) / 3)


def test_evaluation_is_exact_whatever_the_batch_size_and_scores_whole_examples(tmp_path):
    """Eval rows are windows in order with weight-0 filler past the last: the report equals one batch holding every
    window, whatever the batch size; with too few batches, only examples whose every window was read count."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_eval_step, mean_of
    from models import registry
    from training.objectives import objective_for, report
    from training.optimizer import make_optimizer

    rows = [squad_row("Who wrote it?", CONTEXT, "Ada Lovelace"), squad_row("From where?", CONTEXT, "Paris"),
            squad_row("When?", CONTEXT, "1901"), squad_row("Who?", CONTEXT), squad_row("Lived?", CONTEXT, "London")]
    source = source_of(rows, tmp_path)
    windows = len(source.inputs)
    results = {}
    for batch_size in (4, windows + 4 - windows % 4):  # several batches with filler; all windows at once
        cfg = qa_config(eval_batch_size=batch_size)
        layout = Layout.from_config(make_mesh("x:4", jax.devices()[:4]), "batch:x")
        objective = objective_for(cfg)
        graphdef, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg),
                                                        layout, cfg.seed)
        data = batch_shardings(layout, objective, batch_shapes(objective, cfg, batch_size))
        step = make_eval_step(graphdef, objective, layout, shardings.params, data)
        steps = -(-windows // batch_size)
        sums = [step(state.params, jax.device_put(source.batch(i, batch_size), data)) for i in range(steps)]
        results[batch_size] = report(objective, mean_of(sums), None, source)
        if batch_size == 4:
            partial = report(objective, mean_of(sums[:1]), None, source)
    one, many = results.values()
    assert one["examples"] == many["examples"] == 5 and windows % 4  # the last batch of 4 had filler
    for key in ("loss", "exact_match", "f1"):
        assert one[key] == pytest.approx(many[key], rel=1e-6, abs=1e-9), key
    bounds = np.searchsorted(source.example_of, np.arange(6))
    assert partial["examples"] == int((bounds[1:] <= 4).sum()) < 5


def qa_batches(cfg, steps, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = rng.integers(cfg.n_ctx // 2, cfg.n_ctx + 1, cfg.train_batch_size)
        segment_ids = (np.arange(cfg.n_ctx)[None] < lengths[:, None]).astype(np.int32)
        starts = rng.integers(0, lengths // 2).astype(np.int32)
        out.append({"inputs": rng.integers(3, cfg.n_vocab, (cfg.train_batch_size, cfg.n_ctx)).astype(np.int32),
                    "segment_ids": segment_ids, "token_types": segment_ids * (np.arange(cfg.n_ctx) > 6),
                    "start_positions": starts, "end_positions": (starts + rng.integers(0, 4, starts.shape)).astype(
                        np.int32), "weights": np.ones(cfg.train_batch_size, np.float32)})
    return out


def test_question_answering_trains_sharded_as_on_one_device():
    from tests.common import tiny_config, train_metrics

    cfg = tiny_config(model="bert", task="question_answering", n_token_types=2, warmup_steps=0, lr=3e-3,
                      attention_types=None)
    batches = qa_batches(cfg, 1) * 3  # one batch again and again: the loss must fall
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y")
    assert single[-1]["loss"] < single[0]["loss"]
    for a, b in zip(single, sharded):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def hf_qa_model(kind):
    """A randomly initialised transformers *ForQuestionAnswering of the test fixtures' shapes."""
    import torch
    import transformers

    from tests import hf_fixtures

    if kind in ("bert", "roberta"):
        hf_fixtures.ENCODERS.setdefault((kind, "question_answering"), getattr(
            transformers, "BertForQuestionAnswering" if kind == "bert" else "RobertaForQuestionAnswering"))
        return hf_fixtures.encoder(kind=kind, head="question_answering", num_labels=2)
    base = hf_fixtures.gpt2() if kind == "gpt2" else hf_fixtures.gpt_neo()
    config = base.config
    config.architectures = None
    model = (transformers.GPT2ForQuestionAnswering if kind == "gpt2" else
             transformers.GPTNeoForQuestionAnswering)(config).eval()
    model.transformer.load_state_dict(base.transformer.state_dict())
    torch.manual_seed(3)
    with torch.no_grad():
        model.qa_outputs.weight.normal_(0.0, 0.3)
        model.qa_outputs.bias.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("kind", ["bert", "roberta", "gpt2", "gpt_neo"])
def test_import_and_export_match_transformers_question_answering(kind, tmp_path):
    import torch
    import transformers
    from safetensors.numpy import load_file

    from convert.hf import export_params, load_hf
    from tests import hf_fixtures
    from tests.test_bert import ours, padded_batch

    reference = hf_qa_model(kind)
    reference.save_pretrained(str(tmp_path / "in"))
    cfg, params = load_hf(str(tmp_path / "in"))
    assert cfg.doc_stride == cfg.n_ctx // 2 < 128  # the pipeline's min(128, half a window): 128 left no room
    assert cfg.task == "question_answering" and cfg.model == kind
    tokens, mask = padded_batch(hf_fixtures.VOCAB, width=40)
    with torch.no_grad():
        out = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask))
    want = np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)  # (B, T, 2)
    real = mask == 1
    got = ours(cfg, params, tokens, mask)
    assert got.shape == want.shape
    # GPT-Neo's unscaled attention logits on these random weights amplify float32 rounding (test_convert: 1e-4)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4 if kind == "gpt_neo" else 1e-5, rtol=0)
    export_params(cfg, params, str(tmp_path / "out"))
    original, exported = load_file(str(tmp_path / "in/model.safetensors")), \
        load_file(str(tmp_path / "out/model.safetensors"))
    assert np.array_equal(original["qa_outputs.weight"], exported["qa_outputs.weight"])
    reloaded = transformers.AutoModelForQuestionAnswering.from_pretrained(str(tmp_path / "out"),
                                                                      attn_implementation="eager").eval()
    assert type(reloaded) is type(reference)
    with torch.no_grad():
        again = reloaded(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask))
    assert torch.equal(again.start_logits, out.start_logits) and torch.equal(again.end_logits, out.end_logits)


def test_init_from_a_bare_bert_starts_the_qa_head_fresh(tmp_path):
    """As transformers' BertForQuestionAnswering.from_pretrained of a BertModel: the encoder's weights, a new
    qa_outputs; the head is named as fresh."""
    from convert.hf import load_hf
    from tests import hf_fixtures
    from parallel.state import abstract_model, path_name
    from training.init_from import imported_params, initialised_notes
    from training.peft import build_model

    hf_fixtures.encoder(head=None).save_pretrained(str(tmp_path))
    cfg = load_hf(str(tmp_path))[0].replace(task="question_answering", num_labels=2, init_from=str(tmp_path))
    params = imported_params(cfg, str(tmp_path))
    assert "token_classifier" not in params and "wte" in params and "blocks" in params
    model = abstract_model(lambda rngs: build_model(cfg, rngs))[1]
    names = {path_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(model)}
    taken = {path_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
    head = sorted(names - taken)
    assert head == ["token_classifier/mlp/layers/0/bias", "token_classifier/mlp/layers/0/kernel"]
    notes = initialised_notes(str(tmp_path), head, [])
    assert any(line.startswith("warning: ") and "token_classifier/mlp/layers/0/kernel" in line for line in notes)


def test_tfds_squad_reads_like_its_jsonl(tmp_path, monkeypatch):
    from tests.data_common import prepare_tiny_squad, use_dataset_configs

    rows = [squad_row("Who wrote it?", CONTEXT, "Ada Lovelace"), squad_row("Where?", CONTEXT, "Paris"),
            squad_row("Who?", CONTEXT), squad_row("When?", CONTEXT, "1901")]
    prepare_tiny_squad(str(tmp_path / "tfds"), rows)
    write(tmp_path / "train.jsonl", rows[:-2])
    write(tmp_path / "eval.jsonl", rows[-2:])
    use_dataset_configs(monkeypatch, tmp_path / "dc", qa={"path": str(tmp_path / "train.jsonl"),
                                                          "eval_path": str(tmp_path / "eval.jsonl")})
    for split in ("train", "eval"):
        by_tfds = answer_source(qa_config(datasets=[["tfds:neomesh_tiny_squad", None, None, None]],
                                          tfds_data_dir=str(tmp_path / "tfds")), split)
        by_jsonl = answer_source(qa_config(datasets=[["qa", None, None, None]]), split)
        assert by_tfds.examples.answers == by_jsonl.examples.answers and len(by_tfds.examples) == 2
        for field in ("inputs", "token_types", "offsets", "starts", "ends"):
            np.testing.assert_array_equal(getattr(by_tfds, field), getattr(by_jsonl, field))
    assert by_tfds.null_allowed  # "Who?" has no answer


@pytest.mark.e2e
def test_train_then_answer_with_predict(tmp_path):
    from tests.common import metrics_rows, run_command

    rng = np.random.default_rng(0)
    rows = []
    for year in range(60):
        name = ["Ada", "Bob", "Cy", "Dee", "Eve"][rng.integers(5)]
        rows.append(squad_row("Who wrote it?", f"It was written in {1900 + year} by {name}.", name))
    write(tmp_path / "train.jsonl", rows[:50])
    write(tmp_path / "eval.jsonl", rows[50:])
    (tmp_path / "squad.json").write_text(json.dumps({"path": "train.jsonl", "eval_path": "eval.jsonl",
                                                     "tokenizer_path": "bytes"}))
    run = str(tmp_path / "run")
    result = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", run, "--no-progress",
                         *[x for kv in ("task=question_answering", "num_labels=2", "n_vocab=257", "n_ctx=48",
                                        "doc_stride=8", "train_steps=60", "eval_steps=2", "eval_batch_size=16",
                                        "train_batch_size=16", "n_layer=1", "n_embd=64", "warmup_steps=5",
                                        f'datasets=[["{tmp_path}/squad.json", null, null, null]]')
                           for x in ("--set", kv)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "10 questions (0 without an answer) in" in result.stdout
    (evaluation,) = metrics_rows(run, "eval")
    assert evaluation["examples"] == 10 and evaluation["exact_match"] >= 50, evaluation
    result = run_command("predict.py", "--model-path", run, "--prompt", "Who wrote it?", "--pair",
                         "It was written in 1931 by Eve.")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("prompt 1: 'Eve' (score "), result.stdout
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(run)
    logits = model(["Who wrote it?"], ["It was written in 1931 by Eve."])
    assert logits.shape[0] == 1 and logits.shape[-1] == 2  # (B, T, 2): start and end logits
    text, score = model.answer("Who wrote it?", "It was written in 1931 by Eve.")
    assert text == "Eve" and f"(score {score:.4f})" in result.stdout
    result = run_command("predict.py", "--model-path", run, "--prompt", "Who wrote it?")
    assert result.returncode != 0 and "--pair: a bert model trained for question_answering answers each" in \
        result.stderr


def test_answer_gives_padding_no_span_as_evaluation_does_and_takes_lists():
    """Pretrained.answer's windows are right-padded to n_ctx; padding logits (never trained: the loss gives padding
    no probability) used to take the likeliest places, so a short context got "" where evaluation found its span."""
    from pretrained import Pretrained

    context = "It was written by Ada."

    class Padded(Pretrained):  # a model whose padding logits are the highest and whose context peaks at "Ada"
        def __init__(self):
            self.config, self.tokenizer = qa_config(n_ctx=128, n_token_types=2), load_tokenizer("bytes")

        def __call__(self, batch, pairs=None):
            logits = np.where(batch["segment_ids"][..., None] == 0, 10.0, np.zeros((2,)))  # (W, T, 2)
            spans = self.tokenizer.encode_windows("Who?", context, 128, 8)[0][2]
            at = [i for i, span in enumerate(spans) if span and span[0] == context.index("Ada")][0]  # bytes: A, d, a
            logits[0, at, 0] = logits[0, at + 2, 1] = 5.0
            return logits

    model = Padded()
    assert model.answer("Who?", context) == ("Ada", 10.0)
    assert model.answer(["Who?", "Who?"], [context, context]) == [("Ada", 10.0)] * 2  # as the pipeline takes lists
    with pytest.raises(ConfigError, match=r"^answer: context must be a string \(or question and context lists of "
                                          r"one length\), not NoneType \(None\)$"):  # was: "" and the null score
        model.answer("Who?", None)
