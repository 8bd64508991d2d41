"""GPT-Neo's mesh-tensorflow checkpoints -> NeoMesh runs. A tiny checkpoint in the format of GPT-Neo's releases is
written with TensorFlow from a transformers GPT-Neo model (variable names, shapes and orientation as GPT-Neo's
mesh-tensorflow model created them; optimizer slots and global_step beside them; bfloat16 masters for a
bfloat16 run), converted, and the run's logits compared with that model's."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from convert import gpt_neo_mtf
from data.tf_import import tensorflow
from models.rotary import apply_rotary
from tests import hf_fixtures
from pretrained import load_run

tf = tensorflow()  # as the data code imports it (quiet, without Keras)

N_EMBD, N_HEAD, N_LAYER, N_CTX, WINDOW = 32, 4, 4, 32, 8
GPT_NEO_CONFIG = {  # as a GPT-Neo release's config.json: GPT-Neo's keys, TPU keys and all
    "n_head": N_HEAD, "n_vocab": hf_fixtures.VOCAB, "embed_dropout": 0, "lr": 0.0002, "lr_decay": "cosine",
    "warmup_steps": 3000, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "opt_name": "adam", "weight_decay": 0,
    "train_batch_size": 512, "attn_dropout": 0, "train_steps": 400000, "eval_steps": 0, "predict_steps": 1,
    "res_dropout": 0, "eval_batch_size": 128, "predict_batch_size": 1, "iterations": 500, "n_embd": N_EMBD,
    "datasets": [["pile", 25, "documents_random", 1.0]], "model_path": "gs://neo-d/models/GPT3_XL_Pile",
    "n_ctx": N_CTX, "n_layer": N_LAYER, "scale_by_depth": True, "scale_by_in": False,
    "attention_types": [[["global", "local"], N_LAYER // 2]], "local_attention_radius": WINDOW,
    "mesh_shape": "x:128,y:2", "layout": "batch:x,memory_length:y,embd:y", "activation_function": "gelu",
    "recompute_grad": True, "gradient_clipping": 1.0, "tokens_per_mb_per_replica": 4096,
    "precision": "bfloat16", "padding_id": 50257, "eos_id": 50256,
}
STEP = 362000


def mtf_variables(model) -> dict:
    """The transformers GPT-Neo weights as GPT-Neo's mesh-tensorflow variables: torch Linear weights are
    (out, in), mesh-tensorflow's are (in, out), with q/k/v/o's heads and features combined heads-major."""
    sd = {k.removeprefix("transformer."): v.detach().numpy() for k, v in model.state_dict().items()}
    out = {"gpt2/wte": sd["wte.weight"], "gpt2/wpe": sd["wpe.weight"], "gpt2/ln_f/g": sd["ln_f.weight"],
           "gpt2/ln_f/b": sd["ln_f.bias"]}
    for i in range(N_LAYER):
        h, m = f"h.{i}.", f"gpt2/h{i}/"
        for norm, ln in (("norm_1", "ln_1"), ("norm_2", "ln_2")):
            out[f"{m}{norm}/g"], out[f"{m}{norm}/b"] = sd[f"{h}{ln}.weight"], sd[f"{h}{ln}.bias"]
        for name in "qkv":
            out[f"{m}attn/{name}"] = sd[f"{h}attn.attention.{name}_proj.weight"].T
        out[f"{m}attn/o"] = sd[f"{h}attn.attention.out_proj.weight"].T
        out[f"{m}attn/compute_output_bias/o_b"] = sd[f"{h}attn.attention.out_proj.bias"]
        for name in ("c_fc", "c_proj"):
            out[f"{m}mlp/conv1d_main/{name}/kernel"] = sd[f"{h}mlp.{name}.weight"].T
            out[f"{m}mlp/conv1d_main/{name}/bias"] = sd[f"{h}mlp.{name}.bias"]
    return out


def write_checkpoint(directory, variables: dict, config: dict | None = GPT_NEO_CONFIG, bf16=True) -> str:
    """A TensorFlow checkpoint as GPT-Neo's saver left it: model.ckpt-STEP.{index,data-*}, the 'checkpoint'
    file, Adam slots and global_step beside the variables, masters in bfloat16 for a bfloat16 run."""
    tensors = {}
    for name, value in variables.items():
        tensors[name] = tf.constant(value, tf.bfloat16 if bf16 else tf.float32)
        tensors[name + "/adam_m"] = tf.zeros(value.shape, tf.float32)
    tensors["global_step"] = tf.constant(STEP, tf.int64)
    prefix = f"{directory}/model.ckpt-{STEP}"
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tensors[n] for n in names])
    (directory / "checkpoint").write_text(f'model_checkpoint_path: "model.ckpt-{STEP}"\n')
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.fixture(scope="module")
def reference():
    return hf_fixtures.gpt_neo(n_embd=N_EMBD, n_head=N_HEAD, n_layer=N_LAYER, n_ctx=N_CTX, window=WINDOW)


def bf16_rounded(model):
    """The reference with its weights rounded to bfloat16, as a bfloat16 run's checkpoint holds them."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model


def run_logits(model_path, tokens):
    cfg, graphdef, params = load_run(model_path)
    return cfg, np.asarray(nnx.merge(graphdef, nnx.State(params))(jnp.asarray(tokens))[0])  # (B, T, V)


def test_release_checkpoint_converts_with_logit_parity(tmp_path, reference):
    reference = bf16_rounded(reference)
    ckpt = write_checkpoint(tmp_path / "GPT3_XL", mtf_variables(reference))
    tokenizer = tmp_path / "gpt2"
    tokenizer.mkdir()
    hf_fixtures.tokenizer().save(str(tokenizer / "tokenizer.json"))
    assert gpt_neo_mtf.main([ckpt, str(tmp_path / "run"), "--tokenizer", str(tokenizer), "--keep-step"]) == 0
    tokens = np.random.default_rng(0).integers(0, hf_fixtures.VOCAB, (2, N_CTX))
    cfg, ours = run_logits(str(tmp_path / "run"), tokens)
    with torch.no_grad():
        theirs = reference(torch.tensor(tokens)).logits.numpy()
    assert (cfg.n_layer, cfg.attention_layers[:2], cfg.local_attention_radius) == (N_LAYER, ("global", "local"), 8)
    assert cfg.data_start_step == STEP  # the new data is read from its first batch, not skipped STEP batches in
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == [str(STEP)]


def test_gpt_neo_rotary_is_rotary_style_halves():
    """GPT-Neo's rotary (its models/layers.py: half the frequencies concatenated twice, rotate_half) in numpy
    against apply_rotary with rotary_style 'halves'; a rotary GPT-Neo config converts to that style."""
    rng = np.random.default_rng(0)
    t, h = 6, 8
    x = rng.normal(size=(2, t, 3, h))  # (B, T, N, H)
    pos = np.arange(t)
    freqs = 1.0 / 10000 ** (np.arange(h // 2) * 2 / h)
    angles = np.concatenate([pos[:, None] * freqs] * 2, axis=1)[None, :, None, :]  # (1, T, 1, H)
    x1, x2 = x[..., :h // 2], x[..., h // 2:]
    theirs = x * np.cos(angles) + np.concatenate([-x2, x1], -1) * np.sin(angles)
    ours = apply_rotary(jnp.asarray(x, jnp.float32), jnp.broadcast_to(jnp.asarray(pos), (2, t)), h, "halves")
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
    assert not np.allclose(np.asarray(apply_rotary(jnp.asarray(x, jnp.float32), jnp.asarray(pos)[None], h)), theirs)
    cfg = gpt_neo_mtf.config_from_gpt_neo({**GPT_NEO_CONFIG, "rotary_emb": True}, "config.json")
    assert cfg.rotary_style == "halves" and cfg.rotary_dim == N_EMBD // N_HEAD


def one_line_error(capsys, argv) -> str:
    assert gpt_neo_mtf.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_untied_output_layer_is_refused_with_its_reason(tmp_path, reference, capsys):
    variables = mtf_variables(reference)
    variables["gpt2/wte_final_linear/conv1d_main/linear_out/kernel"] = np.zeros((N_EMBD, hf_fixtures.VOCAB))
    ckpt = write_checkpoint(tmp_path / "untied", variables, bf16=False)
    assert "without ln_f and with a bias" in one_line_error(capsys, [ckpt, str(tmp_path / "run")])
    ckpt = write_checkpoint(tmp_path / "untied_config", mtf_variables(reference),
                            {**GPT_NEO_CONFIG, "no_weight_tie": True}, bf16=False)
    assert "no_weight_tie: GPT-Neo's untied output layer reads the last block without ln_f" in \
        one_line_error(capsys, [ckpt, str(tmp_path / "run")])


@pytest.mark.parametrize("change, expected", [
    (lambda v: v.pop("gpt2/h1/attn/k"), "no variable gpt2/h1/attn/k, which the config's model needs"),
    (lambda v: v.update({"gpt2/h9/norm_1/g": np.ones(N_EMBD)}), "variable gpt2/h9/norm_1/g has no place"),
    (lambda v: v.update({"gpt2/wte_slice_0": np.ones(N_EMBD)}), "holds per-device slices (gpt2/wte_slice_0)"),
    (lambda v: v.update({"gpt2/wte": np.ones((50, N_EMBD))}), "parameter wte/embedding: the weights have shape"),
])
def test_bad_checkpoints_are_one_line_errors(tmp_path, reference, capsys, change, expected):
    variables = mtf_variables(reference)
    change(variables)
    ckpt = write_checkpoint(tmp_path / "ckpt", variables, bf16=False)
    assert expected in one_line_error(capsys, [ckpt, str(tmp_path / "run")])


def test_missing_config_and_checkpoint_are_one_line_errors(tmp_path, reference, capsys):
    ckpt = write_checkpoint(tmp_path / "noconfig", mtf_variables(reference), config=None, bf16=False)
    assert "no GPT-Neo config (the release's config.json); name it with --config" in \
        one_line_error(capsys, [ckpt, str(tmp_path / "run")])
    assert "no TensorFlow checkpoint" in one_line_error(capsys, [str(tmp_path), str(tmp_path / "run")])


def test_run_directory_with_checkpoints_is_refused(tmp_path, reference, capsys):
    """Converting into another run's directory would save step 0 beside its steps (predict loads the newest,
    the old run's) or collide with a step it has: refused before anything is written."""
    ckpt = write_checkpoint(tmp_path / "ckpt", mtf_variables(reference), bf16=False)
    (tmp_path / "run" / "checkpoints" / "6").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text('{"n_layer": 1}')
    assert "already holds a run's checkpoints; import into a new directory" in \
        one_line_error(capsys, [ckpt, str(tmp_path / "run")])
    assert (tmp_path / "run" / "config.json").read_text() == '{"n_layer": 1}'
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["6"]


def test_a_run_kept_at_gpt_neos_step_reads_its_data_from_the_first_batch():
    """--keep-step's run resumes at GPT-Neo's global step with no input position saved: it replayed (skipped) that
    many batches of the new data first (362,000 of them for the 1.3B release: the run never reached a step). Step N
    reads batch N - data_start_step, and a saved position is looked up under the checkpoint's own step."""
    import train

    class Source:
        def restore(self, step, batch_size, rows, saved):
            self.restored = (step, batch_size, saved)
            return "input: ..."

    class Checkpoints:
        def restore_input(self, step):
            return f"position saved with checkpoint {step}"

    from config import load_config
    from parallel.layout import Layout
    from parallel.mesh import make_mesh

    cfg, _ = load_config("quickstart", (f"data_start_step={STEP}",))
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    sharding = {"tokens": layout.sharding(("batch", "sequence"))}
    source = Source()
    train.restore_input_position(source, Checkpoints(), STEP + 2, cfg, sharding, {"tokens": (4, 9)})
    assert source.restored == (2, 4, f"position saved with checkpoint {STEP + 2}")
