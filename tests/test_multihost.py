"""train.py under jax.distributed: 2 processes x 4 CPU devices against 1 process x 8 CPU devices.

The main test runs ``train.py`` three times (the test process itself never initializes jax.distributed):

* a two-process run (subprocesses, 4 simulated devices each, gloo collectives, started with the environment
  SLURM's srun gives its tasks, on a data x FSDP x tensor layout whose parameter shards span both processes),
  stopped by a SIGTERM to one process after ``STEPS`` steps: both must stop at the same step, save it together
  and exit 0;
* a reference run, one process with 8 simulated devices (this test's own process, as ``tests.common.run_command``
  runs commands), one step further: the two-process run must have logged the same per-step train and eval losses;
* a single-process 8-device ``--resume`` of the two-process checkpoint (in this test's process again), which must
  match the reference's last step: its train loss is computed from the restored parameters, its eval loss after
  the update from the restored optimizer state and step.

The learning-rate schedule is pinned (``warmup_steps=1``, ``lr_decay_end``) so that it does not depend on
``train_steps`` and the runs of different lengths follow the same trajectory. The explicit ``--coordinator``
flags are exercised by the per-host input test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.xla_test_flags import xla_flags_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300  # seconds per train.py launch
TOLERANCE = 1e-5  # fp32 losses; only the order of the cross-device reductions differs
STEPS = 3

SMALL = {
    "n_layer": 2, "attention_types": [[["global", "local"], 1]], "local_attention_radius": 8,
    "n_embd": 64, "n_head": 4, "n_ctx": 32, "train_batch_size": 8, "eval_batch_size": 8,
    "eval_steps": 1, "eval_every": 1, "sample_tokens": 0, "precision": "float32",
    "warmup_steps": 1, "lr_decay_end": 16, "steps_per_checkpoint": 100,
}

# Data x FSDP x tensor on a 3-D mesh: the batch over x and y, parameters and optimizer state split over x (which
# spans both processes, so the checkpoint holds shards that only process 1 has), heads and the MLP over z.
MESH_SHAPE = "x:2,y:2,z:2"
LAYOUT = "batch:x+y,embd:x,heads:z,intermediate_expanded:z,activation_embd:none"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(model_path: str, mesh_shape: str, layout: str, steps: int, *extra: str) -> list[str]:
    settings = {**SMALL, "train_steps": steps, "mesh_shape": mesh_shape, "layout": layout}
    cmd = [sys.executable, "train.py", "--config", "configs/quickstart.json", "--model-path", model_path,
           "--no-progress"]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    return cmd + list(extra)


def environment(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags_for(devices)  # replaces conftest's 8
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(commands: list[list[str]], devices: int, envs: list[dict] | None = None) -> list[tuple[int, str, str]]:
    """Runs ``commands`` concurrently (``envs``: extra environment variables per command); if one fails or the
    deadline passes, the others are killed.

    Returns (returncode, stdout, stderr) per command; raises AssertionError with every process's output on a
    failure."""
    envs = envs or [{} for _ in commands]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env={**environment(devices), **extra}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for cmd, extra in zip(commands, envs)]
    # Drain the pipes in threads so a chatty process can never block on a full pipe.
    outputs: list[list[str]] = [["", ""] for _ in procs]

    def drain(i, which, stream):
        outputs[i][which] = stream.read()

    readers = [threading.Thread(target=drain, args=(i, w, s), daemon=True)
               for i, p in enumerate(procs) for w, s in ((0, p.stdout), (1, p.stderr))]
    for r in readers:
        r.start()
    deadline = time.monotonic() + TIMEOUT
    timed_out = False
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            timed_out = not failed
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    for p in procs:
        p.wait()
    for r in readers:
        r.join(timeout=30)
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
    if timed_out or any(code != 0 for code, _, _ in results):
        report = "\n".join(
            f"--- process {i}: exit {code}\n$ {' '.join(cmd)}\n[stdout]\n{out[-4000:]}\n[stderr]\n{err[-8000:]}"
            for i, (cmd, (code, out, err)) in enumerate(zip(commands, results)))
        why = f"timed out after {TIMEOUT} s" if timed_out else "failed"
        raise AssertionError(f"train.py {why}:\n{report}")
    return results


def run_to_the_end(commands: list[list[str]], envs: list[dict]) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of ``commands`` started together, each run to its own end (``launch`` stops
    the others at the first failure); none is left running past the deadline."""
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in zip(commands, envs)]
    try:
        outputs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def in_this_process(command: list[str]) -> str:
    """Runs a one-process ``train_command`` in this test process (8 simulated devices, like conftest's): the same
    ``main(argv)``, without a second interpreter start and compile. Returns its stdout."""
    from tests.common import run_command

    result = run_command(*command[1:])
    assert result.returncode == 0, f"$ {' '.join(command)}\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return result.stdout


def read_metrics(model_path: str) -> tuple[dict[int, float], dict[int, float]]:
    """{step: loss} for the train rows and for the eval rows of model_path/metrics.jsonl."""
    train, evals = {}, {}
    with open(os.path.join(model_path, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                (train if row["kind"] == "train" else evals)[row["step"]] = row["loss"]
    return train, evals


def assert_close(got: dict[int, float], want: dict[int, float], what: str) -> None:
    worst = max(abs(got[s] - want[s]) for s in want)
    assert worst <= TOLERANCE, f"{what}: losses differ by up to {worst:.3g}\n got  {got}\n want {want}"


@pytest.mark.slow
def test_two_processes_match_one_stop_together_on_sigterm_and_one_resumes(tmp_path):
    """The README's SLURM recipe (``srun python train.py ... --distributed``) with the environment srun gives each
    task, on one machine: jax finds the coordinator, process count and id itself; 2 processes x 4 devices log the
    losses of 1 process x 8 devices; a preemption notice (SIGTERM) to one of them stops both at the step JAX's
    preemption service agrees on, where they write one checkpoint together and exit 0; one process resumes it."""
    mesh_shape, layout = MESH_SHAPE, LAYOUT
    multi = str(tmp_path / "two-processes")
    job = str(slurm_job_id_with_free_port())
    tasks = [{"SLURM_JOB_ID": job, "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NTASKS": "2",
              "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "SLURM_STEP_NUM_NODES": "1"} for i in range(2)]
    command = train_command(multi, mesh_shape, layout, 100_000, "--new", "--distributed")
    (out0, _), _ = preempted([command] * 2, tasks, multi, tmp_path)
    assert "over 8 cpu devices (2 processes)" in out0, out0
    assert "note: data_shards 1 is not a multiple of the 2 processes" in out0  # both read everything
    train, evals = read_metrics(multi)  # written by process 0 only
    last = max(train)
    assert sorted(train) == list(range(1, last + 1)) and last >= STEPS, train
    assert f"saved the checkpoint of step {last}" in out0, out0
    # orbax finalizes (renames) a step directory only after every process has written its shards: one directory,
    # the step both stopped at, means both saved it.
    checkpoints = os.path.join(multi, "checkpoints")
    assert os.listdir(checkpoints) == [str(last)], f"unfinished or extra saves: {os.listdir(checkpoints)}"

    # The reference, one process with 8 devices (this test's own), one step further.
    reference = str(tmp_path / "one-process")
    in_this_process(train_command(reference, mesh_shape, layout, last + 1, "--new"))
    ref_train, ref_eval = read_metrics(reference)
    assert len(set(ref_train.values())) > 1, f"the loss should move over the steps: {ref_train}"
    assert_close(train, {s: ref_train[s] for s in train}, "train loss, 2x4 vs 1x8 devices")
    assert_close(evals, {s: ref_eval[s] for s in evals}, "eval loss, 2x4 vs 1x8 devices")

    # One process with 8 devices resumes the two-process checkpoint where the one-process reference went: its
    # first train loss is computed from the restored parameters, its eval after the update from the restored
    # optimizer state and step.
    out = in_this_process(train_command(multi, mesh_shape, layout, last + 1, "--resume"))
    assert f"at step {last}" in out, out
    train, evals = read_metrics(multi)
    assert sorted(train) == list(range(1, last + 2)), train
    assert_close(train, ref_train, "train loss after a one-process resume of the two-process run")
    assert_close(evals, ref_eval, "eval loss after a one-process resume of the two-process run")
    assert os.path.isdir(os.path.join(checkpoints, str(last + 1)))


def preempted(commands: list[list[str]], envs: list[dict], model_path: str, logs_dir) -> list[tuple[str, str]]:
    """Starts ``commands`` (4 devices each), sends SIGTERM to the last one once ``STEPS`` steps (and their evals)
    are in ``model_path``'s metrics, and returns every process's (stdout, stderr) after all exited 0."""
    from tests.common import metrics_lines

    logs = [(open(logs_dir / f"out{i}.txt", "w+"), open(logs_dir / f"err{i}.txt", "w+")) for i in range(len(commands))]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env={**environment(4), **extra}, stdout=out, stderr=err, text=True)
             for cmd, extra, (out, err) in zip(commands, envs, logs)]

    def texts():
        for out, err in logs:
            out.seek(0), err.seek(0)
        return [(out.read(), err.read()) for out, err in logs]

    try:
        deadline = time.monotonic() + TIMEOUT
        while metrics_lines(model_path) < 2 * STEPS:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, texts()
            time.sleep(0.1)
        procs[-1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outputs = texts()
    for out, err in logs:
        out.close(), err.close()
    assert codes == [0] * len(procs), outputs
    return outputs


def slurm_job_id_with_free_port() -> int:
    """A SLURM job id whose coordinator port (jax derives it: 61440 + id mod 4096) is free on this machine."""
    for port in range(61440 + os.getpid() % 4096, 65536):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port - 61440
    raise RuntimeError("no free port in jax's SLURM range")


@pytest.mark.slow
def test_two_processes_read_disjoint_files_and_assemble_the_one_process_batches(tmp_path):
    """Per-host input: with data_shards 4 over 4 files, each of 2 processes reads only its 2 files, and the global
    batches are those of 1 process; the input position the 2 processes save resumes 1 process without replay."""
    from tests.data_common import synthetic_docs, use_dataset_configs, write_tf_records

    docs = synthetic_docs([3, 40, 7, 2, 25, 11, 60, 5, 1, 30, 9, 4, 18, 6, 2, 33])
    for i in range(4):
        write_tf_records(str(tmp_path / f"a_{i}.tfrecords"), docs[i * 4:(i + 1) * 4])
    configs = tmp_path / "dc"

    class Patch:  # use_dataset_configs wants a monkeypatch; the subprocesses get the directory instead
        def setattr(self, *args):
            pass

    use_dataset_configs(Patch(), configs, a={"path": str(tmp_path / "a_*.tfrecords"), "tokenizer_path": "bytes",
                                             "shuffle_buffer": 8})
    script = [sys.executable, "tests/multihost_input.py", "--dataset-configs", str(configs), "--steps", "4"]
    multi, single = tmp_path / "two", tmp_path / "one"
    multi.mkdir(), single.mkdir()
    port = free_port()
    launch([script + ["--out", str(multi), "--save-at", "2", "--coordinator", f"127.0.0.1:{port}",
                      "--num-processes", "2", "--process-id", str(i)] for i in range(2)], devices=4)
    [(_, out, _)] = launch([script + ["--out", str(single), "--resume-from", str(multi / "run")]], devices=8)

    read = {p: json.load(open(multi / f"files_{p}.json")) for p in range(2)}
    assert read == {0: ["a_0.tfrecords", "a_1.tfrecords"], 1: ["a_2.tfrecords", "a_3.tfrecords"]}, read
    assert json.load(open(single / "files_0.json")) == [f"a_{i}.tfrecords" for i in range(4)]
    import numpy as np
    one, two = np.load(single / "batches.npy"), np.load(multi / "batches.npy")
    assert one.shape == (4, 8, 17) and len(np.unique(one[:, :, 0])) > 8
    assert np.array_equal(one, two)
    assert "input: continues at step 2" in out and "replayed 0" in out, out
    assert np.array_equal(np.load(single / "resumed.npy"), one[2:])


def test_processes_given_different_configs_or_flags_stop_at_start_with_one_line_naming_the_key(tmp_path):
    """2 processes whose --set values and flags differ (another n_embd, --eval on one only) would meet at their
    first collective with arrays of other shapes and abort inside gloo with a C++ stack: both say at start-up,
    in one line, which key differs and its value in each process, and exit 2 before creating the run."""
    port = free_port()
    run = str(tmp_path / "run")
    commands = [train_command(run, "x:-1", "batch:x", 2, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", "2", "--process-id", str(i), *extra)
                for i, extra in enumerate([(), ("--set", "n_embd=128", "--eval")])]
    for code, out, err in run_to_the_end(commands, [environment(1)] * 2):
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and lines == [
            "error: --eval differs between the 2 processes (process 0: false, process 1: true) (and n_embd): "
            "every process must run the same command, config and --set values"], (code, out, err[-4000:])
        assert "Traceback" not in err and "gloo" not in err.lower().replace("[gloo]", ""), err[-4000:]
    assert not os.path.exists(run)


def test_a_process_whose_peers_never_start_says_so_and_gives_up_in_one_line(tmp_path):
    """Process 0 of 2 started alone waited jax's 300 s in silence and then aborted from C++ with a stack trace
    (DEADLINE_EXCEEDED in RegisterTask): it says that it waits, and within NEOMESH_JOIN_TIMEOUT gives up in one
    line naming the coordinator and the count, exit 2, no run created."""
    port = free_port()
    run = str(tmp_path / "run")
    command = train_command(run, "x:-1", "batch:x", 2, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                            "--process-id", "0")
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env={**environment(1), "NEOMESH_JOIN_TIMEOUT": "10"},
                            capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines == [
        f"waiting for the 2 processes to join at 127.0.0.1:{port} (this is process 0)",
        f"error: --coordinator 127.0.0.1:{port}: the 2 processes did not all join within 10 s (this is process 0); "
        "start each one with the same --coordinator and --num-processes and its own --process-id "
        "(NEOMESH_JOIN_TIMEOUT=SECONDS waits longer)"], (result.returncode, result.stdout, result.stderr[-4000:])
    assert took < 60 and not os.path.exists(run)


@pytest.mark.slow
def test_a_process_that_stops_answering_mid_run_stops_the_other_in_one_line(tmp_path):
    """Process 1 frozen mid-run (SIGSTOP: a hung host; its sockets stay open, so no collective fails): process 0
    waited in its collective, silently, until jax's 100 s heartbeat timeout aborted it from C++. It says in one line
    that process 1 sent no heartbeat for NEOMESH_PEER_TIMEOUT seconds and exits 2. (kill -9 of a peer mostly ends
    in gloo's error instead, the same one line: tests/test_bad_inputs.py.)"""
    from tests.common import metrics_lines

    port = free_port()
    run = str(tmp_path / "run")
    commands = [train_command(run, MESH_SHAPE, LAYOUT, 100_000, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", "2", "--process-id", str(i)) for i in range(2)]
    logs = [open(tmp_path / f"err{i}.txt", "w+") for i in range(2)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env={**environment(4), "NEOMESH_PEER_TIMEOUT": "10"},
                              stdout=subprocess.DEVNULL, stderr=err, text=True) for cmd, err in zip(commands, logs)]
    try:
        deadline = time.monotonic() + TIMEOUT
        while metrics_lines(run) < 2 * STEPS:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, open(logs[0].name).read()
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGSTOP)
        code = procs[0].wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    err = open(logs[0].name).read()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and lines == [
        "error: another process of this run stopped (process 1 sent no heartbeat for 10 s); this process stops too: "
        "start every process again to resume from the last checkpoint"], (code, err[-4000:])
    assert "Traceback" not in err, err[-4000:]


def test_processes_holding_different_device_counts_stop_with_one_line_naming_each_count(tmp_path):
    """Process 0 with 2 CPU devices and process 1 with 1: jax's cross-process collectives failed with a
    ValueError traceback ('cannot reshape array of size 3 into shape (2,2)'); both now name each count."""
    port = free_port()
    run = str(tmp_path / "run")
    commands = [train_command(run, "x:-1", "batch:x", 2, "--coordinator", f"127.0.0.1:{port}", "--num-processes",
                              "2", "--process-id", str(i)) for i in range(2)]
    for code, out, err in run_to_the_end(commands, [environment(2), environment(1)]):
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and lines == [
            "error: the 2 processes hold different numbers of devices (process 0: 2, process 1: 1); every process "
            "must see the same number (CUDA_VISIBLE_DEVICES, XLA_FLAGS' --xla_force_host_platform_device_count)"
        ], (code, out, err[-4000:])
        assert "Traceback" not in err, err[-4000:]
    assert not os.path.exists(run)


def test_the_timeouts_of_a_multi_process_run_are_checked_before_it_joins(monkeypatch):
    from config import ConfigError
    from parallel import distributed

    monkeypatch.setenv("NEOMESH_PEER_TIMEOUT", "2")
    with pytest.raises(ConfigError, match="NEOMESH_PEER_TIMEOUT: '2' is not a number of seconds of at least 5"):
        distributed.peer_timeout()
    monkeypatch.setenv("NEOMESH_PEER_TIMEOUT", "30")
    assert distributed.peer_timeout() == 30
    monkeypatch.setenv("NEOMESH_JOIN_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="NEOMESH_JOIN_TIMEOUT: 'soon' is not a number of seconds of at least 10"):
        distributed.join_timeout()


def test_distributed_outside_a_cluster_is_one_line(monkeypatch):
    """``--distributed`` where jax detects no cluster (a plain machine, a shell outside the SLURM job) names the
    flag and the way to start processes by hand instead of jax's 'coordinator_address should be defined'."""
    import jax

    from config import ConfigError
    from parallel import distributed

    def no_cluster(**kwargs):
        raise ValueError("coordinator_address should be defined.")

    monkeypatch.setattr(jax.distributed, "initialize", no_cluster)
    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # leaves this process's collectives alone
    with pytest.raises(ConfigError, match=r"--distributed: found no cluster to join.*--coordinator HOST:PORT"):
        distributed.initialize(None, None, None, auto=True)
