"""BERT masked-LM train step, NeoMesh (JAX) against transformers (PyTorch), same shape, same run.

    python benchmarks/mlm_train_step.py                       # BERT-base shape, T=128, batch 8
    python benchmarks/mlm_train_step.py --layers 4 --width 256 --heads 4 --steps 5

Both sides run one full step (forward, masked-LM loss over the 15% masked tokens, backward, AdamW update) on the
same batch; compile / warm-up steps are excluded. PyTorch uses as many threads as JAX has CPU cores to use.
Prints one table: shape, implementation, tokens/s, ms/step, compile seconds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def neomesh(args, batch) -> tuple[float, float]:
    """(median seconds per step, compile seconds) of NeoMesh's jitted train step on one device."""
    from benchmarks import zoo_step

    return zoo_step.neomesh(dict(model="bert", n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                                 d_ff=4 * args.width, n_ctx=args.seq, n_vocab=args.vocab,
                                 train_batch_size=args.batch, lr=1e-4), batch, args.steps)


def pytorch(args, batch) -> tuple[float, float]:
    """(median seconds per step, first-step seconds) of transformers' BertForMaskedLM with torch.optim.AdamW."""
    import torch
    import transformers

    from benchmarks import zoo_step

    zoo_step.torch_threads()
    cfg = transformers.BertConfig(vocab_size=args.vocab, hidden_size=args.width, num_hidden_layers=args.layers,
                                  num_attention_heads=args.heads, intermediate_size=4 * args.width,
                                  max_position_embeddings=args.seq, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertForMaskedLM(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.from_numpy(batch["inputs"]).long()
    labels = torch.from_numpy(batch["targets"]).long().masked_fill(torch.from_numpy(batch["mask"]) == 0, -100)

    def step():
        optimizer.zero_grad()
        model(input_ids=inputs, labels=labels).loss.backward()
        optimizer.step()

    return zoo_step.timed(step, args.steps)


def check(args) -> None:
    """Bad settings as one line naming the flag (``ConfigError``), before jax or torch starts."""
    from benchmarks.flags import at_least_one, heads_divide_width
    from config import ConfigError

    at_least_one(args, "layers", "width", "heads", "seq", "batch", "steps")
    if args.vocab <= 103:
        raise ConfigError(f"--vocab: {args.vocab} has no id 103, the [MASK] token the batch uses")
    heads_divide_width(args)


def main(argv=None) -> None:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--layers", type=int, default=12, help="BERT-base: 12")
    p.add_argument("--width", type=int, default=768, help="BERT-base: 768")
    p.add_argument("--heads", type=int, default=12, help="BERT-base: 12")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--vocab", type=int, default=30522, help="BERT's WordPiece vocabulary")
    p.add_argument("--steps", type=int, default=3, help="timed steps per implementation (median reported)")
    args = p.parse_args(argv)
    check(args)
    from benchmarks import zoo_step

    zoo_step.require_pytorch_peer()
    import numpy as np

    rng = np.random.default_rng(0)
    targets = rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32)
    mask = (rng.random(targets.shape) < 0.15).astype(np.float32)
    batch = {"inputs": np.where(mask == 1, 103, targets).astype(np.int32), "targets": targets, "mask": mask}
    rows = [("NeoMesh (JAX)", *neomesh(args, batch)), ("transformers (PyTorch)", *pytorch(args, batch))]
    zoo_step.print_table(f"BERT masked-LM train step: {args.layers} layers x {args.width}, {args.heads} heads, "
                         f"T={args.seq}, batch {args.batch}, fp32", "tokens", args.batch * args.seq, rows)


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
