"""LoRA adapters between NeoMesh and Hugging Face's peft library (convert/peft_adapter.py): a NeoMesh LoRA model
exported as a peft adapter directory computes its logits under ``peft.PeftModel.from_pretrained``, and a peft
adapter loaded onto its base computes peft's, on tiny models built locally."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from config import ConfigError
from convert.hf import load_hf
from convert.hf_dir import write_hf_dir
from convert.peft_adapter import CONFIG_FILE, WEIGHTS_FILE, adapter_of, adapter_params
from models import registry
from tests import hf_fixtures
from tests.common import tiny_config
from training.peft import apply_peft, build_model
from training.peft.lora import lora_modules

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = np.random.default_rng(0).integers(3, hf_fixtures.VOCAB, (2, 24))
MASK = (np.arange(24)[None] < np.array([[24], [15]])).astype(np.int64)
PIXELS = np.random.default_rng(0).standard_normal((2, 16, 16, 3)).astype(np.float32)


def base_model(cfg, params):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    return nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))


def real(logits):
    """Per-token logits at the real (unpadded) positions; a sequence classifier's as they are."""
    return logits[MASK == 1] if logits.ndim == 3 else logits


def neomesh_logits(model, cfg):
    tokens = jnp.asarray(TOKENS, jnp.int32)
    if cfg.model in ("bert", "roberta"):
        return real(np.asarray(model(tokens, segment_ids=jnp.asarray(MASK, jnp.int32))[0]))
    if cfg.model == "t5":
        return np.asarray(model(tokens, decoder_inputs=tokens[:, :7])[0])
    if cfg.model == "vit":
        return np.asarray(model(jnp.asarray(PIXELS))[0])
    return np.asarray(model(tokens)[0])


def peft_logits(base, adapter_dir, cfg):
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        if cfg.model in ("bert", "roberta"):
            return real(model(input_ids=torch.tensor(TOKENS), attention_mask=torch.tensor(MASK)).logits.numpy())
        if cfg.model == "t5":
            return model(input_ids=torch.tensor(TOKENS), decoder_input_ids=torch.tensor(TOKENS[:, :7])).logits.numpy()
        if cfg.model == "vit":
            return model(pixel_values=torch.from_numpy(PIXELS.transpose(0, 3, 1, 2))).logits.numpy()
        return model(input_ids=torch.tensor(TOKENS)).logits.numpy()


def trained_lora(cfg, params, lora, head_moved=False):
    """A NeoMesh model of ``cfg`` with LoRA ``lora`` whose B factors (and head, with ``head_moved``) moved from
    their start, as training moves them."""
    model = apply_peft(base_model(cfg, params), {"lora": lora})
    rng = np.random.default_rng(1)
    for _, m in lora_modules(model):
        m.lora_b[...] = jnp.asarray(0.2 * rng.standard_normal(m.lora_b.shape), jnp.float32)
    if head_moved:
        for path, value in nnx.iter_graph(model):
            if isinstance(value, nnx.Param) and path[0] in ("classifier", "score", "token_classifier"):
                value[...] = value[...] + jnp.asarray(0.3 * rng.standard_normal(value.shape), jnp.float32)
    return model


def gpt2_classifier():
    config = hf_fixtures.gpt2(n_embd=32, n_head=4, n_layer=2).config
    config.num_labels, config.pad_token_id = 3, 1  # no row is padded: the last token pools, as in NeoMesh
    torch.manual_seed(0)
    return transformers.GPT2ForSequenceClassification(config).eval()


def vit():
    from tests.test_vit import hf_vit

    return hf_vit(16, 4, 3, 32, 4, 2, 5)


FAMILIES = {
    "gpt2": lambda: hf_fixtures.gpt2(n_embd=32, n_head=4, n_layer=2),
    "gpt_neo": lambda: hf_fixtures.gpt_neo(n_embd=32, n_head=2, n_layer=2),
    "bert": lambda: hf_fixtures.encoder("bert", "masked_lm"),
    "roberta": lambda: hf_fixtures.encoder("roberta", "masked_lm"),
    "bert_classifier": lambda: hf_fixtures.encoder("bert", "sequence_classification"),
    "roberta_classifier": lambda: hf_fixtures.encoder("roberta", "sequence_classification"),
    "gpt2_classifier": lambda: gpt2_classifier(),
    "t5": lambda: hf_fixtures.t5(),
    "t5_gated": lambda: hf_fixtures.t5(ffn="gated-gelu", tied=False),
    "vit": lambda: vit(),
}


@pytest.mark.parametrize("family, targets", [
    ("gpt2", ["q", "v"]), ("gpt2", ["q", "k", "v", "out", "c_fc", "c_proj"]), ("gpt2", ["out"]),
    ("gpt2", ["blocks/1/attn/k", "blocks/0/attn/q", "blocks/0/attn/v"]),
    ("gpt_neo", ["q", "v"]), ("gpt_neo", ["q", "k", "v", "out", "c_fc", "c_proj"]),
    ("bert", ["q", "v", "out", "c_proj"]), ("roberta", ["q", "k", "v", "c_fc"]),
    ("bert_classifier", ["q", "v"]), ("roberta_classifier", ["q", "v", "c_proj"]), ("gpt2_classifier", ["q", "v"]),
    ("t5", ["q", "v", "out", "c_fc", "c_proj"]), ("t5_gated", ["k", "c_gate", "decoder/blocks/*/crossattention/q"]),
    ("vit", ["q", "v", "c_fc"]),
])
def test_an_exported_adapter_computes_the_neomesh_logits_in_peft(family, targets, tmp_path):
    reference = FAMILIES[family]()
    base_dir = str(tmp_path / "base")
    reference.save_pretrained(base_dir)
    cfg, params = load_hf(base_dir)
    lora = {"targets": targets, "rank": 3, "alpha": 5.0}
    model = trained_lora(cfg, params, lora, head_moved=cfg.task != "causal_lm")
    ours = neomesh_logits(model, cfg)
    settings = {"lora": lora, "trainable": ["lora"] if cfg.task == "masked_lm" else None}
    config, tensors = adapter_of(cfg.replace(peft=settings), nnx.to_pure_dict(nnx.state(model, nnx.Param)), base_dir)
    write_hf_dir(str(tmp_path / "adapter"), config, tensors, names=(CONFIG_FILE, WEIGHTS_FILE))
    written = json.load(open(tmp_path / "adapter" / CONFIG_FILE))
    assert written["base_model_name_or_path"] == base_dir and written["r"] == 3 and written["lora_alpha"] == 5.0
    assert written["task_type"] == {"causal_lm": "CAUSAL_LM", "masked_lm": None, "seq2seq": "SEQ_2_SEQ_LM",
                                    "image_classification": None}.get(cfg.task, "SEQ_CLS")
    base = type(reference).from_pretrained(base_dir).eval()
    with torch.no_grad():
        plain = peft_logits(type(reference).from_pretrained(base_dir).eval(), str(tmp_path / "adapter"), cfg)
    assert np.abs(plain - neomesh_logits(base_model(cfg, params), cfg)).max() > 1e-3  # the LoRA matters
    np.testing.assert_allclose(peft_logits(base, str(tmp_path / "adapter"), cfg), ours, atol=1e-4, rtol=0)


def test_gpt2_target_modules_are_peft_names_and_fused_qkv_keeps_its_scale(tmp_path):
    reference = hf_fixtures.gpt2(n_embd=32, n_head=4, n_layer=2)
    reference.save_pretrained(str(tmp_path))
    cfg, params = load_hf(str(tmp_path))
    lora = {"targets": ["q", "v", "out"], "rank": 4, "alpha": 8.0}
    model = trained_lora(cfg, params, lora)
    config, tensors = adapter_of(cfg.replace(peft={"lora": lora}), nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                                 "gpt2")
    # attn.c_proj, not c_proj: that would adapt the MLP's c_proj too
    assert config["target_modules"] == ["attn.c_proj", "c_attn"] and config["fan_in_fan_out"]
    assert config["rank_pattern"] == {"c_attn": 8} and config["alpha_pattern"] == {"c_attn": 16.0}
    b = tensors["base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]
    assert b.shape == (96, 8) and not b[32:64].any()  # k has no LoRA: its rows of c_attn's B stay zero


def peft_adapter(reference, tmp_path, **options):
    """A peft LoRA adapter directory of ``reference`` with random factors (as a trained one has)."""
    model = peft.get_peft_model(reference, peft.LoraConfig(**options))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(tmp_path / "adapter"))
    return str(tmp_path / "adapter")


@pytest.mark.parametrize("family, options", [
    ("gpt2", dict(target_modules=["c_attn", "mlp.c_proj"], r=4, lora_alpha=8, fan_in_fan_out=True)),
    ("gpt2", dict(target_modules=["c_attn", "c_fc"], r=4, lora_alpha=8, fan_in_fan_out=True,
                  rank_pattern={"c_fc": 2}, alpha_pattern={"c_attn": 3}, use_rslora=True)),
    ("gpt_neo", dict(target_modules=["q_proj", "v_proj", "out_proj"], r=4, lora_alpha=16, layers_to_transform=[1])),
    ("bert", dict(target_modules=["query", "value", "intermediate.dense"], r=2, lora_alpha=4)),
    ("roberta", dict(target_modules=["query", "key", "output.dense"], r=3, lora_alpha=6)),
    ("t5", dict(target_modules=["q", "v", "wo"], r=4, lora_alpha=8)),
    ("vit", dict(target_modules=["q_proj", "v_proj", "fc2"], r=4, lora_alpha=8, modules_to_save=["classifier"])),
])
def test_a_peft_adapter_on_its_base_computes_peft_logits(family, options, tmp_path):
    reference = FAMILIES[family]()
    base_dir = str(tmp_path / "base")
    reference.save_pretrained(base_dir)
    adapter_dir = peft_adapter(FAMILIES[family](), tmp_path, **options)
    cfg, params = load_hf(base_dir)
    cfg, loaded = adapter_params(cfg, params, adapter_dir)
    assert "lora" in cfg.peft
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0))))
    ours = neomesh_logits(nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, loaded))), cfg)
    theirs = peft_logits(type(reference).from_pretrained(base_dir).eval(), adapter_dir, cfg)
    assert np.abs(theirs - neomesh_logits(base_model(*load_hf(base_dir)), cfg)).max() > 1e-3
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_an_adapter_peft_cannot_hold_is_one_line(tmp_path):
    reference = hf_fixtures.gpt2(n_embd=32, n_head=4, n_layer=2)
    reference.save_pretrained(str(tmp_path))
    cfg, params = load_hf(str(tmp_path))
    settings = {"lora": {"targets": ["q"], "rank": 2}, "adapter": {"size": 4}}
    with pytest.raises(ConfigError, match="peft.adapter has no place in a Hugging Face peft LoRA adapter"):
        adapter_of(cfg.replace(peft=settings), params, "gpt2")
    with pytest.raises(ConfigError, match="peft.trainable 'norm' has no place"):
        adapter_of(cfg.replace(peft={"lora": {}, "trainable": ["lora", "norm"]}), params, "gpt2")
    with pytest.raises(ConfigError, match="the masked-LM head trains .* shares the word embeddings"):
        adapter_of(tiny_config(model="bert", task="masked_lm", peft={"lora": {}}), {}, "bert")
    head_lora = {"score": {"out": {"lora_a": np.zeros((32, 2)), "lora_b": np.zeros((2, 2))}}}
    with pytest.raises(ConfigError, match="score/out has LoRA, and no Hugging Face gpt2 module it maps to adapts"):
        adapter_of(cfg.replace(task="sequence_classification", peft={"lora": {"targets": ["score/out"]}}),
                   head_lora, "gpt2")
    dora = peft_adapter(hf_fixtures.gpt2(n_embd=32, n_head=4, n_layer=2), tmp_path, target_modules=["c_attn"],
                        use_dora=True, fan_in_fan_out=True)
    with pytest.raises(ConfigError, match="use_dora true: NeoMesh's LoRA is plain LoRA"):
        adapter_params(cfg, params, dora)
    # an adapter of a larger base, on this one: named as such, whatever flag gave it
    wider = peft_adapter(hf_fixtures.gpt2(n_embd=64, n_head=4, n_layer=2), tmp_path / "wider",
                         target_modules=["c_attn"], fan_in_fan_out=True)
    with pytest.raises(ConfigError, match=rf"^{wider}: the adapter's blocks/0/attn/\w/lora_a has shape \(64, 8\), the "
                       r"base model's \(32, 8\): an adapter of another base model \(another size\?\)$"):
        adapter_params(cfg, params, wider)
    from pretrained import load
    with pytest.raises(ConfigError, match=f"^{dora}: a peft adapter directory, given as the base model of the "
                       f"adapter {dora}: an adapter goes on a base model; give its base"):
        load(dora, adapter=dora)  # an adapter given as the base of another (or of itself)


def test_init_from_a_peft_adapter_starts_from_its_base_and_factors(tmp_path):
    """train.py --init-from ADAPTER_DIR: the run's model is the base with the adapter's LoRA setting and factors,
    computing peft's logits before any step."""
    from training.init_from import imported_params, with_architecture_of

    reference = FAMILIES["gpt2"]()
    base_dir = str(tmp_path / "base")
    reference.save_pretrained(base_dir)
    adapter_dir = peft_adapter(FAMILIES["gpt2"](), tmp_path, target_modules=["c_attn"], r=4, lora_alpha=8,
                               fan_in_fan_out=True)
    config = json.load(open(f"{adapter_dir}/{CONFIG_FILE}"))
    json.dump({**config, "base_model_name_or_path": base_dir}, open(f"{adapter_dir}/{CONFIG_FILE}", "w"))
    notes = []
    cfg = with_architecture_of(load_hf(base_dir)[0].replace(
        init_from=adapter_dir, peft={"lora": {"targets": ["q", "v"], "rank": 8}, "checkpoint": "trainable"}),
        "--init-from", notes)
    assert cfg.peft["lora"]["targets"] == ["k", "q", "v"] and cfg.peft["lora"]["rank"] == 4
    assert cfg.peft["checkpoint"] == "trainable" and any("peft.lora is the adapter's" in n for n in notes)
    params = imported_params(cfg, adapter_dir)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0))))
    ours = neomesh_logits(nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params))), cfg)
    np.testing.assert_allclose(ours, peft_logits(type(reference).from_pretrained(base_dir).eval(), adapter_dir, cfg),
                               atol=1e-4, rtol=0)


@pytest.mark.e2e
def test_a_peft_adapter_trains_on_predicts_and_exports_back_to_peft(tmp_path, monkeypatch):
    """The README's commands: predict.py --hf-model BASE --adapter DIR, train.py --init-from DIR (the adapter's
    LoRA goes on training; checkpoints hold only the factors), and export --adapter of that run, which peft loads
    onto the base with the run's logits."""
    import neomesh.paths
    from pydoc_data.topics import topics

    from pretrained import Pretrained
    from tests.common import run_command

    monkeypatch.setattr(neomesh.paths, "work_root", lambda: str(tmp_path))
    base_dir = hf_fixtures.save(hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2, n_ctx=64), tmp_path / "gpt2")
    adapter_dir = peft_adapter(hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2, n_ctx=64), tmp_path,
                               target_modules=["c_attn", "attn.c_proj"], r=4, lora_alpha=8, fan_in_fan_out=True,
                               task_type="CAUSAL_LM")
    config = json.load(open(f"{adapter_dir}/{CONFIG_FILE}"))
    json.dump({**config, "base_model_name_or_path": base_dir}, open(f"{adapter_dir}/{CONFIG_FILE}", "w"))
    predicted = run_command("predict.py", "--hf-model", base_dir, "--adapter", adapter_dir, "--prompt", "The",
                            "--temperature", "0", "--max-new-tokens", "4")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    plain = run_command("predict.py", "--hf-model", base_dir, "--prompt", "The", "--temperature", "0",
                        "--max-new-tokens", "4")
    assert predicted.stdout != plain.stdout  # the adapter changed what it generates
    alone = run_command("predict.py", "--hf-model", adapter_dir, "--prompt", "The", "--temperature", "0",
                        "--max-new-tokens", "4")  # on the base its base_model_name_or_path names
    assert alone.returncode == 0 and alone.stdout == predicted.stdout, alone.stderr[-3000:]
    wrong = run_command("predict.py", "--hf-model", base_dir, "--adapter", base_dir, "--prompt", "The")
    assert wrong.returncode != 0 and wrong.stderr.strip().splitlines()[-1] == \
        f"error: --adapter {base_dir}: not a peft adapter directory (no adapter_config.json)"
    file = f"{adapter_dir}/{CONFIG_FILE}"  # the adapter's config file for its directory: the directory is named
    wrong = run_command("predict.py", "--hf-model", base_dir, "--adapter", file, "--prompt", "The")
    assert wrong.stderr.strip().splitlines()[-1] == \
        f"error: --adapter {file}: is the adapter's adapter_config.json; give its directory, {adapter_dir}"
    text = tmp_path / "my_text.txt"
    text.write_text("\n".join(topics[k] for k in sorted(topics)[:12]))
    run = tmp_path / "run"
    trained = run_command("train.py", "--config", "configs/finetune_lora_gpt2.json", "--init-from", adapter_dir,
                          "--data", str(text), "--model-path", str(run), "--no-progress", "--set", "train_steps=2",
                          "--set", "eval_steps=1", "--set", "sample_tokens=0")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "peft.lora is the adapter's" in trained.stdout + trained.stderr
    recorded = json.load(open(run / "init_from.json"))["fingerprint"]["files"]
    assert {"adapter_model.safetensors", "base_model/model.safetensors"} <= set(recorded)  # the base is checked too
    exported = run_command("-m", "convert", "export", str(run), str(tmp_path / "out"), "--adapter")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.load(open(tmp_path / "out" / CONFIG_FILE))["base_model_name_or_path"] == base_dir  # not the adapter
    assert exported.stdout.strip().endswith(f"as a peft adapter of {base_dir}"), exported.stdout  # as it says
    tuned = Pretrained.from_pretrained(str(run))
    ours = np.asarray(tuned({"inputs": TOKENS, "segment_ids": np.ones_like(TOKENS)}))
    cfg = tuned.config
    theirs = peft_logits(transformers.GPT2LMHeadModel.from_pretrained(base_dir).eval(), str(tmp_path / "out"), cfg)
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    started = Pretrained.from_pretrained(adapter_dir)  # the base named in adapter_config.json
    np.testing.assert_array_equal(np.asarray(started({"inputs": TOKENS, "segment_ids": np.ones_like(TOKENS)})),
                                  np.asarray(Pretrained.from_pretrained(base_dir, adapter=adapter_dir)(
                                      {"inputs": TOKENS, "segment_ids": np.ones_like(TOKENS)})))
    first = np.asarray(started({"inputs": TOKENS, "segment_ids": np.ones_like(TOKENS)}))
    np.testing.assert_allclose(first, peft_logits(transformers.GPT2LMHeadModel.from_pretrained(base_dir).eval(),
                                                  adapter_dir, cfg), atol=1e-4, rtol=0)
    assert np.abs(first - ours).max() > 1e-4  # the run trained the adapter's factors on


def test_an_adapter_names_a_hub_base_by_its_name_and_a_local_one_by_its_directory(tmp_path):
    from convert.peft_adapter import base_name

    snapshot = tmp_path / "hub" / "models--EleutherAI--gpt-neo-125M" / "snapshots" / "abc123"
    assert base_name(str(snapshot)) == "EleutherAI/gpt-neo-125M"
    assert base_name(str(tmp_path / "gpt2")) == str(tmp_path / "gpt2") and base_name(None) is None


def test_a_vit_adapter_from_transformers_4_module_names_loads_the_same(tmp_path):
    """transformers 5 renamed ViT's modules (vit.layers.0.attention.q_proj), so peft names them so; an adapter saved
    under transformers 4 names them vit.encoder.layer.0.attention.attention.query: both load alike."""
    from safetensors.numpy import load_file, save_file

    base_dir = str(tmp_path / "base")
    FAMILIES["vit"]().save_pretrained(base_dir)
    adapter_dir = peft_adapter(FAMILIES["vit"](), tmp_path, target_modules=["q_proj", "fc1"], r=2)
    old = {"attention.q_proj": "attention.attention.query", "mlp.fc1": "intermediate.dense"}
    renamed = {}
    for key, value in load_file(f"{adapter_dir}/{WEIGHTS_FILE}").items():
        for new, legacy in old.items():
            key = key.replace(new, legacy)
        renamed[key.replace("vit.layers.", "vit.encoder.layer.")] = value
    (tmp_path / "legacy").mkdir()
    save_file(renamed, str(tmp_path / "legacy" / WEIGHTS_FILE))
    (tmp_path / "legacy" / CONFIG_FILE).write_text(open(f"{adapter_dir}/{CONFIG_FILE}").read())
    cfg, params = load_hf(base_dir)
    new_cfg, new = adapter_params(cfg, params, adapter_dir)
    legacy_cfg, legacy = adapter_params(cfg, params, str(tmp_path / "legacy"))
    assert new_cfg.peft == legacy_cfg.peft and new_cfg.peft["lora"]["targets"] == ["c_fc", "q"]
    jax.tree.map(np.testing.assert_array_equal, new, legacy)


def test_eval_puts_an_adapter_on_its_base(tmp_path):
    """eval.py --adapter DIR scores with the adapter on the model, as predict.py --adapter generates with it."""
    import eval as eval_cli
    from evaluation.scorer import Scorer

    base_dir = hf_fixtures.save(hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2), tmp_path / "gpt2")
    adapter_dir = peft_adapter(hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2), tmp_path, target_modules=["c_attn"],
                               r=4, fan_in_fan_out=True)
    requests = [("The for statement", " is"), ("def", " add")]
    plain = Scorer.from_pretrained(base_dir, kind="hf").loglikelihood(requests)
    adapted = Scorer.from_pretrained(base_dir, kind="hf", adapter=adapter_dir)
    assert adapted.cfg.peft["lora"]["rank"] == 4 and adapted.loglikelihood(requests) != plain
    parsed = eval_cli.build_parser().parse_args(["--hf-model", base_dir, "--adapter", base_dir])
    with pytest.raises(ConfigError, match=f"^--adapter {base_dir}: not a peft adapter directory"):
        eval_cli.check_options(parsed)
