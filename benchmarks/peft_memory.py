"""Optimizer and train-step memory with parameter-efficient fine-tuning against full fine-tuning.

    python benchmarks/peft_memory.py                          # GPT-2 small's shape (124M), T=256, batch 4
    python benchmarks/peft_memory.py --layers 2 --width 128 --heads 4 --vocab 1024 --seq 64

For each setting: the parameters that train, the bytes of the optimizer state the train step carries (AdamW's
two moments and counters, measured on the abstract train state: exactly what would be allocated), and XLA's
memory analysis of the compiled train step on this machine's first device (arguments, outputs and temporaries:
gradients live in the temporaries). Frozen parameters get neither gradients nor optimizer state.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LORA_RANK = 8
SETTINGS = {
    "full fine-tuning": None,
    f"LoRA r={LORA_RANK} on q,v": {"lora": {"targets": ["q", "v"], "rank": LORA_RANK}},
    f"LoRA r={LORA_RANK} on q,k,v,out,c_fc,c_proj": {"lora": {"targets": ["q", "k", "v", "out", "c_fc", "c_proj"],
                                                          "rank": LORA_RANK}},
    "prefix tuning, 16 slots": {"prefix": {"length": 16}},
    "adapters, size 32": {"adapter": {"size": 32}},
    "BitFit (biases)": {"bitfit": True},
}


def measure(args, peft) -> dict:
    import jax
    import jax.numpy as jnp

    from config import from_dict
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import abstract_train_state, split_params
    from parallel.steps import batch_shapes, batch_shardings, make_train_step
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer
    from training.peft import build_model, trainable_filter

    cfg, _ = from_dict(dict(model="gpt2", n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                            n_ctx=args.seq, n_vocab=args.vocab, train_batch_size=args.batch, warmup_steps=0,
                            mesh_shape="x:1", peft=peft))
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    tx, objective, trainable = make_optimizer(cfg), objective_for(cfg), trainable_filter(cfg.peft_settings)
    graphdef, abstract, shardings = abstract_train_state(lambda rngs: build_model(cfg, rngs), tx, layout, trainable)
    nbytes = lambda tree: sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           trainable=trainable)
    batch = {name: jax.ShapeDtypeStruct(s, jnp.int32, sharding=data[name])
             for name, s in batch_shapes(objective, cfg, cfg.train_batch_size).items()}
    memory = step.lower(abstract, batch).compile().memory_analysis()
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract.params))
    trained = sum(math.prod(x.shape) for x in jax.tree.leaves(split_params(abstract.params, trainable)[0]))
    return {"params": params, "trained": trained, "opt_bytes": nbytes(abstract.opt_state),
            "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
            "arg_bytes": getattr(memory, "argument_size_in_bytes", None)}


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--layers", type=int, default=12, help="transformer blocks (the defaults are GPT-2 small's shape)")
    p.add_argument("--width", type=int, default=768, help="embedding width")
    p.add_argument("--heads", type=int, default=12, help="attention heads; must divide --width")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary size (the default is GPT-2's BPE)")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (T)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    args = p.parse_args(argv)
    from benchmarks.flags import at_least_one, heads_divide_width
    from config import ConfigError

    at_least_one(args, "layers", "width", "heads", "vocab", "seq", "batch")
    heads_divide_width(args)
    if args.vocab < 2:
        raise ConfigError(f"--vocab: {args.vocab} is below the minimum 2 (n_vocab)")
    if args.width < LORA_RANK:
        raise ConfigError(f"--width: {args.width} is below the minimum {LORA_RANK}, the LoRA rank the table times")
    mib = lambda b: "n/a" if b is None else f"{b / 2 ** 20:,.1f}"  # noqa: E731
    rows = [(name, measure(args, peft)) for name, peft in SETTINGS.items()]
    full = rows[0][1]["opt_bytes"]
    print(f"gpt2 shape: {args.layers} layers x {args.width}, {args.heads} heads, vocab {args.vocab}, "
          f"T={args.seq}, batch {args.batch}; AdamW, float32")
    print("| setting | trained params | of all | optimizer state MiB | vs full | step args MiB | step temps MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['trained']:,} | {100 * r['trained'] / r['params']:.2f}% | {mib(r['opt_bytes'])} | "
              f"{r['opt_bytes'] / full:.4f}x | {mib(r['arg_bytes'])} | {mib(r['temp_bytes'])} |")
    return 0


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
