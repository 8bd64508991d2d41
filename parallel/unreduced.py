"""Gradient accumulation that reduces once per step (``accumulate_unreduced``; PyTorch DDP's ``no_sync``).

The reduced path (parallel/steps.py) accumulates microbatches in one GSPMD program, which reduces each
microbatch's gradients over the batch axes as soon as they exist. Here the same accumulation runs on each
device's own rows under ``shard_map``, manual over the batch axes, so the sums stay on their device until one
reduction per step: a reduce-scatter where a parameter is split over those axes (FSDP), else an all-reduce. Within
a device the other axes (tensor parallelism) stay GSPMD's. What it costs: a parameter split over the batch axes
is gathered whole once per step and its gradient sum held whole. Each device draws its own dropout masks, so they
differ from the reduced path's, which draws the whole batch's.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import PartitionSpec

from models.axes import shard_map_rest
from parallel.layout import Layout, spec_axes
from parallel.state import Params


def per_device_accumulation(accumulated: Callable, layout: Layout, shardings: Params) -> Callable | None:
    """``accumulated(params, frozen, batch, key, total_weight) -> ((sums, sown metrics), grads)`` run on each
    device's rows and reduced once (``shardings``: the differentiated parameters'); None where the layout splits
    the batch over no axis, so there is nothing to reduce."""
    batch_axes = tuple(a for a in spec_axes(layout.spec(("batch",))[0]) if layout.mesh.shape[a] > 1)
    if not batch_axes:
        return None

    def batch_parts(spec):  # per dimension of a parameter, the batch axes its layout splits it over
        return tuple(tuple(a for a in spec_axes(entry) if a in batch_axes) for entry in spec)

    def reduced(grad, sharding):  # summed over the batch axes, scattered along the dimensions they split
        parts = batch_parts(sharding.spec)
        rest = tuple(a for a in batch_axes if all(a not in axes for axes in parts))

        def reduce(grad):
            for dim, axes in enumerate(parts):
                if axes:
                    grad = jax.lax.psum_scatter(grad, axes, scatter_dimension=dim, tiled=True)
            return jax.lax.psum(grad, rest) if rest else grad

        # Each device reduces only its share of what the other axes split (tensor parallelism): with those axes
        # manual too, the gradient split over them as its parameter is.
        spec = PartitionSpec(*(tuple(a for a in spec_axes(entry) if a not in batch_axes) or None
                               for entry in sharding.spec))
        return shard_map_rest(reduce, layout.mesh, spec, spec)(grad)

    def local(params, frozen, batch, key, total_weight):
        key = jax.random.fold_in(key, jax.lax.axis_index(batch_axes))
        with layout.without(batch_axes).active():
            (sums, aux), grads = accumulated(params, frozen, batch, key, total_weight)
        grads = jax.tree.map(reduced, grads, shardings)
        return (jax.lax.psum(sums, batch_axes), jax.lax.pmean(aux, batch_axes)), grads

    whole, rows = PartitionSpec(), PartitionSpec(batch_axes)
    grad_specs = jax.tree.map(lambda s: PartitionSpec(*(axes or None for axes in batch_parts(s.spec))), shardings)
    return jax.shard_map(local, mesh=layout.mesh, in_specs=(whole, whole, rows, whole, whole),
                         out_specs=((whole, whole), grad_specs), axis_names=set(batch_axes), check_vma=False)
