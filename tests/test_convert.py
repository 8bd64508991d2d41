"""``python -m convert import``: what its closing lines say for each family, a text model imported from a
directory without tokenizer files (a note at import; predict.py does not read text with another tokenizer), and the
config.json values (dropout, pad_token_id) an import keeps and an export writes back."""

import json
import os

import pytest

from config import from_dict
from convert.__main__ import imported
from tests import hf_fixtures
from tests.common import run_command


@pytest.mark.parametrize("keys, says, not_said", [
    (dict(model="gpt_neo"), ["generate with predict.py", "score with eval.py", "on data made with its tokenizer"], []),
    (dict(model="t5"), ["generate with predict.py"], ["eval.py"]),
    (dict(model="t5", n_decoder_layer=0), ["fine-tune on data made with its tokenizer"], ["predict.py", "eval.py"]),
    (dict(model="bert"), ["fill masks with predict.py", "fine-tune on data made with its tokenizer"],
     ["eval.py", "label texts"]),
    (dict(model="bert", task="sequence_classification"), ["label texts with predict.py"], ["eval.py", "fill masks"]),
    (dict(model="vit"), ["classify images with predict.py", "fine-tune with train.py"],
     ["label texts", "eval.py", "tokenizer"]),
])
def test_import_says_what_the_family_is_for(keys, says, not_said, tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    lines = imported(from_dict(keys)[0], "org/name", str(tmp_path))
    assert len(lines) == 1
    for text in says + ["--init-from org/name (a new one)", f"python -m convert export {tmp_path} HF_DIR"]:
        assert text in lines[0]
    for text in not_said:
        assert text not in lines[0]


def test_a_text_model_imported_without_a_tokenizer_says_so(tmp_path):
    source, run = tmp_path / "hf", tmp_path / "run"
    hf_fixtures.gpt_neo().save_pretrained(str(source))  # weights and config.json only
    (source / "tokenizer_config.json").write_text("{}")  # settings without a vocabulary are no tokenizer
    result = run_command("-m", "convert", "import", str(source), str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    note, closing = result.stdout.splitlines()
    assert note.startswith(f"note: {source} has no tokenizer") and f"{run}/tokenizer/" in note
    assert closing.startswith("imported gpt_neo") and not (run / "tokenizer").exists()
    # Without the model's tokenizer predict.py refuses, rather than reading text with the default dataset's.
    result = run_command("predict.py", "--model-path", str(run), "--prompt", "x")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert f"tokenizer_path: '{source}'" in result.stderr
    # Its export has none either, and says so (it wrote the weights without a word).
    result = run_command("-m", "convert", "export", str(run), str(tmp_path / "exported"))
    assert result.returncode == 0 and result.stderr.splitlines() == [
        f"note: {tmp_path / 'exported'} has no tokenizer: {run} has no tokenizer/ folder; put the model's tokenizer "
        f"files in {tmp_path / 'exported'} before --hf-model, Pretrained or transformers' pipelines read text with "
        "it"], result.stderr


@pytest.mark.e2e
def test_an_export_of_a_run_that_reads_bytes_says_it_has_no_tokenizer(tmp_path):
    """A run trained with the "bytes" tokenizer exports no tokenizer: a note says so, and how text becomes ids.
    None is written because a tokenizer.json cannot be the same tokenizer: the tokenizers library matches its
    special tokens in the text (encode_special_tokens, which would stop it, is not saved), so a typed
    "<|endoftext|>" would be id 256 where NeoMesh reads 13 bytes."""
    import tokenizers
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    from data.tokenizer import ByteTokenizer

    run, hf = tmp_path / "run", tmp_path / "hf"
    sets = ['datasets=[["embedded", null, null, null]]', "n_vocab=257", "n_layer=1", 'attention_types=[[["global"],1]]',
            "n_embd=32", "n_head=2", "n_ctx=16", "train_batch_size=8", "train_steps=1", "warmup_steps=1",
            "eval_every=0", "eval_steps=1", "sample_tokens=0"]
    trained = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(run), "--no-progress",
                          *[arg for s in sets for arg in ("--set", s)])
    assert trained.returncode == 0, trained.stderr[-2000:]
    result = run_command("-m", "convert", "export", str(run), str(hf))
    assert result.returncode == 0 and result.stderr.splitlines() == [
        f"note: {hf} has no tokenizer: {run} reads text as UTF-8 bytes (tokenizer 'bytes': ids 0..255, end-of-text "
        "256), which no tokenizer.json reproduces exactly; transformers takes its ids (list(text.encode('utf-8'))), "
        f"and predict.py --model-path, eval.py and Pretrained read text with the run itself ({run})"], result.stderr
    assert sorted(os.listdir(hf)) == ["config.json", "model.safetensors"]
    exported = json.load(open(hf / "config.json"))  # transformers' generate stops at the bytes' end-of-text
    assert (exported["eos_token_id"], exported["bos_token_id"]) == (256, 256), exported
    # The would-be tokenizer.json: every byte its own id (characters by GPT-2's bytes_to_unicode), end-of-text 256,
    # saved and loaded; it agrees with NeoMesh's on text but not on a typed end-of-text.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = dict(zip(printable, map(chr, printable)))
    chars.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in chars)})
    tok = tokenizers.Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.encode_special_tokens = True
    tok = tokenizers.Tokenizer.from_str(tok.to_str())
    text = "".join(map(chr, range(1, 0x800, 7))) + " é€😀"
    assert tok.encode(text).ids == ByteTokenizer().encode(text)  # the bytes agree...
    typed = "a <|endoftext|> b"
    assert 256 in tok.encode(typed).ids and 256 not in ByteTokenizer().encode(typed)  # ...a typed end-of-text not


def test_export_refuses_a_directory_it_would_spoil(tmp_path):
    """Export replaces a previous export, and nothing else: not a directory of other files, not the run's
    init_from base (a LoRA run reads it: its logits would change) nor its tokenizer's directory."""
    from config import ConfigError
    from convert.hf import check_export_dir, check_export_sources

    check_export_dir(str(tmp_path / "new"))
    previous = tmp_path / "previous"
    previous.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        (previous / name).write_text("{}")
    check_export_dir(str(previous))  # replaced
    (previous / "model.safetensors.tmp").write_text("")  # an earlier version's export, killed mid-write
    check_export_dir(str(previous))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty and not a previous export \\(it holds notes.txt\\)"):
        check_export_dir(str(tmp_path))
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_export_dir(str(tmp_path / "notes.txt"))

    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (tmp_path / "tok.json").write_text("{}")
    cfg = from_dict(dict(model="gpt_neo", init_from=str(previous), tokenizer_path=str(tmp_path / "tok.json")))[0]
    check_export_sources(cfg, str(run), str(tmp_path / "out"))
    check_export_sources(cfg.replace(tokenizer_path="bytes"), str(run), "bytes")  # not a directory
    for target, key in ((previous, "init_from"), (tmp_path, "tokenizer_path"), (run / "tokenizer", "tokenizer")):
        with pytest.raises(ConfigError, match=f"is the run's {key} "):
            check_export_sources(cfg, str(run), str(target) + "/")


def test_an_export_replaces_a_previous_one_whole_or_not_at_all(tmp_path, monkeypatch):
    """While the weights are written (the long part, where a kill lands) the directory still holds the previous
    export, untouched: not the new tokenizer beside the old weights, no half-written file a later export refuses.
    Done, it holds the new export only (a previous tokenizer.json beside new vocab.json/merges.txt would be the
    one transformers reads)."""
    import numpy as np
    import safetensors.numpy

    from convert.hf_dir import write_hf_dir

    out, new_tokenizer = tmp_path / "export", tmp_path / "tok"
    old_tokenizer = tmp_path / "old_tok"
    old_tokenizer.mkdir()
    (old_tokenizer / "tokenizer.json").write_text('{"old": true}')
    write_hf_dir(str(out), {"n": 1}, {"w": np.zeros(2)}, str(old_tokenizer))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    new_tokenizer.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (new_tokenizer / name).write_text("new")
    seen = []
    save_file = safetensors.numpy.save_file

    def save_and_look(tensors, path, metadata=None):
        save_file(tensors, path, metadata=metadata)
        seen.append({p.name: p.read_bytes() for p in out.iterdir()})

    monkeypatch.setattr(safetensors.numpy, "save_file", save_and_look)
    write_hf_dir(str(out), {"n": 2}, {"w": np.ones(2)}, str(new_tokenizer))
    assert seen == [before]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "old_tok", "tok"]  # nothing left beside it


def test_an_import_writes_its_checkpoint_last_and_can_be_redone(tmp_path, monkeypatch):
    """The step-0 checkpoint makes the directory a run: when it is written the tokenizer and config.json are in
    place (a run killed between them read text with the default dataset's tokenizer), and an import killed
    before it committed (a save in flight) is redone, not refused as a run."""
    from convert.hf import import_hf
    from training.checkpoint import Checkpoints

    source, run = hf_fixtures.save(hf_fixtures.gpt_neo(), tmp_path / "hf"), tmp_path / "run"
    (run / "checkpoints" / "0.orbax-checkpoint-tmp").mkdir(parents=True)  # killed mid-save
    seen = []
    save = Checkpoints.save

    def look_then_save(self, step, *args, **kwargs):
        seen.append(sorted(os.listdir(run)))
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(Checkpoints, "save", look_then_save)
    import_hf(source, str(run))
    assert seen == [["checkpoints", "config.json", "tokenizer"]]
    assert sorted(os.listdir(run / "checkpoints")) == ["0"]


def test_an_import_reads_config_json_once(tmp_path, monkeypatch):
    """The model's keys and its label names come from one read: it was read twice (and could change between)."""
    import builtins

    from convert.hf import import_hf

    source = hf_fixtures.save(hf_fixtures.gpt_neo(), tmp_path / "hf")
    config_json, reads = os.path.join(source, "config.json"), []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, str) and os.path.abspath(file) == os.path.abspath(config_json):
            reads.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    import_hf(source, str(tmp_path / "run"))
    assert len(reads) == 1, reads


def dead_pid() -> int:
    """The id of a process that has exited (what a killed export's names carry)."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def test_an_export_killed_while_replacing_the_previous_one_is_put_back(tmp_path):
    """Killed between its two renames, an export left the previous one as <dir>.old-PID and no <dir>: a reader
    said only 'no such directory', and the next export left it there for good. A reader now names it in one line,
    and the next export puts it back before replacing it (or removes one left beside a new export)."""
    import json

    import numpy as np

    from config import ConfigError
    from convert.hf_dir import restore_replaced, write_hf_dir
    from neomesh.hf_cache import resolve_model

    out = tmp_path / "export"
    write_hf_dir(str(out), {"n": 1}, {"w": np.zeros(2)})
    pid = dead_pid()
    old, staging = tmp_path / f"export.old-{pid}", tmp_path / f"export.tmp-{pid}"
    out.rename(old)  # the kill: the previous export aside, the new one staged in full beside it
    staging.mkdir()
    (staging / "config.json").write_text('{"n": 2}')
    with pytest.raises(ConfigError, match=f"^--hf-model {out}: no such directory; {old} holds the export that was "
                                          f"there .*: rename it to {out}, or export again$"):
        resolve_model(str(out))
    result = run_command("-m", "convert", "import", str(out), str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and f"{old} holds" in result.stderr, \
        result.stderr[-2000:]

    restore_replaced(str(out))
    assert json.loads((out / "config.json").read_text()) == {"n": 1} and not old.exists()
    write_hf_dir(str(out), {"n": 3}, {"w": np.ones(2)})
    assert json.loads((out / "config.json").read_text()) == {"n": 3}

    old.mkdir()  # killed while removing the previous export, the new one in place
    (old / "config.json").write_text("{")
    write_hf_dir(str(out), {"n": 4}, {"w": np.ones(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_export_into_a_read_only_parent_says_why_it_must_be_writable(tmp_path, monkeypatch):
    """A writable export directory in a read-only parent failed with '<dir>.tmp-PID: Permission denied', a name
    the user never gave, and only after restoring the run. The staging directory must be beside the target: only a
    rename replaces a directory at once, and it writes the parent. Said before any work, and at the write."""
    import numpy as np

    from config import ConfigError
    from convert.hf import check_export_dir
    from convert.hf_dir import write_hf_dir

    out = tmp_path / "export"
    out.mkdir()
    says = f"^export: {tmp_path} is not writable.*: an export is staged beside {out} and renamed into its place, " \
           "the only way to replace a directory at once"
    real_access, real_makedirs = os.access, os.makedirs
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: real_access(path, mode, **kw) and
                        (path != str(tmp_path) or mode != os.W_OK))
    with pytest.raises(ConfigError, match=says):
        check_export_dir(str(out))

    def makedirs(path, *args, **kwargs):  # what a read-only parent does to root too
        if os.path.dirname(path) == str(tmp_path):
            raise PermissionError(13, "Permission denied", path)
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    with pytest.raises(ConfigError, match=says) as refused:
        write_hf_dir(str(out), {"n": 1}, {"w": np.zeros(2)})
    assert f"{tmp_path} is not writable (Permission denied): " in str(refused.value)
    assert os.listdir(out) == []


def test_a_bert_without_token_types_exports_a_zero_type_row(tmp_path):
    """transformers' BERT adds a token-type row to every token (type_vocab_size 1 at least): the export gives it a
    zero one, which adds nothing, where it had none (transformers drew it at random)."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from convert.hf import export_params
    from models import registry
    from tests.common import tiny_config

    cfg = tiny_config(model="bert", task="masked_lm", attention_types=None, causal=False, n_token_types=0)
    model = registry.build(cfg, nnx.Rngs(0))
    export_params(cfg, nnx.to_pure_dict(nnx.state(model, nnx.Param)), str(tmp_path / "hf"))
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    assert not hf.bert.embeddings.token_type_embeddings.weight.abs().sum()
    tokens = np.random.default_rng(0).integers(0, cfg.n_vocab, (2, 12))
    with torch.no_grad():
        want = hf(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(tokens))[0]), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("model", ["gpt_neo", "gpt2"])
def test_a_decoder_exported_without_a_tokenizer_names_no_token_outside_its_vocabulary(model, tmp_path):
    """config.json left bos/eos out, so transformers read its GPT-2 default 50256, past a small vocabulary's end:
    a warning on load, and generate waiting for a token the model cannot produce."""
    import transformers
    from flax import nnx

    from convert.hf import export_params
    from models import registry
    from tests.common import tiny_config

    cfg = tiny_config(model=model, attention_types=None if model == "gpt2" else tiny_config().attention_types)
    export_params(cfg, nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(0)), nnx.Param)), str(tmp_path / "hf"))
    loaded = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    assert (loaded.bos_token_id, loaded.eos_token_id) == (None, None)
    export_params(cfg, nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(0)), nnx.Param)), str(tmp_path / "hf"),
                  eos_id=cfg.n_vocab - 1)
    loaded = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    assert (loaded.bos_token_id, loaded.eos_token_id) == (cfg.n_vocab - 1, cfg.n_vocab - 1)


@pytest.mark.parametrize("family", ["gpt_neo", "bert"])
def test_a_model_that_shares_its_block_weights_exports_a_copy_per_layer(family, tmp_path, capsys):
    """share_parameters keeps one set of block weights (in the first block); Hugging Face's families hold them per
    layer: the export copies them to every layer, and transformers computes the same logits from it."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from convert.hf import export_params
    from models import registry
    from tests.common import tiny_config

    changes = dict(n_layer=4, attention_types=[[["global", "local"], 2]]) if family == "gpt_neo" else \
        dict(model="bert", task="masked_lm", n_layer=3, attention_types=None, causal=False)
    cfg = tiny_config(share_parameters=True, **changes)
    model = registry.build(cfg, nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert list(params["blocks"]) == [0]
    export_params(cfg, params, str(tmp_path / "hf"))
    assert capsys.readouterr().err == (f"note: export: share_parameters: each of the {cfg.n_layer} layers gets a copy "
                                       "of the one set of block weights (Hugging Face's families hold weights per "
                                       "layer; imported back, the layers train apart)\n")
    auto = transformers.AutoModelForCausalLM if family == "gpt_neo" else transformers.AutoModelForMaskedLM
    hf = auto.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    tokens = np.random.default_rng(0).integers(0, cfg.n_vocab, (2, 24))
    with torch.no_grad():
        want = hf(torch.from_numpy(tokens)).logits.numpy()
    got = np.asarray(model(jnp.asarray(tokens))[0])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


DROPOUT = {  # model_type: (config.json keys of a tiny model, its dropout keys, NeoMesh's res, embed and attn dropout)
    "bert": (dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  vocab_size=300, max_position_embeddings=32),
             dict(hidden_dropout_prob=0.15, attention_probs_dropout_prob=0.05), (0.15, 0.15, 0.05)),
    "gpt_neo": (dict(hidden_size=32, num_layers=2, num_heads=2, vocab_size=300, max_position_embeddings=32,
                     attention_types=[[["global", "local"], 1]]),
                dict(resid_dropout=0.1, embed_dropout=0.2, attention_dropout=0.3), (0.1, 0.2, 0.3)),
    "gpt2": (dict(n_embd=32, n_layer=1, n_head=2, vocab_size=300, n_positions=32),
             dict(resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.3), (0.1, 0.2, 0.3)),
    "t5": (dict(d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=300), dict(dropout_rate=0.2),
           (0.2, 0.2, 0.2)),
    "vit": (dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=8,
                 patch_size=4), dict(hidden_dropout_prob=0.15, attention_probs_dropout_prob=0.05), (0.15, 0.15, 0.05)),
}


@pytest.mark.parametrize("model_type", list(DROPOUT))
def test_import_keeps_the_checkpoints_dropout_and_export_writes_it_back(model_type, tmp_path):
    """Import set res_dropout, embed_dropout and attn_dropout to 0.0 whatever config.json said, so fine-tuning an
    imported model ran without the dropout transformers' Trainer would use, and export wrote 0.0 back."""
    import transformers

    from convert.hf import MAPPINGS, hf_config

    shape, dropout, ours = DROPOUT[model_type]
    transformers.AutoConfig.for_model(model_type, **shape, **dropout).save_pretrained(str(tmp_path))
    cfg = hf_config(str(tmp_path))
    assert (cfg.res_dropout, cfg.embed_dropout, cfg.attn_dropout) == ours
    written = MAPPINGS[model_type].config_to_hf(cfg)
    assert {key: written[key] for key in dropout} == dropout


CLASSIFIER_DROPOUT = [  # model_type, architecture, config.json's classifier_dropout, the head's rate transformers uses
    ("bert", "BertForSequenceClassification", 0.3, 0.3), ("bert", "BertForTokenClassification", None, 0.15),
    ("gpt_neo", "GPTNeoForTokenClassification", 0.25, 0.25), ("gpt2", "GPT2ForTokenClassification", None, 0.1)]


@pytest.mark.parametrize("model_type, architecture, written, rate", CLASSIFIER_DROPOUT)
def test_an_imported_classifier_drops_its_heads_input_at_classifier_dropout(model_type, architecture, written, rate,
                                                                            tmp_path):
    """The heads dropped at res_dropout whatever classifier_dropout said (transformers' BERT heads use it, else
    hidden_dropout_prob; GPT-2's and GPT-Neo's token heads use it, else 0.1), and export left it out."""
    import transformers
    from flax import nnx

    from convert.hf import MAPPINGS, hf_config
    from models import registry

    shape, dropout, _ = DROPOUT[model_type]
    transformers.AutoConfig.for_model(model_type, **shape, **dropout, classifier_dropout=written,
                                      architectures=[architecture]).save_pretrained(str(tmp_path))
    cfg = hf_config(str(tmp_path))
    assert cfg.head_dropout == rate
    model = registry.build(cfg, nnx.Rngs(0))
    head = model.classifier if architecture == "BertForSequenceClassification" else model.token_classifier
    assert head.dropout_rate == rate
    assert MAPPINGS[model_type].config_to_hf(cfg)["classifier_dropout"] == (written if model_type == "bert" else rate)


def test_a_dropout_config_json_cannot_hold_names_its_key(tmp_path):
    from config import ConfigError
    from convert.hf import hf_config

    shape, _, _ = DROPOUT["gpt2"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **shape, "attn_pdrop": 1.5}))
    with pytest.raises(ConfigError, match=r"config\.json: attn_pdrop: 1\.5 is above the maximum 1\.0 \(read as "
                                          r"NeoMesh's attn_dropout\)$"):
        hf_config(str(tmp_path))


def test_a_bert_import_and_export_give_back_its_config_values(tmp_path):
    """The run an import writes trains with the checkpoint's dropout, and its export writes config.json's dropout
    and pad_token_id back (they came back as 0.0 and were left out)."""
    from convert.hf import export_hf, import_hf

    reference = hf_fixtures.encoder(head="masked_lm")
    reference.config.hidden_dropout_prob, reference.config.attention_probs_dropout_prob = 0.1, 0.2
    reference.save_pretrained(str(tmp_path / "in"))
    import_hf(str(tmp_path / "in"), str(tmp_path / "run"))
    run = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (run["res_dropout"], run["embed_dropout"], run["attn_dropout"]) == (0.1, 0.1, 0.2)
    export_hf(str(tmp_path / "run"), str(tmp_path / "out"))
    original, exported = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("in", "out"))
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob", "pad_token_id")
    assert {k: exported[k] for k in keys} == {k: original[k] for k in keys} == \
        {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.2, "pad_token_id": 0}
