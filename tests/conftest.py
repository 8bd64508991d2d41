"""Every test runs on 8 simulated CPU devices; the flags must be set before jax is imported.

The suite compiles hundreds of tiny programs and runs each a few times, so compile time is what it spends:
``JAX_DISABLE_MOST_OPTIMIZATIONS`` skips XLA's optimisation passes (numerics are unchanged, programs are just not
fused as hard), the CPU backend's compile-time extras are off (``tests/xla_test_flags.py``), and one persistent
compilation cache per session lets identical programs (the same tiny model in several tests, every train.py a
test starts) compile once. The garbage collector's full passes are kept to what each test module leaves (see
``pytest_runtest_teardown``). All of it reaches the subprocesses tests start through the environment (xdist's
workers too: they inherit the flags and add none twice); the JAX_* settings may be set by the caller to override.
"""

import atexit
import gc
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.xla_test_flags import refused, xla_flags_for  # noqa: E402  (jax-free)

_given = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_given, *(f for f in xla_flags_for(8).split() if f not in _given.split())]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# The tests' image folders stay out of the home's decoded-image cache (data/image_cache.py); the cache's own tests
# (test_image_folder.py) turn it on in a temporary cache home.
os.environ.setdefault("NEOMESH_IMAGE_CACHE", "0")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # pytest-xdist workers inherit the controller's
    _cache = tempfile.mkdtemp(prefix="neomesh-test-jax-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_report_header(config):
    if refused():
        return f"XLA flags this jaxlib does not know, left out of the tests' XLA_FLAGS: {' '.join(refused())}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test module (its fixtures finalized): collect its garbage, then freeze what survives. A test process
    holds a million long-lived objects (TensorFlow, torch, jax's caches), and each of Python's full collections
    walked them all: 20-30 s per worker over the suite; frozen, a full pass walks only what came after."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()
