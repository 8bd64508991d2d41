"""The one place TensorFlow is imported: lazily, and only by the data paths that read or write TFRecords/TFDS."""

from __future__ import annotations

import os

from config import ConfigError


def tensorflow():
    """``tensorflow``, quiet and kept off accelerators (JAX owns their memory); a one-line error if missing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    try:
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
