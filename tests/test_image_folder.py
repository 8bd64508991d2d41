"""Image folders for ViT (data/image_folder.py): batches equal to transformers' ViTImageProcessor (resize, rescale)
on PNG and JPEG files, labels and label names from the class folders, eval order, a held-out fraction, resume by
step, the classifier's label order, one-line errors for bad input, --data, and a tiny train.py run whose loss
falls."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from config import ConfigError, from_dict
from data.images import image_source
from data.source import NoEvalSet
from neomesh import label_names
from tests.common import metrics_rows, run_command
from tests.data_common import use_dataset_configs

COLOURS = {"cat": (200, 40, 40), "dog": (40, 40, 200), "fox": (40, 200, 40)}


def write_image(path, colour, seed, size=(13, 10), mode="RGB") -> str:
    """A noisy image of about ``colour`` (width x height ``size``); PNG or JPEG by suffix."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour) + rng.integers(-40, 40, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).convert(mode).save(path)
    return str(path)


def write_folder(root, counts, seed=0, classes=("cat", "dog")) -> list[str]:
    """``counts`` images per class under root/CLASS/, PNG and JPEG by turns, one grey and one RGBA PNG among them;
    the files in the order a source reads them (sorted classes, then sorted names)."""
    files = []
    for c, name in enumerate(classes):
        for i in range(counts):
            suffix, mode = [(".png", "RGB"), (".jpg", "RGB"), (".png", "L"), (".png", "RGBA")][i % 4]
            files.append(write_image(os.path.join(root, name, f"{i:02d}{suffix}"), COLOURS[name],
                                     seed * 1000 + c * 100 + i, size=(13 + i, 10), mode=mode))
    return sorted(files)


def vit(datasets, image_size=8, num_channels=3, num_labels=2, **changes):
    cfg, _ = from_dict({**dict(model="vit", image_size=image_size, patch_size=4, num_channels=num_channels,
                               num_labels=num_labels, n_embd=32, n_head=4, n_layer=1, d_ff=64, image_augmentation=False,
                               datasets=[[str(datasets), None, None, None]]), **changes})
    return cfg


@pytest.fixture
def pets(tmp_path):
    """pets/train (6 cats, 6 dogs) and pets/validation (2 + 2): the split layout of Hugging Face's imagefolder."""
    return {"root": tmp_path / "pets", "train": write_folder(tmp_path / "pets" / "train", 6),
            "eval": write_folder(tmp_path / "pets" / "validation", 2, seed=1)}


def test_batches_are_what_vit_image_processor_makes_of_the_files(pets):
    """RGB: transformers' ViTImageProcessor without its normalisation (it resizes with Pillow, bilinear, and
    rescales by 1/255), channels last. Eval walks the eval folder in order, then weight-0 filler."""
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 8, "width": 8}, do_normalize=False)
    evaluation = image_source(vit(pets["root"]), "eval")
    assert evaluation.label_names == ["cat", "dog"] and len(evaluation) == 4
    assert evaluation.description.endswith("validation: 4 images of 8x8x3; per label: cat 2, dog 2")
    batch = evaluation.batch(0, 6)
    want = processor([Image.open(f).convert("RGB") for f in pets["eval"]], return_tensors="np")["pixel_values"]
    assert batch["images"].shape == (6, 8, 8, 3) and batch["images"].dtype == np.float32
    np.testing.assert_allclose(batch["images"][:4], want.transpose(0, 2, 3, 1), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(batch["labels"], [0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch["weights"], [1, 1, 1, 1, 0, 0])
    assert batch["images"][2:4, ..., 2].mean() > batch["images"][2:4, ..., 0].mean() + 0.2  # the dogs are blue


def test_grey_images_and_train_batches_are_a_pure_function_of_the_step(pets):
    cfg = vit(pets["root"], image_size=4, num_channels=1, image_augmentation=True, seed=3)
    train = image_source(cfg, "train")
    assert train.description.endswith("train: 12 images of 4x4x1; per label: cat 6, dog 6")
    grey = np.stack([np.asarray(Image.open(f).convert("L").resize((4, 4), Image.Resampling.BILINEAR))
                     for f in pets["train"]])[..., None] / 255.0  # (12, 4, 4, 1)
    plain = image_source(cfg.replace(image_augmentation=False), "train")
    batch = plain.batch(5, 12)  # one epoch: every image once, in the permutation of the seed and epoch
    ids = [next(i for i in range(12) if np.allclose(image, grey[i], atol=1e-6)) for image in batch["images"]]
    assert sorted(ids) == list(range(12)) and ids != list(range(12))
    np.testing.assert_array_equal(batch["labels"], [i // 6 for i in ids])
    shifted = train.batch(5, 12)
    again = image_source(cfg, "train").batch(5, 12)  # a resumed run's fresh source: the same batch
    for key in shifted:
        np.testing.assert_array_equal(again[key], shifted[key])
    assert not np.array_equal(shifted["images"], batch["images"])  # augmentation moved some
    np.testing.assert_array_equal(train.batch(5, 12, slice(3, 9))["images"], shifted["images"][3:9])


def test_a_folder_of_class_folders_holds_out_a_fixed_fraction_of_each_class(tmp_path, monkeypatch):
    files = write_folder(tmp_path / "shapes", 10, classes=("cat", "dog", "fox"))
    cfg = vit(tmp_path / "shapes", num_labels=3, image_size=4)
    train, evaluation = image_source(cfg, "train"), image_source(cfg.replace(seed=9), "eval")
    assert len(train) + len(evaluation) == 30 and set(evaluation.labels) == {0, 1, 2}  # some of every class
    assert "(about 10% of each class held out for eval, by a hash of each image's path): " in evaluation.description
    seen = np.concatenate([train.images, evaluation.images])  # no image on both sides, none left out
    assert len(np.unique(seen.reshape(30, -1), axis=0)) == 30
    use_dataset_configs(monkeypatch, tmp_path / "configs", shapes={"path": str(tmp_path / "shapes"),
                                                                   "eval_fraction": 0.3},
                        whole={"path": str(tmp_path / "shapes"), "eval_path": ""},
                        both={"path": str(tmp_path / "shapes"), "eval_path": str(tmp_path), "eval_fraction": 0.3})
    more = image_source(cfg.replace(datasets=[["shapes", None, None, None]]), "eval")  # a larger share only adds
    assert len(more) > len(evaluation)
    assert {im.tobytes() for im in evaluation.images} <= {im.tobytes() for im in more.images}
    whole = cfg.replace(datasets=[["whole", None, None, None]])
    assert len(image_source(whole, "train")) == len(files) == 30  # GPT-Neo's "eval_path": "": no eval set
    with pytest.raises(NoEvalSet, match="eval_path is empty"):
        image_source(whole, "eval")
    with pytest.raises(ConfigError, match="^configs/dataset_configs/both.json: eval_fraction holds images out of "
                                          "path, but eval_path names an eval folder; give one of them$"):
        image_source(cfg.replace(datasets=[["both", None, None, None]]), "train")


def test_adding_images_to_a_class_moves_no_other_image_between_train_and_eval():
    """The held-out images were a permutation drawn from the class's size: one image more reshuffled the class, and
    a run going on with it evaluated on images it had trained on. Each image's side is its path's, alone."""
    from data.image_folder import held_out

    root = os.path.join("pets")
    cats = [os.path.join(root, "cat", f"{i:03d}.jpg") for i in range(200)]
    sides = lambda files: [set(held_out(root, {"cat": files}, 0.1, s)["cat"]) for s in ("train", "eval")]  # noqa
    train, evaluation = sides(cats)
    assert 8 <= len(evaluation) <= 35 and train | evaluation == set(cats) and not train & evaluation
    more_train, more_eval = sides(cats + [os.path.join(root, "cat", "new", f"{i}.png") for i in range(50)])
    assert train <= more_train and evaluation <= more_eval
    fewer_train, fewer_eval = sides(cats[::2])
    assert fewer_train == train & set(cats[::2]) and fewer_eval == evaluation & set(cats[::2])


@pytest.mark.parametrize("train, held", [("training", "eval"), ("train", "evaluation"), ("train", "testing")])
def test_split_folders_go_by_hugging_face_datasets_split_names(tmp_path, train, held):
    """An eval folder of another of datasets' split names was passed over: 10% of train held out, without a word."""
    from data.image_folder import looks_like_one

    write_folder(tmp_path / "pets" / train, 3)
    write_folder(tmp_path / "pets" / held, 1, seed=1)
    cfg = vit(tmp_path / "pets", image_size=4)
    assert looks_like_one(str(tmp_path / "pets"))
    assert len(image_source(cfg, "train")) == 6
    evaluation = image_source(cfg, "eval")
    assert len(evaluation) == 2 and evaluation.description.startswith(f"eval: {tmp_path / 'pets' / held}: 2 images")


def test_label_order_from_the_dataset_config_or_the_classifier_the_run_starts_from(pets, tmp_path, monkeypatch):
    use_dataset_configs(monkeypatch, tmp_path / "configs", pets={
        "path": str(pets["root"] / "train"), "eval_path": str(pets["root"] / "validation"), "labels": ["dog", "cat"]})
    named = image_source(vit("pets"), "eval")
    assert named.label_names == ["dog", "cat"]
    np.testing.assert_array_equal(named.labels, [1, 1, 0, 0])
    run = tmp_path / "run"  # an imported classifier keeps its names in labels.json: its head's row i is label i
    label_names.save(str(run), ["dog", "cat"])
    ours = image_source(vit(pets["root"], model_path=str(run)), "train")
    assert ours.label_names == ["dog", "cat"] and "per label: dog 6, cat 6" in ours.description
    np.testing.assert_array_equal(np.bincount(ours.labels[:6]), [0, 6])  # the cats come first, as id 1


def test_images_in_a_class_folders_subfolders_belong_to_it_as_in_image_folder(tmp_path, image_cache_on):
    """torchvision's ImageFolder walks each class folder down: cat/sub/x.png is a cat. Hidden folders are passed
    over; a class folder whose images are all in subfolders is a class; the decoded-image cache knows each file."""
    from data.image_folder import class_files, looks_like_one

    root = tmp_path / "nest"
    files = write_folder(root, 2)
    nested = write_image(root / "cat" / "sub" / "deeper" / "x.png", COLOURS["fox"], 5)
    write_image(root / "cat" / ".ipynb_checkpoints" / "y.png", COLOURS["fox"], 6)
    only_nested = write_image(root / "fox" / "sub" / "z.png", COLOURS["fox"], 7)
    assert class_files(str(root)) == {"cat": sorted(files[:2] + [nested]), "dog": files[2:], "fox": [only_nested]}
    assert looks_like_one(str(root / "fox"))  # its class folder "sub" holds an image one level further down
    cfg = vit(root, num_labels=3)
    train, evaluation = image_source(cfg, "train"), image_source(cfg, "eval")
    assert train.description.endswith("path): 3 images of 8x8x3; per label: cat 1, dog 1, fox 1")
    assert evaluation.description.endswith("path): 3 images of 8x8x3; per label: cat 2, dog 1, fox 0")  # 3 cats
    image_cache_on.clear()
    write_image(nested, COLOURS["cat"], 8, size=(20, 20))  # a nested file changed: the list is decoded anew
    image_source(cfg, "eval")
    assert nested in image_cache_on


def bad(tmp_path, what):
    root = tmp_path / "pets"
    write_folder(root / "train", 2)
    write_folder(root / "validation", 1)
    if what == "corrupt":
        (root / "train" / "cat" / "zz.jpg").write_bytes(b"not a jpeg at all")
    elif what == "truncated":
        data = open(root / "train" / "dog" / "00.png", "rb").read()
        (root / "train" / "dog" / "zz.png").write_bytes(data[:len(data) // 2])
    elif what == "empty class":
        os.makedirs(root / "train" / "emu")
    elif what == "eval class":
        write_folder(root / "validation", 1, classes=("fox",))
    elif what == "stray image":
        write_image(root / "train" / "loose.png", (0, 0, 0), 0)
    return root


@pytest.mark.parametrize("what, datasets, split, message", [
    ("corrupt", "pets", "train", r"^.*pets/train/cat/zz\.jpg: not a readable image \(cannot identify image file "
                                 r".*\); remove it, or leave it out: train.py --data ... --skip-bad-files, or "
                                 r"skip_bad_files in a dataset config$"),
    ("truncated", "pets", "train", r"^.*pets/train/dog/zz\.png: not a readable image \(.*\); remove it"),
    ("empty class", "pets", "eval", r"^.*pets/train/emu: no images \(\.jpg, .*\) in this class folder$"),
    ("eval class", "pets", "eval", r"^.*pets/validation/fox: eval class 'fox' is not a train class \(cat, dog\)$"),
    ("stray image", "pets", "eval", r"^.*pets/train/loose\.png: an image outside a class folder \(the layout is "
                            r".*pets/train/CLASS/IMAGE\)$"),
    (None, "pets/trian", "train", r"^datasets: .*pets/trian: no such folder \(did you mean .*pets/train\?\); task "
                                  r"image_classification reads digits, tfds:NAME, a folder of class folders or a "
                                  r"dataset config naming one$"),
    (None, "pets", "train", r"^num_labels: 3, but .*pets/train has 2 labels \(cat, dog\)$"),
])
def test_bad_input_is_one_line_naming_it(tmp_path, what, datasets, split, message):
    root = bad(tmp_path, what)
    cfg = vit(tmp_path / datasets, num_labels=3 if what is None and datasets == "pets" else 2)
    with pytest.raises(ConfigError, match=message):
        image_source(cfg, split)
    assert root.exists()


def test_a_dataset_config_may_leave_bad_files_out_and_names_a_missing_folder(tmp_path, monkeypatch, capsys):
    root = bad(tmp_path, "corrupt")
    use_dataset_configs(monkeypatch, tmp_path / "configs", pets={"path": str(root / "train"), "skip_bad_files": True,
                                                                    "eval_path": str(root / "validation")},
                        typo={"path": str(root / "train"), "eval_path": str(root / "valdation")})
    train = image_source(vit("pets"), "train")
    assert train.description.endswith("train: 4 images of 8x8x3; per label: cat 2, dog 2")  # 5 files, 1 bad
    warnings = [line for line in capsys.readouterr().out.splitlines() if "zz.jpg" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "left out (skip_bad_files)" in warnings[0]
    with pytest.raises(ConfigError, match=r"^configs/dataset_configs/typo\.json eval_path: .*valdation: no such "
                                          r"folder \(did you mean .*pets/validation\?\) \(a folder of class folders: "
                                          r"CLASS/IMAGE\)$"):
        image_source(vit("typo"), "train")


@pytest.fixture
def image_cache_on(tmp_path, monkeypatch):
    """The decoded-image cache as a user has it, in this test's own cache home; records each file decoded."""
    from data import image_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NEOMESH_IMAGE_CACHE", "1")
    decoded, decode = [], image_folder.decode
    monkeypatch.setattr(image_folder, "decode", lambda path, *args: decoded.append(path) or decode(path, *args))
    return decoded


def test_a_folder_is_decoded_once_and_again_where_a_file_changes(pets, tmp_path, image_cache_on, capsys):
    decoded = image_cache_on
    first = image_source(vit(pets["root"]), "train")
    assert sorted(decoded) == pets["train"] and "as an earlier start decoded them" not in capsys.readouterr().out
    (entry,) = (tmp_path / "cache" / "neomesh" / "images").iterdir()  # written whole: no .writing- file left
    decoded.clear()
    again = image_source(vit(pets["root"]), "train")
    assert decoded == [] and np.array_equal(again.images, first.images) and again.description == first.description
    assert f"note: the 12 images as an earlier start decoded them, from {entry}" in capsys.readouterr().out
    assert np.array_equal(image_source(vit(pets["root"], image_size=4), "train").images.shape, (12, 4, 4, 3))
    decoded.clear()  # another size is another entry; a file rewritten (a new size and time) decodes the list anew
    write_image(pets["train"][0], COLOURS["fox"], 7, size=(20, 20))
    changed = image_source(vit(pets["root"]), "train")
    assert sorted(decoded) == pets["train"] and not np.array_equal(changed.images[0], first.images[0])
    assert np.array_equal(changed.images[1:], first.images[1:])


def test_a_cached_bad_file_is_refused_or_left_out_as_when_decoded(tmp_path, monkeypatch, image_cache_on, capsys):
    root = bad(tmp_path, "corrupt")
    use_dataset_configs(monkeypatch, tmp_path / "configs", pets={"path": str(root / "train"), "skip_bad_files": True,
                                                                    "eval_path": str(root / "validation")})
    with pytest.raises(ConfigError, match=r"zz\.jpg: not a readable image .*; remove it, or leave it out: "):
        image_source(vit(root), "train")  # decoded, kept with its bad file, refused
    image_cache_on.clear()
    skipped = image_source(vit("pets"), "train")  # the same files: from the cache, the bad one left out
    assert image_cache_on == [] and skipped.description.endswith("train: 4 images of 8x8x3; per label: cat 2, dog 2")
    assert "zz.jpg: not a readable image" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"zz\.jpg: not a readable image"):
        image_source(vit(root), "train")  # and refused again without skip_bad_files


def test_the_image_cache_is_off_with_its_switch_and_bounded_least_recently_used_first(tmp_path, monkeypatch):
    from data import image_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NEOMESH_IMAGE_CACHE", "0")
    assert image_cache.entry_for([], 8, 3) is None
    monkeypatch.setenv("NEOMESH_IMAGE_CACHE", "1")
    assert image_cache.entry_for([str(tmp_path / "gone.png")], 8, 3) is None  # removed since listed: no cache
    images = np.zeros((4, 8, 8, 3), np.uint8)
    paths = [image_cache.entry_for([write_image(tmp_path / f"{i}.png", (0, 0, 0), i)], 8, 3) for i in range(3)]
    for i, path in enumerate(paths):
        image_cache.save(path, images + i, [None] * 4)
        os.utime(path, (1000 + i, 1000 + i))
    assert image_cache.load(paths[0], (4, 8, 8, 3))[0].max() == 0  # read: now the most recently used
    assert image_cache.load(paths[0], (5, 8, 8, 3)) is None  # not what this list of files decodes to
    size = os.path.getsize(paths[0])
    dead = next(pid for pid in range(2**22, 2**22 + 1000) if not os.path.exists(f"/proc/{pid}"))
    killed, writing = f"{paths[1]}.tmp-{dead}", f"{paths[1]}.tmp-{os.getppid()}"  # a dead writer's, a live one's
    for staged in (killed, writing):
        open(staged, "wb").write(b"half an entry")
    image_cache.evict(os.path.dirname(paths[0]), keep=paths[2], max_bytes=2 * size)
    assert [os.path.exists(p) for p in paths] == [True, False, True]
    assert not os.path.exists(killed) and os.path.exists(writing)
    torn = paths[2] + ".torn.npz"  # damaged: decoded again
    for damage in (b"torn", open(paths[2], "rb").read()[:300]):  # not a zip file, a zip file cut short
        open(torn, "wb").write(damage)
        assert image_cache.load(torn, (4, 8, 8, 3)) is None
    (tmp_path / "home_file").write_text("")  # a cache home that cannot hold folders (root writes past chmod)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home_file"))
    unwritable = image_cache.entry_for([str(tmp_path / "0.png")], 8, 3)
    image_cache.save(unwritable, images, [None] * 4)  # no cache, not an error
    assert image_cache.load(unwritable, (4, 8, 8, 3)) is None


def test_check_dataset_says_which_file_is_bad_in_one_line(tmp_path):
    root = bad(tmp_path, "corrupt")
    result = run_command("train.py", "--config", "configs/vit_digits.json", "--check-dataset", "--set",
                         f'datasets=[["{root}", null, null, null]]', "--set", "num_labels=2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {root}/train/cat/zz.jpg: not a readable image")


def test_data_names_an_image_folder_as_it_is(tmp_path):
    from config import load_config
    from data.make_dataset import config_for_data

    cfg = load_config("vit_digits", [])[0]
    write_folder(tmp_path / "pets" / "train", 1)
    named = config_for_data(cfg, [str(tmp_path / "pets") + "/"])
    assert named.datasets == [[str(tmp_path / "pets"), None, None, None]] and named.model_path == "runs/pets"
    assert named.eval_steps == cfg.eval_steps  # its validation folder, or a held-out fraction, is the eval set
    with pytest.raises(ConfigError, match="^--data: plain text cannot feed task image_classification, which needs "
                                          r"labelled images: a folder of class folders \(--data my_images/"):
        config_for_data(cfg, [str(tmp_path / "pets" / "train" / "cat")])  # images, but no class folders
    with pytest.raises(ConfigError, match=r"^--data .*/pest: no such folder \(did you mean .*/pets\?\)$"):
        config_for_data(cfg, [str(tmp_path / "pest")])


def test_data_with_skip_bad_files_leaves_an_unreadable_image_out(tmp_path, monkeypatch, capsys):
    """--data FOLDER --skip-bad-files names the folder in a dataset config with skip_bad_files, written once per
    folder under data_cache/image_folders/: a corrupt image is a warning line and left out (it was refused)."""
    from data.images import image_source
    from data.make_dataset import config_for_data

    monkeypatch.setattr("neomesh.paths.work_root", lambda: str(tmp_path / "work"))
    root = bad(tmp_path, "corrupt")
    cfg = config_for_data(vit(root), [str(root)], skip_bad_files=True)
    [[source, *_]] = cfg.datasets
    assert source.startswith(str(tmp_path / "work" / "data_cache" / "image_folders" / "pets-")), source
    assert json.load(open(source)) == {"path": str(root / "train"), "skip_bad_files": True,
                                       "eval_path": str(root / "validation")}
    assert cfg.model_path == "runs/pets"
    assert len(image_source(cfg, "train")) == 4  # two per class; the corrupt one left out
    assert f"warning: {root}/train/cat/zz.jpg: not a readable image" in capsys.readouterr().out
    assert config_for_data(vit(root), [str(root)], skip_bad_files=True).datasets == cfg.datasets  # the same file
    assert os.listdir(os.path.dirname(source)) == [os.path.basename(source)]  # no staging file left behind


@pytest.mark.e2e
def test_train_py_learns_an_image_folder_and_keeps_its_label_names(tmp_path):
    root = tmp_path / "colours"
    write_folder(root / "train", 8, classes=("cat", "dog", "fox"))
    write_folder(root / "validation", 2, seed=1, classes=("cat", "dog", "fox"))
    run = tmp_path / "run"
    sets = dict(num_labels=3, num_channels=3, image_size=8, patch_size=4,
                n_embd=32, n_head=4, n_layer=1, d_ff=64, train_batch_size=8, eval_batch_size=8, train_steps=30,
                eval_steps=1, eval_every=30, steps_per_checkpoint=30, warmup_steps=0, lr=0.01, log_every=5)
    result = run_command("train.py", "--config", "vit_digits", "--data", str(root), "--model-path", str(run),
                         "--no-progress", *[a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: " + str(root / "train") + ": 24 images of 8x8x3; per label: cat 8, dog 8, fox 8" in result.stdout
    losses = [row["loss"] for row in metrics_rows(str(run))]
    assert len(losses) >= 5 and losses[-1] < 0.5 * losses[0], losses
    assert metrics_rows(str(run), "eval")[-1]["accuracy"] > 0.5  # of 6 held-out images; chance is 1/3
    assert json.loads((run / "labels.json").read_text()) == ["cat", "dog", "fox"]
