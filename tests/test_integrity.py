"""The pieces that keep runs trustworthy, each on its own (no training): checkpoint checksums, the bad-step guard,
metrics.jsonl repair, the run lock, and naming the config key that changes a checkpoint's shape."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from config import ConfigError
from parallel.mesh import make_mesh
from tests.common import tiny_config
from training import integrity, saved_state
from training.checkpoint import check_same_model, first_changed_key, model_changes, training_changes
from training.metrics import MetricsWriter, read_rows
from training.optimizer import bad_step_counts, make_optimizer
from training.run_lock import RunLock


def test_checksums_see_one_flipped_bit_and_ignore_the_sharding():
    tree = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 7, "n": jnp.int32(3),
            "flag": jnp.array(True), "h": jnp.ones((8, 4), jnp.bfloat16)}
    sums, non_finite = integrity.summarize(tree)
    assert non_finite == [] and set(sums) == {"w", "n", "flag", "h"}
    mesh = make_mesh("x:4,y:2")
    sharded = dict(tree, w=jax.device_put(tree["w"], jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("x", "y"))))
    assert integrity.summarize(sharded)[0] == sums  # integer sums: the same whatever the reduction order
    words = np.asarray(tree["w"]).view(np.uint32).copy()
    words[17, 5] ^= 1 << 9  # one bit of one element
    flipped = dict(tree, w=jnp.asarray(words.view(np.float32)))
    record, _ = integrity.record(tree)
    assert integrity.problem(flipped, record) == "w differs from what was saved (checksum mismatch)"
    swapped = np.asarray(tree["w"]).copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # the same words in another order: only the weighted sum sees it
    assert integrity.problem(dict(tree, w=jnp.asarray(swapped)), record) is not None
    assert integrity.problem(tree, record) is None


def test_non_finite_leaves_are_named():
    tree = {"a": jnp.ones(3), "b": {"c": jnp.array([1.0, jnp.inf])}}
    assert integrity.summarize(tree)[1] == ["b/c"]
    assert integrity.problem(tree, None, prefix="params/") == "params/b/c holds NaN or infinity"


def test_bad_steps_leave_the_state_alone_and_are_counted():
    cfg = tiny_config(max_bad_steps=3, warmup_steps=0, lr=0.1)
    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    tx = make_optimizer(cfg)
    state = tx.init(params)
    tx = tx._replace(update=jax.jit(tx.update))  # one compile instead of many eager dispatches
    good = {"w": jnp.full((2, 2), 0.5), "b": jnp.ones(2)}
    bad = {"w": jnp.full((2, 2), jnp.nan), "b": jnp.ones(2)}
    updates, state = tx.update(good, state, params)
    params = optax.apply_updates(params, updates)
    before = jax.tree.map(np.asarray, (params, optax.tree.get(state, "mu")))
    for expected in (1, 2):
        updates, state = tx.update(bad, state, params)
        params = optax.apply_updates(params, updates)
        assert [int(c) for c in bad_step_counts(state)] == [expected, expected]
    after = jax.tree.map(np.asarray, (params, optax.tree.get(state, "mu")))
    jax.tree.map(np.testing.assert_array_equal, after, before)  # skipped: parameters and moments untouched
    updates, state = tx.update(good, state, params)
    assert [int(c) for c in bad_step_counts(state)] == [0, 2]  # a good step resets the run, not the total


def test_a_gradient_spike_is_skipped_like_a_non_finite_one():
    cfg = tiny_config(grad_spike_factor=4.0, warmup_steps=0)
    params = {"w": jnp.ones(4)}
    tx = make_optimizer(cfg)
    state = tx.init(params)
    tx = tx._replace(update=jax.jit(tx.update))
    for _ in range(12):  # the running mean needs SPIKE_WARMUP accepted steps before it judges
        _, state = tx.update({"w": jnp.full(4, 0.1)}, state, params)
    assert int(bad_step_counts(state)[0]) == 0
    updates, state = tx.update({"w": jnp.full(4, 0.3)}, state, params)  # 3x: within the factor
    assert int(bad_step_counts(state)[0]) == 0
    updates, state = tx.update({"w": jnp.full(4, 10.0)}, state, params)  # 100x: a spike
    assert int(bad_step_counts(state)[0]) == 1
    assert float(jnp.abs(updates["w"]).max()) == 0.0


def test_metrics_drop_a_torn_line_and_rows_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "kind": "train", "loss": 1.0 / s} for s in (1, 2, 3, 4)] + [{"step": 2, "kind": "eval"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "kind": "tr')
    notes = []
    writer = MetricsWriter(str(tmp_path), start_step=2, say=notes.append)
    assert len(notes) == 1 and "dropped its torn last line" in notes[0]
    assert writer.stored_eval(2) == {"step": 2, "kind": "eval"} and writer.stored_eval(3) is None
    writer.write({"step": 3, "kind": "train", "loss": math.nan, "grad_norm": math.inf})
    writer.close()
    text = path.read_text()
    kept, bad = read_rows(str(path))
    assert bad == [] and [(r["step"], r["kind"]) for r in kept] == [(1, "train"), (2, "train"), (2, "eval"),
                                                                     (3, "train")]
    assert kept[-1]["loss"] is None and kept[-1]["grad_norm"] is None
    json.loads(text.splitlines()[-1], parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))

    path.write_text(text.replace('"step": 2, "kind": "train"', '"step": 2, "kind": tr'))  # damaged, not torn
    MetricsWriter(str(tmp_path), start_step=3, say=notes.append).close()
    assert notes[-1] == f"note: {path}: dropped damaged line(s) [2] (not whole JSON rows)"


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard shows them (its purge of a resumed run's steps applied)."""
    import sys
    import types

    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("notf"))  # its TensorFlow stub: no TF import
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_shows_what_metrics_jsonl_holds_after_a_kill_and_a_resume(tmp_path):
    killed = MetricsWriter(str(tmp_path), start_step=0)
    for step in range(1, 7):
        killed.write({"step": step, "kind": "train", "loss": 1.0 / step, "lr": math.nan})
        if step % 2 == 0:
            killed.write({"step": step, "kind": "eval", "loss": step / 4})
    # killed with -9 here (no close), then resumed from the checkpoint of step 4: every row written is on disk
    # already (tensorboardX's thread wrote its queue every two minutes, so TensorBoard lacked the eval of step 4)
    assert tensorboard_scalars(tmp_path / "tensorboard")["eval/loss"] == [(2, 0.5), (4, 1.0), (6, 1.5)]
    resumed = MetricsWriter(str(tmp_path), start_step=4)
    for step in (5, 6):
        resumed.write({"step": step, "kind": "train", "loss": 1.0 / step})
    resumed.close()
    shown = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(shown) == {"train/loss", "eval/loss"}  # NaN (null in metrics.jsonl) is left out, as before
    rows = read_rows(str(tmp_path / "metrics.jsonl"))[0]
    for tag in shown:  # each step once, with the value metrics.jsonl holds
        kind, key = tag.split("/")
        assert shown[tag] == [(r["step"], pytest.approx(r[key])) for r in rows if r["kind"] == kind], tag


def test_a_checkpoint_without_checksums_is_restored_with_a_note(tmp_path):
    import shutil

    from training.checkpoint import Checkpoints

    state = {"w": jnp.arange(8, dtype=jnp.float32)}
    with Checkpoints(str(tmp_path), keep=2) as checkpoints:
        checkpoints.save(2, state, {"n_embd": 8})
    shutil.rmtree(tmp_path / "checkpoints" / "2" / "integrity")  # or written before checkpoints held checksums
    said = []
    with Checkpoints(str(tmp_path), keep=2) as checkpoints:
        restored, step = checkpoints.restore_newest_good(jax.eval_shape(lambda: state), lambda c, s: None, said.append)
    assert step == 2 and np.array_equal(restored["w"], state["w"])
    assert said == ["note: checkpoint 2 holds no checksums (written by an older NeoMesh, or its integrity/ was "
                    "deleted): its arrays were only checked for NaN and infinity"]


def test_run_lock_refuses_a_second_holder_and_takes_over_a_dead_ones(tmp_path):
    first = RunLock(str(tmp_path))
    assert first.acquire() is None
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/run.lock: another run is using this model_path "
                                          rf"\(pid {os.getpid()} on "):
        RunLock(str(tmp_path)).acquire()
    first.file.close()  # the holder dies without cleaning up: the kernel drops its lock, the file stays
    first.file = None
    assert os.path.exists(tmp_path / "run.lock")
    second = RunLock(str(tmp_path))
    note = second.acquire()
    assert note and "took over the lock of a run that is gone" in note and f"pid {os.getpid()}" in note
    assert note.endswith("; it saved no checkpoint")  # not "its last complete checkpoint is used": there is none
    second.release()
    assert not os.path.exists(tmp_path / "run.lock")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=rf"^model_path: {tmp_path}/file is a file, not a run directory$"):
        RunLock(str(tmp_path / "file")).acquire()  # it was "File exists"


def test_the_first_key_that_changes_the_state_shape_is_named():
    cfg = tiny_config()
    saved = {**cfg.to_dict(), "lr": 0.5, "n_embd": 32, "n_layer": 3,
             "attention_types": [[["global", "local", "global"], 1]]}
    # lr and n_layer differ too: lr changes no shape, n_layer comes after n_embd in the config's key order.
    assert first_changed_key(saved, cfg, saved_state.state_shapes) == "n_embd"
    assert first_changed_key({**cfg.to_dict(), "lr": 0.5, "train_steps": 7}, cfg, saved_state.state_shapes) is None
    assert first_changed_key({**cfg.to_dict(), "opt_name": "adafactor"}, cfg, saved_state.state_shapes) == "opt_name"
    resharded = {**cfg.to_dict(), "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y"}  # restore reshards
    assert first_changed_key(resharded, cfg, saved_state.state_shapes) is None


def test_a_resume_with_another_optimizer_says_the_optimizer_state_differs_not_the_model():
    cfg = tiny_config(model_path="runs/x")
    where = "the checkpoint at step 6"
    with pytest.raises(ConfigError, match=r'^opt_name: the checkpoint at step 6 was trained with opt_name="adafactor", '
                       r"the config has \"adam\"; the optimizer state's shape differs \(the model's parameters fit\) "
                       r"\(set it back, or --new for a fresh run; --init-from runs/x --model-path NEW_DIR goes on "
                       r"from its weights with a fresh optimizer state\)$"):
        check_same_model({**cfg.to_dict(), "opt_name": "adafactor"}, cfg, saved_state.state_shapes, where)
    with pytest.raises(ConfigError, match=r"^n_embd: .* the model's shape differs \(set it back, or --new for a "
                                          r"fresh run\)$"):
        check_same_model({**cfg.to_dict(), "n_embd": 16}, cfg, saved_state.state_shapes, where)


def test_a_resume_names_the_model_keys_that_change_without_changing_shapes():
    cfg = tiny_config()
    saved = {**cfg.to_dict(), "activation_function": "relu", "local_attention_radius": 4, "lr": 0.5,
             "train_steps": 7, "eval_steps": 3, "warmup_steps": 1, "datasets": [["other", None, None, None]]}
    assert model_changes(saved, cfg) == ['local_attention_radius 4 -> 8', 'activation_function "relu" -> "gelu"']
    global_only = {**cfg.to_dict(), "attention_types": [[["global"], 2]]}
    assert model_changes(global_only, cfg) == ['attention_types [[["global"], 2]] -> [[["global", "local"], 1]]']
    # spellings of one model are no change: every layer global written out, or left to the default
    spelled = tiny_config(attention_types=None)
    assert model_changes({**spelled.to_dict(), "attention_types": [[["global"], 2]]}, spelled) == []
    assert model_changes({**cfg.to_dict(), "d_ff": 4 * cfg.n_embd}, cfg) == []


def test_a_resume_names_the_training_keys_that_change():
    """lr, train_steps' schedule, the seed or the data changed on resume steer the run elsewhere than the
    checkpoint's run went: named in a note (old -> new); where and how often it saves or logs, and the mesh, not."""
    cfg = tiny_config()
    assert training_changes(cfg.to_dict(), cfg) == []
    saved = {**cfg.to_dict(), "lr": 0.5, "train_steps": 7, "seed": 3, "activation_function": "relu",
             "steps_per_checkpoint": 9, "log_every": 3, "mesh_shape": "x:4,y:2", "eval_steps": 3}
    assert training_changes(saved, cfg) == [f"lr 0.5 -> {json.dumps(cfg.lr)}",
                                            f"train_steps 7 -> {cfg.train_steps}", f"seed 3 -> {cfg.seed}"]
    # A classifier or seq2seq run going on reads its text with its own tokenizer/, saved from its dataset's at its
    # first start: not a change the user made (the note said "tokenizer_path null -> .../tokenizer")
    own = cfg.replace(model_path="runs/x", tokenizer_path=os.path.join("runs/x", "tokenizer"))
    assert training_changes({**own.to_dict(), "tokenizer_path": None}, own) == []
    assert training_changes({**own.to_dict(), "tokenizer_path": "other"}, own) == [
        'tokenizer_path "other" -> "runs/x/tokenizer"']


def test_unretrieved_orbax_read_failures_are_not_logged():
    """The other failed reads of a damaged checkpoint do not reach stderr as tracebacks; other asyncio errors do."""
    import logging

    import training.checkpoint  # noqa: F401  (installs the filter)

    def failure(filename):
        namespace = {}
        exec(compile("def read():\n    raise ValueError('bad chunk')\n", filename, "exec"), namespace)
        try:
            namespace["read"]()
        except ValueError as e:
            return type(e), e, e.__traceback__

    def record(exc_info, message="Task exception was never retrieved\nfuture: <Task finished>"):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, exc_info)

    asyncio_logger = logging.getLogger("asyncio")
    orbax_read = failure("/site-packages/orbax/checkpoint/_src/serialization/serialization.py")
    assert not asyncio_logger.filter(record(orbax_read))
    assert asyncio_logger.filter(record(failure("/home/user/job.py")))
    assert asyncio_logger.filter(record(orbax_read, "Exception in callback"))
    # tensorstore's own futures fail in C++: no Python frame, the spec they read in the message.
    tensorstore_read = ValueError('DATA_LOSS: Error opening "zarr" driver: Error reading "params.wte/.zarray" in OCDBT '
                                  'database [tensorstore_spec=\'{"driver":"zarr"}\']')
    unretrieved_future = "Future exception was never retrieved\nfuture: <Future finished>"
    assert not asyncio_logger.filter(record((ValueError, tensorstore_read, None), unretrieved_future))
    assert asyncio_logger.filter(record((ValueError, ValueError("bad input"), None), unretrieved_future))


def test_orbax_step_metadata_damage_is_one_line(capsys):
    """A damaged _CHECKPOINT_METADATA (orbax's record of the save) restores fine; orbax logged the file's whole
    content, however long, on every read. One note per file instead; other absl records pass."""
    import logging

    import training.checkpoint  # noqa: F401  (installs the filter)

    absl = logging.getLogger("absl")
    path = "/run/checkpoints/8/_CHECKPOINT_METADATA"

    def record(message, *args):
        return logging.LogRecord("absl", logging.ERROR, __file__, 1, message, args, None)

    garbage = record("Failed to json parse Metadata file: %s, file content: %s, error: %s", path, "{x\n" * 500, "e")
    assert not absl.filter(garbage) and not absl.filter(garbage)
    assert not absl.filter(record("Metadata file does not exist: %s", path + "2"))
    assert capsys.readouterr().err.splitlines() == [
        f"note: {path}: unreadable or missing (orbax's record of the save, not needed to restore; the arrays are "
        "checked by their checksums)",
        f"note: {path}2: unreadable or missing (orbax's record of the save, not needed to restore; the arrays are "
        "checked by their checksums)"]
    assert absl.filter(record("Saving checkpoint %s", path))
