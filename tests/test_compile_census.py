"""tests/compile_census.py, the plugin that says where the suite's compile time goes."""

import subprocess
import sys

from tests.common import ROOT
from tests.compile_census import Census

TESTS = '''
import jax
import jax.numpy as jnp


def test_doubles():
    assert int(jax.jit(lambda x: 2 * x)(jnp.int32(3))) == 6


def test_squares():
    def squared(x):
        return x * x

    assert int(jax.jit(squared)(jnp.int32(3))) == 9
    assert int(jax.jit(squared)(jnp.int32(4))) == 16  # the same program: one compile
'''


def function_rows(lines: list[str]) -> dict[str, list[str]]:
    """{function: [compiles, trace s, lower s, compile s]} from the census table's lines."""
    start = next(i for i, line in enumerate(lines) if line.startswith("function ")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("test "))
    return {line.split()[0]: line.split()[1:] for line in lines[start:end]}


def test_the_census_names_each_jitted_function_and_test_with_its_compiles(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TESTS)
    result = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_tiny.py"), "-q",
                             "-p", "tests.compile_census", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = function_rows(lines)
    assert rows["squared"][0] == "1" and rows["<lambda>"][0] == "1", result.stdout
    assert any(line.startswith("compile census: ") for line in lines), result.stdout
    assert any("test_tiny.py::test_squares" in line for line in lines), result.stdout


def test_a_worker_tally_adds_to_the_reporting_process():
    """Under xdist each worker hands its counts to the controller, which reports their sum."""
    worker, controller = Census(), Census()
    for census, test in ((worker, "a.py::test_one"), (controller, "b.py::test_two")):
        census.test = test
        census.heard("/jax/core/compile/jaxpr_trace_duration", 0.5, fun_name="train_step")
        census.heard("/jax/core/compile/backend_compile_duration", 1.5, fun_name="jit(train_step)")
        census.heard("/jax/checkpoint/write/duration_secs", 9.0)  # not a compile stage
    controller.merge(worker.tally())
    lines = controller.table()
    assert lines[0] == "compile census: 2 XLA compiles; trace 1.0 s, lower 0.0 s, compile 3.0 s"
    assert function_rows(lines) == {"train_step": ["2", "1.0", "0.0", "3.0"]}
    tests = {line.split()[0]: line.split()[1] for line in lines if "::" in line}
    assert tests == {"a.py::test_one": "2.0", "b.py::test_two": "2.0"}
