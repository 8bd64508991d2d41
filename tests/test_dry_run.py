"""Dry run: the HLO reader on a program whose collectives and FLOPs are known, the dry run's memory figures
against the live buffers of a real step, and ``train.py --dry-run`` on a device count of its own."""

import importlib.util
import math
import os
import re
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from config import ConfigError, load_config
from models import registry
from parallel.dry_run import dry_run, report, run_dry_run
from parallel.topologies import gpu_topology, topology_devices, tpu_topology
from parallel.estimate import ACCELERATORS, collective_seconds, on_hosts
from parallel.hlo_stats import Collective, HloStats, loop_body_kernels, parse_hlo, replica_groups
from parallel.layout import Layout
from parallel.mesh import make_mesh
from tests.common import random_batches, run_cli, tiny_config, train_step_for

TRIPS = 5


def test_hlo_reader_counts_loop_trips_groups_and_flops():
    mesh = make_mesh("x:4,y:2")

    def block(a, w):  # per device: a (2, 8), w (8, 8)
        def body(_, c):
            return c + jax.lax.psum(c @ w, "x")  # one all-reduce over the 4 devices of x and one dot per trip
        return jax.lax.fori_loop(0, TRIPS, body, a)

    f = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(P("x", "y"), P()), out_specs=P("x", "y")))
    compiled = f.lower(jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32)).compile()
    stats = parse_hlo(compiled.as_text(), 8)
    [row] = stats.by_kind().values()
    assert list(stats.by_kind()) == ["all-reduce"]
    assert row["executions"] == TRIPS and row["bytes"] == TRIPS * 2 * 8 * 4
    groups = {frozenset(g) for c in stats.collectives for g in c.groups}
    assert groups == {frozenset(int(d.id) for d in mesh.devices[:, j]) for j in range(2)}  # x varies, y fixed
    assert stats.matmul_flops == TRIPS * 2 * 2 * 8 * 8
    # all-reduce over 4: 2 * 3/4 of 64 bytes sent per trip, inside one node of 8 on NVLink
    assert collective_seconds(stats, ACCELERATORS["h100"]) == pytest.approx(TRIPS * 1.5 * 64 / 450e9)


@pytest.mark.parametrize("lhs, rhs, strides, padding, lhs_dilation, rhs_dilation, groups", [
    ((4, 8, 16, 16), (6, 8, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),
    ((2, 8, 15, 9), (4, 4, 3, 2), (2, 1), ((0, 2), (3, 1)), (1, 2), (2, 1), 2),
    # the TPU compiler's spelling of PD,DNH->PNH: a window of 12 over a padded axis of 1, one valid tap each
    ((3, 16, 1, 5), (12, 16, 12, 1), (1, 1), ((11, 11), (0, 0)), (1, 1), (1, 1), 1),
], ids=["padded", "strided-dilated-grouped", "dot-as-window"])
def test_hlo_reader_counts_convolutions_as_xla_does(lhs, rhs, strides, padding, lhs_dilation, rhs_dilation, groups):
    """The TPU compiler writes every dot as a convolution: their FLOPs are the valid window taps, as XLA's own
    cost analysis counts them."""
    f = jax.jit(lambda a, b: jax.lax.conv_general_dilated(a, b, strides, padding, lhs_dilation, rhs_dilation,
                                                          feature_group_count=groups))
    compiled = f.lower(jnp.zeros(lhs), jnp.zeros(rhs)).compile()
    assert " convolution(" in compiled.as_text()
    assert parse_hlo(compiled.as_text(), 1).matmul_flops == compiled.cost_analysis()["flops"] > 0


LOOP_HLO = """HloModule loop

%body (p: (s32[], f32[2,8], f32[8,8])) -> (s32[], f32[2,8], f32[8,8]) {
  %p = (s32[], f32[2,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %step = s32[]{:T(128)} constant(STEP)
  %next = s32[]{:T(128)} add(%i, %step)
  %c = f32[2,8]{1,0} get-tuple-element(%p), index=1
  %w = f32[8,8]{1,0} get-tuple-element(%p), index=2
  %d = f32[2,8]{1,0} dot(%c, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %k = (bf16[2,8]{1,0}, u8[0]{0}) custom-call(%c, %c, %c), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %t = (s32[], f32[2,8]{1,0}, f32[8,8]{1,0}) tuple(%next, %d, %w)
}

%cond (q: (s32[], f32[2,8], f32[8,8])) -> pred[] {
  %limit = s32[]{:T(128)} constant(7)
  %q = (s32[], f32[2,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %n = s32[]{:T(128)} get-tuple-element(%q), index=0
  ROOT %lt = pred[]{:T(512)} compare(%n, %limit), direction=LT
}

ENTRY %main (a: f32[2,8], w: f32[8,8], s: s32[]) -> f32[2,8] {
  %a = f32[2,8]{1,0} parameter(0)
  %w = f32[8,8]{1,0} parameter(1)
  %start = s32[]{:T(128)} START
  %init = (s32[], f32[2,8]{1,0}, f32[8,8]{1,0}) tuple(%start, %a, %w)
  %loop = (s32[], f32[2,8]{1,0}, f32[8,8]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[2,8]{1,0} get-tuple-element(%loop), index=1
}
"""


@pytest.mark.parametrize("start, step, trips", [("constant(2)", 1, 5), ("constant(0)", 1, 7), ("parameter(2)", 1, 7),
                                               ("constant(0)", 2, 4)])
def test_hlo_reader_reads_a_loops_trips_off_its_condition(start, step, trips):
    """The TPU compiler's loops state no known_trip_count: counter < limit, from the counter's initial constant,
    in the body's steps (2 in a loop XLA unrolled twice)."""
    hlo = LOOP_HLO.replace("START", start).replace("STEP", str(step))
    stats = parse_hlo(hlo, 1)
    assert stats.matmul_flops == trips * 2 * 2 * 8 * 8
    assert stats.attention_kernel_calls == trips  # cuDNN's flash attention, whose FLOPs the HLO does not show


CUBLAS_HLO = """HloModule cublas

ENTRY %main (a: bf16[4,256,512], w: bf16[512,1024], b: bf16[4,512,64]) -> bf16[1024,1024] {
  %a = bf16[4,256,512]{2,1,0} parameter(0)
  %w = bf16[512,1024]{1,0} parameter(1)
  %b = bf16[4,512,64]{2,1,0} parameter(2)
  %batched = (bf16[4,256,64]{2,1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],\
"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  %flat = bf16[1024,512]{1,0} bitcast(%a)
  %plain = (bf16[1024,1024]{1,0}, s8[4194304]{0}) custom-call(%flat, %w), custom_call_target="__cublas$gemm", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],\
"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %out = bf16[1024,1024]{1,0} get-tuple-element(%plain), index=0
}
"""


def test_hlo_reader_counts_the_matmuls_xla_gpu_hands_to_cublas():
    """With cuBLAS chosen for a step's matmuls (parallel/xla_flags.GPU_STEP_OPTIONS) XLA:GPU writes them as library
    calls whose contracted dimensions sit in the backend config (as XLA wrote them for an H100, trimmed)."""
    assert parse_hlo(CUBLAS_HLO, 1).matmul_flops == 2 * 4 * 256 * 64 * 512 + 2 * 1024 * 1024 * 512


DECODE_LOOP_HLO = """HloModule decode

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %a = f32[8]{0} fusion(%x), kind=kLoop, calls=%f
  %b = f32[8]{0} custom-call(%a), custom_call_target="__cublas$gemm"
  %c = f32[8]{0} copy(%b)
  %d = f32[8]{0} fusion(%c), kind=kInput, calls=%f
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8]) tuple(%next, %d)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]) tuple(%zero, %x)
  %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body{config}
  ROOT %out = f32[8]{0} get-tuple-element(%w), index=1
}
"""


@pytest.mark.parametrize("step, per_iteration", [(1, 5), (2, 2.5)], ids=["as-written", "double-buffered"])
def test_the_loop_reader_counts_one_iterations_kernels(step, per_iteration):
    """Four kernels and the counter's add per iteration; XLA:GPU's double buffering puts two iterations in one
    body and says so in the loop's config."""
    config = (', backend_config={"known_trip_count":{"n":"4"},"known_init_step":{"init":"0","step":"2"}}'
              if step == 2 else "")
    text = DECODE_LOOP_HLO.replace("{config}", config)
    assert loop_body_kernels(text) == per_iteration
    assert loop_body_kernels(text.replace("while(", "call(").replace("body=", "to_apply=")) == 0


def test_a_gpu_node_is_one_host():
    """The NVLink domain of a GPU topology is one host's GPUs: an all-reduce over 2 hosts x 4 GPUs crosses the
    network, over one host it stays on NVLink; TPU slices are one ICI domain whatever their hosts."""
    class Device:
        def __init__(self, host):
            self.process_index = host

    two_hosts = [Device(i // 4) for i in range(8)]
    h100 = on_hosts(ACCELERATORS["h100"], two_hosts)
    assert h100.node_size == 4 and on_hosts(ACCELERATORS["h100"], [Device(0)] * 8).node_size == 8
    assert on_hosts(ACCELERATORS["tpu-v5e"], two_hosts).node_size is None
    stats = HloStats(collectives=(Collective("all-reduce", 1024, 1, (tuple(range(8)),)),), matmul_flops=0.0)
    wire = 2 * 7 / 8 * 1024
    assert collective_seconds(stats, h100) == pytest.approx(wire / h100.network_bandwidth)
    assert collective_seconds(stats, ACCELERATORS["h100"]) == pytest.approx(wire / h100.link_bandwidth)


def test_replica_group_spellings():
    assert replica_groups("replica_groups={{0,2},{1,3}}, x", 4) == ((0, 2), (1, 3))
    assert replica_groups("replica_groups=[2,2]<=[2,2]T(1,0), x", 4) == ((0, 2), (1, 3))
    assert replica_groups("replica_groups=mesh['a'=2,'b'=2] {'a'}, x", 4) == ((0, 2), (1, 3))


def test_dry_run_memory_matches_a_real_step():
    """Parameters and optimizer state per device from the dry run equal the buffers a real step leaves on a
    device (margin 0.1%: the step counter), and XLA's argument size equals them plus the batch (margin 1%)."""
    cfg = tiny_config(tokens_per_mb_per_replica=32)  # 2 microbatches: the loop's collectives are counted twice
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,embd:x,heads:y,intermediate_expanded:y")
    run = dry_run(cfg, layout, lambda rngs: registry.build(cfg, rngs))

    step, state, data, _ = train_step_for(cfg, "x:4,y:2", "batch:x,embd:x,heads:y,intermediate_expanded:y",
                                          microbatches=2)
    state, _ = step(state, jax.device_put(random_batches(cfg, 1)[0], data))
    device = jax.devices()[0]
    live = {name: sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards
                      if s.device == device) for name, tree in (("params", state.params), ("opt", state.opt_state))}
    assert run.parameter_bytes == live["params"]
    assert math.isclose(run.optimizer_bytes, live["opt"], rel_tol=1e-3)
    assert math.isclose(run.argument_bytes, live["params"] + live["opt"] + run.batch_bytes, rel_tol=0.01)
    logits = cfg.train_batch_size // 4 // 2 * cfg.n_ctx * cfg.n_vocab * 4  # one microbatch's f32 logits
    assert run.temp_bytes >= logits
    assert run.microbatches == 2
    kinds = run.hlo.by_kind()
    assert kinds["all-reduce"]["executions"] > kinds["all-reduce"]["ops"]  # collectives in the microbatch loop
    # FSDP gradients: all-reduce + slice on CPU, counted as the reduce-scatter GPUs and TPUs run
    assert kinds["reduce-scatter"]["bytes"] > 0 and run.hlo.whole_before_scatter > 0
    text = report(run, cfg, layout)
    assert "| optimizer state |" in text and "| TPU v5e |" in text


def test_fsdp_gradients_in_bfloat16_read_as_the_reduce_scatters_they_are_in_float32():
    """In bf16 the CPU program converts each FSDP gradient's f32 sum to bf16 whole before slicing it: the reader
    follows the convert, so the step's collectives and whole arrays read as in float32 (they read as
    all-reduces, twice the bytes on the wire, and the dry run's 13B FSDP peak kept 51 GB of gradients whole)."""
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,embd:x,heads:y,intermediate_expanded:y")
    runs = {}
    for precision in ("float32", "bfloat16"):
        cfg = tiny_config(tokens_per_mb_per_replica=32, precision=precision)
        runs[precision] = dry_run(cfg, layout, lambda rngs: registry.build(cfg, rngs)).hlo
    assert runs["bfloat16"].by_kind() == runs["float32"].by_kind()
    assert runs["bfloat16"].whole_before_scatter == runs["float32"].whole_before_scatter > 0


@pytest.mark.slow
def test_dry_run_command_simulates_its_own_devices():
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--dry-run", "--devices", "16",
                     "--set", "mesh_shape=x:8,y:2", "--set", "layout=batch:x,heads:y", "--set", "n_layer=2",
                     "--set", 'attention_types=[[["global","local"],1]]', timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh {'x': 8, 'y': 2} (16 simulated devices)" in result.stdout
    assert "| all-reduce |" in result.stdout and "| H100 |" in result.stdout
    result = run_cli("train.py", "--config", "configs/gpt_neo_13B.json", "--dry-run", "--devices", "8")
    assert result.returncode == 2 and "mesh_shape 'x:16,y:16' needs 256 devices; give --devices 256" in result.stderr
    assert "Traceback" not in result.stderr


def test_tpu_slice_and_gpu_node_mistakes_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="--topology: 'tpu7:2x2' is not a TPU slice such as v5e:2x2"):
        tpu_topology("tpu7:2x2")
    with pytest.raises(ConfigError, match="'a100:8' is not a TPU slice .*, nor a GPU node such as h100:8, h200:8"):
        topology_devices("a100:8")
    with pytest.raises(ConfigError, match="--topology: 'h100:2x' is not a GPU node such as h100:8"):
        gpu_topology("h100:2x")
    with pytest.raises(ConfigError, match="--topology: 'h100:0' names no GPU"):
        gpu_topology("h100:0")
    monkeypatch.setitem(sys.modules, "jax_plugins.xla_cuda12", None)  # as where it is not installed
    with pytest.raises(ConfigError, match=r"compiling for GPUs needs jax's CUDA plugin \(pip install "
                                          r'"jax\[cuda12-local\]==0.10.2"'):
        topology_devices("h100:8")
    monkeypatch.setitem(sys.modules, "libtpu", None)  # as where it is not installed
    with pytest.raises(ConfigError, match=r'--topology: compiling for TPUs needs libtpu \(pip install "jax\[tpu\]'):
        tpu_topology("v5e:2x2")
    cfg, _ = load_config("quickstart", ())
    with pytest.raises(ConfigError, match="--devices: not with --topology"):
        run_dry_run(cfg, 4, topology="v5e:2x2")
    with pytest.raises(ConfigError, match="--accelerator: not with --topology"):
        run_dry_run(cfg, None, "tpu-v4", topology="v5e:2x2")


def test_dry_run_mistakes_name_the_real_problem():
    """Each found before any device is simulated, and named as it is, not as a device count left open."""
    cfg, _ = load_config("quickstart", ())
    for mesh_shape, devices, message in (("x4", None, "mesh_shape: 'x4' is not axis:size"),
                                         ("x4", 4, "mesh_shape: 'x4' is not axis:size"),
                                         ("x:-1,y:-1", None, "mesh_shape: only one axis may be -1, got x, y"),
                                         ("x:-1", 0, "--devices: 0 is not a device count; it must be at least 1"),
                                         ("x:-1", 100000, "--devices: 100,000 devices are more than the 16,384"),
                                         ("x:256,y:128", None, "mesh_shape 'x:256,y:128': 32,768 devices are more "
                                                               "than the 16,384 CPU devices one process simulates"),
                                         ("x:-1", None, "mesh_shape 'x:-1' leaves the device count open"),
                                         # the dry run sets the device count, so XLA_FLAGS is not the advice
                                         ("x:8", 4, "--devices 4: mesh_shape 'x:8' needs 8 devices; give --devices 8 "
                                                    "or leave --devices out"),
                                         ("x:3,y:-1", 8, "--devices 8: mesh_shape 'x:3,y:-1' fixes 3 devices, which "
                                                         "does not divide 8; give a multiple of 3")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            run_dry_run(cfg.replace(mesh_shape=mesh_shape), devices)
    # what a real run refuses when it opens its data is refused at load, so a dry run (which reads none) refuses it
    with pytest.raises(ConfigError, match="datasets: embedded_bpe: sampling_mode 'chunk' is not one of chunks"):
        load_config("quickstart", ('datasets=[["embedded_bpe",null,"chunk",null]]',))
    with pytest.raises(ConfigError, match="datasets: embedded_bpe: weight 0 must be a positive number or null"):
        load_config("quickstart", ('datasets=[["embedded_bpe",null,null,0]]',))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason='compiling for TPUs needs libtpu: pip install '
                    '"jax[tpu]==0.10.2" (CI has none: the checks above cover the reader and the kernel choice)')
def test_dry_run_compiles_for_a_tpu_slice_without_one():
    """The TPU compiler's own program for a v5e slice of 4 chips, on this CPU machine: splash attention's Pallas
    kernels compiled for global and local layers (forward, dq and dk/dv per layer), the TPU's memory plan, and an
    estimate for that TPU alone."""
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--dry-run", "--topology", "v5e:2x2",
                     "--set", "mesh_shape=x:4", "--set", "layout=batch:x", "--set", "n_layer=2",
                     "--set", 'attention_types=[[["global","local"],1]]', timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "mesh {'x': 4} (4 TPU v5 lite devices, compiled ahead of time, none attached)" in out
    assert "attention in 6 Pallas kernel calls, counted as the model" in out
    assert "(TPU v5 lite compiler)" in out and "| TPU v5e |" in out and "H100" not in out
    model, compiled = (float(x) for x in re.search(r"model ([\d.e+]+) .*compiled matmuls ([\d.e+]+)", out).groups())
    assert 0.5 * model < compiled < model  # the head and projections, read off convolutions; attention not


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


@pytest.mark.slow
@pytest.mark.skipif(not (installed("jax_plugins.xla_cuda12") and installed("nvidia.cudnn")),
                    reason="compiling for GPUs needs jax's CUDA plugin and cuDNN: pip install "
                    '"jax[cuda12-local]==0.10.2" "nvidia-cudnn-cu12>=9.8,<10" (CI has neither: the checks above '
                    "cover the reader and the names)")
def test_dry_run_compiles_for_gpus_without_one(monkeypatch):
    """XLA's GPU compiler's own program for two H100s, on this CPU machine: cuDNN flash attention for global and
    local layers (forward and backward per layer), the GPU's memory plan and an estimate for the H100 alone. A
    step the compiler cannot compile without its GPU is one line (ViT's small matmuls as Triton kernels, without
    the step's cuBLAS option: XLA does not autotune Triton tiles without a GPU) and compiles with the workaround
    the line names."""
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--dry-run", "--topology", "h100:2",
                     "--set", "mesh_shape=x:2", "--set", "layout=batch:x", "--set", "n_layer=2",
                     "--set", "precision=bfloat16", "--set", 'attention_types=[[["global","local"],1]]',
                     timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "mesh {'x': 2} (2 NVIDIA H100 80GB HBM3 devices, compiled ahead of time, none attached)" in out
    assert "attention in 4 cuDNN flash attention kernel calls, counted as the model" in out
    assert "(NVIDIA H100 80GB HBM3 compiler)" in out and "| H100 |" in out and "TPU" not in out
    assert "| all-reduce |" in out  # the gradients, over the two GPUs
    model, compiled = (float(x) for x in re.search(r"model ([\d.e+]+) .*compiled matmuls ([\d.e+]+)", out).groups())
    assert 0.5 * model < compiled < model  # the head and projections; attention inside cuDNN's kernels
    vit = ("train.py", "--config", "configs/vit_digits.json", "--dry-run", "--topology", "h100", "--set",
           "mesh_shape=x:1", "--set", "precision=bfloat16")
    result = run_cli(*vit, timeout=300)  # the step's own options: cuBLAS
    assert result.returncode == 0 and "| H100 |" in result.stdout, result.stderr[-3000:]
    monkeypatch.setenv("NEOMESH_XLA_DEFAULTS", "0")
    result = run_cli(*vit, timeout=300)
    assert "Traceback" not in result.stderr and (result.returncode == 0 or "--xla_gpu_enable_triton_gemm=false"
                                                 in result.stderr), result.stderr[-3000:]
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_triton_gemm=false")
    result = run_cli(*vit, timeout=300)
    assert result.returncode == 0 and "| H100 |" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not (installed("jax_plugins.xla_cuda12") and installed("nvidia.cudnn")),
                    reason="compiling for GPUs needs jax's CUDA plugin and cuDNN (see above)")
def test_unreduced_accumulation_compiles_for_gpus_with_cudnn_attention():
    """accumulate_unreduced traces the model inside a shard_map manual over the batch axis, where jax's
    partitioning rule for cuDNN attention cannot run over the tensor-parallel axis left to GSPMD (the GPU compile
    failed in it): there each device calls the kernel on its share. The step keeps its cuDNN calls and reduces
    the gradients once instead of after each of its 2 microbatches."""
    accumulating_unreduced_keeps_the_kernels("h100:4", "cuDNN flash attention")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="compiling for TPUs needs libtpu (see above)")
def test_unreduced_accumulation_compiles_for_a_tpu_slice_with_splash_attention():
    """The same on a v5e slice: splash attention's own shard_map takes the tensor-parallel axis inside the step's."""
    accumulating_unreduced_keeps_the_kernels("v5e:2x2", "Pallas")


def accumulating_unreduced_keeps_the_kernels(topology: str, kernels: str) -> None:
    """Dry runs for ``topology`` (4 devices) with and without accumulate_unreduced: the same attention kernel
    calls, fewer all-reduces per step with it."""
    outputs = {}
    for unreduced in ("false", "true"):
        result = run_cli("train.py", "--config", "configs/quickstart.json", "--dry-run", "--topology", topology,
                         "--set", "mesh_shape=x:2,y:2", "--set", "layout=batch:x,heads:y", "--set", "n_layer=2",
                         "--set", "precision=bfloat16", "--set", 'attention_types=[[["global","local"],1]]',
                         "--set", "tokens_per_mb_per_replica=512", "--set", f"accumulate_unreduced={unreduced}",
                         timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs[unreduced] = result.stdout
    calls, runs = set(), {}
    for unreduced, out in outputs.items():
        calls.add(re.search(rf"attention in (\d+) {kernels} kernel calls", out).group(1))
        runs[unreduced] = int(re.search(r"\| all-reduce \| \d+ \| (\d+) \|", out).group(1))
    assert len(calls) == 1 and int(calls.pop()) > 0  # every layer's attention, both ways
    assert "in 2 microbatches (gradients reduced once per step)" in outputs["true"]
    assert runs["true"] < runs["false"], runs


@pytest.mark.slow
@pytest.mark.skipif(not (installed("jax_plugins.xla_cuda12") and installed("nvidia.cudnn")),
                    reason="compiling for GPUs needs jax's CUDA plugin and cuDNN (see above)")
def test_generation_compiles_for_an_h100_without_one_and_its_loop_is_not_double_buffered(monkeypatch):
    """NeoMesh's XLA defaults double-buffer while loops (for scanned train steps); the generation loop opts out,
    so its kernels per token are those of a compile without the defaults."""
    command = ("benchmarks/generate.py", "--compile-only", "--topology", "h100", "--config", "quickstart",
               "--precision", "bfloat16", "--batch-sizes", "1", "--new-tokens", "8", "--prompt-tokens", "4")
    kernels = []
    for defaults in ("1", "0"):
        monkeypatch.setenv("NEOMESH_XLA_DEFAULTS", defaults)
        result = run_cli(*command, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        header, _, row = result.stdout.strip().splitlines()[-3:]
        assert header == "| batch | KV cache | temporaries | kernels per new token | compile s |"
        kernels.append(float(row.strip("|").split("|")[3]))
    assert kernels[0] == kernels[1] > 0


@pytest.mark.skipif(not (installed("jax_plugins.xla_cuda12") and installed("nvidia.cudnn")),
                    reason="compiling for GPUs needs jax's CUDA plugin and cuDNN (see above)")
def test_on_a_gpu_one_prompt_decodes_as_two_rows_whose_matmuls_write_no_weight_sized_products():
    """XLA:GPU turns a one-row matmul into a multiply and a sum, writing some products out whole (the 1.3B plan
    kept 625 MB of them); a single prompt decodes as two rows there, so batch 1's plan is batch 2's."""
    command = ("benchmarks/generate.py", "--compile-only", "--topology", "h100", "--config", "gpt_neo_125M",
               "--precision", "bfloat16", "--batch-sizes", "1,2", "--new-tokens", "8", "--prompt-tokens", "4")
    result = run_cli(*command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = result.stdout.strip().splitlines()[-2:]
    one, two = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert one[0] == "1" and two[0] == "2"
    assert one[1:3] == two[1:3]  # the same KV cache and temporaries
    assert 0 <= int(one[3]) - int(two[3]) <= 1  # kernels per token: one more cuts the real row's logits out


@pytest.mark.skipif(not (installed("jax_plugins.xla_cuda12") and installed("nvidia.cudnn")),
                    reason="compiling for GPUs needs jax's CUDA plugin and cuDNN (see above)")
def test_decoding_through_cudnn_calls_it_once_per_layer_and_token_on_an_h100(tmp_path):
    """decode_kernel 'cudnn': XLA:GPU's plan of the decode loop calls cuDNN's flash attention once per layer (the
    KV cache read where it lies, the mask as a bias) where the XLA path has none. Since the cache stores keys and
    values heads first, XLA fuses its own path's scores, softmax and weighted sum into two kernels a layer, and
    the cuDNN plan is no longer the shorter one (quickstart: 61 kernels per token against 56; README, Speed)."""
    from parallel.hlo_stats import loop_body_kernels, split_computations

    kernels, calls = {}, {}
    for kernel in ("xla", "cudnn"):
        hlo = tmp_path / f"{kernel}.hlo"
        result = run_cli("benchmarks/generate.py", "--compile-only", "--topology", "h100", "--config", "quickstart",
                         "--precision", "bfloat16", "--batch-sizes", "1", "--new-tokens", "8", "--prompt-tokens", "4",
                         "--set", f"decode_kernel={kernel}", "--hlo", str(hlo), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        kernels[kernel] = float(result.stdout.strip().splitlines()[-1].strip("|").split("|")[3])
        text = hlo.read_text()
        assert loop_body_kernels(text) == kernels[kernel]  # the file is the program the table describes
        computations, _, _ = split_computations(text)
        bodies = [m.group(1) for lines in computations.values() for line in lines
                  if (m := re.search(r"\bbody=%([\w.\-]+)", line))]
        body = max(bodies, key=lambda name: len(computations[name]))  # the decode loop's
        calls[kernel] = sum("__cudnn$fmha" in line for line in computations[body])
    assert calls == {"xla": 0, "cudnn": 4}, calls  # quickstart's 4 layers
    assert kernels["cudnn"] > 0 and kernels["xla"] > 0


def test_a_plan_that_does_not_fit_says_which_accelerators_and_what_to_change():
    """A 'no' in the fits column came without a word on what would need less memory; the line under the table
    names the accelerators it does not fit and this config's keys that would help (and no key already set)."""
    from types import SimpleNamespace

    from parallel.dry_run import memory_advice

    GB = 10 ** 9
    by_name = {a.name: a for a in ACCELERATORS.values()}
    run = SimpleNamespace(peak_bytes=50 * GB, hlo=SimpleNamespace(whole_before_scatter=0), parameter_bytes=6 * GB,
                          optimizer_bytes=12 * GB, loss_chunk=512,
                          estimates=[SimpleNamespace(accelerator=by_name[n]) for n in ("H100", "TPU v4", "TPU v5e")])
    cfg, _ = load_config("gpt_neo_1.3B", ("train_batch_size=8", "recompute_grad=false"))
    advice = memory_advice(run, cfg, SimpleNamespace(text="batch:x"))
    assert advice == (
        "does not fit TPU v4, TPU v5e (peak 50 GB per device); to need less: split the parameters and optimizer "
        "state (18 GB per device) over the data axis too (FSDP: layout embd:AXIS) or more devices; --set "
        "recompute_grad=full; --set scan_layers=true; a smaller train_batch_size (now 8) or microbatches "
        "(tokens_per_mb_per_replica)"), advice
    scanned, _ = load_config("gpt_neo_1.3B", ("scan_layers=true", "recompute_grad=full"))
    run.parameter_bytes, run.optimizer_bytes = GB, 2 * GB
    advice = memory_advice(run, scanned, SimpleNamespace(text="batch:x,embd:x"))
    assert advice.endswith("to need less: a smaller train_batch_size (now 512) or microbatches "
                           "(tokens_per_mb_per_replica)"), advice
    run.peak_bytes = 10 * GB
    assert memory_advice(run, cfg, SimpleNamespace(text="batch:x")) is None
    # Planned for an H100's memory the 125M loss at T=2048, batch 8 is whole; a 16 GB TPU v5e would chunk it.
    small, _ = load_config("gpt_neo_125M", ("n_ctx=2048", "train_batch_size=8", "scan_layers=true",
                                            "recompute_grad=full"))
    run.peak_bytes, run.loss_chunk = 20 * GB, 0
    one = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    advice = memory_advice(run, small, one)
    assert "to need less: a plan for the TPU v5e's memory (--accelerator tpu-v5e), where the loss is computed " \
           "512 positions at a time (loss_chunk), as a run there does;" in advice, advice
