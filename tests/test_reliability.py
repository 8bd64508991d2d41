"""Nothing lost, nothing silent: train.py as a user runs it, under kill -9 (mid-save), SIGTERM, a second run on
the same directory, a damaged checkpoint, a torn metrics line, a diverging learning rate and a full disk.

End-to-end (marked ``e2e``): each case launches train.py on a one-layer, 32-wide model on one CPU device, for a
few steps; they share a persistent compilation cache, and one reference run (``reference``) gives the exact
losses every resumed run must reproduce bit for bit. Checks that need no new process run the commands' main() in
this one against copies of the reference run.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

import predict
import train
from convert.__main__ import main as convert_main
from pretrained import load_run
from tests.common import ROOT, metrics_lines
from tests.xla_test_flags import xla_flags_for
from training.checkpoint import Checkpoints

pytestmark = pytest.mark.e2e

STEPS = 6
TINY = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_ctx": 16, "attention_types": [[["global"], 1]],
        "train_batch_size": 8, "eval_batch_size": 8, "eval_steps": 0, "sample_tokens": 0, "n_vocab": 257,
        "datasets": [["embedded", None, None, None]], "warmup_steps": 1, "lr_decay_end": 100,
        "train_steps": STEPS, "steps_per_checkpoint": 2, "res_dropout": 0.1}
TIMEOUT = 240


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One CPU device (fast to compile) and a compilation cache shared by every launch of this module."""
    env = dict(os.environ, XLA_FLAGS=xla_flags_for(1), JAX_PLATFORMS="cpu",
               PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def arguments(model_path, **changes) -> list[str]:
    args = ["--config", "configs/quickstart.json", "--model-path", str(model_path), "--no-progress"]
    for key, value in {**TINY, **changes}.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def launch(env, model_path, *extra, prefix=(), **changes) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "train.py", *arguments(model_path, **changes), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(env, model_path, *extra, prefix=(), **changes) -> tuple[int, str, str]:
    proc = launch(env, model_path, *extra, prefix=prefix, **changes)
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def rows(model_path, kind="train") -> list[dict]:
    with open(os.path.join(model_path, "metrics.jsonl")) as f:
        return [r for r in (json.loads(line, parse_constant=_no_bare_constants) for line in f) if r["kind"] == kind]


def _no_bare_constants(name):
    raise AssertionError(f"metrics.jsonl holds a bare {name}: not strict JSON")


def trajectory(model_path) -> list[tuple]:
    """What a resumed run must reproduce exactly: per step, loss, gradient norm and learning rate."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows(model_path)]


def checkpoint_steps(model_path) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(model_path, "checkpoints")) if n.isdigit())


def wait_for(condition, proc, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"train.py ended (exit {proc.returncode}) before {what}:\n{out}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """An uninterrupted run of STEPS steps with checkpoints at 2, 4 and 6: the trajectory to reproduce."""
    path = tmp_path_factory.mktemp("reference") / "run"
    code, out, err = run(env, path)
    assert code == 0, err[-3000:]
    assert checkpoint_steps(path) == [2, 4, 6] and [r[0] for r in trajectory(path)] == list(range(1, STEPS + 1))
    return path


def copy_of(reference, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(reference, target)
    return target


def test_kill_9_mid_save_then_resume_is_bit_identical(reference, tmp_path, env):
    path = tmp_path / "run"
    after = random.randrange(1, STEPS - 1)  # a random point: the first save in flight after this many steps
    proc = launch(env, path, steps_per_checkpoint=1)
    in_flight = lambda: glob.glob(str(path / "checkpoints" / "*.orbax-checkpoint-tmp*"))  # noqa: E731
    wait_for(lambda: metrics_lines(path) >= after and in_flight(), proc, f"a save in flight after step {after}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert in_flight(), "the kill was meant to land mid-save"
    killed_at = metrics_lines(path)
    code, out, err = run(env, path, steps_per_checkpoint=1)
    assert code == 0, err[-3000:]
    assert "took over the lock of a run that is gone" in out
    assert trajectory(path) == trajectory(reference), f"killed after {killed_at} rows (threshold {after})"


def test_damaged_checkpoint_falls_back_and_a_torn_metrics_line_is_dropped(reference, tmp_path, env, capsys):
    path = copy_of(reference, tmp_path)
    rng = random.Random(0)
    # Every data file: which arrays share a file depends on orbax's write order, and every reader must refuse.
    for data in glob.glob(str(path / "checkpoints" / "6" / "state" / "**" / "d" / "*"), recursive=True):
        blob = bytearray(open(data, "rb").read())
        for _ in range(8):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        open(data, "wb").write(blob)
    with open(path / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "kind": "tra')  # a run killed mid-write

    # Generation and export refuse the damaged checkpoint in one line.
    assert predict.main(["--model-path", str(path), "--prompt", "def "]) == 2
    assert convert_main(["export", str(path), str(tmp_path / "exported")]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and all(f"checkpoint {path}/checkpoints/6 is damaged" in e for e in errs), errs
    assert all(e.endswith(f"(train.py --model-path {path} --eval moves a damaged checkpoint to damaged_checkpoints/ "
                          "and evaluates the one before, which this command then reads)") for e in errs), errs
    assert not os.path.exists(tmp_path / "exported" / "model.safetensors")

    # Training falls back to checkpoint 4 and redoes 5 and 6 exactly; keep_checkpoints=1 still keeps 4, the
    # checkpoint it verified and resumed from.
    code, out, err = run(env, path, steps_per_checkpoint=1, keep_checkpoints=1)
    assert code == 0, err[-3000:]
    damaged = [line for line in out.splitlines() if "is damaged" in line]
    assert len(damaged) == 1 and damaged[0].startswith("warning: checkpoint 6 is damaged: "), out
    assert f"resumed from {path}/checkpoints at step 4" in out
    assert "dropped its torn last line" in out
    assert "Traceback" not in err
    assert trajectory(path) == trajectory(reference)
    assert checkpoint_steps(path) == [4, 6]
    assert len(glob.glob(str(path / "damaged_checkpoints" / "6-*"))) == 1


def test_diverging_run_skips_bad_steps_then_stops_without_a_non_finite_checkpoint(tmp_path, env):
    path = tmp_path / "run"
    code, out, err = run(env, path, lr=1e6, max_bad_steps=2, train_steps=30, steps_per_checkpoint=1)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: step ") and "2 steps in a row skipped" in lines[0]
    assert "update skipped (1 in a row" in out
    train_rows = rows(path)
    assert train_rows[-1]["skipped_steps"] >= 2 and train_rows[-1]["loss"] is None  # NaN written as null
    steps = checkpoint_steps(path)
    assert steps and steps[-1] < train_rows[-1]["step"]
    with Checkpoints(str(path), keep=1, read_only=True) as checkpoints:
        for step in steps:  # every checkpoint on disk restores finite and matches its checksums
            state = checkpoints.restore_params_verified(_abstract_params(checkpoints, step), step)
            assert all(bool(jnp.isfinite(p).all()) for p in jax.tree.leaves(state))


def _abstract_params(checkpoints, step):
    from config import from_dict
    from models import registry
    from parallel.state import sharded_abstract_params
    from pretrained import default_layout

    cfg, _ = from_dict(checkpoints.config(step))
    return sharded_abstract_params(lambda rngs: registry.build(cfg, rngs), default_layout())[1]


def test_sigterm_saves_the_current_step_and_a_second_run_is_refused(tmp_path, env, capsys):
    path = tmp_path / "run"
    proc = launch(env, path, train_steps=100_000, steps_per_checkpoint=1000)
    wait_for(lambda: metrics_lines(path) >= 2, proc, "two steps")

    # A second run on the same directory (here in this process) is one line.
    assert train.main(arguments(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}/run.lock: another run is using this model_path (pid {proc.pid}" in err[0]

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    last = rows(path)[-1]["step"]
    assert f"stopped by SIGTERM: saved the checkpoint of step {last} in {path}/checkpoints" in out
    assert checkpoint_steps(path) == [last]
    assert not os.path.exists(path / "run.lock")


def test_a_full_disk_is_one_line(tmp_path, env):
    path = tmp_path / "disk" / "run"
    path.parent.mkdir()
    tmpfs = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"', str(path.parent)]
    if shutil.which("unshare") and subprocess.run([*tmpfs, "true"], capture_output=True).returncode == 0:
        code, out, err = run(env, path, prefix=tmpfs)  # a 64 KiB disk: the first checkpoint does not fit
    else:
        os.makedirs(path)
        os.symlink("/dev/full", path / "metrics.jsonl")  # every write: ENOSPC
        code, out, err = run(env, path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-5000:]
    assert lines[0].startswith("error: ") and lines[0].endswith("No space left on device"), lines[0]


def test_device_memory_running_out_is_not_a_full_disk():
    """XLA says RESOURCE_EXHAUSTED for device memory as TensorStore does for a full disk: one line each, each
    named for what it is."""
    from neomesh.errors import one_line

    for xla in ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12.50GiB.",
                "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
                "(49.97G) exceeds available HBM (15.75G)."):
        line = one_line(RuntimeError(f"{xla}\nmore lines of the compiler's report"))
        assert line.startswith(f"out of device memory: {xla[len('RESOURCE_EXHAUSTED: '):-1]}; "), line
        assert "scan_layers" in line and "\n" not in line
    disk = RuntimeError('RESOURCE_EXHAUSTED: Failed writing: "/run/checkpoints/5/x" [OS error: No space left on '
                        'device]')
    assert one_line(disk) == "/run/checkpoints/5/x: No space left on device"


def test_resume_mistakes_and_finished_runs_say_so_in_one_line(reference, tmp_path, capsys):
    path = copy_of(reference, tmp_path)
    for changes, expected in [(dict(n_embd=64), "error: n_embd: the checkpoint at step 6"),
                              (dict(opt_name="adafactor"), "error: opt_name: the checkpoint at step 6")]:
        assert train.main(arguments(path, **changes)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(expected) and "orbax" not in err[0], err
    assert train.main([*arguments(path, train_steps=8), "--stop-at-step", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: --stop-at-step: 5 is not after the run's step 6"
    assert "mesh" not in captured.out  # refused before the mesh, data and model are built

    assert train.main(arguments(path, sample_tokens=8)) == 0  # finished: says so, samples nothing
    out = capsys.readouterr().out
    assert f"the run in {path} is finished: step 6 of train_steps 6" in out and "sample:" not in out

    for _ in range(2):  # a second --eval of the same step does not append a second row
        assert train.main([*arguments(path, eval_steps=1), "--eval"]) == 0
    out = capsys.readouterr().out
    assert "already has the eval of step 6; not appended" in out
    assert train.main([*arguments(path, eval_steps=2), "--eval"]) == 0  # other settings: other numbers
    line = capsys.readouterr().out.strip().splitlines()[-1]
    (stored,) = rows(path, "eval")
    assert line.startswith("eval at step 6: loss ") and line.endswith(
        f"(not appended: metrics.jsonl already has an eval of step 6 that differs, loss {stored['loss']:.4f}  "
        f"perplexity {stored['perplexity']:.4f}  bits_per_byte {stored['bits_per_byte']:.4f}: it was made with "
        "other eval settings, data or model)"), line
    assert [r["step"] for r in rows(path, "eval")] == [6]
    assert [r["step"] for r in rows(path)] == list(range(1, STEPS + 1))


def test_an_eval_a_kill_cut_short_is_done_on_resume(reference, tmp_path, env, capsys):
    """A step's checkpoint is saved before its eval runs: kill -9 during that eval leaves the checkpoint and no eval
    row, and the resumed run (training on from there, or finished) never wrote the row."""
    finished = copy_of(reference, tmp_path)  # what a kill during the final eval leaves: no eval row at step 6
    assert train.main(arguments(finished, eval_steps=1)) == 0
    out = capsys.readouterr().out
    assert "step 6: eval loss " in out and f"the run in {finished} is finished" in out, out
    assert [r["step"] for r in rows(finished, "eval")] == [6]
    assert train.main(arguments(finished, eval_steps=1)) == 0  # done once: the second run only says finished
    assert "step 6: eval" not in capsys.readouterr().out
    assert [r["step"] for r in rows(finished, "eval")] == [6]

    mid = tmp_path / "mid"  # killed during the eval of step 4 (eval_every 4): resumes at 4, evaluates it, trains on
    shutil.copytree(reference, mid)
    shutil.rmtree(mid / "checkpoints" / "6")
    code, out, err = run(env, mid, eval_steps=1, eval_every=4)  # on the reference's one device: bit for bit
    assert code == 0 and "step 4: eval loss " in out, err[-3000:]
    assert [r["step"] for r in rows(mid, "eval")] == [4, 6]
    assert trajectory(mid) == trajectory(reference)


def test_ctrl_c_during_an_eval_stops_at_its_step_with_a_checkpoint(reference, tmp_path, capsys, monkeypatch):
    """SIGINT while step 7 is evaluated (not a checkpoint step): the run saves step 7 and stops there, exit 130. It
    trained step 8 first and saved that."""
    path = copy_of(reference, tmp_path)
    said = train.eval_text

    def eval_text_then_ctrl_c(result):
        os.kill(os.getpid(), signal.SIGINT)
        return said(result)

    monkeypatch.setattr(train, "eval_text", eval_text_then_ctrl_c)
    assert train.main(arguments(path, train_steps=10, steps_per_checkpoint=100, eval_steps=1, eval_every=7)) == 130
    out = capsys.readouterr().out
    assert "step 7: eval loss " in out and f"stopped by SIGINT: saved the checkpoint of step 7 in {path}" in out, out
    assert max(checkpoint_steps(path)) == 7 and rows(path)[-1]["step"] == 7


def test_a_checkpoint_rotated_away_while_read_is_no_damage(reference, tmp_path, capsys, monkeypatch):
    """predict.py on a run in progress picks its newest checkpoint; the run saves the next and its keep_checkpoints
    rotation deletes the one being read: generation goes on with the newer one, never calls the run damaged."""
    path = copy_of(reference, tmp_path)
    aside = tmp_path / "6"
    shutil.move(path / "checkpoints" / "6", aside)  # 4 is the newest when predict.py looks
    read_config = Checkpoints.config

    def run_saves_6_and_rotates_4_away(self, step=None):
        if step == 4 and os.path.isdir(path / "checkpoints" / "4"):
            shutil.move(aside, path / "checkpoints" / "6")
            shutil.rmtree(path / "checkpoints" / "4")
        return read_config(self, step)

    monkeypatch.setattr(Checkpoints, "config", run_saves_6_and_rotates_4_away)
    assert predict.main(["--model-path", str(path), "--prompt", "def ", "--max-new-tokens", "2"]) == 0, \
        capsys.readouterr().err
    assert "damaged" not in capsys.readouterr().err


def test_a_run_whose_checkpoints_were_all_damaged_does_not_start_over_unasked(reference, tmp_path, capsys):
    """Once every checkpoint was moved to damaged_checkpoints/, running the command again started a fresh run in
    the directory, dropping its metrics.jsonl rows: it says what the first run said, --new."""
    path = copy_of(reference, tmp_path)
    before = (path / "metrics.jsonl").read_text()
    (path / "damaged_checkpoints").mkdir()
    for step in (2, 4, 6):  # what a run that found each of them damaged left
        shutil.move(path / "checkpoints" / str(step), path / "damaged_checkpoints" / f"{step}-20260101-000000")
    assert train.main(arguments(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: model_path: no usable checkpoint in {path}/checkpoints "
                                               "(every one was damaged") and "--new" in err[0], err
    assert (path / "metrics.jsonl").read_text() == before


def test_a_run_whose_checkpoints_are_gone_does_not_start_over_unasked(reference, tmp_path, capsys):
    """checkpoints/ deleted (or on a disk that is not mounted) after the run got past its first save: starting
    from step 0 rewrote metrics.jsonl without its rows, without a word."""
    path = copy_of(reference, tmp_path)
    before = (path / "metrics.jsonl").read_text()
    shutil.rmtree(path / "checkpoints")
    assert train.main(arguments(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: model_path: {path}/metrics.jsonl has rows up to step 6, "
                                               f"but {path}/checkpoints holds no checkpoint") and "--new" in err[0]
    assert (path / "metrics.jsonl").read_text() == before
    shutil.rmtree(path / "checkpoints", ignore_errors=True)
    (path / "checkpoints").write_text("")  # a file where the folder was: said so, not "deleted?"
    assert train.main(arguments(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"but {path}/checkpoints is a file, not a folder;" in err[0], err


def test_a_finished_run_whose_checkpoints_are_gone_does_not_start_over_unasked(tmp_path, capsys):
    """A run shorter than two checkpoint intervals started over once checkpoints/ was gone (a run killed before
    its first save committed should): one that trained to its end had waited for its last save."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 5.0}) + "\n"
                                                for s in (1, 2, 3)))
    assert train.main(arguments(path, train_steps=3)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: model_path: {path}/metrics.jsonl has rows up to step 3, "), err
    assert len((path / "metrics.jsonl").read_text().splitlines()) == 3


def test_generation_and_export_refuse_non_finite_weights(reference, tmp_path, capsys):
    path = copy_of(reference, tmp_path)
    cfg, _, params = load_run(str(path))
    nan_params = jax.tree.map(lambda p: p * jnp.nan, params)
    with Checkpoints(str(path), keep=5) as checkpoints:  # written past the guard, as an older version could have
        checkpoints.manager.save(8, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": nan_params}),
                                                            config=ocp.args.JsonSave(cfg.to_dict())))
    assert predict.main(["--model-path", str(path), "--prompt", "def "]) == 2
    assert convert_main(["export", str(path), str(tmp_path / "exported")]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and all("holds NaN or infinity; refusing its weights" in e for e in errs), errs


def test_a_stop_python_drops_in_a_finalizer_is_raised_at_the_next_check(capsys):
    """Python runs a signal handler between any two bytecodes, a finalizer's or jax's garbage collector callback's
    too, and drops what is raised there: a Ctrl-C at start-up was lost that way, and the run trained to its end. The
    stop is raised again at the next check (arming, every step), without Python's 'Exception ignored' message."""
    from training.stop_signals import StopNow, StopSignals

    signals = StopSignals(multi_process=False)

    class Finalized:
        def __del__(self):
            signals._handle(signal.SIGINT, None)

    signals.install()
    try:
        Finalized()  # unreferenced at once: its finalizer runs, and Python drops the StopNow raised in it
        assert signals.phase == "before"
        with pytest.raises(StopNow, match="^stopped by SIGINT before the first step; nothing to save$"):
            signals.arm()
        signals.phase, signals.pending = "training", None
        signals._handle(signal.SIGINT, None)  # the first signal in training waits for the step's checkpoint
        assert signals.should_stop(1, None) and signals.exit_code == 130
        Finalized()  # the second stops at once; dropped, at the next step
        with pytest.raises(StopNow, match="again, before the checkpoint was written"):
            signals.should_stop(2, None)
    finally:
        signals.uninstall()
    assert "Exception ignored" not in capsys.readouterr().err
