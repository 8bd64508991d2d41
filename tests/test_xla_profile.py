"""benchmarks/xla_profile.py: the XLA ops of a profiled step, named by the jax operations they came from."""

import subprocess
import sys

import jax
import jax.numpy as jnp

from benchmarks.xla_profile import op_names, op_totals, print_profile
from tests.common import ROOT


def test_op_names_map_compiled_instructions_to_their_jax_operations():
    compiled = jax.jit(lambda x, w: jnp.tanh(jnp.einsum("BTD,DF->BTF", x, w))).lower(
        jnp.ones((2, 8, 16)), jnp.ones((16, 32))).compile()
    names = op_names(compiled.as_text())
    assert "BTD,DF->BTF/dot_general" in names.values() and "tanh" in names.values()
    assert all(not name.startswith("jit(") for name in names.values())


def test_op_names_show_a_parameter_path_as_jax_wrote_it():
    line = ("  %copy_bitcast_fusion.3 = f32[768,768]{1,0} fusion(%p.1), kind=kLoop, metadata={op_name=\"jit(_sample)/"
            "params[\\'blocks\\'][4][\\'attn\\']\" source_file=\"x.py\"}")
    assert op_names(line) == {"copy_bitcast_fusion.3": "params['blocks'][4]['attn']"}


def test_a_profiled_function_lists_its_matmul_first():
    code = """
import os
from benchmarks.xla_profile import CPU_FLAG, profile
os.environ["XLA_FLAGS"] = CPU_FLAG
import jax, jax.numpy as jnp, tempfile
f = jax.jit(lambda x: jnp.tanh(jnp.einsum("ND,DF->NF", x, x)))
x = jnp.ones((1024, 1024))
compiled = f.lower(x).compile()
rows = profile(lambda: jax.block_until_ready(compiled(x)), compiled.as_text(), tempfile.mkdtemp())
print(rows[0][0], rows[0][2] > 0)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["ND,DF->NF/dot_general", "True"]


def test_a_gpu_trace_counts_the_device_kernels_by_their_hlo_op():
    names = {"fusion.3": "tanh", "custom-call.1": "ND,DF->NF/dot_general"}
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "fusion.3", "dur": 900},  # the host launching it: not counted
        {"ph": "X", "pid": 7, "name": "loop_tanh_fusion", "dur": 40, "args": {"hlo_op": "fusion.3"}},
        {"ph": "X", "pid": 7, "name": "sm90_xmma_gemm_bf16", "dur": 300, "args": {"hlo_op": "custom-call.1"}},
        {"ph": "X", "pid": 7, "name": "sm90_xmma_gemm_bf16", "dur": 100, "args": {"hlo_op": "custom-call.1"}},
        {"ph": "X", "pid": 7, "name": "memcpy", "dur": 5},  # no instruction of the program: counted as a copy
    ]
    assert op_totals(events, names) == {("ND,DF->NF/dot_general", "custom-call"): 400, ("tanh", "fusion"): 40,
                                        ("-", "copy"): 5}


def test_kernels_of_a_cuda_graph_count_by_their_fusion_name_or_their_library():
    """As an H100's trace of the 125M step came (2026-11-27): inside XLA's command buffers every kernel's hlo_op
    is the graph's; a fusion's kernel keeps its instruction's name with _N for .N, a cuBLAS or cuDNN kernel its
    library's own name."""
    names = {"gemm_fusion_dot_general.73": "jvp()/while/body/closed_call/dot_general",
             "loop_multiply_fusion.26": "mul", "loop_multiply_fusion": "mul"}
    graph = {"hlo_op": "command_buffer_297", "cuda_graph_id": "325"}
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "gemm_fusion_dot_general_73", "dur": 1212.0, "args": graph},
        {"ph": "X", "pid": 1, "name": "loop_multiply_fusion_26", "dur": 1.5, "args": graph},
        {"ph": "X", "pid": 1, "name": "nvjet_sm90_tst_128x160_64x5_1x2_h_bz_NNT", "dur": 93.0, "args": graph},
        {"ph": "X", "pid": 1, "name": "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", "dur": 28.0, "args": graph},
        {"ph": "X", "pid": 1, "name": "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64"
         "_1x4x1_cga1x1x1_kernel0", "dur": 267.0, "args": graph},
        {"ph": "X", "pid": 1, "name": "input_reduce_fusion_9", "dur": 4.0, "args": graph},  # not in this program
    ]
    assert op_totals(events, names) == {
        ("jvp()/while/body/closed_call/dot_general", "gemm_fusion_dot_general"): 1212.0,
        ("mul", "loop_multiply_fusion"): 1.5, ("-", "cuBLAS"): 121.0, ("-", "cuDNN"): 267.0,
        ("-", "input_reduce_fusion"): 4.0}


def test_the_printed_profile_accounts_for_the_ops_it_leaves_out(capsys):
    rows = [("ND,DF->NF/dot_general", "custom-call", 4.0), ("tanh", "fusion", 1.5), ("add", "fusion", 0.25),
            ("mul", "fusion", 0.25)]
    print_profile(rows, "/tmp/trace", shown=2)
    table = capsys.readouterr().out.splitlines()[-4:]
    assert table[:2] == ["| 4.0 | ND,DF->NF/dot_general | custom-call |", "| 1.5 | tanh | fusion |"]
    assert table[2:] == ["| 0.5 | the 2 other operations | |", "| 6.0 | all traced operations | |"]
