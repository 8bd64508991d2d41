"""Your own images for ``task: image_classification``: a folder of class folders, as torchvision's ImageFolder and
Hugging Face's ``imagefolder`` read them::

    pets/train/cat/1.jpg  pets/train/dog/2.png  pets/train/dog/puppies/3.png  ...   pets/validation/cat/7.jpg  ...

(an image in a class folder's subfolders, at any depth, is of that class, as in ImageFolder).

``datasets`` names the folder itself (``pets``: its ``train`` (or ``training``) folder trains and the first of
``validation``, ``val``, ``valid``, ``dev``, ``test``, ``testing``, ``eval``, ``evaluation`` evaluates, Hugging Face
datasets' split names; a folder without a train folder is the class folders themselves, ``eval_fraction`` of each
class held out), or a dataset config whose ``path`` (and ``eval_path``) are
such folders, with ``eval_fraction``, ``labels`` (the classes in id order) and ``skip_bad_files``.

Class ids follow the sorted class folder names (a run started from a classifier that names the same classes takes
its order, as labelled text does). Every image is decoded with Pillow, converted to RGB (``num_channels`` 3) or
grey (1) and resized to ``image_size`` x ``image_size`` bilinearly, what transformers' ``ViTImageProcessor`` does
before it rescales, and held in memory as uint8; batches scale it to [0, 1] (data/images.py). What a start
decodes, the next one reads back (data/image_cache.py).
"""

from __future__ import annotations

import difflib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from config import ConfigError

SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# Hugging Face datasets' split keywords (data_files.SPLIT_KEYWORDS), validation's before test's
TRAIN_FOLDERS = ("train", "training")
EVAL_FOLDERS = ("validation", "val", "valid", "dev", "test", "testing", "eval", "evaluation")
EVAL_FRACTION = 0.1  # of each class, held out where no eval folder is given
MODES = {1: "L", 3: "RGB"}  # num_channels -> Pillow mode


def meant_folder(path: str) -> str:
    """" (did you mean DIR?)" for the folder beside a missing ``path`` whose name is closest to its own, or ""."""
    parent, missing = os.path.split(os.path.normpath(path))
    there = [e.name for e in os.scandir(parent or ".") if e.is_dir()] if os.path.isdir(parent or ".") else []
    near = difflib.get_close_matches(missing, there, 1)
    return f" (did you mean {os.path.join(parent, near[0])}?)" if near else ""


def looks_like_one(path: str) -> bool:
    """Whether ``path`` is a folder of class folders (or holds them in ``train``): a subfolder with an image."""
    if not os.path.isdir(path):
        return False
    root = split_folder(path, TRAIN_FOLDERS) or path
    return any(entry.is_dir() and not entry.name.startswith(".") and next(images_under(entry.path), None)
               for entry in os.scandir(root))


def split_folder(path: str, names: tuple[str, ...]) -> str | None:
    """The first of the split folders ``names`` in ``path``, or None."""
    return next((os.path.join(path, n) for n in names if os.path.isdir(os.path.join(path, n))), None)


def images_under(folder: str):
    """The image files in ``folder`` and its subfolders, at any depth, as torchvision's ImageFolder finds them
    (the label is the class folder above them all); hidden files and folders (.ipynb_checkpoints) are passed over."""
    for parent, folders, files in os.walk(folder, followlinks=True):
        folders[:] = [f for f in folders if not f.startswith(".")]  # pruned in place: os.walk goes no deeper
        for f in files:
            path = os.path.join(parent, f)
            if not f.startswith(".") and f.lower().endswith(SUFFIXES) and os.path.isfile(path):
                yield path


def folder_dataset(name: str, dataset: dict | None = None) -> dict:
    """The train and eval folders of a ``datasets`` entry that is a folder (``dataset`` None) or a dataset config
    whose ``path`` is one: {"path", "eval_path" (None: a held-out fraction; "": no eval set), "eval_fraction",
    "labels", "skip_bad_files", "where"}."""
    if dataset is None:
        dataset = {"path": name, "where": name}
        train = split_folder(name, TRAIN_FOLDERS)
        if train:  # split folders, as Hugging Face's imagefolder finds them
            dataset.update(path=train, eval_path=split_folder(name, EVAL_FOLDERS), where=train)
    where = dataset["where"]
    for key in ("path", "eval_path"):
        value = dataset.get(key)
        if value and not os.path.isdir(value):
            raise ConfigError(f"{where} {key}: {value}: no such folder{meant_folder(value)} (a folder of class "
                              "folders: CLASS/IMAGE)")
    fraction = dataset.get("eval_fraction", EVAL_FRACTION)
    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise ConfigError(f"{where}: eval_fraction {fraction!r} must be a number between 0 and 1 (exclusive)")
    if dataset.get("eval_path") and "eval_fraction" in dataset:
        raise ConfigError(f"{where}: eval_fraction holds images out of path, but eval_path names an eval folder; "
                          "give one of them")
    return {"path": dataset["path"], "eval_path": dataset.get("eval_path"), "eval_fraction": fraction,
            "labels": dataset.get("labels"), "skip_bad_files": bool(dataset.get("skip_bad_files")), "where": where}


def skipping_dataset_config(folder: str) -> str:
    """The path of a dataset config naming ``folder`` (its split folders found as for a folder named in
    ``datasets``) with ``skip_bad_files``: what ``train.py --data FOLDER --skip-bad-files`` trains on. Written to
    ``data_cache/image_folders/`` (one per folder path) whole, then renamed into place."""
    import hashlib
    import json

    from neomesh.paths import work_root

    folder = os.path.abspath(folder)
    dataset = folder_dataset(folder)
    config = {"path": dataset["path"], "skip_bad_files": True}
    if dataset["eval_path"]:
        config["eval_path"] = dataset["eval_path"]
    name = f"{os.path.basename(folder)}-{hashlib.sha256(folder.encode()).hexdigest()[:8]}.json"
    target = os.path.join(work_root(), "data_cache", "image_folders", name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = f"{target}.tmp-{os.getpid()}"
    with open(staging, "w") as f:
        json.dump(config, f, indent=1)
    os.replace(staging, target)
    return target


def class_files(root: str) -> dict[str, list[str]]:
    """{class folder name: its image files, those in its subfolders too}, both sorted; one-line errors for an
    image outside a class folder, a folder without classes and a class folder without images. Hidden files and
    folders and other suffixes are ignored."""
    classes, strays = {}, []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            classes[entry.name] = sorted(images_under(entry.path))
        elif entry.name.lower().endswith(SUFFIXES):
            strays.append(entry.path)
    if strays:
        raise ConfigError(f"{strays[0]}: an image outside a class folder (the layout is {root}/CLASS/IMAGE)")
    if not classes:
        raise ConfigError(f"{root}: no class folders (the layout is {root}/CLASS/IMAGE)")
    empty = next((name for name, files in classes.items() if not files), None)
    if empty is not None:
        raise ConfigError(f"{os.path.join(root, empty)}: no images ({', '.join(SUFFIXES)}) in this class folder")
    return classes


def pillow_mode(channels: int) -> str:
    """The Pillow mode image files are converted to for ``num_channels``; one-line errors for a count neither
    RGB nor grey and for Pillow not installed."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ConfigError("image files are decoded with Pillow: pip install pillow (NeoMesh's [images] "
                          "extra)") from None
    if channels not in MODES:
        raise ConfigError(f"num_channels: image files are read as RGB (3) or grey (1), not {channels} channels")
    return MODES[channels]


def decode(path: str, size: int, channels: int) -> np.ndarray:
    """(size, size, channels) uint8: the image at ``path`` converted to RGB or grey and resized bilinearly;
    ValueError (naming why) for a file Pillow cannot read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image = image.convert(MODES[channels])
            if image.size != (size, size):
                image = image.resize((size, size), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return pixels.reshape(size, size, channels)


def held_out(root: str, classes: dict[str, list[str]], fraction: float, split: str) -> dict[str, list[str]]:
    """Each class's files of ``split``: an image is held out when the hash of its path in its class folder falls
    below ``fraction`` (data/eval_split.py's draw, as for ``--data`` text), so adding or removing images, or
    re-encoding them, moves no other image between train and eval, whatever the run's seed (its path, not its
    bytes: nothing is read to decide, and a folder resized offline keeps its split); in a class of two or more
    images at least one is on each side. A class of one image trains."""
    from data.eval_split import Draws, draw_bytes

    chosen = {}
    for name, files in classes.items():
        values = [draw_bytes(os.path.relpath(path, os.path.join(root, name)).replace(os.sep, "/").encode("utf-8"))
                  for path in files]
        draws = Draws(fraction)
        for value in values:
            draws.add_draw(value)
        rule, _ = draws.split()
        chosen[name] = [path for path, value in zip(files, values)
                        if (rule.whole_documents and rule.is_eval(value)) == (split == "eval")]
    return chosen


def decode_all(files: list[str], size: int, channels: int) -> tuple[np.ndarray, list[str | None]]:
    """(N, size, size, channels) uint8 of ``files`` (zeros where one cannot be read), and per file None or the
    problem that leaves it out."""
    images = np.empty((len(files), size, size, channels), np.uint8)  # filled in place: no second copy of them all

    def one(i):
        try:
            images[i] = decode(files[i], size, channels)
        except ValueError as e:
            images[i] = 0
            return f"{files[i]}: not a readable image ({e})"
        return None

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # Pillow decodes outside the GIL
        return images, list(pool.map(one, range(len(files))))


def read_images(files: list[str], size: int, channels: int, skip_bad: bool) -> tuple[np.ndarray, list[int]]:
    """(N, size, size, channels) uint8 of the readable ``files`` and their indices; a file that cannot be read is
    an error naming it or, with ``skip_bad``, a warning line and left out."""
    from data import image_cache

    entry = image_cache.entry_for(files, size, channels)  # None with the cache off
    found = image_cache.load(entry, (len(files), size, size, channels))
    if found is None:
        images, problems = decode_all(files, size, channels)
        image_cache.save(entry, images, problems)
    else:
        images, problems = found
        print(f"note: the {len(files)} images as an earlier start decoded them, from {entry} "
              "(NEOMESH_IMAGE_CACHE=0 decodes at every start)", flush=True)
    for problem in filter(None, problems):
        if not skip_bad:
            raise ConfigError(f"{problem}; remove it, or leave it out: train.py --data ... --skip-bad-files, or "
                              "skip_bad_files in a dataset config")
        print(f"warning: {problem}; left out (skip_bad_files)", flush=True)
    kept = [i for i, problem in enumerate(problems) if problem is None]
    return (images if len(kept) == len(files) else images[kept]), kept


def read_folder(dataset: dict, split: str, names: list[str] | None, size: int, channels: int
                ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(uint8 images (N, size, size, channels), int32 labels, label names) of ``split`` of an image folder
    dataset (``folder_dataset``). Label names are ``names`` if given, else the train folder's sorted classes; eval
    classes must be among them."""
    pillow_mode(channels)
    where = dataset["where"]
    train = class_files(dataset["path"])
    if names is None:
        names = list(train)
    for name in train:
        if name not in names:
            raise ConfigError(f"{os.path.join(dataset['path'], name)}: class {name!r} is not among the labels "
                              f"({', '.join(names)})")
    if split == "train" or not dataset["eval_path"]:
        if split == "eval" and dataset["eval_path"] == "":
            from data.source import NoEvalSet
            raise NoEvalSet(f"{where}: eval_path is empty (no eval set)")
        classes = train if dataset["eval_path"] is not None else held_out(dataset["path"], train,
                                                                          dataset["eval_fraction"], split)
        root = dataset["path"]
    else:
        classes, root = class_files(dataset["eval_path"]), dataset["eval_path"]
        unknown = next((name for name in classes if name not in names), None)
        if unknown is not None:
            raise ConfigError(f"{os.path.join(root, unknown)}: eval class {unknown!r} is not a train class "
                              f"({', '.join(names)})")
    files = [f for name in classes for f in classes[name]]
    labels = np.array([names.index(name) for name in classes for _ in classes[name]], np.int32)
    if not files:
        raise ConfigError(f"{where}: no {split} images (every class has a single image; give an eval folder)")
    images, kept = read_images(files, size, channels, dataset["skip_bad_files"])
    if not kept:
        raise ConfigError(f"{root}: no readable {split} images")
    return images, labels[kept], names
