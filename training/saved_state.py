"""The train state as a run's checkpoints hold it: its abstract shapes (what a checkpoint must match), the part
of it that is saved (all of it, or with peft checkpoint 'trainable' the parameters that train), the full
parameters again from that part, and a checkpoint that stores the layers otherwise moved to this run's storage."""

from __future__ import annotations


def state_shapes(cfg):
    """The abstract train state (parameters and optimizer state) of ``cfg``: what a checkpoint must match."""
    import jax

    from parallel.state import abstract_model, split_params
    from training.layer_stack import stack_abstract, storage_plan
    from training.optimizer import make_optimizer
    from training.peft import build_model, trainable_filter

    graphdef, params, _ = abstract_model(lambda rngs: build_model(cfg, rngs))
    tx, trainable = make_optimizer(cfg), trainable_filter(cfg.peft_settings)
    params = stack_abstract(params, storage_plan(graphdef, params, tx, trainable))
    trained = split_params(params, trainable)[0]
    saved = trained if checkpoints_trained_only(cfg) else params
    return {"params": saved, "opt_state": jax.eval_shape(tx.init, trained)}


def checkpoints_trained_only(cfg) -> bool:
    return cfg.peft is not None and cfg.peft_settings["checkpoint"] == "trainable"


def storage_changed(cfg, saved: dict, stacking: dict, where: str, make_model, layout, trainable, abstract, shardings,
                    say):
    """A checkpoint storing the layers otherwise than this run does (training/layer_stack.py): written with the
    other ``scan_layers`` (optimizer state and parameters stacked or per layer), or by a scan_layers run of an
    earlier storage (parameters per layer, or stacked with another period). ``stacking``: the checkpoint's
    stacked parameters ({} per layer). (The abstract state as stored, a jitted function moving the restored state
    to this run's storage and shardings); any other difference is the usual one-line error."""
    import jax

    from parallel.state import abstract_train_state
    from training.checkpoint import check_same_model
    from training.layer_stack import as_stored, convert_opt_state, unstack_layers
    from training.optimizer import make_optimizer

    as_saved = cfg.replace(scan_layers=saved.get("scan_layers", False))
    check_same_model(saved, as_saved, state_shapes, where)
    stored = saved_part(cfg, abstract_train_state(make_model, make_optimizer(as_saved), layout, trainable,
                                                  stacking=stacking)[1])
    convert = jax.jit(lambda state: state.replace(params=as_stored(unstack_layers(state.params), abstract.params),
                                                  opt_state=convert_opt_state(state.opt_state, abstract.opt_state)),
                      out_shardings=saved_part(cfg, shardings))
    params_stacked = bool(stacking)

    def converted(state):
        say(f"note: {where} stored the parameters {'stacked' if params_stacked else 'per layer'} and the optimizer "
            f"state {'stacked' if as_saved.scan_layers else 'per layer'} (scan_layers="
            f"{str(as_saved.scan_layers).lower()}); moved to this run's storage (scan_layers="
            f"{str(cfg.scan_layers).lower()})")
        return convert(state)

    return stored, converted


def saved_part(cfg, state):
    """What a checkpoint holds of ``state`` (or of an abstract state): all of it, or with peft checkpoint
    'trainable' only the parameters that train (and the optimizer state, which covers only them anyway)."""
    if not checkpoints_trained_only(cfg):
        return state
    from parallel.state import split_params
    from training.peft import trainable_filter

    return state.replace(params=split_params(state.params, trainable_filter(cfg.peft_settings))[0])


def base_params(cfg, make_model, imported, abstract, shardings, trained):
    """The full parameters of a run whose checkpoint holds only the ``trained`` ones: the base comes from
    ``init_from`` (``imported``) as at the run's start, or from the same seeded init."""
    from parallel.state import init_params, join_params, place_params

    fresh = lambda: init_params(make_model, cfg.seed, shardings.params)  # noqa: E731
    base = place_params(imported, abstract.params, fresh) if imported is not None else fresh()
    return join_params(trained, base)
