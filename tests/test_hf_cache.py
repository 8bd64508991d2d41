"""Hugging Face models by name from a local cache laid out as huggingface_hub lays it out (a fake one here:
models--ORG--NAME/refs/main and snapshots/<hash>/ with files linked from blobs/)."""

import os

import pytest

from config import ConfigError
from neomesh.hf_cache import hub_cache_dir, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(hub, repo="EleutherAI/gpt-neo-125M", commit=COMMIT, files=("config.json", "model.safetensors"),
               ref="main"):
    """A cached snapshot of ``repo``: files are symlinks into blobs/, as huggingface_hub stores them."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for i, name in enumerate(files):
        blob = folder / "blobs" / f"blob{i}-{commit[:6]}"
        blob.write_text(name)
        os.symlink(blob, snapshot / name)
    if ref:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_cache_location_follows_huggingface_hub_variables(clean_env, tmp_path):
    assert hub_cache_dir() == str(tmp_path / "home" / ".cache" / "huggingface" / "hub")
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == str(tmp_path / "xdg" / "huggingface" / "hub")
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == str(tmp_path / "hf" / "hub")
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_cache_dir() == str(tmp_path / "hub")


def test_name_resolves_to_the_snapshot_refs_main_names(clean_env, tmp_path):
    hub = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    old = fake_cache(hub, commit="f" * 40, ref=None)
    current = fake_cache(hub)
    os.utime(old, (2e9, 2e9))  # newer on disk, but refs/main names the other one
    assert resolve_model("EleutherAI/gpt-neo-125M") == str(current)
    assert resolve_model("EleutherAI/gpt-neo-125M@" + "f" * 40) == str(old)
    assert os.path.isfile(os.path.join(resolve_model("EleutherAI/gpt-neo-125M"), "config.json"))


def test_hf_home_and_a_cache_without_refs(clean_env, tmp_path):
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = fake_cache(tmp_path / "hf" / "hub", repo="gpt2", files=("config.json", "pytorch_model.bin"),
                          ref=None)
    assert resolve_model("gpt2") == str(snapshot)


def test_a_directory_wins_over_the_cache(clean_env, tmp_path):
    fake_cache(tmp_path / "home" / ".cache" / "huggingface" / "hub", repo="org/model")
    local = tmp_path / "org" / "model"
    local.mkdir(parents=True)
    clean_env.chdir(tmp_path)
    assert resolve_model("org/model") == "org/model"


def test_missing_model_is_one_line_saying_how_to_download(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as missing:
        resolve_model("EleutherAI/gpt-neo-125M")
    message = str(missing.value)
    assert "\n" not in message and str(tmp_path / "hub") in message
    assert "huggingface-cli download EleutherAI/gpt-neo-125M" in message and "hf download" in message
    assert "git clone https://huggingface.co/EleutherAI/gpt-neo-125M" in message
    fake_cache(tmp_path / "hub", files=("config.json",))  # config only: transformers fetched just the config
    with pytest.raises(ConfigError, match="lacks config.json or the weights.*huggingface-cli download"):
        resolve_model("EleutherAI/gpt-neo-125M")
    with pytest.raises(ConfigError, match=r"^--init-from \./nope: no such directory$"):
        resolve_model("./nope", "--init-from")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    file = str(tmp_path / "model" / "config.json")  # a file of the model, not its directory ("no such directory")
    with pytest.raises(ConfigError) as a_file:
        resolve_model(file)
    assert str(a_file.value) == f"--hf-model {file}: a file; give the model's directory ({tmp_path}/model)"


def test_predict_reads_a_cached_model_by_name(clean_env, tmp_path):
    """A tiny GPT-Neo directory, written by NeoMesh's export mapping, placed in a fake cache: predict.py's loader
    and pretrained.load read it by name."""
    import jax
    import numpy as np
    from flax import nnx

    import predict
    from convert import gpt_neo
    from convert.hf_dir import write_hf_dir
    from data.tokenizer import train_bpe
    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from tests.common import tiny_config

    cfg = tiny_config(n_vocab=300)
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(0)), nnx.Param)))
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = fake_cache(tmp_path / "hub", repo="tiny/neo", files=())
    (tmp_path / "tok").mkdir()
    train_bpe(["def f(x):\n    return x + 1\n"] * 4, 300).save(str(tmp_path / "tok" / "tokenizer.json"))
    write_hf_dir(str(snapshot), gpt_neo.config_to_hf(cfg), gpt_neo.params_to_hf(cfg, params), str(tmp_path / "tok"))
    args = predict.parse_args(["--hf-model", "tiny/neo", "--prompt", "x"])
    predict.check_options(args)
    assert args.hf_model == str(snapshot)
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    loaded_cfg, _, loaded, tokenizer = predict.load_model(args, layout)
    assert loaded_cfg.n_layer == cfg.n_layer and tokenizer.decode(tokenizer.encode("def f")) == "def f"
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((np.asarray(a) == b).all()), loaded, params))
    from pretrained import load
    assert load("tiny/neo")[0].n_layer == cfg.n_layer
