"""What a run prints: a line every log_every steps without a terminal, and the closing summary."""

import io

import pytest

from config import ConfigError
from tests.common import tiny_config
from training.progress import Progress, format_duration, wants_bar


def run_steps(start, stop, log_every, seconds=0.1):
    lines = []
    progress = Progress(start, stop, total=stop, tokens_per_step=100, log_every=log_every, bar=False,
                        say=lines.append)
    for step in range(start + 1, stop + 1):
        progress.update(step, {"loss": 10.0 - step, "lr": 1e-3 * step}, seconds)
    return progress, lines


def test_lines_every_log_every_steps_and_at_the_first_and_last():
    _, lines = run_steps(0, 10, log_every=4)
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "8/10", "10/10"]
    assert lines[0].endswith("(compiling included)")
    step4 = lines[1].split()
    assert step4[step4.index("loss") + 1] == "6.0000" and step4[step4.index("lr") + 1] == "4.000e-03"
    assert step4[step4.index("tokens/s") + 1] == "1,000"  # 3 steps x 100 tokens in 0.3 s since the last line


def test_a_resumed_run_counts_from_where_it_resumed():
    _, lines = run_steps(6, 12, log_every=5)
    assert [line.split()[1] for line in lines] == ["7/12", "10/12", "12/12"]


def test_summary_names_losses_time_and_where_things_are():
    progress, _ = run_steps(0, 10, log_every=50)
    progress.compile_seconds = 5.0  # the first step compiled: left out of the rate
    progress.train_seconds = 5.0 + 9 * 0.1
    lines = progress.summary(10, {"loss": 2.5, "perplexity": 12.18, "lambada_examples": 330}, 10,
                             "runs/x/checkpoints/10", "runs/x")
    text = "\n".join(lines)
    assert lines[0].startswith("done: 10 steps (1..10) in ") and "1,000 tokens/s while training" in lines[0]
    assert "train loss 9.0000 -> 0.0000 over steps 1..10" in text
    assert "eval at step 10: loss 2.5000  perplexity 12.1800  lambada_examples 330\n" in text
    assert "checkpoint: runs/x/checkpoints/10" in text
    assert "runs/x/metrics.jsonl" in text and "tensorboard --logdir runs/x" in text
    assert progress.summary(10, None, None, None, "/tmp/neo run")[-1].endswith(
        "tensorboard --logdir '/tmp/neo run'")  # a command to paste, quoted


def test_a_finished_run_says_so():
    progress = Progress(400, 400, total=400, tokens_per_step=100, log_every=40, bar=False, say=print)
    assert progress.summary(0, None, None, None, "runs/x")[0] == "nothing to train: the run is at step 400 of 400"


def test_bar_only_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert wants_bar(no_progress=False, lead=True, stream=Terminal())
    assert not wants_bar(no_progress=False, lead=True, stream=io.StringIO())  # redirected to a file
    assert not wants_bar(no_progress=True, lead=True, stream=Terminal())
    assert not wants_bar(no_progress=False, lead=False, stream=Terminal())


def test_log_every_default_and_validation():
    assert tiny_config(train_steps=400).log_interval == 40
    assert tiny_config(train_steps=100_000).log_interval == 50
    assert tiny_config(train_steps=5).log_interval == 1
    assert tiny_config(train_steps=400, log_every=7).log_interval == 7
    with pytest.raises(ConfigError, match="log_every: 0 is below the minimum 1"):
        tiny_config(log_every=0)


def test_durations_read_naturally():
    assert [format_duration(s) for s in (4.25, 177, 3 * 3600 + 300)] == ["4.2s", "2m57s", "3h05m"]


def test_the_readme_says_what_the_logged_numbers_are():
    """metrics.jsonl's tokens_per_sec and the log lines' timing come from the loop's fetch windows; eval_tasks is
    evaluated (a stale sentence said it was not)."""
    import os
    import re

    from tests.common import ROOT
    from train import METRICS_FETCH_EVERY

    readme = re.sub(r"\s+", " ", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    assert f"fetches them from the device only every {METRICS_FETCH_EVERY} steps" in readme
    assert "`tokens_per_sec` and `mfu` are the mean over such a window" in readme
    assert "is when the line printed, not when its step ended" in readme
    assert "LAMBADA is not evaluated" not in readme
