"""Decoding speed: NeoMesh's KV-cached generation against transformers (PyTorch) on the same weights, in one run.

    python benchmarks/generate.py [--config configs/gpt_neo_125M.json] [--new-tokens 32] [--prompt-tokens 32]

Both sides decode greedily to exactly ``--new-tokens`` tokens (no early eos) from the same random prompt; times
include the prefill and are the median of ``--repeats`` runs after a warm-up (NeoMesh's warm-up compiles).
The transformers side needs torch and transformers (``pip install -r requirements-test.txt``); without them, or
with ``--neomesh-only``, NeoMesh runs alone on randomly initialised weights. transformers decodes with its dynamic
cache and, with ``--static-cache``, also with its static cache (compiled on GPUs, once per batch size: ``--static-cache
1`` at batch 1 alone). Each row is printed as soon as
it is measured, so a run cut off by a time limit keeps what it measured; a transformers case that fails is a row
saying so. On a GPU, jax allocates as it needs (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set): PyTorch
shares the device.

``--compile-only`` runs nothing: it compiles NeoMesh's generation program for one device, this machine's or with
``--topology`` an accelerator this machine does not have (``h100``, ``h200``, ``v5e:1x1``: XLA's own GPU or TPU
compiler, as ``train.py --dry-run --topology``), and prints its plan per batch size: the bytes of the weights, the
KV cache and the temporaries and, for a GPU, the kernels the decode loop launches per new token (at batch 1 each
costs microseconds whatever its size). Nothing is allocated, so any shape compiles.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> None:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--config", default="configs/gpt_neo_125M.json", help="model shape to time")
    p.add_argument("--new-tokens", type=int, default=32, metavar="N", help="tokens generated per row")
    p.add_argument("--prompt-tokens", type=int, default=32, metavar="N", help="random prompt length")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="timed runs per case (the median is shown)")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"), help="weights and KV cache "
                   "dtype on both sides")
    p.add_argument("--static-cache", nargs="?", const="all", metavar="BATCH_SIZES", help="transformers also with "
                   "cache_implementation='static' and a compiled forward (its fastest decoding, where the model "
                   "supports it), at every batch size or at these (comma-separated; each compiles anew)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of --config "
                   "for NeoMesh, as train.py's --set does (decode_kernel=cudnn, say); repeatable")
    p.add_argument("--neomesh-only", action="store_true", help="time NeoMesh alone (random weights), without "
                   "transformers")
    p.add_argument("--profile", metavar="DIR", help="after timing, trace NeoMesh's generation at the first batch "
                   "size with jax.profiler into DIR and print the XLA ops that took longest, and the kernels' time "
                   "per new token against the step's (benchmarks/xla_profile.py)")
    p.add_argument("--compile-only", action="store_true", help="compile NeoMesh's generation program for one "
                   "device without running it: memory, and kernels per new token on a GPU (nothing allocated)")
    p.add_argument("--topology", metavar="NAME", help="with --compile-only: the device to compile for, without "
                   "it: h100, h200 (jax's CUDA plugin) or a one-chip TPU slice such as v5e:1x1 (libtpu)")
    p.add_argument("--hlo", metavar="FILE", help="with --compile-only: also write the optimized HLO text of the "
                   "last batch size's program to FILE (its kernels, for reading or a tool of your own)")
    args = p.parse_args(argv)
    from parallel.xla_flags import apply_defaults

    apply_defaults(compilation_cache=False)  # as train.py runs, but every compile timed cold
    if not (args.neomesh_only or args.compile_only):  # PyTorch shares the GPU: jax must not take 90% at start
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from config import ConfigError

    if args.topology and not args.compile_only:
        raise ConfigError("--topology: only with --compile-only (nothing runs on a device this machine lacks)")
    if args.hlo and not args.compile_only:
        raise ConfigError("--hlo: only with --compile-only (the program it writes is the one compiled there)")
    if args.profile and args.compile_only:
        raise ConfigError("--profile: not with --compile-only, which runs nothing to profile")
    if args.profile:  # XLA:CPU traces its ops only with this flag, read when jax starts
        from benchmarks.xla_profile import trace_cpu_ops

        trace_cpu_ops(args.profile)
    static_batch_sizes(args)  # the flags' mistakes (--batch-sizes, --static-cache) before jax starts
    if args.static_cache and (args.neomesh_only or args.compile_only):
        raise ConfigError(f"--static-cache: transformers' cache, not with --"
                          f"{'neomesh-only' if args.neomesh_only else 'compile-only'}, which times NeoMesh alone")
    if args.compile_only:
        return compile_plan(args)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from convert import gpt_neo
    from models import registry
    from models.generate import Sampling, sample
    from parallel.state import abstract_model

    torch = transformers = None
    if not args.neomesh_only:
        try:
            import torch
            import transformers
        except ImportError as e:
            torch = transformers = None
            print(f"note: the transformers side needs torch and transformers ({e.name} is missing: pip install -r "
                  "requirements-test.txt); timing NeoMesh alone on random weights", flush=True)

    cfg = checked_config(args)
    if transformers is not None and cfg.model != "gpt_neo":
        raise ConfigError(f"--config {args.config}: the transformers side runs GPT-Neo, not model {cfg.model}; "
                          "add --neomesh-only to time NeoMesh alone")
    graphdef, _, _ = abstract_model(lambda rngs: registry.build(cfg, rngs))
    dtype = jnp.bfloat16 if args.precision == "bfloat16" else jnp.float32
    device = "cpu"
    if transformers is not None:
        reference = transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(**gpt_neo.config_to_hf(cfg))).eval()
        tensors = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
        params = jax.tree.map(jnp.asarray, gpt_neo.params_from_hf(cfg, tensors))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        reference = reference.to(device, dtype=torch.bfloat16 if args.precision == "bfloat16" else torch.float32)
    else:
        from flax import nnx
        params = nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(0))))
    params = jax.tree.map(lambda p: p.astype(dtype), params)  # the KV cache takes the weights' dtype
    settings = Sampling(max_new_tokens=args.new_tokens, temperature=0, eos_id=None)

    def timed(fn) -> float:
        fn()  # warm-up (compiles NeoMesh's loop once per shape)
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    rows = []

    def add(name, batch, seconds=None, failed=None):
        rows.append((name, batch, seconds and batch * args.new_tokens / seconds,
                     seconds and 1000 * seconds / args.new_tokens, failed))
        print("row: " + table_row(*rows[-1]), flush=True)

    prompts = {batch: np.random.default_rng(0).integers(0, cfg.n_vocab, (batch, args.prompt_tokens))
               for batch in batch_sizes(args)}
    for batch, prompt in prompts.items():  # NeoMesh's rows first: a peer's long compile cannot cost them
        pad = np.zeros((batch,), np.int32)
        add("NeoMesh (JAX)", batch, timed(lambda: jax.block_until_ready(
            sample(graphdef, params, prompt, pad, settings, jax.random.key(0)))))
    if args.profile:
        profile_generation(args, graphdef, params, prompts, settings, rows[0])
    caches = {"dynamic cache": ({}, list(prompts))}
    if args.static_cache:  # compiles itself on GPUs
        caches["static cache"] = ({"cache_implementation": "static"}, static_batch_sizes(args))
    for cache_name, (cache, sizes) in caches.items() if torch is not None else ():
        for batch, prompt in ((b, prompts[b]) for b in sizes):
            ids = torch.from_numpy(prompt).to(device)

            def theirs_run():
                with torch.no_grad():
                    reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                                       max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **cache)

            name = f"transformers (PyTorch, {cache_name})"
            try:
                add(name, batch, timed(theirs_run))
            except Exception as e:  # noqa: BLE001  a cache or compile this model or version lacks: a row
                from benchmarks.flags import failure

                add(name, batch, failed=failure(e))

    jax_device = jax.devices()[0]
    theirs = "" if torch is None else (f", PyTorch on {device}" + (f" with {torch.get_num_threads()} threads"
                                                                   if device == "cpu" else ""))
    print(f"\n{title(args, cfg)}; JAX on {jax_device.platform} ({jax_device.device_kind}){theirs}; "
          f"load {os.getloadavg()[0]:.1f}")
    print("| implementation | batch | tokens/s | ms/token |")
    print("|---|---|---|---|")
    for row in rows:
        print(table_row(*row))


def profile_generation(args, graphdef, params, prompts: dict, settings, row: tuple) -> None:
    """``--profile``: NeoMesh's generation at the first batch size (``row``: its timed row) under jax.profiler,
    the ops that took longest, and the traced ops' summed time per new token against the timed step. On a GPU the
    program is compiled again without command buffers (xla_profile.GPU_PROFILE_OPTIONS: the kernels then name
    their instructions): its kernels take the same time, the gaps between them do not."""
    import jax
    import numpy as np

    from benchmarks.xla_profile import GPU_PROFILE_OPTIONS, print_profile, profile
    from models.generate import compiled_sample

    batch, prompt = next(iter(prompts.items()))
    on_gpu = jax.devices()[0].platform == "gpu"
    if on_gpu:
        print("NeoMesh: compiling generation again without command buffers for its profile", flush=True)
    run, hlo_text = compiled_sample(graphdef, params, prompt, np.zeros((batch,), np.int32), settings,
                                    jax.random.key(0), GPU_PROFILE_OPTIONS if on_gpu else None)
    jax.block_until_ready(run())  # the first run's allocations stay out of the trace
    rows = profile(lambda: jax.block_until_ready(run()), hlo_text, args.profile)
    print_profile(rows, args.profile, shown=20)
    traced = sum(millis for _, _, millis in rows) / args.new_tokens
    print(f"batch {batch}: the traced ops add up to {traced:.3f} ms per new token (prefill included) against "
          f"{row[3]:.3f} ms per new token timed; on a GPU the difference is time between kernels")


def title(args, cfg) -> str:
    """What a table measured: the model, its ``--set`` keys (decode_kernel=cudnn, say) and the decoding."""
    return (f"{args.config}: {cfg.n_layer} layers x {cfg.n_embd}{''.join(f', {given}' for given in args.set)}, "
            f"{args.precision}, prompt {args.prompt_tokens} + {args.new_tokens} new tokens, greedy")


def table_row(name, batch, tokens_per_second, ms, failed) -> str:
    if failed:
        return f"| {name} | {batch} | failed: {failed} | - |"
    return f"| {name} | {batch} | {tokens_per_second:,.1f} | {ms:.2f} |"


def batch_sizes(args) -> list[int]:
    """The ``--batch-sizes``, after the counts every path shares are checked (``ConfigError`` naming the flag)."""
    from benchmarks.flags import at_least_one
    from config import ConfigError

    # compile_plan's callers give no repeats
    at_least_one(args, *(flag for flag in ("new_tokens", "prompt_tokens", "repeats") if hasattr(args, flag)))
    sizes = []
    for text in args.batch_sizes.split(","):
        if not text.strip().isdigit() or int(text) < 1:
            raise ConfigError(f"--batch-sizes: {text.strip()!r} is not a positive whole number (e.g. 1,16)")
        sizes.append(int(text))
    return sizes


def static_batch_sizes(args) -> list[int]:
    """The batch sizes ``--static-cache`` names (all of ``--batch-sizes`` without a value, none without the flag),
    after ``batch_sizes``' checks."""
    from config import ConfigError

    sizes = batch_sizes(args)
    if not args.static_cache:
        return []
    if args.static_cache == "all":
        return sizes
    chosen = []
    for text in args.static_cache.split(","):
        if not text.strip().isdigit() or int(text) not in sizes:
            raise ConfigError(f"--static-cache: {text.strip()!r} is not one of --batch-sizes {args.batch_sizes}")
        chosen.append(int(text))
    return chosen


def checked_config(args):
    """The ``--config``, refused in one line where it cannot generate or the prompt and new tokens overrun it."""
    from config import ConfigError, load_config
    from models import registry

    cfg, _ = load_config(args.config, overrides=tuple(args.set))
    if not hasattr(registry.family(cfg.model), "prefill") or (cfg.model == "t5" and cfg.decoder_layers == 0):
        raise ConfigError(f"--config {args.config}: model {cfg.model} ({cfg.task}) does not generate text; "
                          "use a decoder (gpt_neo, gpt2) or an encoder-decoder (t5) config")
    if cfg.model == "t5":  # the prompt is the encoder's input; the decoder's positions are relative
        if args.prompt_tokens > cfg.n_ctx:
            raise ConfigError(f"--prompt-tokens: {args.prompt_tokens} is more than the {cfg.n_ctx} tokens "
                              f"(n_ctx) the encoder of {args.config} reads")
    elif args.prompt_tokens + args.new_tokens > cfg.n_ctx:
        raise ConfigError(f"--prompt-tokens {args.prompt_tokens} + --new-tokens {args.new_tokens} is more than the "
                          f"{cfg.n_ctx} positions (n_ctx) of {args.config}")
    return cfg


def compile_plan(args) -> None:
    """``--compile-only``: the generation program's plan per batch size, as XLA compiles it for one device."""
    import jax
    import jax.numpy as jnp

    from config import ConfigError
    from models import registry
    from models.axes import placing
    from models.generate import Sampling, lower_sample, model_rows
    from parallel.dry_run import human_bytes
    from parallel.hlo_stats import loop_body_kernels
    from parallel.state import abstract_model

    if args.topology:
        from parallel.topologies import topology_devices

        jax.config.update("jax_platforms", "cpu")  # this machine only compiles for the accelerator
        devices = topology_devices(args.topology)
        if len(devices) != 1:
            raise ConfigError(f"--topology: '{args.topology}' has {len(devices)} devices; generation is planned "
                              "for one (h100, v5e:1x1)")
        where = f"{devices[0].device_kind}, compiled ahead of time, none attached"
    else:
        devices = jax.devices()
        where = f"{devices[0].platform} ({devices[0].device_kind})"
    on_device = jax.sharding.SingleDeviceSharding(devices[0])
    sizes = batch_sizes(args)
    cfg = checked_config(args)
    def on_that_device(names, prefer):  # the layers choose their kernels for that device, built and traced
        return on_device

    with placing(on_that_device):
        graphdef, abstract, _ = abstract_model(lambda rngs: registry.build(cfg, rngs))
    dtype = jnp.bfloat16 if args.precision == "bfloat16" else jnp.float32
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, dtype, sharding=on_device), abstract)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=on_device)
    settings = Sampling(max_new_tokens=args.new_tokens, temperature=0, eos_id=None)
    weights = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    rows = []
    for batch in sizes:
        prompts = jax.ShapeDtypeStruct((batch, args.prompt_tokens), jnp.int32, sharding=on_device)
        pad = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=on_device)

        def prefill(params, prompts, pad):
            from flax import nnx
            return nnx.merge(graphdef, nnx.State(params)).prefill(prompts, pad, args.new_tokens, dtype)[1]

        rows_run = jax.ShapeDtypeStruct((model_rows(batch, devices[0].platform), args.prompt_tokens), jnp.int32)
        cache = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(
            jax.eval_shape(prefill, params, rows_run, jax.ShapeDtypeStruct(rows_run.shape[:1], jnp.int32))))
        start = time.perf_counter()
        with placing(on_that_device):  # as predict.py samples under its layout
            compiled = lower_sample(graphdef, params, prompts, pad, settings, key).compile()
        seconds = time.perf_counter() - start
        text = compiled.as_text()
        rows.append((batch, cache, compiled.memory_analysis().temp_size_in_bytes, loop_body_kernels(text), seconds))
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(text)
    print(f"\n{title(args, cfg)}; compiled for {where}; weights {human_bytes(weights)}")
    # Only a GPU launches each top-level operation of the loop as a kernel of its own; XLA:TPU's count is mostly
    # scalar and asynchronous-copy instructions, XLA:CPU's runs as threaded loops: no launch cost to compare.
    on_gpu = devices[0].platform == "gpu"
    print("| batch | KV cache | temporaries |" + (" kernels per new token |" if on_gpu else "") + " compile s |")
    print("|---|---|---|" + ("---|" if on_gpu else "") + "---|")
    for batch, cache, temporaries, kernels, seconds in rows:
        print(f"| {batch} | {human_bytes(cache)} | {human_bytes(temporaries)} |" + (f" {kernels:.0f} |" if on_gpu
              else "") + f" {seconds:.1f} |")


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
