"""Labelled images for ``task: image_classification`` (ViT): (B, H, W, C) float32 batches in [0, 1], or
normalised per channel as ``(x - image_mean) / image_std`` where the config gives them (an imported ViT's).

``datasets`` names one image set:

* ``digits`` (the default): scikit-learn's 8x8 grey handwritten digits (1,797 images, 10 classes), shipped inside
  the scikit-learn package, so nothing is downloaded; a fixed split (seeded permutation) keeps 360 for eval.
* ``tfds:NAME`` (``tfds:mnist``, ``tfds:cifar10``, ...): a TFDS image dataset prepared in the local data dir
  (``tfds_data_dir``), its ``image`` and ``label`` features, ``train`` for training and ``test`` for eval.
* a folder of class folders (``pets/train/cat/1.jpg``, ...), or a dataset config naming one: your own images,
  decoded and resized to ``image_size`` once (data/image_folder.py); the class folder names are the label names.

The images are held in memory as stored (uint8 for TFDS) and scaled per batch. Batches follow ``ExampleStream``
(data/labelled.py): train batches walk a per-epoch permutation of the seed, eval batches the images in order.
With ``image_augmentation`` each training image is shifted by up to one pixel in each direction (edges
repeated); the shift is drawn from (seed, position of the example in the data stream), so a resumed run sees
exactly the images the uninterrupted run would have.
"""

from __future__ import annotations

import os

import numpy as np

import data.source
from config import Config, ConfigError
from data.image_folder import meant_folder
from data.labelled import ExampleStream

DIGITS_EVAL = 360  # images of the fixed eval split of scikit-learn's digits


class ImageSource(ExampleStream):
    """Image classification batches from images held in memory."""

    tokenizer = None  # images need none (train.py saves a tokenizer only where a source has one)
    bytes_per_token = None

    def __init__(self, images: np.ndarray, labels: np.ndarray, scale: float, *, shuffle: bool, seed: int,
                 augment: bool, description: str, names: list[str] | None = None,
                 mean: list[float] | None = None, std: list[float] | None = None):
        self.images, self.labels = images, labels.astype(np.int32)  # (N, H, W, C), (N,)
        self.gain, self.shift = normalisation(scale, mean, std)
        self.shuffle, self.seed, self.augment = shuffle, seed, augment
        self.label_names = names  # saved as the run's labels.json (train.py) where they say more than the ids
        counts = np.bincount(self.labels, minlength=len(names or ()))
        self.description = (f"{description}: {len(labels):,} images of {'x'.join(map(str, images.shape[1:]))}; "
                            f"per label: " + ", ".join(f"{names[i] if names else i} {c}" for i, c in enumerate(counts)))

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> dict:
        """Rows ``rows`` (default all) of global batch ``step``: {"images": (rows, H, W, C) float32, "labels":
        (rows,) int32, "weights": (rows,) float32}."""
        ids, weights = self.example_ids(step, batch_size, rows)
        images = self.images[ids].astype(np.float32) * self.gain + self.shift
        if self.augment:
            positions = np.arange(step * batch_size, (step + 1) * batch_size)[rows or slice(None)]
            images = np.stack([shifted(image, np.random.default_rng([self.seed, 1 << 20, int(p)]).integers(-1, 2, 2))
                               for image, p in zip(images, positions)])
        return {"images": images, "labels": self.labels[ids], "weights": weights}


def normalisation(scale: float, mean: list[float] | None, std: list[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """(gain, shift) per channel: stored pixels x become (x * scale - mean) / std as one multiply-add, x * gain +
    shift; without mean and std, x * scale."""
    std = np.asarray(std if std is not None else 1.0, np.float32)
    return np.float32(scale) / std, -np.asarray(mean if mean is not None else 0.0, np.float32) / std


def image_files(paths: list[str]) -> list[str]:
    """The image files named by ``paths``: each a file, or a folder whose images (at any depth, as an image folder's
    class folders are walked) are taken in sorted order; one-line errors for a missing path and a folder without
    images."""
    from data.image_folder import SUFFIXES, images_under

    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(images_under(path))
            if not found:
                raise ConfigError(f"{path}: no images ({', '.join(SUFFIXES)}) in this folder")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ConfigError(f"{path}: no such file or folder{meant_folder(path)}")
    return files


def read_image_files(cfg: Config, files: list[str]) -> np.ndarray:
    """(N, image_size, image_size, num_channels) float32 of image files as training batches hold a folder's
    images: converted to RGB or grey, resized bilinearly, scaled to [0, 1] and normalised with the config's
    image_mean and image_std; a file Pillow cannot read is a one-line error naming it."""
    from data.image_folder import decode, pillow_mode

    pillow_mode(cfg.num_channels)
    gain, shift = normalisation(1.0 / 255.0, cfg.image_mean, cfg.image_std)
    images = np.empty((len(files), cfg.image_size, cfg.image_size, cfg.num_channels), np.float32)
    for i, path in enumerate(files):
        try:
            images[i] = decode(path, cfg.image_size, cfg.num_channels) * gain + shift
        except ValueError as e:
            raise ConfigError(f"{path}: not a readable image ({e})") from None
    return images


def shifted(image: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """(H, W, C) moved by ``shift`` (rows, columns) pixels, the edge rows and columns repeated into the gap."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
    return padded[1 - shift[0]:1 - shift[0] + h, 1 - shift[1]:1 - shift[1] + w]


def digits(split: str) -> tuple[np.ndarray, np.ndarray, float]:
    """scikit-learn's digits: (images (N, 8, 8, 1) float in 0..16, labels, scale to [0, 1]) of ``split``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("datasets: digits (the embedded image set) ships with scikit-learn: pip install "
                          "scikit-learn (NeoMesh's [images] extra)") from None
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))  # one fixed split, whatever the run's seed
    chosen = order[-DIGITS_EVAL:] if split == "eval" else order[:-DIGITS_EVAL]
    return data.images[chosen, :, :, None].astype(np.float32), data.target[chosen], 1.0 / 16.0


def tfds_images(name: str, data_dir: str | None, split: str) -> tuple[np.ndarray, np.ndarray, float]:
    """A prepared TFDS image dataset's ``train`` (or ``test``, for eval) split: (uint8 images, labels, 1/255)."""
    from data.pipeline import open_tfds
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()
    tfds_split = "train" if split == "train" else "test"
    builder = open_tfds(name, data_dir, tfds_split, "label")
    if "image" not in builder.info.features:
        raise ConfigError(f"tfds:{name}: no 'image' feature (features: {', '.join(sorted(builder.info.features))})")
    images, labels = [], []
    for batch in tfds.as_numpy(builder.as_dataset(split=tfds_split, shuffle_files=False, batch_size=4096)):
        images.append(batch["image"])
        labels.append(batch["label"])
    if not images:
        raise ConfigError(f"tfds:{name}: split {tfds_split!r} has no examples")
    return np.concatenate(images), np.concatenate(labels), 1.0 / 255.0


def folder_images(cfg: Config, name: str, split: str) -> tuple[np.ndarray, np.ndarray, float, list[str], str]:
    """An image folder's ``split`` (``name`` the folder or a dataset config naming one): (uint8 images resized to
    image_size, labels, 1/255, label names in id order, the folder read)."""
    from data.image_folder import class_files, folder_dataset, read_folder
    from data.labelled import in_head_order, label_names
    if os.path.isdir(name):
        dataset = folder_dataset(name)
    else:
        config = data.source.load_dataset_config(name)
        if not os.path.isdir(config["path"]):
            if os.path.isabs(config["path"]) and not os.path.exists(config["path"]):  # a typo, or a folder not there
                raise ConfigError(f"{config['where']} path: {config['path']}: no such folder"
                                  f"{meant_folder(config['path'])} (a folder of class folders: CLASS/IMAGE)")
            raise ConfigError(f"datasets: {name!r} is not an image dataset: {config['where']}'s path "
                              f"{config['path']} is not a folder of class folders (CLASS/IMAGE)")
        dataset = folder_dataset(name, config)
    given = label_names(dataset, None, cfg.num_labels)  # a dataset config's labels list, checked
    names = given or label_names({**dataset, "labels": list(class_files(dataset["path"]))}, None, cfg.num_labels)
    names = in_head_order(cfg, names, dataset)
    images, labels, names = read_folder(dataset, split, names, cfg.image_size, cfg.num_channels)
    if dataset["eval_path"] is None:
        held = f"about {dataset['eval_fraction']:.0%} of each class held out for eval, by a hash of each image's path"
        where = f"{dataset['path']} ({'less ' + held if split == 'train' else held})"
    else:
        where = dataset["path"] if split == "train" else dataset["eval_path"]
    return images, labels, 1.0 / 255.0, names, where


def image_source(cfg: Config, split: str) -> ImageSource:
    """The image source for ``split`` ("train" or "eval") of the config's one image dataset."""
    if len(cfg.datasets) != 1:
        raise ConfigError(f"datasets: task image_classification reads one image dataset, got {len(cfg.datasets)}")
    name, names = cfg.datasets[0][0], None
    if name == "digits":
        images, labels, scale = digits(split)
    elif name.startswith("tfds:"):
        images, labels, scale = tfds_images(name[len("tfds:"):], cfg.tfds_data_dir, split)
    elif os.path.isdir(name) or name.endswith(".json") or \
            os.path.exists(os.path.join(data.source.DATASET_CONFIG_DIR, name + ".json")):
        images, labels, scale, names, name = folder_images(cfg, name, split)
    else:
        readable = "task image_classification reads digits, tfds:NAME, a folder of class folders or a dataset config " \
                   "naming one"
        hint = meant_folder(name)
        if os.sep in name or "/" in name or hint:
            raise ConfigError(f"datasets: {name}: no such folder{hint}; {readable}")
        raise ConfigError(f"datasets: {name!r} is not an image dataset: {readable}")
    want = (cfg.image_size, cfg.image_size, cfg.num_channels)
    if images.shape[1:] != want:
        raise ConfigError(f"image_size: {name} images are {'x'.join(map(str, images.shape[1:]))} (height x width x "
                          f"channels), the config reads {'x'.join(map(str, want))} (image_size, num_channels)")
    if labels.max() >= cfg.num_labels:
        raise ConfigError(f"num_labels: {name} has label {int(labels.max())}; num_labels must be above it")
    return ImageSource(images, labels, scale, shuffle=split == "train", seed=cfg.seed, names=names,
                       mean=cfg.image_mean, std=cfg.image_std,
                       augment=split == "train" and cfg.image_augmentation, description=f"{split}: {name}")
