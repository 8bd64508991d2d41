"""The tokenizer of an export (``python -m convert export``) of a run trained with NeoMesh's own byte-level BPE:
transformers' AutoTokenizer loads it (it picked T5Tokenizer or BertTokenizer by model_type and failed), and gives
the ids NeoMesh feeds the model, special tokens included (the exported tokenizer.json added none), so a
text-classification pipeline computes the run's logits. A language model's prompts stay as they are; a tokenizer
imported with its own tokenizer_config.json is exported as it is."""

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from config import from_dict
from convert.hf import export_hf
from data import corpus
from data.tokenizer import train_bpe
from models import registry
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import create_train_state
from pretrained import Pretrained
from training.checkpoint import Checkpoints
from training.optimizer import make_optimizer

TEXTS = ["def add(a, b):\n    return a + b", "Hello, World! 42", "  spaced  out  "]
PAIRS = ["a second text", "import os", "x"]
ENCODER = dict(model="bert", causal=False, attention_types=None)
MODELS = {  # name: the run's model keys
    "bert_classify": dict(ENCODER, task="sequence_classification", num_labels=3),
    "bert_mlm": dict(ENCODER, task="masked_lm"),
    "gpt_neo_classify": dict(model="gpt_neo", task="sequence_classification", num_labels=3),
    "gpt_neo_tokens": dict(model="gpt_neo", task="token_classification", num_labels=3),
    "gpt_neo_lm": dict(model="gpt_neo"),
    "t5": dict(model="t5", task="seq2seq", attention_types=None),
}


@pytest.fixture(scope="module")
def bpe():
    """NeoMesh's byte-level BPE with a [MASK] token, as configs/bert_mlm.json's dataset trains it."""
    return train_bpe([text for _, text in corpus.documents()[:40]], 400, special_tokens=["[MASK]"])


def saved_run(run, keys, bpe):
    """A step-0 run of the model ``keys`` give in ``run``, with ``bpe`` as its tokenizer/ (as train.py keeps it)."""
    cfg = from_dict(dict(n_ctx=32, n_embd=32, n_head=2, n_layer=2, n_vocab=400, local_attention_radius=8,
                         model_path=str(run), **keys))[0]
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, state, _ = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), layout, cfg.seed)
    with Checkpoints(str(run), cfg.keep_checkpoints) as checkpoints:
        checkpoints.save(0, state, cfg.to_dict())
    (run / "tokenizer").mkdir()
    bpe.save(str(run / "tokenizer" / "tokenizer.json"))
    return str(run)


def exported(name, bpe, tmp_path):
    """(the run of MODELS[name] as NeoMesh loads it, the directory ``python -m convert export`` makes of it)."""
    run = saved_run(tmp_path / "run", MODELS[name], bpe)
    export_hf(run, str(tmp_path / "hf"))
    return Pretrained.from_pretrained(run), str(tmp_path / "hf")


def neomesh_ids(model, text, pair=None):
    """The ids NeoMesh feeds ``model`` for ``text`` (and ``pair``): its data pipeline's for the task."""
    from data.pairs import encode_ended
    from data.token_labels import TokenLabelSource

    cfg, tokenizer = model.config, model.tokenizer
    if cfg.task == "seq2seq":
        ids, lengths, _ = encode_ended(tokenizer, [text], cfg.n_ctx)
        return ids[0, :lengths[0]].tolist()
    if cfg.task == "token_classification":
        words = text.split()
        rows = TokenLabelSource([words], [[0] * len(words)], ["test"], None, tokenizer, cfg.n_ctx, cfg.num_labels,
                                shuffle=False, seed=0, description="test")
        return rows.inputs[0, :rows.lengths[0]].tolist()
    if cfg.task == "causal_lm":
        return tokenizer.encode(text)
    return tokenizer.encode_pair(text, pair)[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_auto_tokenizer_loads_the_export_and_gives_neomeshs_ids(name, bpe, tmp_path):
    model, hf = exported(name, bpe, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    pairs = model.config.task in ("sequence_classification", "masked_lm")
    for text, pair in zip(TEXTS, PAIRS):
        if name == "gpt_neo_tokens":
            text = " ".join(text.split())  # the words a token classifier's data holds
        assert tokenizer(text)["input_ids"] == neomesh_ids(model, text), (name, text)
        if pairs:
            assert tokenizer(text, pair)["input_ids"] == neomesh_ids(model, text, pair), (name, text, pair)
    types = "token_type_ids" in tokenizer("a")  # GPT-Neo would add the embedding of type 0 to every token
    assert types == (model.config.model == "bert")
    hf_config = json.loads(open(f"{hf}/config.json").read())
    if "pad_token_id" in hf_config or name == "t5":  # what generate pads with is what the tokenizer pads with
        assert hf_config["pad_token_id"] == tokenizer.pad_token_id, name
    config = json.loads(open(f"{hf}/tokenizer_config.json").read())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["eos_token"] == "<|endoftext|>"
    assert config["pad_token"] == "<|padding|>" and (config.get("mask_token") == "[MASK]") == (name.startswith("bert"))
    if model.config.model == "bert" or model.config.task == "sequence_classification":  # the same pad as config.json
        assert transformers.AutoConfig.from_pretrained(hf).pad_token_id == tokenizer.pad_token_id == 1
    written = json.loads(open(f"{hf}/tokenizer.json").read())["post_processor"]
    assert (written is None) == (name == "gpt_neo_lm")  # transformers' generate sees a prompt as it is


@pytest.mark.parametrize("name", ["bert_classify", "gpt_neo_classify"])
def test_a_text_classification_pipeline_on_the_export_gives_the_runs_logits(name, bpe, tmp_path):
    model, hf = exported(name, bpe, tmp_path)
    classify = transformers.pipeline("text-classification", model=hf, function_to_apply="none", top_k=None)
    for text in TEXTS:
        scores = {row["label"]: row["score"] for row in classify([text])[0]}
        theirs = np.array([scores[f"LABEL_{i}"] for i in range(model.config.num_labels)])
        np.testing.assert_allclose(theirs, np.asarray(model([text]))[0], rtol=0, atol=1e-4)
    if name == "bert_classify":  # a pair's second text has token type 1 on both sides
        hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(hf).eval()
        inputs = transformers.AutoTokenizer.from_pretrained(hf)(TEXTS[0], PAIRS[0], return_tensors="pt")
        with torch.no_grad():
            theirs = hf_model(**inputs).logits.numpy()[0]
        np.testing.assert_allclose(theirs, np.asarray(model([TEXTS[0]], [PAIRS[0]]))[0], rtol=0, atol=1e-4)


def test_an_imported_tokenizer_is_exported_as_it_came(bpe, tmp_path):
    """A tokenizer with its own tokenizer_config.json (Hugging Face's, copied in by convert import) keeps it, and
    its tokenizer.json, byte for byte."""
    run = saved_run(tmp_path / "run", MODELS["bert_classify"], bpe)
    own = '{"tokenizer_class": "RobertaTokenizer", "model_max_length": 512}'
    (tmp_path / "run" / "tokenizer" / "tokenizer_config.json").write_text(own)
    export_hf(run, str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "tokenizer_config.json").read_text() == own
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (tmp_path / "run/tokenizer/tokenizer.json").read_bytes()


@pytest.mark.parametrize("keys", [MODELS["gpt_neo_tokens"], dict(ENCODER, task="token_classification", num_labels=3)],
                         ids=["gpt_neo", "bert"])
def test_a_token_classifier_reads_texts_as_its_training_rows_hold_their_words(keys, bpe):
    """Pretrained.tokenize frames a token classifier's text as TokenLabelSource frames its words (a decoder's too:
    it fed the plain ids), long texts cut to n_ctx with the closing token kept."""
    from flax import nnx

    cfg = from_dict(dict(n_ctx=32, n_embd=32, n_head=2, n_layer=1, n_vocab=400, local_attention_radius=8, **keys))[0]
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(0)))
    model = Pretrained(cfg, graphdef, nnx.to_pure_dict(state), bpe)
    texts = [" ".join(text.split()) for text in TEXTS] + [" ".join(["word"] * 40)]
    batch = model.tokenize(texts)
    for row, text in enumerate(texts):
        want = neomesh_ids(model, text)
        assert batch["inputs"][row, :len(want)].tolist() == want and batch["segment_ids"][row].sum() == len(want)
    assert len(neomesh_ids(model, texts[-1])) == cfg.n_ctx and batch["inputs"][-1, -1] == bpe.eos_id
    assert model(texts).shape == (len(texts), cfg.n_ctx, cfg.num_labels)
