"""The one place TensorFlow (and TFDS) is imported: lazily, and only by the data paths that read or write
TFRecords/TFDS."""

from __future__ import annotations

import contextlib
import importlib.util
import os

from config import ConfigError


def tensorflow():
    """``tensorflow``, quiet and kept off accelerators (JAX owns their memory); a one-line error if missing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    try:
        with _without_eager_keras():
            import tensorflow as tf
    except ImportError:
        raise ConfigError("datasets: TFRecord and TFDS data need TensorFlow (pip install tensorflow-cpu==2.21.0); "
                          "an installed NeoMesh has it in its [data] extra (pip install 'neomesh[data]'); "
                          "the 'embedded' dataset works without it") from None
    try:
        tf.config.set_visible_devices([], "GPU")
        tf.config.set_visible_devices([], "TPU")
    except (RuntimeError, ValueError):
        pass  # already initialised, or no such device type
    return tf


def tensorflow_datasets():
    """``tensorflow_datasets``, with TensorFlow imported by ``tensorflow()`` first: TFDS imports TensorFlow on
    first use, and bare (with Keras, without the settings above) if nothing did before."""
    tensorflow()
    import tensorflow_datasets as tfds
    return tfds


@contextlib.contextmanager
def _without_eager_keras():
    """``import tensorflow`` loads all of Keras 3 (and scikit-learn through it, where installed) to register its
    optimizers: 2.3 s of every run's start-up, for nothing tf.data uses. With ``TF_USE_LEGACY_KERAS`` set during
    the import and no ``tf_keras`` installed, TensorFlow skips that eager load; ``tf.keras`` still loads Keras 3
    on first use, since the variable is gone again by then. A user's own setting is kept."""
    skip = "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is None
    if skip:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    try:
        yield
    finally:
        if skip:
            del os.environ["TF_USE_LEGACY_KERAS"]
