"""Automatic mesh and layout: for a table of (config, devices, memory) cases the choice is stable (golden file
tests/golden_layouts/auto.txt; regenerate with NEOMESH_UPDATE_GOLDEN=1 and review the diff) and usable: every
parameter and the batch split evenly on the chosen mesh."""

import dataclasses
import functools
import os

import pytest

from config import ConfigError, from_dict, load_config
from models import registry
from parallel.auto import choose, job_for
from parallel.estimate import ACCELERATORS
from parallel.layout import Layout
from parallel.mesh import abstract_mesh, parse_mesh_shape
from parallel.state import abstract_model, param_shardings
from parallel.steps import batch_shapes, batch_shardings
from tests.common import ROOT
from training.objectives import objective_for
from training.optimizer import make_optimizer

GOLDEN = os.path.join(ROOT, "tests", "golden_layouts", "auto.txt")
MEMORY = {name: a.memory for name, a in ACCELERATORS.items()}

# (config, devices, accelerator whose memory per device, mesh_shape given or None, changes to the config)
CASES = {
    "quickstart on 8 H100": ("quickstart", 8, "h100", None, {}),
    "125M on 8 TPU v5e": ("gpt_neo_125M", 8, "tpu-v5e", None, {}),
    "1.3B on 8 TPU v5e": ("gpt_neo_1.3B", 8, "tpu-v5e", None, {}),
    "2.7B on 256 TPU v4": ("gpt_neo_2.7B", 256, "tpu-v4", None, {}),
    "2.7B on 1024 TPU v4": ("gpt_neo_2.7B", 1024, "tpu-v4", None, {}),
    "13B on 8 H100": ("gpt_neo_13B", 8, "h100", None, {}),
    "13B on 256 TPU v4": ("gpt_neo_13B", 256, "tpu-v4", None, {}),
    "13B on 2048 TPU v4": ("gpt_neo_13B", 2048, "tpu-v4", None, {}),
    "moe on 8 TPU v5e": ("moe", 8, "tpu-v5e", None, {}),
    "13B auto_layout on x:16,y:16": ("gpt_neo_13B", 256, "tpu-v4", "x:16,y:16", {}),
    "2.7B auto_layout on x:128,y:2": ("gpt_neo_2.7B", 256, "tpu-v4", "x:128,y:2", {}),
    "1.3B auto_layout on data:4,fsdp:8,tensor:8, batch 64": (
        "gpt_neo_1.3B", 256, "h100", "data:4,fsdp:8,tensor:8", {"train_batch_size": 64}),
    # n_embd 2560 does not split 24 or 1024 ways: FSDP over the share of the data axes that divides it
    "2.7B on 24 H100, batch 24": ("gpt_neo_2.7B", 24, "h100", None, {"train_batch_size": 24}),
    "2.7B auto_layout on x:32,y:32, batch 1024": ("gpt_neo_2.7B", 1024, "tpu-v4", "x:32,y:32",
                                                  {"train_batch_size": 1024}),
}


@functools.cache
def model(name: str):
    """(config, abstract parameters, their logical axes), built once per config."""
    cfg, _ = load_config(os.path.join(ROOT, "configs", name + ".json"))
    _, abstract, logical = abstract_model(lambda rngs: registry.build(cfg, rngs))
    return cfg, abstract, logical


def config_and_job(name: str):
    cfg, abstract, _ = model(name)
    return cfg, job_for(cfg, abstract, make_optimizer(cfg), devices=1, memory=1.0, devices_per_host=8)


def chosen(case: str):
    name, devices, accelerator, mesh_shape, changes = CASES[case]
    cfg, job = config_and_job(name)
    cfg = cfg.replace(**changes) if changes else cfg
    job = dataclasses.replace(job, devices=devices, memory=MEMORY[accelerator], batch=cfg.train_batch_size)
    mesh = parse_mesh_shape(mesh_shape, devices) if mesh_shape else None
    return cfg, choose(job, mesh)


def test_choices_match_golden():
    table = "".join(f"{case}: mesh_shape {c.mesh_shape} | layout {c.layout} | {c.reason}\n"
                    for case, c in ((case, chosen(case)[1]) for case in CASES))
    if os.environ.get("NEOMESH_UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            f.write(table)
    with open(GOLDEN) as f:
        assert table == f.read(), "automatic layouts changed; see the module docstring to regenerate"


@pytest.mark.parametrize("case", CASES)
def test_choice_is_a_usable_layout(case):
    cfg, choice = chosen(case)
    devices = CASES[case][1]
    layout = Layout.from_config(abstract_mesh(choice.mesh_shape, devices), choice.layout)
    _, abstract, logical = model(CASES[case][0])
    param_shardings(layout, abstract, logical)  # raises if a split dimension does not divide its axes
    objective = objective_for(cfg)
    batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    assert layout.axis_size("batch") * layout.axis_size("heads") >= devices  # every device has work


@pytest.mark.parametrize("devices, batch", [(8, 16), (16, 8)])  # FSDP alone; FSDP with tensor parallelism
def test_an_automatic_fsdp_layout_keeps_experts_whole_on_their_devices(devices, batch):
    """With FSDP the experts rule came after embd's, so the expert weights split embd over the data axis and
    every device held a slice of every expert, while the reason said 'experts over data (1 per device)'."""
    cfg, job = config_and_job("moe")
    job = dataclasses.replace(job, devices=devices, memory=job.state_bytes, batch=batch)  # whole: FSDP
    choice = choose(job)
    assert "FSDP" in choice.reason and "experts over data (1 per device)" in choice.reason
    layout = Layout.from_config(abstract_mesh(choice.mesh_shape, devices), choice.layout)
    expert_weights = layout.spec(("experts", "embd", "intermediate_expanded"))
    assert expert_weights[:2] == ("data", None)  # whole experts, one per device
    assert layout.spec(("embd", "intermediate_expanded"))[0] == "data"  # dense weights: FSDP


def test_a_model_too_big_for_the_devices_is_a_one_line_error():
    _, job = config_and_job("gpt_neo_13B")
    with pytest.raises(ConfigError, match=r"training state \(206 GB.*per device even split over all 4 devices"):
        choose(dataclasses.replace(job, devices=4, memory=MEMORY["tpu-v5e"]))


def test_fsdp_that_no_divisor_of_n_embd_makes_fit_is_a_one_line_error():
    _, job = config_and_job("gpt_neo_13B")
    job = dataclasses.replace(job, devices=14, memory=MEMORY["h100"], batch=14)  # 5120 = 2^10 * 5: 2 of 14 ways
    with pytest.raises(ConfigError, match=r"layout: auto: FSDP splits n_embd 5120, and the most of the 14 data-"
                                          r"parallel ways that divide it is 2: the training state \(206 GB\) is "
                                          r"103 GB per device, above 50% of 76.4 GB; set mesh_shape and layout"):
        choose(job)


def test_gpt_neo_auto_keys_mean_auto():
    cfg, notes = from_dict({"auto_layout_and_mesh_shape": True})
    assert (cfg.mesh_shape, cfg.layout) == ("auto", "auto")
    cfg, _ = from_dict({"auto_layout": True, "mesh_shape": "x:4,y:2"})
    assert (cfg.mesh_shape, cfg.layout) == ("x:4,y:2", "auto")
    with pytest.raises(ConfigError, match="mesh_shape: 'auto' needs layout 'auto' too"):
        from_dict({"mesh_shape": "auto", "layout": "batch:x"})


@pytest.mark.parametrize("raw, overrides, note", [
    ({}, ("auto_layout=true", "layout=batch:x"), "--set auto_layout=true"),
    ({}, ("layout=batch:x", "auto_layout=true"), "--set auto_layout=true"),
    ({"auto_layout": True, "layout": "batch:x"}, (), "mine.json"),
])
def test_auto_layout_true_makes_the_layout_auto_whatever_the_order(raw, overrides, note):
    """The note said 'auto' while a layout given after the switch was the one used; the documented meaning (and
    GPT-Neo's) is the switch's, and the note names the layout it replaces."""
    cfg, notes = from_dict(raw, source="mine.json", overrides=overrides)
    assert cfg.layout == "auto"
    assert notes == [f"{note}: 'auto_layout': true sets layout to 'auto' (in place of layout 'batch:x')"]


def test_auto_layout_false_on_the_command_line_turns_a_config_files_switch_off():
    cfg, notes = from_dict({"auto_layout": True}, source="mine.json", overrides=("auto_layout=false",
                                                                                 "layout=batch:x"))
    assert (cfg.layout, notes) == ("batch:x", [])


def test_an_automatic_fsdp_layout_counts_what_accumulating_unreduced_holds_whole():
    """The rules choose FSDP from the training state's size; accumulate_unreduced then holds the parameters and
    their gradient sums whole on each device during a step: the reason says so with its size where it fits beside
    the split state, and a one-line error names the key where it does not."""
    import jax
    import numpy as np

    from parallel.auto import resolve
    from tests.common import tiny_config

    cfg = tiny_config(mesh_shape="auto", layout="auto", tokens_per_mb_per_replica=32)
    tx = make_optimizer(cfg)
    make = functools.partial(registry.build, cfg)
    params = abstract_model(make)[1]
    whole = 2 * sum(np.prod(p.shape) * p.dtype.itemsize for p in jax.tree.leaves(params))
    state = job_for(cfg, params, tx, 8, 1.0, 8).state_bytes
    roomy = 2 * 1.01 * (state / 8 + whole)  # the split state and the whole sums fit half of it, the state does not
    assert state > roomy / 2
    for unreduced in (False, True):
        layout, note = resolve(cfg.replace(accumulate_unreduced=unreduced), make, tx, jax.devices()[:8],
                               memory=roomy)
        assert layout.spec(("embd",))[0] is not None, note  # FSDP
        assert (f"{whole / 1e9:.3g} GB held whole during a step (accumulate_unreduced" in note) == unreduced, note
    tight = state / 2  # the state fits half a device only when split over all 8, the whole sums do not beside it
    assert resolve(cfg, make, tx, jax.devices()[:8], memory=tight)[0].spec(("embd",))[0] is not None
    with pytest.raises(ConfigError, match=r"^accumulate_unreduced: with it each device holds the parameters and "
                                          rf"their gradient sums whole during a step \({whole / 1e9:.3g} GB\)"):
        resolve(cfg.replace(accumulate_unreduced=True), make, tx, jax.devices()[:8], memory=tight)


def test_an_automatic_layout_on_a_mesh_of_other_devices_says_how_to_simulate_them():
    """The mesh_shape given beside layout auto was read without the platform: its device-count error lacked the
    hint every other mesh error gives."""
    import jax

    from parallel.auto import resolve
    from tests.common import tiny_config

    cfg = tiny_config(mesh_shape="x:16", layout="auto")
    with pytest.raises(ConfigError, match="needs 16 devices but 8 are available.*simulate 16 devices with XLA_FLAGS"):
        resolve(cfg, functools.partial(registry.build, cfg), make_optimizer(cfg), jax.devices()[:8], memory=1e12)
