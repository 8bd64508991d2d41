"""Masked-LM examples as a tf.data stage (GPT-Neo's ``mlm_*`` options), for encoder models.

From each (n_ctx+1)-token window it takes n_ctx tokens (n_ctx-1 after ``mlm_cls_token_id``, which is prepended)
and selects ``mlm_mask_prob`` of the positions whose id is not in ``mlm_mask_ignore_ids`` (the CLS token is never
selected). A selected token stays as it is with ``mlm_same_token_prob``, becomes a random token with
``mlm_random_token_prob`` (drawn from ``mlm_random_token_ids``, else uniformly from the vocabulary), and becomes
``mlm_mask_token_id`` otherwise. Randomness is stateless, keyed by (seed, example index), so example ``i`` is
masked the same way in every run and on resume.
"""

from __future__ import annotations

from config import Config
from data.pipeline import as_written


def mlm_example(tf, window, index, cfg: Config, seed: int) -> dict:
    """int32[n_ctx+1] window, int64 example index -> {"inputs", "targets": int32[n_ctx], "mask": float32[n_ctx]}
    where ``mask`` is 1 at the selected positions (the ones the loss counts)."""
    n = cfg.n_ctx
    tokens = window[:n]
    if cfg.mlm_cls_token_id is not None:
        tokens = tf.concat([[tf.cast(cfg.mlm_cls_token_id, tf.int32)], window[:n - 1]], 0)
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    k_select, k_kind, k_random = (tf.random.experimental.stateless_fold_in(key, i) for i in range(3))
    ignore = list(cfg.mlm_mask_ignore_ids) + ([cfg.mlm_cls_token_id] if cfg.mlm_cls_token_id is not None else [])
    allowed = tf.ones([n], tf.bool)
    for token in ignore:
        allowed &= tokens != token
    selected = (tf.random.stateless_uniform([n], k_select) < cfg.mlm_mask_prob) & allowed
    kind = tf.random.stateless_uniform([n], k_kind)
    keep = kind < cfg.mlm_same_token_prob
    randomize = (~keep) & (kind < cfg.mlm_same_token_prob + cfg.mlm_random_token_prob)
    if cfg.mlm_random_token_ids:
        pool = tf.constant(cfg.mlm_random_token_ids, tf.int32)
        random_ids = tf.gather(pool, tf.random.stateless_uniform([n], k_random, 0, len(cfg.mlm_random_token_ids),
                                                                 dtype=tf.int32))
    else:
        random_ids = tf.random.stateless_uniform([n], k_random, 0, cfg.n_vocab, dtype=tf.int32)
    replaced = tf.where(randomize, random_ids, tf.fill([n], tf.cast(cfg.mlm_mask_token_id, tf.int32)))
    inputs = tf.where(selected & ~keep, replaced, tokens)
    return {"inputs": inputs, "targets": tokens, "mask": tf.cast(selected, tf.float32)}


def mlm_stage(tf, windows, cfg: Config, seed: int):
    """Maps a stream of int32[n_ctx+1] windows to masked-LM examples (see ``mlm_example``)."""
    example = as_written(tf, lambda i, w: mlm_example(tf, w, i, cfg, seed))
    return windows.enumerate().map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
