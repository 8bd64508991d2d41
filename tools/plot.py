"""Loss curves: ``python -m tools.plot RUN_DIR [RUN_DIR ...] [-o curves.png]``.

Reads each run's ``metrics.jsonl`` and draws one figure with a panel per quantity the runs logged: train and
eval loss, learning rate, tokens per second, the evaluation tasks' accuracies (LAMBADA, multiple choice) and,
for mixture-of-experts runs, the load-balancing and router z-losses. Runs share the panels, one colour each, so
they compare at a glance; eval points are marked. Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import os
import sys

# (panel title, [(kind, metric, label suffix, line style)]): a panel is drawn when any run logged one of them.
PANELS = [
    ("loss (nats per token)", [("train", "loss", "train", "-"), ("eval", "loss", "eval", "--")]),
    ("learning rate", [("train", "lr", "", "-")]),
    ("tokens per second", [("train", "tokens_per_sec", "", "-")]),
    ("evaluation tasks (accuracy)", [("eval", "lambada_acc", "lambada", "--"), ("eval", "choice_acc", "choice", ":")]),
    ("experts' auxiliary losses", [("train", "aux_loss", "load balance", "-"), ("train", "z_loss", "router z", ":")]),
]


def read_run(run_dir: str) -> dict[str, list[dict]]:
    """{"train": rows, "eval": rows} of a run directory's metrics.jsonl (a one-line error if there is none)."""
    from config import ConfigError
    from training.metrics import read_rows

    path = run_dir if is_metrics_file(run_dir) else os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir}: no metrics.jsonl (not a run directory, or nothing trained yet)")
    rows, bad = read_rows(path)
    if bad:  # a run killed mid-write, or a file edited by hand: the curves lack those rows
        print(f"note: {path}: skipped line {bad[0]} (not a whole JSON row)" if len(bad) == 1 else
              f"note: {path}: skipped {len(bad)} lines that are not whole JSON rows (the first: line {bad[0]})",
              file=sys.stderr)
    return {kind: [r for r in rows if r.get("kind") == kind] for kind in ("train", "eval")}


def is_metrics_file(run: str) -> bool:
    """Whether ``run`` names a run's metrics.jsonl itself (as a shell's completion gives it) rather than the run."""
    return os.path.basename(run) == "metrics.jsonl" and os.path.isfile(run)


def run_name(run: str) -> str:
    """The legend's name of a run: its directory's, also when given by its metrics.jsonl."""
    run_dir = os.path.dirname(run) if is_metrics_file(run) else run
    return os.path.basename(os.path.normpath(run_dir)) or run_dir


def plot_runs(run_dirs: list[str], out: str, names: list[str] | None = None):
    """Draws the runs' curves into ``out`` (PNG, or any format matplotlib knows by the extension); returns the
    figure."""
    from config import ConfigError

    try:
        import matplotlib
    except ImportError:  # requirements.txt leaves it out: the [plot] extra
        raise ConfigError("tools.plot draws with matplotlib, which is not installed: pip install matplotlib (or "
                          "NeoMesh's [plot] extra)") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    kinds = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    picture = os.path.splitext(out)[1].lstrip(".").lower() or "png"  # no extension: a PNG, as matplotlib writes
    if os.path.isdir(out):
        raise ConfigError(f"-o {out}: is a directory; name the picture's file")
    folder = os.path.dirname(out)
    if folder and not os.path.isdir(folder):
        raise ConfigError(f"-o {out}: no such folder {folder}")
    if picture not in kinds:
        raise ConfigError(f"-o {out}: the picture's type comes from its extension, one of .{', .'.join(sorted(kinds))}")
    names = names or [run_name(d) for d in run_dirs]
    runs = [read_run(d) for d in run_dirs]
    panels = [(title, curves) for title, curves in PANELS
              if any(row.get(metric) is not None for run in runs for kind, metric, _, _ in curves for row in run[kind])]
    if not panels:
        raise ConfigError(f"{', '.join(run_dirs)}: metrics.jsonl holds no rows yet: nothing to plot")
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 3.6 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, curves) in zip(axes.flat, panels):
        for index, (name, run) in enumerate(zip(names, runs)):
            for kind, metric, suffix, style in curves:
                points = [(r["step"], r[metric]) for r in run[kind] if r.get(metric) is not None]
                if points:
                    steps, values = zip(*points)
                    ax.plot(steps, values, style, color=colours[index % len(colours)],
                            marker="o" if kind == "eval" else None, markersize=4,
                            label=" ".join(p for p in (name, suffix) if p))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.tight_layout()
    save_whole(figure, out, picture)
    plt.close(figure)
    return figure


def save_whole(figure, out: str, picture: str) -> None:
    """Writes the picture whole or not at all (a temporary file, renamed); a failure names ``out``, the file the
    user asked for, not the temporary one."""
    from config import ConfigError

    tmp = out + ".tmp"
    try:
        figure.savefig(tmp, dpi=110, format=picture)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.isfile(tmp):  # a half-written picture
            os.remove(tmp)
        raise ConfigError(f"-o {out}: {e.strerror or e}") from None


def main(argv=None) -> int:
    from neomesh.errors import run_main
    from neomesh.help import ArgumentParser

    command = os.path.basename(sys.argv[0])  # neomesh-plot when run as the installed command
    p = ArgumentParser(prog="python -m tools.plot" if command.endswith(".py") else command,
                       description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run directories (each with a metrics.jsonl), or their metrics.jsonl")
    p.add_argument("-o", "--output", default="curves.png", help="the picture to write (default: curves.png)")
    p.add_argument("--names", nargs="+", help="legend names, one per run (default: the directory names)")
    args = p.parse_args(argv)
    if args.names and len(args.names) != len(args.runs):
        p.error(f"--names: {len(args.names)} names for {len(args.runs)} runs")

    def run():
        plot_runs(args.runs, args.output, args.names)
        print(f"wrote {args.output}")

    return run_main(run)


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())
