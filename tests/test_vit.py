"""ViT: logits and hidden states equal transformers' ViT on random local weights (fp32, several shapes, position
interpolation), the export round trip, sharded = one device, the digits source, and config errors."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from config import ConfigError, from_dict
from convert.hf import export_params, load_hf
from data.images import DIGITS_EVAL, image_source, shifted
from models import registry
from tests.common import train_losses

SHAPES = {  # (image, patch, channels, width, heads, layers, labels)
    "rgb": (16, 4, 3, 32, 4, 2, 5),
    "grey-wide-patch": (12, 6, 1, 48, 3, 1, 3),
}


def hf_vit(image, patch, channels, width, heads, layers, labels, head=True):
    """A random ViTForImageClassification (or ViTModel); encoder_stride keeps transformers' default 16 whatever the
    patch size, as every saved ViTConfig does."""
    cfg = transformers.ViTConfig(image_size=image, patch_size=patch, num_channels=channels, hidden_size=width,
                                 num_attention_heads=heads, num_hidden_layers=layers, intermediate_size=2 * width,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 id2label={i: str(i) for i in range(labels)})
    torch.manual_seed(0)
    model = (transformers.ViTForImageClassification(cfg) if head else transformers.ViTModel(cfg)).eval()
    with torch.no_grad():  # the default init hides wrong scales: make every part matter
        for name, p in model.named_parameters():
            p.add_(0.2 * torch.randn_like(p)) if "bias" in name or "norm" in name else p.normal_(0.0, 0.2)
    return model


def images_for(image, channels, batch=3, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, image, image, channels)).astype(np.float32)


def saved(model, tmp_path):
    model.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("shape", SHAPES)
def test_logits_match_transformers(shape, tmp_path):
    hf = hf_vit(*SHAPES[shape])
    cfg, params = load_hf(saved(hf, tmp_path))
    model = nnx.merge(nnx.graphdef(registry.build(cfg, nnx.Rngs(0))), nnx.State(jax.tree.map(jnp.asarray, params)))
    pixels = images_for(cfg.image_size, cfg.num_channels)
    with torch.no_grad():
        want = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2))).logits.numpy()
    got = np.asarray(nnx.jit(lambda model, pixels: model(pixels)[0])(model, jnp.asarray(pixels)))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(want).max() > 0.5  # the comparison is not between near-zero logits


def test_vit_model_hidden_states_and_interpolated_positions_match_transformers(tmp_path):
    hf = hf_vit(16, 4, 3, 32, 4, 2, 2, head=False)
    cfg, params = load_hf(saved(hf, tmp_path))
    assert "classifier" not in params  # ViTModel has none: the classifier starts fresh
    cfg = cfg.replace(interpolate_positions=True)
    model = registry.build(cfg, nnx.Rngs(0))
    nnx.update(model, nnx.State({k: jax.tree.map(jnp.asarray, v) for k, v in params.items()}))
    hidden_states = nnx.jit(lambda model, pixels: model.hidden_states(pixels))
    for size in (16, 24, 12):  # the learned 4x4 grid, then up to 6x6 and down to 3x3
        pixels = images_for(size, 3, batch=2, seed=size)
        with torch.no_grad():
            want = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),
                      interpolate_pos_encoding=True).last_hidden_state.numpy()
        np.testing.assert_allclose(np.asarray(hidden_states(model, jnp.asarray(pixels))), want, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="set interpolate_positions true"):
        registry.build(cfg.replace(interpolate_positions=False), nnx.Rngs(0))(jnp.zeros((1, 24, 24, 3)))


def test_only_a_masked_image_modeling_head_needs_encoder_stride_equal_to_patch_size():
    from convert import vit

    hf = dict(model_type="vit", image_size=16, patch_size=4, encoder_stride=16, hidden_size=32, num_attention_heads=4,
              intermediate_size=64, num_hidden_layers=2)
    for architecture in ("ViTForImageClassification", "ViTModel"):
        assert vit.config_from_hf({**hf, "architectures": [architecture]}).patch_size == 4
    with pytest.raises(ConfigError, match="config.json: encoder_stride 16 differs from patch_size 4 "
                                          r"\(ViTForMaskedImageModeling's head\)"):
        vit.config_from_hf({**hf, "architectures": ["ViTForMaskedImageModeling"]})


def test_export_round_trip_loads_in_transformers(tmp_path):
    cfg, _ = from_dict(dict(model="vit", image_size=16, patch_size=4, n_embd=32, n_head=4, n_layer=2, d_ff=64,
                            num_labels=4))
    params = nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(3)), nnx.Param))
    export_params(cfg, params, str(tmp_path / "hf"))
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    pixels = images_for(16, 3)
    with torch.no_grad():
        want = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2))).logits.numpy()
    model = nnx.merge(nnx.graphdef(registry.build(cfg, nnx.Rngs(0))), nnx.State(params))
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(pixels))[0]), want, atol=1e-5, rtol=0)
    _, back = load_hf(str(tmp_path / "hf"))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, back)


def test_imported_vit_exports_and_predict_and_eval_say_it_reads_images(tmp_path):
    """A Hugging Face ViT directory has no tokenizer: the import writes no tokenizer folder and says what a ViT run
    is for (predict.py --image), the export needs none, and predict.py --prompt / eval.py refuse it in one line."""
    from tests.common import run_command

    hf = hf_vit(16, 4, 3, 32, 4, 2, 3)
    run, out = tmp_path / "run", tmp_path / "out"
    result = run_command("-m", "convert", "import", saved(hf, tmp_path / "hf"), str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (run / "tokenizer").exists()
    assert f"classify images with predict.py --model-path {run} --image FILE_OR_FOLDER" in result.stdout
    assert "generate" not in result.stdout and "note" not in result.stdout
    assert f"--init-from {tmp_path / 'hf'}" in result.stdout and f"convert export {run}" in result.stdout
    (run / "tokenizer").mkdir()  # an earlier import's empty folder: no use to a ViT, not read
    result = run_command("-m", "convert", "export", str(run), str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (out / "tokenizer.json").exists()
    pixels = torch.from_numpy(images_for(16, 3).transpose(0, 3, 1, 2))
    with torch.no_grad():
        want = hf(pixel_values=pixels).logits
        assert torch.equal(transformers.ViTForImageClassification.from_pretrained(out)(pixel_values=pixels).logits,
                           want)
    for command, extra, message in (("predict.py", ["--prompt", "x"], "does not generate text"),
                                    ("eval.py", [], "does not score text")):
        result = run_command(command, "--model-path", str(run), *extra)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
        assert f"a vit model trained for image_classification {message}" in result.stderr


def test_vit_trains_sharded_as_on_one_device():
    cfg, _ = from_dict(dict(model="vit", image_size=8, patch_size=2, num_channels=1, n_embd=32, n_head=4,
                            n_layer=2, d_ff=64, num_labels=10, train_batch_size=8, warmup_steps=0, lr=1e-3,
                            image_augmentation=True))
    source = image_source(cfg, "train")
    batches = [source.batch(step, 8) for step in range(3)]
    single = train_losses(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_losses(cfg, batches, "x:4,y:2", "batch:x,heads:y,embd:y")
    # FSDP, each device accumulating its own rows' gradients, reduced (scattered) once per step
    unreduced = train_losses(cfg, batches, "x:4,y:2", "batch:x,embd:x,heads:y", microbatches=2,
                             accumulate_unreduced=True)
    assert single[-1] < single[0]
    np.testing.assert_allclose(sharded, single, rtol=0, atol=1e-5)
    np.testing.assert_allclose(unreduced, single, rtol=0, atol=1e-5)


def test_digits_source_is_a_fixed_split_and_a_pure_function_of_the_step():
    cfg, _ = from_dict(dict(model="vit", image_size=8, patch_size=2, num_channels=1, num_labels=10, seed=5))
    train, evaluation = image_source(cfg, "train"), image_source(cfg, "eval")
    assert len(train) + len(evaluation) == 1797 and len(evaluation) == DIGITS_EVAL
    batch = train.batch(7, 16)
    assert batch["images"].shape == (16, 8, 8, 1) and batch["images"].dtype == np.float32
    assert 0.0 <= batch["images"].min() and batch["images"].max() <= 1.0
    again = image_source(cfg, "train").batch(7, 16)  # a fresh source (a resumed run) reads the same batch
    for key in batch:
        np.testing.assert_array_equal(again[key], batch[key])
    rows = train.batch(7, 16, slice(4, 12))  # one process's rows are those rows of the global batch
    np.testing.assert_array_equal(rows["images"], batch["images"][4:12])
    plain = image_source(cfg.replace(image_augmentation=False), "train").batch(7, 16)
    assert not np.array_equal(plain["images"], batch["images"])  # training images are shifted
    np.testing.assert_array_equal(plain["labels"], batch["labels"])
    last = evaluation.batch(2, 160)  # eval: in order, weight-0 filler past the last image
    assert last["weights"].sum() == DIGITS_EVAL - 320
    image = np.arange(9.0).reshape(3, 3, 1)
    np.testing.assert_array_equal(shifted(image, np.array([1, 0]))[:, :, 0], [[0, 1, 2], [0, 1, 2], [3, 4, 5]])


def test_tfds_image_dataset_by_name(tmp_path):
    from tests.data_common import prepare_tiny_images

    prepare_tiny_images(str(tmp_path))
    cfg, _ = from_dict(dict(model="vit", image_size=28, patch_size=7, num_channels=1, num_labels=10,
                            datasets=[["tfds:neomesh_tiny_mnist", None, None, None]], tfds_data_dir=str(tmp_path)))
    train, evaluation = image_source(cfg, "train"), image_source(cfg, "eval")
    assert (len(train), len(evaluation)) == (12, 5)
    batch = evaluation.batch(0, 8)  # in order: images 0..4, then weight-0 filler
    assert batch["images"].shape == (8, 28, 28, 1) and 0.5 < batch["images"].max() <= 1.0
    np.testing.assert_array_equal(batch["labels"][:5], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(batch["weights"], [1] * 5 + [0] * 3)
    with pytest.raises(ConfigError, match="image_size: tfds:neomesh_tiny_mnist images are 28x28x1"):
        image_source(cfg.replace(image_size=32, patch_size=8, n_ctx=17), "train")


def test_python_api_names_images_of_the_wrong_layout(tmp_path):
    """Channels first (transformers' pixel_values), another channel count or one image without its batch axis was
    an einsum, reshape or unpack error from deep inside the model: one line with the shape the model reads."""
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(saved(hf_vit(8, 2, 1, 16, 2, 1, 3), tmp_path))
    images = images_for(8, 1, batch=2)
    logits = np.asarray(model({"inputs": images}))
    assert logits.shape == (2, 3)
    # a batch as training holds it (the README's task table): images under "images", labels and weights unread
    np.testing.assert_array_equal(np.asarray(model({"images": images, "labels": np.zeros(2, np.int32),
                                                    "weights": np.ones(2, np.float32)})), logits)
    assert np.asarray(model.hidden_states({"images": images})).shape == (2, 17, 16)
    with pytest.raises(ConfigError, match=r"^batch: a vit model reads images, under \"images\" as training batches "
                       r"hold them; this batch has 'pixel_values'$"):
        model({"pixel_values": images})
    for shape in [(2, 1, 8, 8), (2, 8, 8, 3), (8, 8, 1), (2, 9, 9, 1)]:
        with pytest.raises(ConfigError, match=rf"inputs: images of shape \({', '.join(map(str, shape))},?\); a vit "
                           r"model reads \(B, H, W, 1\) images, channels last, H and W multiples of patch_size 2"):
            model({"inputs": np.zeros(shape, np.float32)})
    # one override as a plain string, not a tuple of them (it was read letter by letter: "--set p: expected key=value")
    assert Pretrained.from_pretrained(str(tmp_path), overrides="precision=bfloat16").config.precision == "bfloat16"


def test_a_saved_configs_token_count_follows_image_size_given_with_set():
    """A run's saved config holds n_ctx (17 for 8x8 images in 2x2 patches): --set image_size=16 (predict.py,
    Pretrained) said "n_ctx: a vit reads 65 tokens ..., not 17; leave n_ctx out", a key the user never gave."""
    saved = from_dict(dict(model="vit", image_size=8, patch_size=2, num_channels=1, num_labels=10))[0].to_dict()
    assert saved["n_ctx"] == 17
    assert from_dict(saved, overrides=("image_size=16",))[0].n_ctx == 65
    assert from_dict(saved, overrides=("patch_size=4",))[0].n_ctx == 5
    with pytest.raises(ConfigError, match=re.escape("--set n_ctx=10: n_ctx: a vit reads 65 tokens")):
        from_dict(saved, overrides=("image_size=16", "n_ctx=10"))


@pytest.mark.parametrize("changes, message", [
    ({"patch_size": 3}, "patch_size: 3 does not divide image_size 8"),
    ({"task": "sequence_classification"}, "task: model vit trains task image_classification"),
    ({"task": "causal_lm"}, "task: model vit trains task image_classification"),  # not "set causal true"
    ({"n_ctx": 10}, "n_ctx: a vit reads 17 tokens"),
    ({"num_channels": 3}, "image_size: digits images are 8x8x1 (height x width x channels), the config reads 8x8x3"),
    ({"datasets": [["embedded", None, None, None]]}, "datasets: 'embedded' is not an image dataset"),
    ({"image_mean": [0.5]}, "image_std: needed with image_mean"),
    ({"image_mean": [0.5, 0.5], "image_std": [0.5, 0.5]}, "image_mean: [0.5, 0.5] is not a list of 1 numbers"),
    ({"image_mean": [0.5], "image_std": [0]}, "image_std: [0]; every channel's must be above 0"),
])
def test_bad_image_configs_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg, _ = from_dict({**dict(model="vit", image_size=8, patch_size=2, num_channels=1, num_labels=10), **changes})
        image_source(cfg, "train")


@pytest.mark.e2e
def test_vit_digits_trains_and_resumes_exactly_through_train_py(tmp_path):
    """configs/vit_digits.json through train.py (a few steps, dropout and augmentation on): an interrupted and
    resumed run writes the same losses and evaluation as an uninterrupted one, bit for bit."""
    from tests.common import metrics_rows, run_command

    sets = ["train_steps=4", "steps_per_checkpoint=2", "eval_every=4", "eval_steps=1", "n_layer=2",
            "train_batch_size=16", "warmup_steps=1"]

    def train(path, *extra):
        result = run_command("train.py", "--config", "configs/vit_digits.json", "--model-path", str(path),
                             "--no-progress", *[a for s in sets for a in ("--set", s)], *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    train(tmp_path / "whole")
    train(tmp_path / "parts", "--stop-at-step", "2")
    assert "resumed from" in train(tmp_path / "parts").stdout
    rows = lambda path, kind="train": [{k: v for k, v in r.items() if k not in ("tokens_per_sec", "mfu")}  # noqa
                                       for r in metrics_rows(path, kind)]
    assert rows(tmp_path / "parts") == rows(tmp_path / "whole") and len(rows(tmp_path / "whole")) == 4
    evaluation = rows(tmp_path / "whole", "eval")
    assert rows(tmp_path / "parts", "eval") == evaluation and 0.0 <= evaluation[0]["accuracy"] <= 1.0


def test_a_bare_vit_model_starts_a_classifier_for_any_number_of_labels(tmp_path):
    """A ViTModel (google/vit-base-patch16-224-in21k's kind) has no classifier, only the default id2label of two
    labels in its config: --init-from it for 3 classes was refused as 'its classifier has 2 labels'."""
    from training.init_from import imported_params

    bare = saved(hf_vit(8, 4, 3, 16, 2, 1, 2, head=False), tmp_path / "bare")
    cfg, _ = from_dict(dict(model="vit", image_size=8, patch_size=4, num_channels=3, n_embd=16, n_head=2, n_layer=1,
                            d_ff=32, qkv_bias=True, layer_norm_epsilon=1e-12, activation_function="gelu_exact",
                            num_labels=3))
    assert "classifier" not in imported_params(cfg, bare)
    headed = saved(hf_vit(8, 4, 3, 16, 2, 1, 2), tmp_path / "headed")
    with pytest.raises(ConfigError, match="its classifier has 2 labels, but num_labels is 3"):
        imported_params(cfg, headed)


def test_an_imported_vit_is_fed_pixels_normalised_as_its_image_processor_and_exports_it(tmp_path):
    """Hugging Face ViTs read (x - image_mean) / image_std (preprocessor_config.json; 0.5 and 0.5 for Google's):
    import and --init-from take them, the batches apply them, and export writes the processor that gives them."""
    from convert.hf import hf_config
    from data.images import digits

    hf_dir = saved(hf_vit(8, 2, 1, 32, 4, 1, 10), tmp_path / "hf")
    mean, std = [0.25], [0.4]
    transformers.ViTImageProcessor(image_mean=mean, image_std=std, size={"height": 8, "width": 8}).save_pretrained(
        hf_dir)
    cfg, _ = load_hf(hf_dir)
    assert (cfg.image_mean, cfg.image_std) == (mean, std) and hf_config(hf_dir).image_mean == mean

    cfg = cfg.replace(datasets=[["digits", None, None, None]], n_ctx=17)
    pixels, _, scale = digits("eval")
    batch = image_source(cfg, "eval").batch(0, 4)["images"]
    np.testing.assert_allclose(batch, (pixels[:4].astype(np.float32) * scale - 0.25) / 0.4, rtol=1e-6, atol=1e-6)

    params = nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(1)), nnx.Param))
    export_params(cfg, params, str(tmp_path / "out"))
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")
    raw = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1)).astype(np.uint8)
    want = processor(list(raw), return_tensors="np", input_data_format="channels_last")["pixel_values"]
    np.testing.assert_allclose(want.transpose(0, 2, 3, 1), (raw / 255 - 0.25) / 0.4, rtol=1e-5, atol=1e-6)
    assert load_hf(str(tmp_path / "out"))[0].image_mean == mean

    # A processor that does not normalise: fed as they are; one that rescales otherwise: refused in one line.
    transformers.ViTImageProcessor(do_normalize=False).save_pretrained(hf_dir)
    assert hf_config(hf_dir).image_mean is None
    transformers.ViTImageProcessor(rescale_factor=1.0).save_pretrained(hf_dir)
    with pytest.raises(ConfigError, match=r"preprocessor_config.json: rescale_factor 1.0; NeoMesh feeds pixels "
                                          r"scaled to \[0, 1\]"):
        hf_config(hf_dir)


def test_a_vit_classifier_with_other_classes_trains_a_new_head_on_vit_digits(tmp_path):
    """A 2-class ViTForImageClassification fine-tuned on the 10 digits: one line naming both counts, then with
    init_new_head a new 10-class head on its encoder that trains."""
    from tests.common import metrics_rows, run_command

    source = saved(hf_vit(8, 2, 1, 16, 2, 1, 2), tmp_path / "hf")
    sets = ["train_steps=2", "eval_every=0", "eval_steps=1", "train_batch_size=16", "warmup_steps=1"]
    args = ["train.py", "--config", "configs/vit_digits.json", "--model-path", str(tmp_path / "run"), "--no-progress",
            "--init-from", source, *[a for s in sets for a in ("--set", s)]]
    refused = run_command(*args)
    assert refused.returncode != 0 and refused.stderr.splitlines() == [
        f"error: --init-from {source}: its classifier has 2 labels, but num_labels is 10; --set init_new_head=true "
        "keeps its backbone and starts a new head of 10 (--set num_labels=2 fine-tunes its head)"], refused.stderr
    result = run_command(*args, "--set", "init_new_head=true")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "init_new_head: a new head of 10 labels, initialised fresh: classifier/bias, classifier/kernel" \
        in result.stdout
    assert [r["step"] for r in metrics_rows(tmp_path / "run")] == [1, 2]
    # A bare ViTModel's config says two labels too, but it has no head: the check before the data lets it by.
    from training import init_from
    from config import load_config

    bare = saved(hf_vit(8, 2, 1, 16, 2, 1, 2, head=False), tmp_path / "bare")
    digits = load_config("vit_digits")[0]
    assert init_from.with_architecture_of(digits.replace(init_from=bare), "--init-from", []).num_labels == 10
    with pytest.raises(ConfigError, match="its classifier has 2 labels, but num_labels is 10"):
        init_from.with_architecture_of(digits.replace(init_from=source), "--init-from", [])


def test_init_from_a_vit_with_the_default_config_names_the_vit_configs(tmp_path, capsys):
    """train.py --init-from a ViT without --config reads the quickstart's (a gpt_neo): the error names the way."""
    import train

    hf_dir = saved(hf_vit(8, 2, 1, 32, 4, 1, 10), tmp_path / "hf")
    capsys.readouterr()  # save_pretrained's progress bar
    assert train.main(["--config", "quickstart", "--init-from", hf_dir, "--model-path", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --init-from {hf_dir}: a vit model, but the config's model is gpt_neo; name a config of "
                   "the vit family with --config (shipped: vit_digits)\n"), err


def test_predict_classifies_image_files_as_transformers_does(tmp_path, capsys):
    """predict.py --image (files and folders, any size and mode) gives each file the probabilities transformers'
    image processor and ViTForImageClassification give it; text models, missing files and unreadable ones are one
    line. Before, predict.py refused every ViT ("does not generate text") and Pretrained took only pixel arrays."""
    import predict
    from PIL import Image

    from pretrained import Pretrained

    hf = hf_vit(8, 2, 3, 32, 4, 1, 3)
    hf.config.id2label = {0: "cat", 1: "dog", 2: "fox"}
    hf_dir = saved(hf, tmp_path / "hf")
    transformers.ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.4, 0.5, 0.6],
                                   image_std=[0.2, 0.3, 0.4]).save_pretrained(hf_dir)
    rng = np.random.default_rng(0)
    files = []
    for name, size, mode in (("a.png", (13, 10), "RGB"), ("b.jpg", (8, 8), "L"), ("more/c.png", (20, 31), "RGBA")):
        files.append(str(tmp_path / "images" / name))
        os.makedirs(os.path.dirname(files[-1]), exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode).save(files[-1])
    processor = transformers.AutoImageProcessor.from_pretrained(hf_dir)
    pixels = processor([Image.open(f).convert("RGB") for f in files], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = torch.softmax(hf(pixel_values=pixels).logits, -1).numpy()

    model = Pretrained.from_pretrained(hf_dir)
    np.testing.assert_allclose(model.read_images(files)["images"], pixels.numpy().transpose(0, 2, 3, 1), atol=1e-5)
    capsys.readouterr()
    assert predict.main(["--hf-model", hf_dir, "--image", str(tmp_path / "images"), "--top-k", "2",
                         "--output", str(tmp_path / "out.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == (tmp_path / "out.txt").read_text().splitlines() and len(lines) == 3
    for line, path, p in zip(lines, files, want):
        shown = re.fullmatch(rf"{re.escape(path)}: (\w+) ([0-9.]+), (\w+) ([0-9.]+)", line).groups()
        order = np.argsort(-p)[:2]
        assert [shown[0], shown[2]] == [hf.config.id2label[int(i)] for i in order], line
        np.testing.assert_allclose([float(shown[1]), float(shown[3])], p[order], atol=1e-4)

    (tmp_path / "bad.png").write_text("not an image")
    for argv, message in (
            (["--hf-model", hf_dir, "--image", str(tmp_path / "image")],
             f"{tmp_path / 'image'}: no such file or folder (did you mean {tmp_path / 'images'}?)"),
            (["--hf-model", hf_dir, "--image", str(tmp_path / "bad.png")],
             f"{tmp_path / 'bad.png'}: not a readable image (cannot identify image file"),
            (["--hf-model", hf_dir, "--image", str(tmp_path / "hf")], f"{tmp_path / 'hf'}: no images (.jpg, "),
            (["--hf-model", hf_dir, "--prompt", "x"], f"{hf_dir}: a vit model trained for image_classification does "
                                                      "not generate text; give --image FILE_OR_FOLDER"),
            (["--hf-model", hf_dir, "--image", str(tmp_path / "images"), "--temperature", "0"],
             "--temperature shapes generated text; --image classifies images (--top-k: the classes shown)"),
            (["--hf-model", hf_dir, "--image", str(tmp_path / "images"), "--pair", "x"],  # it was ignored
             "--pair gives a sentence-pair classifier's prompts their second texts; --image classifies images")):
        assert predict.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
