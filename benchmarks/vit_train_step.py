"""ViT image-classification train step, NeoMesh (JAX) against transformers (PyTorch), same shape, same run.

    python benchmarks/vit_train_step.py                        # ViT-B/16: 12 layers x 768, 224x224 images
    python benchmarks/vit_train_step.py --batch 2 --steps 2    # lighter, for a small CPU

Both sides run one full step (patch embedding, encoder, classifier on the class token, cross-entropy, backward,
AdamW update) on the same batch of random images; compile / warm-up steps are excluded. PyTorch uses as many
threads as JAX has CPU cores to use. Prints one table: implementation, images/s, ms/step, compile seconds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def neomesh(args, batch) -> tuple[float, float]:
    """(median seconds per step, compile seconds) of NeoMesh's jitted train step on one device."""
    from benchmarks import zoo_step

    return zoo_step.neomesh(dict(model="vit", n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                                 d_ff=4 * args.width, image_size=args.image, patch_size=args.patch,
                                 num_labels=args.labels, train_batch_size=args.batch, lr=1e-4, weight_decay=0.0,
                                 precision=args.precision), batch, args.steps)


def pytorch(args, batch) -> tuple[float, float]:
    """(median seconds per step, first-step seconds) of transformers' ViTForImageClassification with AdamW."""
    import torch
    import transformers

    from benchmarks import zoo_step

    zoo_step.torch_threads()
    cfg = transformers.ViTConfig(hidden_size=args.width, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                 intermediate_size=4 * args.width, image_size=args.image, patch_size=args.patch,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 id2label={i: str(i) for i in range(args.labels)})
    model = transformers.ViTForImageClassification(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    pixels = torch.from_numpy(batch["images"].transpose(0, 3, 1, 2).copy())
    labels = torch.from_numpy(batch["labels"]).long()
    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32

    def step():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        optimizer.step()

    return zoo_step.timed(step, args.steps)


def check(args) -> None:
    """Bad settings as one line naming the flag (``ConfigError``), before jax or torch starts."""
    from benchmarks.flags import at_least_one, heads_divide_width
    from config import ConfigError

    at_least_one(args, "layers", "width", "heads", "image", "patch", "batch", "steps")
    if args.labels < 2:
        raise ConfigError(f"--labels: {args.labels} is below the minimum 2")
    heads_divide_width(args)
    if args.image % args.patch:
        raise ConfigError(f"--patch: --image {args.image} is not divisible into {args.patch}x{args.patch} patches")


def main(argv=None) -> None:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--layers", type=int, default=12, help="ViT-B: 12")
    p.add_argument("--width", type=int, default=768, help="ViT-B: 768")
    p.add_argument("--heads", type=int, default=12, help="ViT-B: 12")
    p.add_argument("--image", type=int, default=224, help="image height and width")
    p.add_argument("--patch", type=int, default=16, help="patch size (ViT-B/16: 16)")
    p.add_argument("--labels", type=int, default=1000, help="classes (ImageNet: 1000)")
    p.add_argument("--batch", type=int, default=8, help="images per step")
    p.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                   help="NeoMesh's compute dtype; PyTorch runs under bf16 autocast for bfloat16")
    p.add_argument("--steps", type=int, default=3, help="timed steps per implementation (median reported)")
    args = p.parse_args(argv)
    check(args)
    from benchmarks import zoo_step

    zoo_step.require_pytorch_peer()
    import numpy as np

    rng = np.random.default_rng(0)
    batch = {"images": rng.random((args.batch, args.image, args.image, 3), np.float32),
             "labels": rng.integers(0, args.labels, args.batch).astype(np.int32),
             "weights": np.ones(args.batch, np.float32)}
    rows = [("NeoMesh (JAX)", *neomesh(args, batch)), ("transformers (PyTorch)", *pytorch(args, batch))]
    zoo_step.print_table(f"ViT train step: {args.layers} layers x {args.width}, {args.heads} heads, "
                         f"{args.image}x{args.image} images in {args.patch}x{args.patch} patches, batch {args.batch}, "
                         f"{args.precision}", "images", args.batch, rows)


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
