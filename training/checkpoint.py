"""Sharded, asynchronous, atomic checkpoints with orbax; restore reshards onto whatever mesh is current.

Orbax writes each step into a temporary directory and renames it when complete, so a crash mid-save leaves the
previous checkpoint intact. All processes call ``save``/``restore`` together (multi-host).

Trust (training/integrity.py): a state holding NaN or infinity is never saved; every checkpoint carries checksums of
its arrays, and ``restore_newest_good`` checks them (and finiteness) on restore, moves a damaged checkpoint aside
with one line saying why, and falls back to the newest good one. Rotation (``keep_checkpoints``) never deletes
the checkpoint a run was verified to resume from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import shlex
import time
import traceback

import jax
import numpy as np
import orbax.checkpoint as ocp

from config import ConfigError
from training import integrity
from training.input_checkpoint import ITEM as INPUT_ITEM
from training.input_checkpoint import InputStateHandler, InputStateRestore, InputStateSave
from training.run_dir import gpt_neo_checkpoint_problem, missing_run_directory

INTEGRITY = "integrity"  # the checkpoint item holding the checksums (training/integrity.py)


class _UnretrievedReadFailures(logging.Filter):
    """A damaged checkpoint fails several of orbax's concurrent array reads: orbax raises the first (reported in
    one line, see ``restore_verified``) and asyncio later logs each other one, never retrieved, with its
    traceback. Those records are dropped: a task failed in orbax's code, or a tensorstore future (it fails in
    C++, with no Python frame, and its error names the tensorstore spec it read); any other asyncio record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "exception was never retrieved" not in record.getMessage().split("\n", 1)[0]:  # a task or future
            return True
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        frames = traceback.extract_tb(error.__traceback__)
        in_orbax = any(f"{os.sep}orbax{os.sep}" in frame.filename for frame in frames)
        return not (in_orbax or "[tensorstore_spec=" in str(error))


logging.getLogger("asyncio").addFilter(_UnretrievedReadFailures())


class _StepMetadataNotes(logging.Filter):
    """Orbax logs a step's unreadable or missing ``_CHECKPOINT_METADATA`` (its own bookkeeping: a save time, not
    needed to restore) with the file's whole content, however long or binary. One line per file instead."""

    PREFIXES = ("Failed to json parse Metadata file: ", "Failed to read Metadata file: ",
                "Metadata file does not exist: ")
    said: set = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(self.PREFIXES) and record.args):
            return True
        path = str(record.args[0])
        if path not in self.said and jax.process_index() == 0:
            self.said.add(path)
            import sys

            print(f"note: {path}: unreadable or missing (orbax's record of the save, not needed to restore; the "
                  "arrays are checked by their checksums)", file=sys.stderr, flush=True)
        return False


logging.getLogger("absl").addFilter(_StepMetadataNotes())


class DamagedCheckpoint(ConfigError):
    """A checkpoint that cannot be read back as it was written."""


@dataclasses.dataclass
class _KeepVerified:
    """An orbax preservation policy: keeps the checkpoint this run restored and verified, however old."""

    step: int | None = None

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        del context
        return [info.step == self.step for info in checkpoints]


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
    from absl import logging

    level = logging.get_verbosity()
    if quiet:
        logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(level)


@functools.cache
def _set_array_handler() -> None:
    """Replica-parallel saving splits a replicated array between its replicas so that several hosts write it;
    within one process it only adds a sliced copy, and an XLA compile, per array shape and replica."""
    with _quiet_absl(True):  # orbax logs every override of its registry
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=jax.process_count() > 1), override=True)


class Checkpoints:
    def __init__(self, model_path: str, keep: int, read_only: bool = False):
        self.directory = os.path.abspath(os.path.join(model_path, "checkpoints"))
        if read_only and not os.path.isdir(self.directory):
            missing = missing_run_directory(model_path)  # predict.py or export before train.py, or a typo
            if missing:
                raise ConfigError(missing)
            gpt_neo = gpt_neo_checkpoint_problem(model_path)
            if gpt_neo:
                raise ConfigError(gpt_neo)
            if "://" not in model_path and os.path.isfile(os.path.join(model_path, "config.json")):
                raise ConfigError(f"model_path: {model_path} is a Hugging Face model directory (config.json, no "
                                  "checkpoints/): predict.py and eval.py read it with --hf-model; python -m convert "
                                  "import makes a run of it")
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        self.verified = _KeepVerified()
        _set_array_handler()
        if read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0,
                                                   enable_async_checkpointing=False)
        else:
            policies = ocp.checkpoint_managers
            options = ocp.CheckpointManagerOptions(
                create=True, enable_async_checkpointing=True,
                preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(keep), self.verified]))
        with _quiet_absl(read_only):  # orbax warns that a read-only manager is read-only
            self.manager = ocp.CheckpointManager(self.directory, options=options,
                                                 item_names=("state", "config", INTEGRITY, INPUT_ITEM),
                                                 item_handlers={INPUT_ITEM: InputStateHandler()})

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(self, *exc) -> None:
        self.close(raise_errors=exc[0] is None)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, config: dict, data: dict | None = None) -> None:
        """Starts an async save; returns once device arrays are copied off the devices. ``data`` is the input
        position (a source's ``state()``), saved as its own item of the same step. A state holding NaN or Inf is
        refused (``ConfigError``); so is a save that fails for lack of disk space."""
        record = self.integrity_record(step, state)
        items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config),
                     **{INTEGRITY: ocp.args.JsonSave(record)})
        items.update(input_position_item(data))
        with self.save_failures():
            self.manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore_input(self, step: int):
        """The input position saved with ``step`` (``training.input_checkpoint.SavedInput``), or None where the
        checkpoint has none (written by a source that needs none, or before positions were saved) or it is
        unreadable."""
        if not os.path.isdir(os.path.join(self.directory, str(step), INPUT_ITEM)):
            return None
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**{INPUT_ITEM: InputStateRestore()}))[INPUT_ITEM]
        except (OSError, ValueError):  # an unreadable position costs a replay, never the run
            return None
    def integrity_record(self, step: int, state) -> dict:
        """The checksums to save with ``state``; a one-line error naming the first array that holds NaN/Inf."""
        record, non_finite = integrity.record(state)
        if non_finite:
            last = self.latest_step()
            raise ConfigError(f"step {step}: {non_finite[0]} holds NaN or infinity; not saved (the last checkpoint, "
                              f"{'step ' + str(last) if last is not None else 'none'}, is intact)")
        return record

    @contextlib.contextmanager
    def save_failures(self):
        """Turns a failed save (disk full, an unwritable directory; async saves report it at the next save or at
        close) into one line naming the checkpoint directory."""
        from neomesh.errors import disk_full, one_line

        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised unless it is an expected failure
            message = "No space left on device" if disk_full(e) else one_line(e)
            if message is None or isinstance(e, ConfigError):
                raise
            # An async save reports its failure at the next save or at close: name the directory, not a step.
            raise ConfigError(f"{self.directory}: a checkpoint could not be saved: {message}") from None

    def restore(self, abstract_state, step: int | None = None):
        """The state at ``step`` (default: latest), placed with the shardings in ``abstract_state``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state)))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model_path: checkpoint {self.directory}/{step} does not fit this config's "
                              f"model ({str(e).splitlines()[0][:200]})") from None
        return restored.state

    def restore_params(self, abstract_params, step: int | None = None):
        """Only the parameters (no optimizer state), placed with the shardings in ``abstract_params``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        target = {"params": abstract_params}
        restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), target)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True)))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model_path: checkpoint {self.directory}/{step} does not fit this config's "
                              f"model ({str(e).splitlines()[0][:200]})") from None
        return restored.state["params"]

    def located_config(self, step: int | None = None) -> dict:
        """``config(step)``, with a damaged checkpoint reported as a one-line error naming it."""
        step = self.latest_step() if step is None else step
        try:
            return self.config(step)
        except DamagedCheckpoint as e:
            raise ConfigError(f"checkpoint {self.directory}/{step} is damaged: {e}") from None

    def restore_params_verified(self, abstract_params, step: int):
        """``restore_params`` checked against the checkpoint's checksums and for NaN/Inf: a one-line error naming
        the checkpoint and the first bad array (generation and export refuse such weights)."""
        try:
            saved = self.saved_integrity(step)
            params = self.restore_params(abstract_params, step)
        except DamagedCheckpoint as e:
            raise ConfigError(f"checkpoint {self.directory}/{step} is damaged: {e}") from None
        except ConfigError as e:  # the model comes from the checkpoint's own config: a misfit is most likely damage
            if "does not fit" not in str(e):
                raise
            raise ConfigError(f"checkpoint {self.directory}/{step} is damaged or does not fit this config's model "
                              f"({str(e).split(' model (', 1)[-1]}") from None
        except Exception as e:  # noqa: BLE001 - orbax reports damaged data as plain exceptions
            raise ConfigError(f"checkpoint {self.directory}/{step} is damaged: {_reason(e)}") from None
        problem = integrity.problem(params, saved, prefix="params/")
        if problem is not None:
            raise ConfigError(f"checkpoint {self.directory}/{step} is damaged: {problem}; refusing its weights")
        return params

    def config(self, step: int | None = None) -> dict:
        """The config the checkpoint was written with."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"model_path: no checkpoint in {self.directory}")
        try:
            return dict(self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config)
        except Exception as e:  # noqa: BLE001 - any failure to read it means the checkpoint is damaged
            raise DamagedCheckpoint(f"its config is unreadable ({_reason(e)})") from None

    def close(self, raise_errors: bool = True) -> None:
        """Waits for pending saves to finish and stops orbax's threads. A failed save raises (one line) unless
        ``raise_errors`` is False (an error is already on its way out)."""
        try:
            with self.save_failures():
                self.manager.wait_until_finished()
        except Exception:  # noqa: BLE001
            if raise_errors:
                raise
        finally:
            self.manager.close()

    # -----------------------------------------------------------------------------------------------------------
    # Verified restore with fallback (training/integrity.py).

    def stacked_layers(self, step: int) -> dict[tuple, int]:
        """{path of a stack: its period} for each stack whose layers the checkpoint's parameters hold stacked
        (training/layer_stack.py: a scan_layers run's since the train state stores them so; empty when they are
        per layer), read from the arrays' metadata."""
        from etils import epath

        try:
            tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(self.directory) / str(step) / "state").tree
        except Exception as e:  # noqa: BLE001 - any failure to read it means the checkpoint is damaged
            raise DamagedCheckpoint(f"its array metadata is unreadable ({_reason(e)})") from None

        def stacks(node, path: tuple) -> dict:  # a Stacked node is saved as {"layers": [group, ...]}
            if not isinstance(node, dict):
                return {}
            if set(node) == {"layers"} and isinstance(node["layers"], list):
                return {path: len(node["layers"])}
            return {k: v for key, child in node.items() for k, v in stacks(child, path + (key,)).items()}

        return stacks(tree.get("params", {}), ())

    def saved_integrity(self, step: int) -> dict | None:
        """The integrity record saved with ``step``; None for a checkpoint written without one."""
        if not os.path.isdir(os.path.join(self.directory, str(step), INTEGRITY)):
            return None
        try:
            return dict(self.manager.restore(step, args=ocp.args.Composite(
                **{INTEGRITY: ocp.args.JsonRestore()}))[INTEGRITY])
        except Exception as e:  # noqa: BLE001
            raise DamagedCheckpoint(f"its checksums are unreadable ({_reason(e)})") from None

    def restore_verified(self, abstract_state, step: int):
        """The state at ``step``, checked against its checksums and for NaN/Inf; ``DamagedCheckpoint`` if not."""
        saved = self.saved_integrity(step)
        try:
            state, failure = self.restore(abstract_state, step), None
        except Exception as e:  # noqa: BLE001 - a structure mismatch is ruled out before (first_changed_key)
            state, failure = None, _reason(e)
        failure = _agreed(failure)
        if failure is None:
            failure = integrity.problem(state, saved)
        if failure is not None:
            raise DamagedCheckpoint(failure)
        return state

    def restore_newest_good(self, abstract_state, check_config, say):
        """(state, step) of the newest checkpoint that restores intact, or (None, None) if there is none at all.

        ``check_config(saved_config, step)`` raises a one-line error when the checkpoint's model differs from the
        current one (that is no damage: nothing is moved); it returns None when the checkpoint stores the state as
        ``abstract_state`` does, or (the abstract state as stored, a function to the current storage). A damaged
        checkpoint is reported with ``say`` in one line and moved to ``<model_path>/damaged_checkpoints/`` so the
        run can save that step again."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None, None
        for step in steps:
            try:
                stored = check_config(self.config(step), step)
                state = self.restore_verified(abstract_state if stored is None else stored[0], step)
                state = state if stored is None else stored[1](state)
            except DamagedCheckpoint as e:
                moved = self.move_aside(step)
                older = [s for s in steps if s < step]
                say(f"warning: checkpoint {step} is damaged: {e}; moved it to {moved}"
                    + (f"; trying step {older[0]}" if older else ""))
                continue
            self.verified.step = step
            if not os.path.isdir(os.path.join(self.directory, str(step), INTEGRITY)):  # a damaged array goes unseen
                say(f"note: checkpoint {step} holds no checksums (written by an older NeoMesh, or its {INTEGRITY}/ "
                    "was deleted): its arrays were only checked for NaN and infinity")
            return state, step
        raise ConfigError(f"model_path: no usable checkpoint in {self.directory} (every one is damaged; "
                          "--new starts a fresh run)")

    def move_aside(self, step: int) -> str:
        """Moves checkpoint ``step`` out of the checkpoint directory (process 0; every process waits)."""
        target = os.path.join(os.path.dirname(self.directory), "damaged_checkpoints",
                              f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(os.path.join(self.directory, str(step)), target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"moved checkpoint {step} aside")
        self.manager.reload()
        return target


def _reason(e: BaseException) -> str:
    from neomesh.errors import innermost_line

    return innermost_line(e)


def _agreed(failure: str | None) -> str | None:
    """Multi-host: every process reads only its shards, so one may fail where another did not; all must then
    treat the checkpoint as damaged (else they would part ways at the next collective)."""
    if jax.process_count() == 1:
        return failure
    from jax.experimental import multihost_utils

    failed = multihost_utils.process_allgather(np.int32(failure is not None))
    if failure is None and np.any(failed):
        return f"process {int(np.argmax(failed))} could not read its shards"
    return failure


def first_changed_key(saved: dict, cfg, state_shapes) -> str | None:
    """The first config key (in ``Config`` field order) whose saved value gives the train state another shape
    than the current config's, or None when the shapes agree. ``state_shapes(cfg)`` is the abstract state."""
    from config import KNOWN_KEYS, from_dict

    def signature(c) -> list:
        return _signature(state_shapes(c))

    differing = [k for k in KNOWN_KEYS if k in saved and saved[k] != getattr(cfg, k)]
    if not differing:
        return None
    current = signature(cfg)
    try:
        if signature(from_dict({k: v for k, v in saved.items() if k in KNOWN_KEYS})[0]) == current:
            return None
    except ConfigError:
        pass
    for key in differing:
        try:
            if signature(cfg.replace(**{key: saved[key]})) != current:
                return key
        except ConfigError:
            return key  # the saved value does not even fit with the current config's other keys
    return differing[0] if differing else None


def model_changes(saved: dict, cfg) -> list[str]:
    """``key old -> new`` for each model-defining key (``config.MODEL_KEYS``) whose saved value gives another model
    than ``cfg``'s; spellings of one model (``config.MODEL_VALUE``) are no change."""
    from config import KNOWN_KEYS, MODEL_KEYS, MODEL_VALUE, from_dict

    try:
        old = from_dict({k: v for k, v in saved.items() if k in KNOWN_KEYS})[0]
    except ConfigError:  # a saved config the current code refuses: its raw values are all there is to compare
        old = None
    changes = []
    for key in (k for k in MODEL_KEYS if k in saved):
        value = MODEL_VALUE.get(key, key)
        if old is not None and getattr(old, value) == getattr(cfg, value):
            continue
        if saved[key] != getattr(cfg, key):
            changes.append(f"{key} {json.dumps(saved[key])} -> {json.dumps(getattr(cfg, key))}")
    return changes


# Keys that leave the train state's trajectory alone (where and how often the run saves, logs, evaluates, samples;
# how the arrays are laid out and computed): a resume may change them without a word. Model keys are noted by
# ``model_changes``; a change of any other key (lr, train_steps' schedule, batch size, seed, data, dropout, ...)
# by ``training_changes``.
TRAJECTORY_FREE = ("eval_batch_size", "eval_steps", "eval_every", "log_every", "steps_per_checkpoint",
                   "keep_checkpoints", "max_bad_steps", "mesh_shape", "layout", "model_path", "sample_prompt",
                   "sample_tokens", "predict_max_steps", "eval_tasks", "lambada_path", "multiple_choice_path",
                   "eval_task_examples", "tfds_data_dir", "init_from", "init_new_head", "attention_kernel",
                   "logits_pad_multiple", "recompute_grad", "scan_layers", "loss_chunk", "tokens_per_mb_per_replica")


def training_changes(saved: dict, cfg) -> list[str]:
    """``key old -> new`` for each key that is neither a model key nor ``TRAJECTORY_FREE`` whose saved value
    differs from ``cfg``'s: the resumed run trains on with other settings than the checkpoint's run had."""
    from config import KNOWN_KEYS, MODEL_KEYS
    from neomesh.paths import run_tokenizer_dir

    current = cfg.to_dict()
    own = cfg.model_path and run_tokenizer_dir(cfg.model_path)
    if saved.get("tokenizer_path") is None and own and cfg.tokenizer_path == own:
        # A run going on reads its text with the copy of its dataset's tokenizer it saved at its first start
        # (training/run_tokenizer.py, which notes where they differ): no change of the user's
        current["tokenizer_path"] = None
    return [f"{key} {json.dumps(saved[key])} -> {json.dumps(current.get(key))}" for key in KNOWN_KEYS
            if key in saved and key not in MODEL_KEYS and key not in TRAJECTORY_FREE
            and json.dumps(saved[key]) != json.dumps(current.get(key))]


def check_same_model(saved: dict, cfg, state_shapes, where: str) -> None:
    """A one-line error naming the first config key whose change gives the model another shape than the
    checkpoint's (``where`` names the checkpoint)."""
    key = first_changed_key(saved, cfg, state_shapes)
    if key is None:
        return
    ways = "set it back, or --new for a fresh run"
    if key == "num_labels" and cfg.task.endswith("classification"):  # new labels on this classifier's backbone
        ways += (f"; --init-from {shlex.quote(cfg.model_path)} --set init_new_head=true --model-path NEW_DIR "
                 f"starts a new head of {cfg.num_labels} on its weights")
    # a peft change may keep every shape, and change which parameters train and what the checkpoint holds
    differs = "what it trains and saves differs" if key == "peft" else "the model's shape differs"
    if key != "peft" and _same_params(saved, cfg, key, state_shapes):  # opt_name, gradient_clipping, ...
        differs = "the optimizer state's shape differs (the model's parameters fit)"
        ways += (f"; --init-from {shlex.quote(cfg.model_path)} --model-path NEW_DIR goes on from its weights with "
                 "a fresh optimizer state")
    raise ConfigError(f"{key}: {where} was trained with {key}={json.dumps(saved.get(key))}, the config has "
                      f"{json.dumps(getattr(cfg, key))}; {differs} ({ways})")


def _signature(tree) -> list:
    """(path, shape, dtype) of each array of an abstract tree."""
    return [(jax.tree_util.keystr(p), tuple(a.shape), str(a.dtype))
            for p, a in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _same_params(saved: dict, cfg, key: str, state_shapes) -> bool:
    """Whether the saved value of ``key`` gives the parameters the same shapes as ``cfg`` (only the optimizer state
    differs)."""
    try:
        return _signature(state_shapes(cfg.replace(**{key: saved[key]}))["params"]) == \
            _signature(state_shapes(cfg)["params"])
    except ConfigError:
        return False


def input_position_item(data: dict | None) -> dict:
    """The checkpoint item for a source's ``state()`` (none when the source has no position to save)."""
    if data is None:
        return {}
    return {INPUT_ITEM: InputStateSave(meta=data["meta"], shards=data["shards"])}
