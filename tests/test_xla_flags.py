"""The XLA flags and the compilation cache train.py and predict.py set before jax starts."""

import os

from parallel.xla_flags import CACHE_MAX_BYTES, DEFAULT_XLA_FLAGS, apply_defaults, with_defaults


def test_xla_flag_defaults_keep_the_users_values():
    mine = "--xla_force_host_platform_device_count=8 --xla_gpu_enable_latency_hiding_scheduler=false"
    flags = with_defaults(mine).split()
    assert flags[:2] == mine.split()  # the user's flags first and unchanged
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert len(flags) == 2 + len(DEFAULT_XLA_FLAGS) - 1
    environ = {"NEOMESH_XLA_DEFAULTS": "0", "XLA_FLAGS": mine}
    apply_defaults(environ)
    assert environ["XLA_FLAGS"] == mine
    environ = {}
    apply_defaults(environ)
    assert sorted(f.split("=")[0].lstrip("-") for f in environ["XLA_FLAGS"].split()) == sorted(DEFAULT_XLA_FLAGS)


def test_the_compilation_cache_defaults_to_the_users_cache_directory_unless_chosen_or_off():
    environ = {"XDG_CACHE_HOME": "/somewhere"}
    apply_defaults(environ)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == os.path.join("/somewhere", "neomesh", "jax")
    assert environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(CACHE_MAX_BYTES)
    environ = {}
    apply_defaults(environ)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == os.path.join(os.path.expanduser("~"), ".cache", "neomesh", "jax")
    for given in ({"JAX_COMPILATION_CACHE_DIR": "/mine"}, {"NEOMESH_COMPILATION_CACHE": "0"}):
        environ = dict(given)
        apply_defaults(environ)
        assert environ.get("JAX_COMPILATION_CACHE_DIR") == given.get("JAX_COMPILATION_CACHE_DIR")
    environ = {}
    apply_defaults(environ, compilation_cache=False)  # the benchmarks: every compile timed cold
    assert "JAX_COMPILATION_CACHE_DIR" not in environ and "XLA_FLAGS" in environ
