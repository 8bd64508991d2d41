"""GPT-Neo train step: NeoMesh (JAX) against transformers' GPTNeoForCausalLM (PyTorch), same shape, same run.

    python benchmarks/train_step.py                                   # the CPU shape: 4 x 256, T=256, batch 8
    python benchmarks/train_step.py --shape 125M --seq 512 --batch 4
    python benchmarks/train_step.py --shape 125M,1.3B --seq 2048 --batch 8 --precision bfloat16   # one GPU

Both sides run one full step (forward, next-token loss, backward, AdamW update) on the same random batch, with
GPT-Neo's alternating global/local layers; compile / warm-up steps are excluded and the median of ``--steps``
timed steps is shown. With ``--precision bfloat16`` NeoMesh computes in bf16 on fp32 master weights and PyTorch
runs under bf16 autocast; PyTorch uses SDPA attention where transformers offers it for GPT-Neo (5.23 does not:
eager attention then; the table says which), eagerly and, with ``--torch-compile``, also ``torch.compile``d.
Prints one table: shape, implementation, tokens/s, MFU (model FLOPs per token from training/flops.py over the
device's peak, where it is known), peak memory, compile seconds; each row is also printed as soon as it is
measured, so a run cut off by a time limit keeps what it measured.

On a GPU the peers share the device with NeoMesh in this process: PyTorch runs first and hands its memory back
(``torch.cuda.empty_cache``), and jax allocates as it needs (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set)
instead of taking 90% of the memory at start. A peer that fails (out of memory, a compile error) is a row saying
so; NeoMesh's rows are measured all the same. Without torch and transformers (``pip install -r
requirements-test.txt``) a note says so and NeoMesh runs alone.

Hugging Face's Flax GPT-Neo left transformers with version 5: ``--hf-flax DIR`` adds it as a third peer from a
transformers 4.x installed in DIR (``benchmarks/hf_flax_peer.py`` says how), timed in a process of its own after
the others.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# --shape names: a shipped config (with its GPT-Neo global/local pattern), or the small shape CPUs can time.
SHAPES = {
    "cpu": ("configs/gpt_neo_125M.json", {"n_layer": 4, "n_embd": 256, "n_head": 8,
                                          "attention_types": [[["global", "local"], 2]]}),
    "125M": ("configs/gpt_neo_125M.json", {}),
    "1.3B": ("configs/gpt_neo_1.3B.json", {}),
    "2.7B": ("configs/gpt_neo_2.7B.json", {}),
}


def shape_config(name: str, args):
    """The validated config of shape ``name`` with the command line's sequence, batch and options."""
    import json

    from config import ConfigError, load_config

    path, overrides = SHAPES[name]
    settings = {**overrides, "n_ctx": args.seq, "train_batch_size": args.batch, "precision": args.precision,
                "recompute_grad": args.remat, "loss_chunk": args.loss_chunk, "scan_layers": args.scan,
                "logits_pad_multiple": args.logits_pad,
                "warmup_steps": 0, "mesh_shape": "x:1",
                "layout": "batch:x"}
    if args.vocab is not None:
        settings["n_vocab"] = args.vocab
    if args.layers is not None:  # the shape's width at another depth, GPT-Neo's global/local pattern kept
        settings.update(n_layer=args.layers, attention_types=[[["global", "local"], args.layers // 2]])
    for given in args.set:  # a key the flags or the shape set is theirs: two values for one key would be a guess
        key = given.split("=", 1)[0].strip()
        if key in settings:
            owner = FLAG_OF_KEY.get(key) or (f"--shape {name}" if key in overrides else None)
            whose = f"set by {owner}" if owner else "fixed by this benchmark (one device, no warm-up)"
            raise ConfigError(f"--set {given}: {key} is {whose}")
    try:
        return load_config(path, overrides=tuple(f"{k}={json.dumps(v)}" for k, v in settings.items())
                           + tuple(args.set))[0]
    except ConfigError as e:  # the flag that set the key, not a --set the command line never had
        for key, flag in FLAG_OF_KEY.items():
            prefix = f"--set {key}="
            if str(e).startswith(prefix):
                raise ConfigError(f"{flag} {json.dumps(settings[key])}:{str(e)[len(prefix):].split(':', 1)[1]}") \
                    from None
        raise


# The config keys the command line sets, by flag.
FLAG_OF_KEY = {"n_ctx": "--seq", "train_batch_size": "--batch", "loss_chunk": "--loss-chunk", "n_layer": "--layers",
               "attention_types": "--layers", "n_vocab": "--vocab", "logits_pad_multiple": "--logits-pad",
               "precision": "--precision", "recompute_grad": "--remat", "scan_layers": "--scan"}


def neomesh(cfg, tokens) -> dict:
    """Median seconds per step, compile seconds and peak bytes of NeoMesh's jitted train step on one device."""
    import jax

    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import abstract_train_state, create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_train_step
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer

    device = jax.devices()[0]
    layout = Layout.from_config(make_mesh("x:1", [device]), "batch:x")
    objective, tx = objective_for(cfg, layout), make_optimizer(cfg)
    chunk = objective.loss_chunk
    how = f"{chunk} positions at a time" if chunk else "over all positions at once"
    print(f"NeoMesh: loss_chunk {chunk} (the loss {how})", flush=True)
    make_model = lambda rngs: registry.build(cfg, rngs)  # noqa: E731
    start = time.perf_counter()
    if ARGS.compile_only:  # nothing allocated: shapes too large for this machine still compile
        graphdef, state, shardings = abstract_train_state(make_model, tx, layout)
    else:
        graphdef, state, shardings = create_train_state(make_model, tx, layout, 0)
        jax.block_until_ready(state)
        print(f"NeoMesh: parameters and optimizer state created in {time.perf_counter() - start:.1f} s", flush=True)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           precision=cfg.precision)
    batch = {"tokens": jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=data["tokens"])}
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_seconds = time.perf_counter() - start
    print(f"NeoMesh: traced and lowered in {lower_seconds:.1f} s; compiling", flush=True)
    compiled = lowered.compile()
    compile_seconds = time.perf_counter() - start
    print(f"NeoMesh: compiled in {compile_seconds - lower_seconds:.1f} s", flush=True)
    analysis = compiled.memory_analysis()
    compiled_bytes = analysis and (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                                   - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
    if ARGS.compile_only:
        return {"seconds": None, "compile": compile_seconds, "peak": compiled_bytes}
    batch = jax.device_put({"tokens": tokens}, data)
    state, metrics = compiled(state, batch)  # the first run allocates; not timed
    jax.block_until_ready(metrics)
    times = []
    for _ in range(ARGS.steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    if ARGS.profile:
        from benchmarks.xla_profile import GPU_PROFILE_OPTIONS, print_profile, profile

        profiled = compiled
        if device.platform == "gpu":  # its kernels then name their instructions (xla_profile.py)
            print("NeoMesh: compiling the step again without command buffers for its profile", flush=True)
            profiled = lowered.compile(compiler_options=GPU_PROFILE_OPTIONS)

        def run():
            nonlocal state
            state, metrics = profiled(state, batch)
            jax.block_until_ready(metrics)

        print_profile(profile(run, profiled.as_text(), ARGS.profile), ARGS.profile)
    stats = device.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use", compiled_bytes)  # CPUs keep no allocator statistics: the program's
    return {"seconds": statistics.median(times), "compile": compile_seconds, "peak": peak}


def pytorch(cfg, tokens, compile_model: bool) -> dict:
    """The same for transformers' GPTNeoForCausalLM with torch.optim.AdamW (bf16 autocast for bfloat16); the
    device's memory is handed back afterwards, also when the step fails."""
    import gc

    import torch

    try:
        return pytorch_step(cfg, tokens, compile_model)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def pytorch_step(cfg, tokens, compile_model: bool) -> dict:
    import torch
    import transformers

    from benchmarks import zoo_step
    from convert import gpt_neo

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    zoo_step.torch_threads()
    model, attention = None, "eager"
    for attention in ("sdpa", "eager"):  # transformers 5.23's GPT-Neo has no SDPA path yet: eager then
        try:
            model = transformers.GPTNeoForCausalLM._from_config(
                transformers.GPTNeoConfig(**gpt_neo.config_to_hf(cfg)), attn_implementation=attention)
            break
        except (ValueError, ImportError):
            continue
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    forward = torch.compile(model) if compile_model else model
    ids = torch.from_numpy(tokens[:, :-1]).long().to(device)
    labels = torch.from_numpy(tokens[:, 1:]).long().to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=cfg.precision == "bfloat16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = forward(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds, first = zoo_step.timed(step, ARGS.steps)
    return {"seconds": seconds, "compile": first, "attention": attention,
            "peak": torch.cuda.max_memory_allocated() if cuda else None}


def hf_flax(cfg, tokens, path: str) -> dict:
    """The same for transformers 4.x's FlaxGPTNeoForCausalLM (installed in ``path``) with optax's AdamW."""
    from convert import gpt_neo

    request = {"config": gpt_neo.config_to_hf(cfg), "tokens": tokens.tolist(), "precision": cfg.precision,
               "steps": ARGS.steps}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "hf_flax_peer.py")],
                          input=json.dumps(request), capture_output=True, text=True, env=env)
    if done.returncode:  # out of memory, a 4.x that does not import: a row, as a failing PyTorch peer's
        return {"failed": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


ARGS = None


def check(args) -> None:
    """Bad flags as one line naming the flag (``ConfigError``), before jax starts."""
    from benchmarks.flags import at_least_one
    from config import ConfigError

    at_least_one(args, "seq", "batch", "steps")
    if args.layers is not None and (args.layers < 2 or args.layers % 2):
        raise ConfigError(f"--layers: {args.layers} is not a positive even depth (GPT-Neo's global/local pairs)")
    given = {"--profile": args.profile, "--torch-compile": args.torch_compile, "--hf-flax": args.hf_flax}
    for flag in (flag for flag, value in given.items() if value and args.compile_only):
        raise ConfigError(f"{flag}: not with --compile-only, which runs nothing (NeoMesh alone, compiled)")
    if args.torch_compile and args.no_peer:
        raise ConfigError("--torch-compile: not with --no-peer, which leaves out the PyTorch model it compiles")
    for name in args.shape.split(","):
        if name not in SHAPES:
            raise ConfigError(f"--shape: unknown shape {name!r} (known: {', '.join(SHAPES)})")
    if args.hf_flax and not os.path.isfile(os.path.join(args.hf_flax, "transformers", "__init__.py")):
        from benchmarks.hf_flax_peer import INSTALL
        raise ConfigError(f"--hf-flax: {args.hf_flax} holds no transformers; {INSTALL.replace('DIR', args.hf_flax)}")
    for name in args.shape.split(","):
        shape_config(name, args)


def table_row(shape, label, tokens_per_second, mfu, peak, compile_seconds, failed) -> str:
    if failed:
        return f"| {shape} | {label} | failed: {failed} | - | - | - |"
    rate = f"{tokens_per_second:,.0f}" if tokens_per_second else "-"
    return (f"| {shape} | {label} | {rate} | {f'{100 * mfu:.1f}%' if mfu else '-'} | "
            f"{f'{peak / 2 ** 30:.2f} GiB' if peak else '-'} | {compile_seconds:.1f} |")


def main(argv=None) -> None:
    global ARGS
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--shape", default="cpu", help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (T)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                   help="bfloat16: NeoMesh computes in bf16 on fp32 weights, PyTorch under bf16 autocast")
    p.add_argument("--remat", default="none", choices=("none", "full", "dots_saveable"),
                   help="NeoMesh's recompute_grad")
    p.add_argument("--loss-chunk", type=int, default=None, help="NeoMesh's loss_chunk (default: automatic)")
    p.add_argument("--vocab", type=int, help="override the shapes' n_vocab (GPT-Neo's 50257 padded to a multiple of "
                   "128 is 50304: what an aligned logits matmul gains)")
    p.add_argument("--logits-pad", type=int, default=None, metavar="N", help="NeoMesh's logits_pad_multiple: the "
                   "head's matmul over the vocabulary padded to a multiple of N, parameters unchanged (--vocab's "
                   "speed without its other model; default: the config's, 128 on a GPU, 0 elsewhere)")
    p.add_argument("--layers", type=int, help="override the shapes' depth (even: global/local pairs)")
    p.add_argument("--scan", action="store_true", help="NeoMesh's scan_layers")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override another key of the "
                   "shape's config, as train.py's --set does (attention_kernel=xla, say); the peers are built from "
                   "the same config; repeatable")
    p.add_argument("--normaliser", choices=("auto", "two-pass"), default="auto", help="the loss's log-normaliser: "
                   "'auto' reads the logits once on GPUs (training/token_losses.py), 'two-pass' as jax.nn.logsumexp "
                   "does everywhere (an A/B)")
    p.add_argument("--compile-only", action="store_true", help="NeoMesh alone, compiled but not run (compile "
                   "seconds and the program's memory; any shape compiles on a CPU)")
    p.add_argument("--profile", metavar="DIR", help="after timing, trace two NeoMesh steps with jax.profiler "
                   "into DIR and print the XLA ops that took longest (benchmarks/xla_profile.py)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per implementation (median reported)")
    p.add_argument("--no-peer", action="store_true", help="without the PyTorch peer: NeoMesh alone, or with "
                   "--hf-flax's")
    p.add_argument("--torch-compile", action="store_true", help="torch.compile the PyTorch model")
    p.add_argument("--hf-flax", metavar="DIR", help="also time Hugging Face's Flax GPT-Neo from a transformers 4.x "
                   "installed in DIR (see benchmarks/hf_flax_peer.py)")
    ARGS = args = p.parse_args(argv)
    from parallel.xla_flags import apply_defaults

    apply_defaults(compilation_cache=False)  # as train.py runs, but every compile timed cold
    if not (args.no_peer or args.compile_only):  # the GPU's memory is shared with the peers (module docstring)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.profile:  # XLA:CPU traces its ops only with this flag, read when jax starts
        from benchmarks.xla_profile import trace_cpu_ops

        trace_cpu_ops(args.profile)
    check(args)
    if not (args.no_peer or args.compile_only):
        from benchmarks import zoo_step
        from config import ConfigError

        try:
            zoo_step.require_pytorch_peer()
        except ConfigError as e:  # as generate.py: NeoMesh's rows all the same
            print(f"note: {e}; timing NeoMesh alone", flush=True)
            args.no_peer = True
    import jax
    import numpy as np

    from models.layers import logits_pad_multiple
    from parallel.xla_flags import step_options
    from training import token_losses
    from training.flops import peak_flops_per_second, train_flops_per_token

    if args.normaliser == "two-pass":
        token_losses.ONE_PASS_PLATFORMS = frozenset()

    device = jax.devices()[0]
    peak_flops = peak_flops_per_second()
    peak_flops = peak_flops / jax.device_count() if peak_flops else None
    rows = []
    for name in args.shape.split(","):
        cfg = shape_config(name, args)
        tokens = np.random.default_rng(0).integers(0, cfg.n_vocab, (args.batch, args.seq + 1)).astype(np.int32)
        shape = f"{name} ({cfg.n_layer}x{cfg.n_embd})"

        def add(label, r):
            tokens_per_second = args.batch * args.seq / r["seconds"] if r.get("seconds") else None
            mfu = tokens_per_second * train_flops_per_token(cfg) / peak_flops if peak_flops and tokens_per_second \
                else None
            rows.append((shape, label, tokens_per_second, mfu, r.get("peak"), r.get("compile"), r.get("failed")))
            print("row: " + table_row(*rows[-1]), flush=True)

        if not (args.no_peer or args.compile_only):  # first: PyTorch hands the GPU's memory back when done
            for compiled in (False, True) if args.torch_compile else (False,):
                try:
                    theirs = pytorch(cfg, tokens, compiled)
                except Exception as e:  # noqa: BLE001  out of memory, a compiler error: a row, not the end
                    from benchmarks.flags import failure

                    theirs = {"failed": failure(e)}
                label = f"transformers (PyTorch, {theirs.get('attention', 'eager')}{', compiled' if compiled else ''})"
                add(label, theirs)
        add("NeoMesh (JAX)", neomesh(cfg, tokens))
        if args.hf_flax and not args.compile_only:
            theirs = hf_flax(cfg, tokens, args.hf_flax)
            add(f"transformers {theirs.get('version', '4.x')} (Flax)", theirs)
    load = os.getloadavg()[0]
    pad = logits_pad_multiple(args.logits_pad)
    options = "".join(f", {name}={value}" for name, value in step_options(device.platform).items())
    print(f"\nGPT-Neo train step, T={args.seq}, batch {args.batch}, {args.precision}, recompute_grad {args.remat}"
          f"{', scan_layers' if args.scan else ''}{f', n_vocab {args.vocab}' if args.vocab else ''}"
          f"{f', logits_pad_multiple {pad}' if pad else ''}{''.join(f', {given}' for given in args.set)}"
          f"{', log-normaliser in two passes' if args.normaliser == 'two-pass' else ''}{options}; "
          f"JAX on {device.platform} ({device.device_kind}); {os.cpu_count()} cores, load {load:.1f}")
    print("| shape | implementation | tokens/s | MFU | peak memory | compile / first step s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(table_row(*row))
    ours = {shape: rate for shape, label, rate, *_ in rows if label.startswith("NeoMesh")}
    for shape, label, rate, *_ in rows:
        if not label.startswith("NeoMesh") and rate and ours.get(shape):
            print(f"{shape}: NeoMesh / {label} = {ours[shape] / rate:.2f}x")


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
