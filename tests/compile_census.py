"""Where the suite's compile time goes: a pytest plugin that sums jax's own compile events (``jax.monitoring``:
tracing, lowering to MLIR, XLA's compile) per jitted function and per test, over every test process, and prints
the largest at the end.

    python -m pytest tests -q -n 2 -p tests.compile_census

Only compiles in the test processes count (not those of the train.py subprocesses some tests start); a test's
row is the wall time its compiles took. Not loaded unless asked for.
"""

from __future__ import annotations

import collections
import json
import re

import pytest

STAGES = {"jaxpr_trace_duration": "trace", "jaxpr_to_mlir_module_duration": "lower",
          "backend_compile_duration": "compile"}
SHOWN = 15


class Census:
    """Seconds per (jitted function, stage), XLA compiles per function, and seconds per test."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()  # (function, stage) -> seconds
        self.compiles: collections.Counter = collections.Counter()  # function -> XLA compiles
        self.by_test: collections.Counter = collections.Counter()  # test id -> seconds of all stages
        self.test = "(outside a test)"

    def heard(self, event: str, duration: float, **kwargs) -> None:
        """A ``jax.monitoring`` duration event; the compile stages are counted."""
        stage = STAGES.get(event.rsplit("/", 1)[-1])
        if stage is None or not event.startswith("/jax/core/compile/"):
            return
        function = re.sub(r"^jit\((.*)\)$", r"\1", str(kwargs.get("fun_name", "?")))
        self.seconds[function, stage] += duration
        self.compiles[function] += stage == "compile"
        self.by_test[self.test] += duration

    def tally(self) -> str:
        """This process's counts as JSON, for the process that reports."""
        return json.dumps({"seconds": [[f, s, v] for (f, s), v in self.seconds.items()],
                           "compiles": dict(self.compiles), "by_test": dict(self.by_test)})

    def merge(self, tally: str) -> None:
        """Adds another process's ``tally``."""
        other = json.loads(tally)
        for function, stage, value in other["seconds"]:
            self.seconds[function, stage] += value
        self.compiles.update(other["compiles"])
        self.by_test.update(other["by_test"])

    def table(self) -> list[str]:
        """Totals per stage, then the functions and the tests that took the most."""
        totals = {stage: sum(v for (_, s), v in self.seconds.items() if s == stage) for stage in STAGES.values()}
        functions: collections.Counter = collections.Counter()
        for (function, _), value in self.seconds.items():
            functions[function] += value
        lines = [f"compile census: {sum(self.compiles.values())} XLA compiles; " +
                 ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in totals.items()),
                 f"{'function':<40} {'compiles':>8} {'trace s':>8} {'lower s':>8} {'compile s':>9}"]
        for function, _ in functions.most_common(SHOWN):
            lines.append(f"{function[:40]:<40} {self.compiles[function]:>8} {self.seconds[function, 'trace']:>8.1f} "
                         f"{self.seconds[function, 'lower']:>8.1f} {self.seconds[function, 'compile']:>9.1f}")
        lines.append(f"{'test':<88} {'all stages s':>12}")
        lines += [f"{test[-88:]:<88} {seconds:>12.1f}" for test, seconds in self.by_test.most_common(SHOWN)]
        return lines


_census = Census()
_listening = []


def pytest_configure(config):
    import jax.monitoring

    if not _listening:  # one listener per process, however often pytest configures in it
        jax.monitoring.register_event_duration_secs_listener(_census.heard)
        _listening.append(True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _census.test = item.nodeid
    yield
    _census.test = "(outside a test)"


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput["compile_census"] = _census.tally()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    tally = getattr(node, "workeroutput", {}).get("compile_census")
    if tally:
        _census.merge(tally)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    terminalreporter.section("compile census")
    for line in _census.table():
        terminalreporter.write_line(line)
