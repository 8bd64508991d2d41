"""Helpers for the data tests: TFRecords written with TensorFlow's own writer, and dataset configs in a
temporary directory that ``make_source`` reads instead of configs/dataset_configs/."""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from tests.common import tiny_config

EOS = 1  # synthetic documents: document d is (d+1)*1000 + [0, 1, ..., len-1], then EOS


def synthetic_docs(lengths, first: int = 0) -> list[list[int]]:
    return [[(first + d + 1) * 1000 + i for i in range(n)] + [EOS] for d, n in enumerate(lengths)]


def write_tf_records(path: str, records: list[list[int]]) -> str:
    """GPT-Neo's format, written by TensorFlow itself: a tf.train.Example per record, int64 list "text"."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    with tf.io.TFRecordWriter(path) as writer:
        for ids in records:
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
            writer.write(tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString())
    return path


def use_dataset_configs(monkeypatch, directory, **configs: dict) -> None:
    """Writes NAME.json dataset configs into ``directory`` and points make_source at it."""
    import data.source
    os.makedirs(directory, exist_ok=True)
    for name, body in configs.items():
        with open(os.path.join(directory, f"{name}.json"), "w") as f:
            json.dump(body, f)
    monkeypatch.setattr(data.source, "DATASET_CONFIG_DIR", str(directory))


def config(datasets, n_ctx=16, n_vocab=1_000_000, **changes):
    """A tiny config for data tests (no model is built, so n_vocab may be large)."""
    return tiny_config(n_ctx=n_ctx, n_vocab=n_vocab, datasets=datasets, **changes)


def take(source, steps, batch_size=8, start=0) -> np.ndarray:
    """(steps * batch_size, n_ctx+1) windows of batches start..start+steps-1."""
    return np.concatenate([source.batch(s, batch_size) for s in range(start, start + steps)])


_TINY_TFDS: dict = {}  # the builder class, defined once: TFDS registers builder names process-wide


def prepare_tiny_tfds(data_dir: str, texts: list[str]) -> None:
    """A prepared TFDS text dataset ``neomesh_tiny_text`` (train: texts[:15], validation: the rest) in
    ``data_dir``, as ``tfds build`` would leave it; train.py reads it by name from the files alone."""
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()

    if "builder" not in _TINY_TFDS:
        class NeomeshTinyText(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            texts: list[str] = []

            def _info(self):
                return self.dataset_info_from_configs(
                    features=tfds.features.FeaturesDict({"text": tfds.features.Text()}), disable_shuffling=True)

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples(self.texts[:15]),
                        "validation": self._generate_examples(self.texts[15:])}

            def _generate_examples(self, split_texts):
                for i, t in enumerate(split_texts):
                    yield i, {"text": t}

        _TINY_TFDS["builder"] = NeomeshTinyText
    builder = _TINY_TFDS["builder"]
    builder.texts = list(texts)
    builder(data_dir=data_dir).download_and_prepare()


def prepare_tiny_glue(data_dir: str, pairs: list[tuple[str, str, int]]) -> None:
    """A prepared TFDS dataset ``neomesh_tiny_glue/mrpc`` shaped like GLUE/MRPC (sentence1, sentence2, a two-class
    label, idx) with train: pairs[:8] and validation: the rest, as ``tfds build`` leaves it in ``data_dir``."""
    builder = _tiny_glue_builder()
    builder.PAIRS = pairs
    builder(config="mrpc", data_dir=data_dir).download_and_prepare()


def prepare_tiny_stsb(data_dir: str, pairs: list[tuple[str, str, float]]) -> None:
    """``neomesh_tiny_glue/stsb``, shaped like GLUE/STS-B (sentence1, sentence2, a float32 score ``label``, idx),
    train: pairs[:8] and validation: the rest."""
    builder = _tiny_glue_builder()
    builder.PAIRS = pairs
    builder(config="stsb", data_dir=data_dir).download_and_prepare()


def prepare_tiny_squad(data_dir: str, rows: list[dict]) -> None:
    """``neomesh_tiny_squad`` shaped like TFDS squad (id, title, context, question, answers {text, answer_start})
    from SQuAD-format ``rows``: train rows[:-2], validation the last two, as ``tfds build`` leaves it."""
    builder = _tiny_squad_builder()
    builder.ROWS = rows
    builder(data_dir=data_dir).download_and_prepare()


@functools.cache
def _tiny_squad_builder():
    """The builder class, defined once: TFDS registers a dataset name when its class is defined."""
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()

    class NeomeshTinySquad(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")
        ROWS: list = []

        def _info(self):
            return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(), "title": tfds.features.Text(), "context": tfds.features.Text(),
                "question": tfds.features.Text(), "answers": tfds.features.Sequence({
                    "text": tfds.features.Text(), "answer_start": np.int32})}), disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(self.ROWS[:-2]),
                    "validation": self._generate_examples(self.ROWS[-2:])}

        def _generate_examples(self, rows):
            for i, row in enumerate(rows):
                yield i, {"id": str(i), "title": "t", "context": row["context"], "question": row["question"],
                          "answers": row["answers"]}

    return NeomeshTinySquad


@functools.cache
def _tiny_glue_builder():
    """The builder class, defined once: TFDS registers a dataset name when its class is defined."""
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()

    class NeomeshTinyGlue(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="mrpc"), tfds.core.BuilderConfig(name="stsb")]
        PAIRS: list = []

        def _info(self):
            label = tfds.features.Scalar(dtype=np.float32) if self.builder_config.name == "stsb" else \
                tfds.features.ClassLabel(names=["not_equivalent", "equivalent"])
            return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
                "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(), "label": label,
                "idx": tfds.features.Scalar(dtype=np.int32)}), disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(self.PAIRS[:8]),
                    "validation": self._generate_examples(self.PAIRS[8:])}

        def _generate_examples(self, rows):
            for i, (a, b, label) in enumerate(rows):
                yield i, {"sentence1": a, "sentence2": b, "label": label, "idx": i}

    return NeomeshTinyGlue


@functools.cache
def _tiny_images_builder():
    """A TFDS image dataset ``neomesh_tiny_mnist`` shaped like MNIST (28x28x1 uint8 ``image``, 10-class
    ``label``; train and test), defined once (TFDS registers the name when the class is defined)."""
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()

    class NeomeshTinyMnist(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(num_classes=10)}), disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(12, 0), "test": self._generate_examples(5, 1)}

        def _generate_examples(self, count, seed):
            rng = np.random.default_rng(seed)
            for i in range(count):
                yield i, {"image": rng.integers(0, 256, (28, 28, 1), dtype=np.uint8), "label": i % 10}

    return NeomeshTinyMnist


def prepare_tiny_images(data_dir: str) -> None:
    """``neomesh_tiny_mnist`` prepared in ``data_dir`` as ``tfds build`` leaves it: 12 train and 5 test images."""
    _tiny_images_builder()(data_dir=data_dir).download_and_prepare()
