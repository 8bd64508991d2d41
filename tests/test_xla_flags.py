"""The XLA flags train.py and predict.py set before jax starts."""

from parallel.xla_flags import DEFAULT_XLA_FLAGS, apply_defaults, with_defaults


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
