"""ViT image-classification train step, NeoMesh (JAX) against transformers (PyTorch), same shape, same run.

    python benchmarks/vit_train_step.py                        # ViT-B/16: 12 layers x 768, 224x224 images
    python benchmarks/vit_train_step.py --batch 2 --steps 2    # lighter, for a small CPU

Both sides run one full step (patch embedding, encoder, classifier on the class token, cross-entropy, backward,
AdamW update) on the same batch of random images; compile / warm-up steps are excluded. PyTorch uses as many
threads as JAX has CPU cores to use. Prints one table: implementation, images/s, ms/step, compile seconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timed(step, steps: int) -> tuple[float, float]:
    """(median seconds of ``steps`` calls after the first, seconds of the first): ``step()`` must block."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def neomesh(args, batch) -> tuple[float, float]:
    import jax

    from config import from_dict
    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_train_step
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer

    cfg, _ = from_dict(dict(model="vit", n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                            d_ff=4 * args.width, image_size=args.image, patch_size=args.patch,
                            num_labels=args.labels, train_batch_size=args.batch, warmup_steps=0, lr=1e-4,
                            weight_decay=0.0, mesh_shape="x:1", precision=args.precision))
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    objective, tx = objective_for(cfg), make_optimizer(cfg)
    graphdef, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), tx, layout, 0)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, args.batch))
    train_step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                                 precision=args.precision)
    batch = jax.device_put(batch, data)
    box = [state]

    def step():
        box[0], metrics = train_step(box[0], batch)
        jax.block_until_ready(metrics)

    return timed(step, args.steps)


def pytorch(args, batch) -> tuple[float, float]:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
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

    return timed(step, args.steps)


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
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"error: the PyTorch peer needs the test requirements ({e.name} is missing): "
              "pip install -r requirements-test.txt", file=sys.stderr)
        sys.exit(2)
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    batch = {"images": rng.random((args.batch, args.image, args.image, 3), np.float32),
             "labels": rng.integers(0, args.labels, args.batch).astype(np.int32),
             "weights": np.ones(args.batch, np.float32)}
    rows = [("NeoMesh (JAX)", *neomesh(args, batch)), ("transformers (PyTorch)", *pytorch(args, batch))]
    print(f"\nViT train step: {args.layers} layers x {args.width}, {args.heads} heads, {args.image}x{args.image} "
          f"images in {args.patch}x{args.patch} patches, batch {args.batch}, {args.precision}; "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print("| implementation | images/s | ms/step | compile / first step s |")
    print("|---|---|---|---|")
    for name, seconds, first in rows:
        print(f"| {name} | {args.batch / seconds:,.1f} | {1000 * seconds:,.0f} | {first:.1f} |")


if __name__ == "__main__":
    from neomesh.errors import exit_process, run_main

    exit_process(run_main(main))
