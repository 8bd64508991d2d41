"""python -m tools.plot: one PNG comparing runs, a curve per run and quantity, read from metrics.jsonl."""

import json
import os

import pytest

from tests.common import run_command


def fake_run(directory, steps: int, eval_every: int, experts: bool = False, torn: bool = True):
    """A run directory whose metrics.jsonl holds what train.py writes (train rows, eval rows with a task) and, with
    ``torn``, the torn last line of a run killed mid-write."""
    directory.mkdir()
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "kind": "train", "loss": 7.0 - step * 0.1, "lr": 1e-3 * min(1, step / 3),
               "grad_norm": 1.0, "tokens_per_sec": 5000.0 + step, "mfu": None, "skipped_steps": 0}
        if experts:
            row.update(aux_loss=1.0 + 0.01 * step, z_loss=0.1)
        rows.append(row)
        if step % eval_every == 0:
            rows.append({"step": step, "kind": "eval", "loss": 7.2 - step * 0.1, "lambada_acc": 0.01 * step})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + ('{"torn' if torn else ""))
    return str(directory)


def test_two_runs_on_one_figure(tmp_path):
    from tools.plot import plot_runs

    a, b = fake_run(tmp_path / "a", 20, 5), fake_run(tmp_path / "b", 12, 4, experts=True)
    out = tmp_path / "curves.png"
    figure = plot_runs([a, b], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    assert set(panels) == {"loss (nats per token)", "learning rate", "tokens per second",
                           "evaluation tasks (accuracy)", "experts' auxiliary losses"}
    lines = lambda title: sorted(line.get_label() for line in panels[title].get_lines())  # noqa: E731
    assert lines("loss (nats per token)") == ["a eval", "a train", "b eval", "b train"]
    assert lines("learning rate") == ["a", "b"]
    assert lines("experts' auxiliary losses") == ["b load balance", "b router z"]  # only b has experts
    eval_a = next(line for line in panels["loss (nats per token)"].get_lines() if line.get_label() == "a eval")
    assert list(eval_a.get_xdata()) == [5, 10, 15, 20]


def test_a_run_given_by_its_metrics_file(tmp_path):
    """A shell's completion names the file: it was 'run/metrics.jsonl: no metrics.jsonl'."""
    from tools.plot import plot_runs

    run = fake_run(tmp_path / "a", 6, 3)
    figure = plot_runs([os.path.join(run, "metrics.jsonl")], str(tmp_path / "curves.png"))
    assert {line.get_label() for ax in figure.axes for line in ax.get_lines()} >= {"a train", "a eval"}


def test_command_line_and_its_mistakes(tmp_path):
    run = fake_run(tmp_path / "run", 6, 3)
    out = tmp_path / "out.png"
    result = run_command("-m", "tools.plot", run, "-o", str(out), "--names", "mine")
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000 and f"wrote {out}" in result.stdout
    missing = run_command("-m", "tools.plot", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "error: " in missing.stderr and "no metrics.jsonl" in missing.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    empty = run_command("-m", "tools.plot", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "metrics.jsonl holds no rows yet" in empty.stderr
    with pytest.raises(SystemExit):
        from tools.plot import main
        main([run, "--names", "a", "b"])
    for out, message in [(tmp_path / "curves.jpgx", "the picture's type comes from its extension, one of"),
                         (tmp_path, "is a directory")]:
        wrong = run_command("-m", "tools.plot", run, "-o", str(out))
        assert wrong.returncode == 2 and f"error: -o {out}: {message}" in wrong.stderr, wrong.stderr
    assert sorted(os.listdir(tmp_path)) == ["empty", "out.png", "run"]  # written whole: no temporary left


def test_the_installed_command_names_itself_in_its_usage(monkeypatch, capsys):
    from tools.plot import main

    monkeypatch.setattr("sys.argv", ["/venv/bin/neomesh-plot"])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: neomesh-plot ")
    monkeypatch.setattr("sys.argv", ["/repo/tools/plot.py"])  # python -m tools.plot
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m tools.plot ")


def test_without_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    """requirements.txt leaves matplotlib out (the [plot] extra): the command said so in a traceback."""
    from tools.plot import main

    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # importing it raises ImportError
    assert main([fake_run(tmp_path / "a", 4, 2), "-o", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err == ("error: tools.plot draws with matplotlib, which is not installed: pip install "
                                       "matplotlib (or NeoMesh's [plot] extra)\n")


def test_lines_that_are_not_rows_are_skipped_with_a_note(tmp_path, capsys):
    """Garbage lines in metrics.jsonl left gaps in the curves without a word."""
    from tools.plot import read_run

    torn = fake_run(tmp_path / "torn", 4, 2)  # 6 rows, then the torn line 7
    assert len(read_run(torn)["train"]) == 4
    assert capsys.readouterr().err == f"note: {torn}/metrics.jsonl: skipped line 7 (not a whole JSON row)\n"
    garbage = fake_run(tmp_path / "garbage", 4, 2, torn=False)
    lines = (tmp_path / "garbage" / "metrics.jsonl").read_text().splitlines()
    lines[1:1] = ["garbage", '{"kind": "train"}']  # lines 2 and 3; a row without a step is not one either
    (tmp_path / "garbage" / "metrics.jsonl").write_text("\n".join(lines + ["[1, 2]"]) + "\n")
    assert len(read_run(garbage)["train"]) == 4
    assert capsys.readouterr().err == (f"note: {garbage}/metrics.jsonl: skipped 3 lines that are not whole JSON rows "
                                       "(the first: line 2)\n")
    assert read_run(fake_run(tmp_path / "whole", 4, 2, torn=False)) and capsys.readouterr().err == ""


def test_a_picture_that_cannot_be_written_names_the_users_path(tmp_path, monkeypatch, capsys):
    """The error named the temporary file (y.png.tmp), which the user never gave."""
    import errno

    from matplotlib.figure import Figure

    from tools.plot import main

    run = fake_run(tmp_path / "run", 4, 2, torn=False)
    out = tmp_path / "missing" / "y.png"
    assert main([run, "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"error: -o {out}: no such folder {tmp_path / 'missing'}\n"

    def disk_full(self, path, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(Figure, "savefig", disk_full)
    out = tmp_path / "y.png"
    assert main([run, "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"error: -o {out}: No space left on device\n"
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no half-written picture left
