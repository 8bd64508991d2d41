"""T5 seq2seq train step, NeoMesh (JAX) against transformers (PyTorch), same shape, same run.

    python benchmarks/t5_train_step.py                        # T5-small: 6+6 layers x 512, 8 heads, d_ff 2048
    python benchmarks/t5_train_step.py --batch 2 --steps 2    # lighter, for a small CPU

The default sequence lengths are T5's span-corruption pretraining: 512 input tokens, 114 targets. Both sides run
one full step (encoder, teacher-forced decoder, cross-entropy over the real targets, backward, AdamW update) on the
same batch; compile / warm-up steps are excluded. PyTorch uses as many threads as JAX has CPU cores to use.
Prints one table: shape, implementation, tokens/s (input + target tokens), ms/step, compile seconds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def neomesh(args, batch) -> tuple[float, float]:
    """(median seconds per step, compile seconds) of NeoMesh's jitted train step on one device."""
    from benchmarks import zoo_step

    return zoo_step.neomesh(dict(model="t5", n_layer=args.layers, n_embd=args.width, n_head=args.heads, d_ff=args.d_ff,
                                 n_ctx=args.inputs, n_decoder_ctx=args.targets, n_vocab=args.vocab,
                                 train_batch_size=args.batch, lr=1e-4, weight_decay=0.0, precision=args.precision,
                                 span_corruption=False),  # the batch is given: --targets need not be span corruption's
                            batch, args.steps)


def pytorch(args, batch) -> tuple[float, float]:
    """(median seconds per step, first-step seconds) of transformers' T5ForConditionalGeneration with AdamW."""
    import torch
    import transformers

    from benchmarks import zoo_step

    zoo_step.torch_threads()
    cfg = transformers.T5Config(vocab_size=args.vocab, d_model=args.width, d_kv=args.width // args.heads,
                                d_ff=args.d_ff, num_layers=args.layers, num_heads=args.heads, dropout_rate=0.0,
                                feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0,
                                eos_token_id=1)  # T5's ids; transformers 5 no longer defaults the start token
    model = transformers.T5ForConditionalGeneration(cfg).train()
    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    inputs = torch.from_numpy(batch["inputs"]).long()
    attention_mask = torch.from_numpy(batch["segment_ids"]).long()
    labels = torch.from_numpy(batch["targets"]).long().masked_fill(
        torch.from_numpy(batch["target_segment_ids"]) == 0, -100)

    def step():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(input_ids=inputs, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()

    return zoo_step.timed(step, args.steps)


def check(args) -> None:
    """Bad settings as one line naming the flag (``ConfigError``), before jax or torch starts."""
    from benchmarks.flags import at_least_one, heads_divide_width
    from config import ConfigError

    at_least_one(args, "layers", "width", "heads", "d_ff", "inputs", "targets", "batch", "vocab", "steps")
    heads_divide_width(args)
    if args.vocab < 3:
        raise ConfigError(f"--vocab: {args.vocab} is below the minimum 3 (T5's padding, eos and one token)")


def main(argv=None) -> None:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder blocks each (T5-small: 6)")
    p.add_argument("--width", type=int, default=512, help="T5-small: 512")
    p.add_argument("--heads", type=int, default=8, help="T5-small: 8")
    p.add_argument("--d-ff", type=int, default=2048, help="T5-small: 2048")
    p.add_argument("--inputs", type=int, default=512, help="encoder tokens per example")
    p.add_argument("--targets", type=int, default=114, help="decoder tokens per example")
    p.add_argument("--batch", type=int, default=8, help="examples per step")
    p.add_argument("--vocab", type=int, default=32128, help="T5's padded SentencePiece vocabulary")
    p.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                   help="NeoMesh's compute dtype; PyTorch runs under bf16 autocast for bfloat16")
    p.add_argument("--steps", type=int, default=3, help="timed steps per implementation (median reported)")
    args = p.parse_args(argv)
    check(args)
    from benchmarks import zoo_step

    zoo_step.require_pytorch_peer()
    import numpy as np

    rng = np.random.default_rng(0)
    b = args.batch
    segment_ids = (np.arange(args.inputs)[None] < rng.integers(args.inputs * 3 // 4, args.inputs + 1, (b, 1)))
    target_segment_ids = (np.arange(args.targets)[None] < rng.integers(args.targets // 2, args.targets + 1, (b, 1)))
    batch = {"inputs": rng.integers(0, args.vocab, (b, args.inputs)).astype(np.int32),
             "segment_ids": segment_ids.astype(np.int32),
             "targets": rng.integers(2, args.vocab, (b, args.targets)).astype(np.int32),
             "target_segment_ids": target_segment_ids.astype(np.int32)}
    rows = [("NeoMesh (JAX)", *neomesh(args, batch)), ("transformers (PyTorch)", *pytorch(args, batch))]
    zoo_step.print_table(f"T5 train step: {args.layers}+{args.layers} layers x {args.width}, {args.heads} heads, "
                         f"d_ff {args.d_ff}, {args.inputs} inputs + {args.targets} targets, batch {b}, "
                         f"{args.precision}", "tokens", b * (args.inputs + args.targets), rows)


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
