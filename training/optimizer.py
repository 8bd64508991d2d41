"""optax optimizers with GPT-Neo semantics, and the learning-rate schedule."""

from __future__ import annotations

import jax
import optax

from config import Config

# GPT-Neo decays to 10% of the peak learning rate.
FINAL_LR_FRACTION = 0.1


def learning_rate_schedule(cfg: Config) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then cosine or linear decay to 0.1*lr at lr_decay_end."""
    end = FINAL_LR_FRACTION * cfg.lr
    warmup = optax.linear_schedule(0.0, cfg.lr, max(cfg.warmup_steps, 1))
    decay_steps = max(cfg.decay_end - cfg.warmup_steps, 1)
    if cfg.lr_decay == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=FINAL_LR_FRACTION)
    elif cfg.lr_decay == "linear":
        decay = optax.linear_schedule(cfg.lr, end, decay_steps)
    else:
        decay = optax.constant_schedule(cfg.lr)
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def decay_mask(params) -> object:
    """Weight decay on matrices (projections, embeddings) only: never on biases or LayerNorm parameters."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW (``adam``/``adamw``) or Adafactor (``adafactor``)."""
    schedule = learning_rate_schedule(cfg)
    if cfg.opt_name in ("adam", "adamw"):
        opt = optax.adamw(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon, weight_decay=cfg.weight_decay,
                          mask=decay_mask)
    else:
        opt = optax.adafactor(schedule, momentum=cfg.beta1 or None, eps=1e-30,
                              weight_decay_rate=cfg.weight_decay or None, weight_decay_mask=decay_mask)
    if cfg.gradient_clipping > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.gradient_clipping), opt)
    return opt
