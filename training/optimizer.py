"""optax optimizers with GPT-Neo semantics, and the learning-rate schedule."""

from __future__ import annotations

import jax
import optax

from config import Config

# GPT-Neo decays to 10% of the peak learning rate.
FINAL_LR_FRACTION = 0.1
DEFAULT_WEIGHT_DECAY = 0.01  # AdamW's when the config leaves weight_decay null


def learning_rate_schedule(cfg: Config) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then cosine or linear decay to 0.1*lr at lr_decay_end. Adafactor
    runs at the constant lr, as GPT-Neo's did (it passed the bare lr to mesh-tensorflow's Adafactor)."""
    if cfg.opt_name == "adafactor":
        return optax.constant_schedule(cfg.lr)
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


def adafactor(cfg: Config) -> optax.GradientTransformation:
    """Adafactor as GPT-Neo ran it (mesh-tensorflow's AdafactorOptimizer with lr=lr, decay_rate=weight_decay,
    beta1, epsilon1=ada_epsilon1, epsilon2=ada_epsilon2), from optax's Adafactor pieces in optax's order:
    factored second moments (decaying at the constant rate weight_decay, or Adafactor's 1-(step+1)^-0.8 when it
    is null), update clipping at RMS 1, the constant lr, scaling by the parameter RMS (at least ada_epsilon2),
    momentum beta1 without bias correction. No weight decay: GPT-Neo's weight_decay was this decay rate."""
    if cfg.weight_decay is None:
        second_moments = optax.scale_by_factored_rms(epsilon=cfg.ada_epsilon1)
    else:
        second_moments = optax.scale_by_factored_rms(decay_rate=cfg.weight_decay, epsilon=cfg.ada_epsilon1,
                                                     decay_rate_fn=lambda step, rate: rate)
    steps = [second_moments, optax.clip_by_block_rms(1.0), optax.scale(cfg.lr),
             optax.scale_by_param_block_rms(min_scale=cfg.ada_epsilon2)]
    if cfg.beta1:
        steps.append(optax.ema(cfg.beta1, debias=False))
    return optax.chain(*steps, optax.scale(-1.0))


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW (``adam``/``adamw``) or GPT-Neo's Adafactor (``adafactor``)."""
    if cfg.opt_name in ("adam", "adamw"):
        decay = DEFAULT_WEIGHT_DECAY if cfg.weight_decay is None else cfg.weight_decay
        opt = optax.adamw(learning_rate_schedule(cfg), b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon,
                          weight_decay=decay, mask=decay_mask)
    else:
        opt = adafactor(cfg)
    if cfg.gradient_clipping > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.gradient_clipping), opt)
    return opt
