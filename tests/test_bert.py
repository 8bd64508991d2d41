"""BERT and RoBERTa against transformers on random local weights: hidden states, masked-LM logits and
classification logits with padded batches, several shapes; import/export round trips; the masked-LM objective."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from config import ConfigError
from convert.hf import export_params, load_hf
from models import registry
from parallel.state import match_params
from tests import hf_fixtures

SHAPES = {
    "bert-48x2-4heads": dict(kind="bert", n_embd=48, n_head=4, n_layer=2),
    "bert-36x3-3heads-relu": dict(kind="bert", n_embd=36, n_head=3, n_layer=3, act="relu"),
    "roberta-48x2-2heads": dict(kind="roberta", n_embd=48, n_head=2, n_layer=2),
}


def padded_batch(vocab, lengths=(40, 23, 7), width=40, seed=0):
    """(tokens, attention mask) for rows of the given real lengths, right-padded with id 1."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, (len(lengths), width))
    mask = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int64)
    return np.where(mask == 1, tokens, 1), mask


def ours(cfg, params, tokens, mask, method="__call__"):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    found, missing, _ = match_params(params, nnx.to_pure_dict(state))
    assert not missing or method == "hidden_states", missing

    def run(params, tokens, mask):
        model = nnx.merge(graphdef, nnx.State(params))
        out = getattr(model, method)(tokens, segment_ids=mask)
        return out if method == "hidden_states" else out[0]

    tree = nnx.to_pure_dict(state)
    filled = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.asarray(found.get("/".join(str(k.key) for k in path), np.zeros(a.shape, a.dtype))), tree)
    return np.asarray(jax.jit(run)(filled, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, jnp.int32)))


def saved(model, tmp_path):
    model.save_pretrained(str(tmp_path))
    return str(tmp_path)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("head", [None, "masked_lm", "sequence_classification", "token_classification"])
def test_outputs_match_transformers(name, head, tmp_path):
    reference = hf_fixtures.encoder(head=head, **SHAPES[name])
    cfg, params = load_hf(saved(reference, tmp_path))
    assert cfg.model == SHAPES[name]["kind"] and cfg.task == (head or "masked_lm")
    tokens, mask = padded_batch(hf_fixtures.VOCAB, seed=len(name))
    with torch.no_grad():
        out = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask))
    real = mask == 1
    if head is None:  # a bare encoder: compare the last hidden states
        got, want = ours(cfg, params, tokens, mask, "hidden_states")[real], out.last_hidden_state.numpy()[real]
    elif head in ("masked_lm", "token_classification"):  # logits per token
        got, want = ours(cfg, params, tokens, mask)[real], out.logits.numpy()[real]
    else:
        got, want = ours(cfg, params, tokens, mask), out.logits.numpy()
        assert got.shape == (3, 3)
    diff = float(np.max(np.abs(got - want)))
    print(f"{name} {head}: max abs diff {diff:.3g}")
    assert diff <= 1e-4, diff


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("head", ["masked_lm", "sequence_classification", "token_classification"])
def test_export_round_trip_is_lossless_and_loads_in_transformers(kind, head, tmp_path):
    reference = hf_fixtures.encoder(kind=kind, head=head)
    source = saved(reference, tmp_path / "in")
    cfg, params = load_hf(source)
    out = tmp_path / "out"
    export_params(cfg, params, str(out))
    original = load_file(f"{source}/model.safetensors")
    exported = load_file(str(out / "model.safetensors"))
    unused = {k for k in original if k.endswith(("decoder.weight", "decoder.bias", "position_ids"))}
    unused |= {k for k in original if ".pooler." in k} if head == "masked_lm" or kind == "roberta" else set()
    assert set(original) - unused == set(exported)
    for name in exported:
        assert np.array_equal(original[name], exported[name]), name
    reloaded = transformers.AutoConfig.from_pretrained(str(out))
    model = hf_fixtures.ENCODERS[kind, head].from_pretrained(str(out), attn_implementation="eager").eval()
    assert type(model).__name__ == reloaded.architectures[0]
    tokens, mask = padded_batch(hf_fixtures.VOCAB)
    with torch.no_grad():
        a = model(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits
        b = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits
    assert torch.equal(a, b)


def test_a_classifier_from_a_bare_bert_starts_from_its_pooler_as_in_transformers(tmp_path):
    """Fine-tuning a classifier from a bare BertModel started its dense layer fresh; transformers starts it from
    the checkpoint's pooler. With the output layer transformers drew, the logits match."""
    from training.init_from import imported_params

    source = saved(hf_fixtures.encoder(head=None), tmp_path)
    reference = transformers.BertForSequenceClassification.from_pretrained(source, num_labels=3).eval()
    cfg = load_hf(source)[0].replace(task="sequence_classification", num_labels=3, init_from=source)
    params = imported_params(cfg, source)
    assert set(params["classifier"]) == {"dense"}  # the output layer is fresh, as transformers' is
    params["classifier"]["out"] = {"kernel": reference.classifier.weight.detach().numpy().T,
                                   "bias": reference.classifier.bias.detach().numpy()}
    tokens, mask = padded_batch(hf_fixtures.VOCAB)
    with torch.no_grad():
        want = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(ours(cfg, params, tokens, mask), want, atol=1e-4)


def mlm_batches(cfg, steps, seed=0):
    """Masked-LM batches with a different number of masked targets in every row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        targets = rng.integers(0, cfg.n_vocab, (cfg.train_batch_size, cfg.n_ctx)).astype(np.int32)
        mask = (rng.random(targets.shape) < rng.uniform(0.05, 0.4, (len(targets), 1))).astype(np.float32)
        inputs = np.where(mask == 1, 3, targets).astype(np.int32)
        out.append({"inputs": inputs, "targets": targets, "mask": mask})
    return out


def test_masked_lm_trains_sharded_as_on_one_device_and_accumulates_exactly():
    from tests.common import tiny_config, train_metrics

    cfg = tiny_config(model="bert", n_token_types=2, warmup_steps=0, lr=3e-3)
    batches = mlm_batches(cfg, 1) * 3  # one batch again and again: the loss must fall
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y")
    accumulated = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1], microbatches=4)
    # each device accumulating its own rows' gradients, reduced once per step
    unreduced = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y", microbatches=2,
                              accumulate_unreduced=True)
    for key in ("loss", "accuracy", "grad_norm"):
        for run in (sharded, accumulated, unreduced):
            np.testing.assert_allclose([m[key] for m in run], [m[key] for m in single], rtol=0, atol=1e-5)
    assert single[-1]["loss"] < single[0]["loss"] - 0.1
    # The loss is the mean over masked targets only: rows with more targets weigh more, as in one big batch.
    assert 0 < single[0]["accuracy"] < 1


def test_python_api_loads_any_zoo_model_and_runs_it_on_text(tmp_path):
    from pretrained import Pretrained

    reference = hf_fixtures.encoder(kind="roberta", head=None)
    source = saved(reference, tmp_path)
    hf_fixtures.tokenizer().save(f"{source}/tokenizer.json")
    with pytest.warns(UserWarning, match="has no weights for mlm/bias"):  # a bare encoder: the MLM head is fresh
        model = Pretrained.from_pretrained(source)
    texts = ["def add(a, b):\n    return a + b", "import os"]
    batch = model.tokenize(texts)
    assert batch["inputs"].shape[0] == 2 and batch["segment_ids"][1].sum() < batch["segment_ids"][0].sum()
    hidden = np.asarray(model.hidden_states(texts))
    with torch.no_grad():
        want = reference(torch.from_numpy(batch["inputs"]).long(),
                         attention_mask=torch.from_numpy(batch["segment_ids"]).long()).last_hidden_state.numpy()
    real = batch["segment_ids"] == 1
    assert np.max(np.abs(hidden[real] - want[real])) <= 1e-4
    assert np.asarray(model(texts)).shape == (*batch["inputs"].shape, hf_fixtures.VOCAB)
    with pytest.raises(Exception, match="does not generate text"):
        model.generate("def ")
    with pytest.raises(ConfigError, match="tokenize: 2 texts but 1 second texts"):  # zip dropped the second
        model(texts, ["a pair"])
    with pytest.raises(ConfigError, match=r"tokenize: texts must be strings, not list \(\[1, 2\]\); pass token ids"):
        model([[1, 2]])


def test_pytorch_model_bin_imports_like_safetensors(tmp_path):
    reference = hf_fixtures.encoder(kind="bert", head="sequence_classification")
    reference.save_pretrained(str(tmp_path / "safetensors"))
    (tmp_path / "bin").mkdir()
    reference.config.save_pretrained(str(tmp_path / "bin"))
    torch.save(reference.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    (cfg_a, a), (cfg_b, b) = load_hf(str(tmp_path / "safetensors")), load_hf(str(tmp_path / "bin"))
    assert cfg_a == cfg_b and jax.tree.structure(a) == jax.tree.structure(b)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


def test_init_from_a_classifier_with_other_labels_names_both_counts(tmp_path):
    """A 3-label BertForSequenceClassification fine-tuned on an 8-label dataset: one line with both counts and the
    way out (it was a shape error of classifier/out/bias, then a line pointing to a base model without the head);
    the same labels load."""
    from training import init_from

    source = saved(hf_fixtures.encoder(kind="bert", head="sequence_classification", num_labels=3), tmp_path)
    cfg, _ = load_hf(source)
    with pytest.raises(ConfigError) as error:
        init_from.imported_params(cfg.replace(num_labels=8), source)
    assert str(error.value) == (f"--init-from {source}: its classifier has 3 labels, but num_labels is 8; --set "
                                "init_new_head=true keeps its backbone and starts a new head of 8 (--set "
                                "num_labels=3 fine-tunes its head)")
    assert "classifier" in init_from.imported_params(cfg, source)
    assert init_from.imported_params(cfg.replace(task="masked_lm", num_labels=8), source)  # no classifier: no count


@pytest.mark.parametrize("kind", ["hf", "run"])
def test_init_new_head_keeps_the_backbone_and_starts_a_head_of_num_labels(tmp_path, kind):
    """init_new_head (transformers' ignore_mismatched_sizes) from a 2-label classifier, a Hugging Face directory or
    a NeoMesh run made of it, for 5 labels: every weight but the head's output layer is the source's, bit for bit,
    and that layer takes the model's init in the new shape."""
    from training import init_from
    from convert.hf import import_hf
    from parallel.state import init_params, path_name, place_params, sharded_abstract_params
    from pretrained import default_layout
    from training.init_from import head_names
    from training.peft import build_model

    source = saved(hf_fixtures.encoder(kind="bert", head="sequence_classification", num_labels=2), tmp_path / "hf")
    if kind == "run":
        import_hf(source, str(tmp_path / "run"))
        source = str(tmp_path / "run")
    theirs, weights = load_hf(str(tmp_path / "hf"))
    cfg = theirs.replace(num_labels=5, init_from=source)
    with pytest.raises(ConfigError, match="its classifier has 2 labels, but num_labels is 5; --set init_new_head"):
        init_from.imported_params(cfg, source)
    cfg = cfg.replace(init_new_head=True)
    params = init_from.imported_params(cfg, source)
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    _, abstract = sharded_abstract_params(make_model, default_layout())
    _, missing, unused = match_params(params, abstract)
    assert missing == head_names(cfg) == ["classifier/out/bias", "classifier/out/kernel"] and not unused
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    placed = place_params(params, abstract, lambda: init_params(make_model, cfg.seed, shardings))
    given = {path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(weights)[0]}
    for path, value in jax.tree_util.tree_flatten_with_path(placed)[0]:
        name = path_name(path)
        if name in missing:
            assert value.shape == ((48, 5) if name.endswith("kernel") else (5,)) and np.all(np.isfinite(value))
        else:
            assert np.array_equal(np.asarray(value), given[name]), name


@pytest.mark.parametrize("changes, head", [
    (dict(model="bert", task="token_classification", head_hidden=[16]), ["token_classifier/mlp/layers/1/bias",
                                                                          "token_classifier/mlp/layers/1/kernel"]),
    (dict(model="gpt2", task="sequence_classification"), ["score/out/kernel"]),
    (dict(model="vit", task="image_classification", image_size=8, patch_size=4, num_channels=1),
     ["classifier/bias", "classifier/kernel"])])
def test_a_new_head_is_the_output_layer_of_any_classifier(changes, head):
    """The head that init_new_head starts afresh is the layer whose shape follows num_labels: an MLP head keeps
    its hidden layers (the backbone's features), a GPT's score has no bias."""
    from config import from_dict
    from training.init_from import head_names

    shape = dict(n_layer=1, n_embd=32, n_head=2, num_labels=3) | ({} if changes["model"] == "vit" else
                                                                  dict(n_ctx=16, n_vocab=64))
    cfg = from_dict(shape | changes)[0]
    assert head_names(cfg) == head


def test_roberta_config_without_a_pad_token_id_is_one_line():
    """RoBERTa's positions start after pad_token_id: null there was a TypeError traceback."""
    from convert import bert

    hf = hf_fixtures.encoder(kind="roberta", head="masked_lm").config.to_dict()
    assert bert.config_from_hf(hf).position_offset == 2
    with pytest.raises(ConfigError, match=r"^x/config.json: pad_token_id null: RoBERTa counts positions from "):
        bert.config_from_hf({**hf, "pad_token_id": None}, "x/config.json")


@pytest.mark.parametrize("kind, offset", [("bert", 2), ("roberta", 0)])
def test_a_position_offset_transformers_cannot_hold_is_refused(kind, offset):
    """BERT counts positions from 0 and RoBERTa from pad_token_id + 1: a bert with position_offset 2 was written
    with positions from row 0 (other logits), a roberta with 0 with pad_token_id -1 (an index error on padding)."""
    from config import from_dict
    from convert import bert

    with pytest.raises(ConfigError, match=f"^export: position_offset={offset} has no {kind} equivalent in "):
        bert.config_to_hf(from_dict(dict(model=kind, position_offset=offset))[0])


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_an_untied_masked_lm_decoder_loads_and_exports_as_its_own(kind, tmp_path):
    """tie_word_embeddings false: the decoder is not the word embeddings. It loaded tied without a word (logits
    off by 13 on this model); now it is no_weight_tie's own kernel, and export writes it back."""
    config = hf_fixtures.encoder(kind=kind, head="masked_lm").config
    config.tie_word_embeddings = False
    torch.manual_seed(2)
    reference = hf_fixtures.ENCODERS[kind, "masked_lm"](config).eval()
    reference.load_state_dict(hf_fixtures.encoder(kind=kind, head="masked_lm").state_dict(), strict=False)
    with torch.no_grad():
        decoder = reference.cls.predictions.decoder if kind == "bert" else reference.lm_head.decoder
        decoder.weight.normal_(0.0, 0.5)
    source = saved(reference, tmp_path / "in")
    cfg, params = load_hf(source)
    assert cfg.no_weight_tie
    tokens, mask = padded_batch(hf_fixtures.VOCAB)
    with torch.no_grad():
        want = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    real = mask == 1
    np.testing.assert_allclose(ours(cfg, params, tokens, mask)[real], want[real], atol=1e-4, rtol=0)
    export_params(cfg, params, str(tmp_path / "out"))
    original, exported = load_file(f"{source}/model.safetensors"), load_file(str(tmp_path / "out/model.safetensors"))
    for name in set(original) - {k for k in original if k.endswith("position_ids") or ".pooler." in k}:
        assert np.array_equal(original[name], exported[name]), name


def test_a_classifiers_label_names_survive_import_and_export(tmp_path):
    """id2label went to LABEL_i on the way back out, and a trained run's labels were never written."""
    import json

    from convert.hf import export_hf, import_hf

    reference = hf_fixtures.encoder(head="sequence_classification")
    reference.config.id2label = {0: "negative", 1: "neutral", 2: "positive"}
    reference.config.label2id = {v: k for k, v in reference.config.id2label.items()}
    import_hf(saved(reference, tmp_path / "in"), str(tmp_path / "run"))
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["negative", "neutral", "positive"]
    export_hf(str(tmp_path / "run"), str(tmp_path / "out"))
    reloaded = transformers.AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert reloaded.id2label == {0: "negative", 1: "neutral", 2: "positive"} and reloaded.label2id["positive"] == 2


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_regression_imports_and_exports_with_transformers_scores(kind, tmp_path):
    """Hugging Face's num_labels 1 (STS-B) is a regression: imported, its one logit per text is transformers' score;
    exported, it is written as a regression (problem_type) with the same tensors, and loads in transformers."""
    import json

    from convert.hf import export_hf, import_hf

    reference = hf_fixtures.encoder(kind=kind, head="sequence_classification", num_labels=1)
    source = saved(reference, tmp_path / "in")
    cfg, params = load_hf(source)
    assert cfg.task == "sequence_classification" and cfg.num_labels == 1 and cfg.regression
    tokens, mask = padded_batch(hf_fixtures.VOCAB, seed=3)
    with torch.no_grad():
        want = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    got = ours(cfg, params, tokens, mask)
    assert got.shape == want.shape == (3, 1) and np.std(want) > 0
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    import_hf(source, str(tmp_path / "run"))
    export_hf(str(tmp_path / "run"), str(tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["problem_type"] == "regression" and len(written["id2label"]) == 1
    original, exported = load_file(f"{source}/model.safetensors"), load_file(str(tmp_path / "out/model.safetensors"))
    for name in exported:
        assert np.array_equal(original[name], exported[name]), name
    back = hf_fixtures.ENCODERS[kind, "sequence_classification"].from_pretrained(str(tmp_path / "out"),
                                                                         attn_implementation="eager").eval()
    assert back.config.problem_type == "regression" and back.num_labels == 1
    with torch.no_grad():
        again = back(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(again, want, atol=1e-6, rtol=0)  # the same tensors; RoBERTa's sums may round apart


@pytest.mark.parametrize("problem_type, num_labels, why", [
    # transformers' multi-output regression was loaded as a 3-class softmax classifier
    ("regression", 3, "NeoMesh's regression is a sequence classifier's one score (num_labels 1)"),
    ("multi_label_classification", 1, "NeoMesh's multi-label classifiers are sequence classifiers of 2 or more labels"),
])
def test_a_problem_type_neomesh_does_not_train_is_one_line(problem_type, num_labels, why, tmp_path):
    reference = hf_fixtures.encoder(head="sequence_classification", num_labels=num_labels)
    reference.config.problem_type = problem_type
    source = saved(reference, tmp_path)
    with pytest.raises(ConfigError) as e:
        load_hf(source)
    assert str(e.value) == (f"{source}/config.json: problem_type {problem_type} with num_labels {num_labels} "
                            f"(sequence_classification); {why}")


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_multi_label_classifier_imports_and_exports_with_transformers_logits_and_loss(kind, tmp_path):
    """problem_type multi_label_classification was imported as a softmax classifier without a word: now it is
    multi_label, its logits and mean binary cross-entropy are transformers', and export writes it back as one."""
    import json

    from convert.hf import export_hf, import_hf
    from training.objectives import objective_for

    reference = hf_fixtures.encoder(kind=kind, head="sequence_classification", num_labels=4)
    reference.config.problem_type = "multi_label_classification"
    source = saved(reference, tmp_path / "in")
    cfg, params = load_hf(source)
    assert cfg.task == "sequence_classification" and cfg.num_labels == 4 and cfg.multi_label
    tokens, mask = padded_batch(hf_fixtures.VOCAB, seed=5)
    labels = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    with torch.no_grad():
        out = reference(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                        labels=torch.from_numpy(labels))
    got = ours(cfg, params, tokens, mask)
    np.testing.assert_allclose(got, out.logits.numpy(), atol=1e-5, rtol=0)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    model = nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))
    losses, _ = objective_for(cfg)(model, {"inputs": jnp.asarray(tokens, jnp.int32),
                                           "segment_ids": jnp.asarray(mask, jnp.int32), "labels": labels})
    np.testing.assert_allclose(float(losses.mean()), out.loss.item(), atol=1e-5, rtol=0)
    import_hf(source, str(tmp_path / "run"))
    export_hf(str(tmp_path / "run"), str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["problem_type"] == "multi_label_classification"
    back = hf_fixtures.ENCODERS[kind, "sequence_classification"].from_pretrained(str(tmp_path / "out"),
                                                                         attn_implementation="eager").eval()
    with torch.no_grad():
        again = back(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(again, out.logits.numpy(), atol=1e-6, rtol=0)


def roberta_tokenizer(path, specials):
    """A byte-level BPE of the test vocabulary whose special tokens take the first ids, in ``specials``' order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from data import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=hf_fixtures.VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text for _, text in corpus.documents()[:40]], trainer)
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return str(path)


@pytest.mark.parametrize("specials, pad", [(["<|endoftext|>", "<|padding|>"], 1), (["<pad>", "</s>"], 0),
                                           (["<s>", "</s>", "<unk>", "<pad>"], 3)])
def test_a_roberta_export_pads_as_its_tokenizer_and_keeps_its_positions(specials, pad, tmp_path, capsys):
    """transformers' RoBERTa takes pad_token_id for padding wherever it appears and counts positions from
    pad_token_id + 1; the export wrote position_offset - 1 whatever the tokenizer padded with, so a real token 1
    (here '</s>', which ends every row) was padding to transformers, and the tokens after it had other positions
    than in NeoMesh. It writes the tokenizer's pad id, with the position table shifted to start after it
    (unchanged where the two agree), and gives NeoMesh's logits."""
    cfg, params = load_hf(saved(hf_fixtures.encoder(kind="roberta", head="masked_lm"), tmp_path / "in"))
    assert cfg.position_offset == 2
    capsys.readouterr()  # what saving the reference printed
    export_params(cfg, params, str(tmp_path / "out"), roberta_tokenizer(tmp_path / "tok", specials))
    assert capsys.readouterr().err == ""
    exported = transformers.AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert (exported.pad_token_id, exported.max_position_embeddings) == (pad, cfg.n_ctx + pad + 1)
    table = load_file(str(tmp_path / "out/model.safetensors"))["roberta.embeddings.position_embeddings.weight"]
    np.testing.assert_array_equal(table[pad:], params["wpe"]["embedding"][cfg.position_offset - 1:])
    model = transformers.RobertaForMaskedLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager")
    tokens, mask = padded_batch(hf_fixtures.VOCAB, lengths=(40, 23, 7))  # real ids 3.., padded with 1
    tokens = np.where(mask == 1, np.where(tokens == pad, pad + 1, tokens), pad)  # the pad token pads only
    tokens[:, 4] = 1 if pad != 1 else 2  # a real token, and the one the export named pad_token_id whatever it was
    with torch.no_grad():
        theirs = model.eval()(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    real = mask == 1
    np.testing.assert_allclose(theirs[real], ours(cfg, params, tokens, mask)[real], atol=1e-4, rtol=0)


def test_a_roberta_export_whose_tokenizer_has_no_pad_token_says_what_transformers_pads(tmp_path, capsys):
    """Padding with end-of-text (which ends every row) is no pad token transformers can tell from text: the export
    keeps pad_token_id at position_offset - 1, which is a token of this tokenizer, and says so."""
    cfg, params = load_hf(saved(hf_fixtures.encoder(kind="roberta", head="masked_lm"), tmp_path / "in"))
    tokenizer = roberta_tokenizer(tmp_path / "tok", ["<|endoftext|>"])
    capsys.readouterr()
    export_params(cfg, params, str(tmp_path / "out"), tokenizer)
    note = capsys.readouterr().err
    assert note.startswith(f"note: export: the tokenizer {tmp_path / 'tok'} has no pad token, so pad_token_id is 1 "
                           "(position_offset - 1: ") and "its token '!'," in note and note.count("\n") == 1, note
    assert transformers.AutoConfig.from_pretrained(str(tmp_path / "out")).pad_token_id == 1
