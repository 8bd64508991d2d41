"""Is the input pipeline ever the bottleneck? Tokens/s the tf.data pipeline delivers (each sampling mode) next
to tokens/s the train step consumes, on this machine; and what a resume at step N costs from the saved input
position against replaying the stream up to N.

    python benchmarks/input_pipeline.py [--batches 40] [--train-steps 5]    # quickstart shape: under a minute
    python benchmarks/input_pipeline.py --full                               # GPT-Neo 125M, batch 8 x 2048
    python benchmarks/input_pipeline.py --full --resume-at 200 --train-steps 0  # resume: saved position vs replay

The data is the quickstart's (BPE tokenizer and TFRecords prepared from the embedded corpus into data_cache/).
By default the shapes are the quickstart's (batch 8 x 128), which finishes in under a minute on a 2-core CPU.
``--full`` times the README's table: batch 8 x 2048 and the 125M train step on whatever devices jax sees, the
batch accumulated over microbatches of one sequence (``tokens_per_mb_per_replica=2048``) so it fits in a CPU's
memory (on a 2-core CPU: more than 25 minutes and about 10 GB).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pipeline_rate(cfg, batches: int, batch_size: int) -> tuple[float, float]:
    """(tokens/s over ``batches`` batches after the first, seconds to the first batch)."""
    from data.source import make_source

    start = time.perf_counter()
    source = make_source(cfg, "train")
    source.batch(0, batch_size)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(1, batches + 1):
        source.batch(step, batch_size)
    return batches * batch_size * cfg.n_ctx / (time.perf_counter() - start), first


def resume_cost(cfg, step: int, batch_size: int) -> tuple[float, float, int]:
    """(seconds to batch ``step`` from a saved position, seconds by replaying the stream, bytes of the position)."""
    from data.source import make_source

    class Saved:  # what the checkpoint's input item gives back
        def __init__(self, state):
            self.meta, self.read = state["meta"], state["shards"].get

    source = make_source(cfg, "train")
    for s in range(step):
        source.batch(s, batch_size)
    state = source.state(batch_size)
    start = time.perf_counter()
    restored = make_source(cfg, "train")
    restored.restore(step, batch_size, slice(0, batch_size), Saved(state))
    restored.batch(step, batch_size)
    restore = time.perf_counter() - start
    start = time.perf_counter()
    make_source(cfg, "train").batch(step, batch_size)
    return restore, time.perf_counter() - start, sum(len(v) for v in state["shards"].values())


def train_rate(cfg, steps: int) -> float:
    """Tokens/s of the jitted train step (compile excluded) on a data-parallel mesh over all devices."""
    import jax
    import numpy as np

    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_train_step, microbatch_count
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer

    layout = Layout.from_config(make_mesh(cfg.mesh_shape), cfg.layout)
    tx = make_optimizer(cfg)
    objective = objective_for(cfg)
    graphdef, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), tx, layout, cfg.seed)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           microbatches=microbatch_count(cfg, layout), seed=cfg.seed)
    tokens = np.random.default_rng(0).integers(0, cfg.n_vocab, (cfg.train_batch_size, cfg.n_ctx + 1), np.int32)
    batch = jax.device_put({"tokens": tokens}, data)
    state, metrics = step(state, batch)  # compile
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return steps * cfg.train_batch_size * cfg.n_ctx / (time.perf_counter() - start)


def main(argv=None) -> None:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--full", action="store_true", help="the README's table: GPT-Neo 125M, batch 8 x 2048 (slow on "
                   "a CPU)")
    p.add_argument("--config", help="config whose shapes are timed (default: quickstart; gpt_neo_125M with --full)")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="sequences per batch")
    p.add_argument("--batches", type=int, default=40, metavar="N", help="pipeline batches timed per mode")
    p.add_argument("--train-steps", type=int, metavar="N", help="train steps timed (0: skip the train step; "
                   "default: 5, or 2 with --full)")
    p.add_argument("--resume-at", type=int, default=0, metavar="N", help="also time a resume at step N of the "
                   "chunks stream: from the saved input position and by replaying it (0: skip)")
    args = p.parse_args(argv)
    from config import ConfigError, load_config

    for flag, minimum in (("batch_size", 1), ("batches", 1), ("train_steps", 0), ("resume_at", 0)):
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise ConfigError(f"--{flag.replace('_', '-')}: {value} is below the minimum {minimum}")
    config = args.config or ("gpt_neo_125M" if args.full else "quickstart")
    overrides = ("train_batch_size=%d" % args.batch_size, "mesh_shape=x:-1")
    if args.full:
        overrides += ("tokens_per_mb_per_replica=2048",)
    base, _ = load_config(config, overrides)
    if base.task != "causal_lm" or base.peft_settings:
        what = f"model {base.model}, task {base.task}" + (", PEFT" if base.peft_settings else "")
        raise ConfigError(f"--config {config}: {what}; this benchmark times the quickstart's data through a plain "
                          "causal-LM train step (a gpt_neo or gpt2 config such as quickstart or gpt_neo_125M)")
    import jax

    from data.source import make_tokenizer
    modes = [("chunks", None), ("documents_fixed", 4), ("documents_random", 4)]
    cores = os.cpu_count()
    print(f"machine: {cores} CPU cores, jax devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
          f"{config}, batch {args.batch_size} x {base.n_ctx}", flush=True)
    # One-time costs, not the pipeline's: the first use prepares the tokenizer and TFRecords; TensorFlow imports.
    start = time.perf_counter()
    make_tokenizer(base.replace(datasets=[["embedded_bpe", None, None, None]]))
    from data.tf_import import tensorflow
    tensorflow()
    print(f"data ready in data_cache/ and TensorFlow imported after {time.perf_counter() - start:.1f} s "
          "(one-time: not in the times below)", flush=True)
    print(f"{'what':44} {'tokens/s':>12}", flush=True)
    rates = []
    for mode, stitch in modes:
        cfg = base.replace(datasets=[["embedded_bpe", stitch, mode if mode != "chunks" else None, None]])
        rate, first = pipeline_rate(cfg, args.batches, args.batch_size)
        rates.append(rate)
        print(f"{'pipeline ' + mode + f' ({args.batch_size} x {cfg.n_ctx})':44} {rate:12,.0f}   "
              f"(first batch after {first:.1f} s)", flush=True)
    if args.resume_at:
        cfg = base.replace(datasets=[["embedded_bpe", None, None, None]])
        restore, replay, size = resume_cost(cfg, args.resume_at, args.batch_size)
        print(f"{'resume at step %d, saved position (%.1f MB)' % (args.resume_at, size / 1e6):44} {restore:11.2f}s")
        print(f"{'resume at step %d, replaying the stream' % args.resume_at:44} {replay:11.2f}s", flush=True)
    train_steps = (2 if args.full else 5) if args.train_steps is None else args.train_steps
    if train_steps:
        print(f"compiling the train step of {config} ...", flush=True)
        consumed = train_rate(base.replace(train_batch_size=args.batch_size), train_steps)
        print(f"{'train step, ' + config + f' ({args.batch_size} x {base.n_ctx})':44} {consumed:12,.0f}")
        print(f"pipeline / train step: {min(rates) / consumed:,.0f}x (slowest mode)")


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
