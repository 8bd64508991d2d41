"""The XLA flags and the compilation cache train.py and predict.py set before jax starts."""

import os

import jax
import jax.numpy as jnp
import pytest

from parallel.xla_flags import (CACHE_MAX_BYTES, DEFAULT_XLA_FLAGS, GPU_MEMORY_FRACTION, GPU_STEP_OPTIONS,
                               apply_defaults, step_options, with_defaults)


def test_xla_flag_defaults_keep_the_users_values():
    mine = "--xla_force_host_platform_device_count=8 --xla_gpu_enable_latency_hiding_scheduler=false"
    flags = with_defaults(mine).split()
    assert flags[:2] == mine.split()  # the user's flags first and unchanged
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert len(flags) == 2 + len(DEFAULT_XLA_FLAGS) - 1
    environ = {"NEOMESH_XLA_DEFAULTS": "0", "XLA_FLAGS": mine}
    apply_defaults(environ)
    assert environ["XLA_FLAGS"] == mine and "XLA_CLIENT_MEM_FRACTION" not in environ
    environ = {}
    apply_defaults(environ)
    assert sorted(f.split("=")[0].lstrip("-") for f in environ["XLA_FLAGS"].split()) == sorted(DEFAULT_XLA_FLAGS)
    assert float(environ["XLA_CLIENT_MEM_FRACTION"]) == GPU_MEMORY_FRACTION  # XLA's own default is 0.75
    names = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    for given, other in (names, names[::-1]):  # the user's fraction, under either name, and never both (jax refuses)
        environ = {given: "0.5"}
        apply_defaults(environ)
        assert environ[given] == "0.5" and other not in environ


def test_the_steps_own_options_apply_on_gpus_unless_the_user_sets_them_or_turns_defaults_off():
    environ = {}
    apply_defaults(environ, compilation_cache=False)  # the process-wide defaults leave the steps' options alone
    assert step_options("gpu", environ) == GPU_STEP_OPTIONS
    assert step_options("cpu", environ) == step_options("tpu", environ) == {}
    name = next(iter(GPU_STEP_OPTIONS))
    assert name not in step_options("gpu", {"XLA_FLAGS": f"--{name}=true --xla_gpu_autotune_level=0"})
    assert step_options("gpu", {"NEOMESH_XLA_DEFAULTS": "0"}) == {}


def test_the_steps_gpu_options_are_ones_this_xla_compiles_with():
    square = lambda x: x @ x  # noqa: E731
    compiled = jax.jit(square, compiler_options=GPU_STEP_OPTIONS).lower(jnp.ones((4, 4))).compile()
    assert compiled(jnp.ones((4, 4)))[0, 0] == 4
    misspelt = {name[:-1]: value for name, value in GPU_STEP_OPTIONS.items()}
    with pytest.raises(Exception, match="No such compile option"):  # what a renamed option would meet
        jax.jit(square, compiler_options=misspelt).lower(jnp.ones((4, 4))).compile()


def test_the_compilation_cache_defaults_to_the_users_cache_directory_unless_chosen_or_off(tmp_path, monkeypatch):
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    apply_defaults(environ)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "neomesh" / "jax")
    assert os.path.isdir(tmp_path / "neomesh" / "jax")
    assert environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(CACHE_MAX_BYTES)
    assert environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"  # jax's 1 s kept a run's small programs out
    environ = {"XDG_CACHE_HOME": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}
    apply_defaults(environ)
    assert environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no XDG_CACHE_HOME: ~/.cache
    environ = {}
    apply_defaults(environ)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "home" / ".cache" / "neomesh" / "jax")
    for given in ({"JAX_COMPILATION_CACHE_DIR": "/mine"}, {"NEOMESH_COMPILATION_CACHE": "0"}):
        environ = dict(given)
        apply_defaults(environ)
        assert environ.get("JAX_COMPILATION_CACHE_DIR") == given.get("JAX_COMPILATION_CACHE_DIR")
    (tmp_path / "file").write_text("")  # a cache home that cannot hold the directory: no cache, no warnings
    environ = {"XDG_CACHE_HOME": str(tmp_path / "file")}
    apply_defaults(environ)
    assert "JAX_COMPILATION_CACHE_DIR" not in environ
    environ = {}
    apply_defaults(environ, compilation_cache=False)  # the benchmarks: every compile timed cold
    assert "JAX_COMPILATION_CACHE_DIR" not in environ and "XLA_FLAGS" in environ


def test_with_jax_already_imported_the_cache_goes_through_jax_config(tmp_path):
    """A notebook imports jax before train.main: jax read its environment then, so the default reaches jax's
    config directly."""
    import jax

    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    saved = dict(os.environ)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE", "NEOMESH_COMPILATION_CACHE",
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        os.environ.pop(name, None)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)  # jax's default
    try:
        apply_defaults()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "neomesh" / "jax")
        assert jax.config.jax_compilation_cache_max_size == CACHE_MAX_BYTES
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    finally:  # this process's environment and jax config as they were (the suite's own cache)
        os.environ.clear()
        os.environ.update(saved)
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_compilation_cache_max_size", before[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[2])


def test_flags_this_xla_does_not_know_are_found_before_they_end_a_process():
    """XLA quits a process on an unknown XLA_FLAGS entry (under pytest's capture without a word): the suite's
    compile-speed flags are tried against the installed XLA first, and an unknown one is left out."""
    from parallel.xla_flags import known_flags

    known = "--xla_cpu_parallel_codegen_split_count=1"
    assert known_flags(["--xla_no_such_flag_anywhere=1", known]) == [known]


def test_the_train_and_eval_steps_compile_with_the_step_options(monkeypatch):
    """make_train_step and make_eval_step hand ``step_options`` of their layout's platform to XLA (on GPUs: cuBLAS
    for their matmuls): an option this XLA does not know stops both compiles."""
    from models import registry
    from parallel import steps
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import abstract_train_state
    from tests.common import tiny_config
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer

    seen = []
    monkeypatch.setattr(steps, "step_options", lambda platform: seen.append(platform) or {"xla_no_such_option": 1})
    cfg = tiny_config(n_layer=1, attention_types=None)
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    tx, objective = make_optimizer(cfg), objective_for(cfg)
    graphdef, abstract, shardings = abstract_train_state(lambda rngs: registry.build(cfg, rngs), tx, layout)
    shapes = steps.batch_shapes(objective, cfg, cfg.train_batch_size)
    data = steps.batch_shardings(layout, objective, shapes)
    batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=data[name]) for name, shape in shapes.items()}
    train = steps.make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data)
    evaluate = steps.make_eval_step(graphdef, objective, layout, shardings.params, data)
    for lowered in (train.lower(abstract, batch), evaluate.lower(abstract.params, batch)):
        with pytest.raises(Exception, match="No such compile option"):
            lowered.compile()
    assert seen == ["cpu", "cpu"]
