"""ViT (An Image is Worth 16x16 Words) on the backbone: an image cut into patches, each patch a token through one
linear projection (the stride-P convolution as a matmul), a learned class token in front, learned positions,
pre-LayerNorm bidirectional blocks, a final LayerNorm and a linear classifier on the class token.

Images are (B, H, W, C) floats. The layout's names apply unchanged: the patches are the ``sequence``. With
``interpolate_positions`` the position table, learned for ``image_size``, is resized bicubically to the patch grid
of whatever image size comes in (transformers' ``interpolate_pos_encoding``, same arithmetic): fine-tuning at
a higher resolution than pretraining.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from config import Config
from models.axes import HIDDEN, axes, constrain
from models.block import Block, run_blocks, share_parameters
from models.layers import BASE_STDDEV, dropout, dropout_keys, norm, projection
from models.spec import block_spec

VIT_INIT = (BASE_STDDEV,) * 4, (BASE_STDDEV,) * 2  # transformers' initializer_range


def patches(images: jax.Array, patch: int) -> jax.Array:
    """(B, H, W, C) -> (B, H/P * W/P, P * P * C): non-overlapping patches in row-major order, each flattened
    (row, column, channel) — what a stride-P convolution with a (P, P, C, D) kernel reads."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel with PyTorch's a = -0.75, at distances ``t``."""
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


@functools.cache
def bicubic_matrix(size_in: int, size_out: int) -> np.ndarray:
    """(out, in) weights of PyTorch's ``interpolate(mode="bicubic", align_corners=False)`` along one axis
    (no antialiasing; taps beyond the border repeat the edge)."""
    scale = size_in / size_out
    source = (np.arange(size_out) + 0.5) * scale - 0.5
    floor = np.floor(source)
    weights = np.zeros((size_out, size_in))
    for tap in range(-1, 3):
        index = np.clip(floor + tap, 0, size_in - 1).astype(int)
        np.add.at(weights, (np.arange(size_out), index), _cubic(source - (floor + tap)))
    return weights


class ViT(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        d, p = cfg.n_embd, cfg.patch_size
        self.patch_embed = projection("BPK,KD->BPD", (p * p * cfg.num_channels, d), (None, "embd"), BASE_STDDEV,
                                      rngs, bias=("embd",))
        init = jax.nn.initializers.normal(BASE_STDDEV)
        self.cls_token = nnx.Param(init(rngs.params(), (d,)), **axes("embd"))
        self.wpe = nnx.Param(init(rngs.params(), (cfg.n_ctx, d)), **axes(None, "embd"))  # class token, patches
        self.blocks = nnx.List([Block(block_spec(cfg, layer, *VIT_INIT), rngs=rngs) for layer in range(cfg.n_layer)])
        if cfg.share_parameters:
            share_parameters(self.blocks)
        self.ln_f = norm("layernorm", d, cfg.layer_norm_epsilon, rngs)
        self.classifier = projection("BD,DC->BC", (d, cfg.num_labels), ("embd", None), BASE_STDDEV, rngs,
                                     bias=(None,))
        self.patch_size, self.grid = p, cfg.image_size // p
        self.interpolate = cfg.interpolate_positions
        self.embed_dropout = cfg.embed_dropout
        self.remat, self.scan = cfg.remat_policy, cfg.scan_layers

    def __call__(self, images: jax.Array, *, dropout_key: jax.Array | None = None) -> tuple[jax.Array, None]:
        """(B, H, W, C) images -> ((B, num_labels) logits of the class token, None: encoders keep no cache)."""
        return self.classifier(self.hidden_states(images, dropout_key=dropout_key)[:, 0]), None

    def hidden_states(self, images: jax.Array, *, dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, H, W, C) -> (B, 1 + patches, D) after the final LayerNorm (transformers' last_hidden_state)."""
        b, h, w, _ = images.shape
        embed_key, blocks_key = dropout_keys(dropout_key, 2)
        x = self.patch_embed(patches(images, self.patch_size))  # (B, P, D)
        cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (b, 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1) + self.positions(h // self.patch_size, w // self.patch_size)
        x = constrain(dropout(self.embed_dropout, x, embed_key), HIDDEN)  # (B, T, D), T = 1 + patches
        positions = jnp.broadcast_to(jnp.arange(x.shape[1])[None, :], x.shape[:2])
        x, _ = run_blocks(self.blocks, x, positions, None, None, blocks_key, remat=self.remat, scan=self.scan)
        return self.ln_f(x)

    def positions(self, rows: int, columns: int) -> jax.Array:
        """(1 + rows * columns, D) position embeddings for a rows x columns patch grid."""
        table = self.wpe[...]
        if (rows, columns) == (self.grid, self.grid):
            return table
        if not self.interpolate:
            raise ValueError(f"images of {rows}x{columns} patches, but the positions are learned for "
                             f"{self.grid}x{self.grid}; set interpolate_positions true to resize them")
        grid = table[1:].reshape(self.grid, self.grid, -1)  # (G, G, D)
        grid = jnp.einsum("rg,gcd->rcd", jnp.asarray(bicubic_matrix(self.grid, rows), grid.dtype), grid)
        grid = jnp.einsum("cg,rgd->rcd", jnp.asarray(bicubic_matrix(self.grid, columns), grid.dtype), grid)
        return jnp.concatenate([table[:1], grid.reshape(rows * columns, -1)], axis=0)
