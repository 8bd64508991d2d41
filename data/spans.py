"""T5's span-corruption examples as a tf.data stage (the seq2seq objective's batches), next to data/mlm.py.

From each window of raw tokens, ``span_noise_density`` of them, in spans of mean length ``span_mean_length``, are
dropped from the inputs: each dropped span becomes one sentinel token (``<extra_id_0>``, ``<extra_id_1>``, ...) in
the inputs, and the targets list every dropped span after its sentinel. Both end with end-of-text and are padded
to their fixed lengths (segment id 0 marks padding):

    raw      the quick brown fox jumps over the lazy dog
    inputs   the quick <extra_id_0> jumps over <extra_id_1> dog <eos>
    targets  <extra_id_0> brown fox <extra_id_1> the lazy <eos>

The noise mask is T5's ``random_spans_noise_mask``: the noise and non-noise token counts are cut into the same
number of random non-empty spans, which alternate starting with non-noise. The raw window length is T5's
``random_spans_helper``: the longest that still gives ``n_ctx`` input tokens. Randomness is stateless, keyed by
(seed, example index): example ``i`` is corrupted the same way in every run and on resume.
"""

from __future__ import annotations

from data.pipeline import as_written


def noise_plan(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a ``length``-token window; never degenerate: at least one noise and one
    non-noise token, and between one span and as many as either side has tokens (T5 leaves the last bound out, and
    fails on short spans of dense noise). Rounding is half to even, as T5's ``tf.round``."""
    length = max(length, 2)
    noise = min(max(int(round(length * noise_density)), 1), length - 1)
    return noise, min(max(int(round(noise / mean_span_length)), 1), noise, length - noise)


def corrupted_lengths(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(input tokens, target tokens) span corruption makes of ``length`` raw tokens, end-of-text included."""
    noise, spans = noise_plan(length, noise_density, mean_span_length)
    return length - noise + spans + 1, noise + spans + 1


def span_corruption_lengths(inputs_length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(raw tokens to read, target tokens made) so that the inputs fill at most ``inputs_length`` tokens."""
    raw = max(inputs_length - 1, 2)
    while corrupted_lengths(raw + 1, noise_density, mean_span_length)[0] <= inputs_length:
        raw += 1
    while raw > 2 and corrupted_lengths(raw, noise_density, mean_span_length)[0] > inputs_length:
        raw -= 1
    return raw, corrupted_lengths(raw, noise_density, mean_span_length)[1]


def noise_mask(tf, length: int, noise_density: float, mean_span_length: float, keys) -> object:
    """bool[length]: which raw tokens are noise. ``keys`` are two stateless seeds, one per random segmentation
    (of the noise tokens into spans, and of the non-noise tokens)."""
    noise, spans = noise_plan(length, noise_density, mean_span_length)

    def segment_lengths(items: int, key):
        # Which of the items 1..items-1 start a new segment: spans-1 of them, chosen by a stable sort of draws.
        draws = tf.random.stateless_uniform([items - 1], key, minval=None, maxval=None, dtype=tf.int64)
        order = tf.argsort(draws, stable=True)
        starts = tf.pad(tf.cast(order < spans - 1, tf.int32), [[1, 0]])  # (items,)
        return tf.math.segment_sum(tf.ones([items], tf.int32), tf.cumsum(starts))  # (spans,)

    interleaved = tf.reshape(tf.stack([segment_lengths(length - noise, keys[1]),
                                       segment_lengths(noise, keys[0])], axis=1), [2 * spans])
    span_starts = tf.cumsum(interleaved)[:-1]
    indicator = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts, length)
    return tf.equal(tf.math.floormod(tf.cumsum(indicator), 2), 1)


def replace_spans(tf, tokens, mask, sentinels):
    """Each run of ``mask`` tokens becomes one sentinel (the i-th run: ``sentinels[i]``); others are kept."""
    previous = tf.pad(mask[:-1], [[1, 0]])
    first = mask & ~previous
    run = tf.maximum(tf.cumsum(tf.cast(first, tf.int32)) - 1, 0)
    tokens = tf.where(first, tf.gather(sentinels, run), tokens)
    return tf.boolean_mask(tokens, ~(mask & previous))


def span_example(tf, window, index, *, n_ctx: int, n_targets: int, noise_density: float,
                 mean_span_length: float, sentinels: list[int], eos_id: int, pad_id: int, seed: int) -> dict:
    """int32[raw] window, int64 example index -> {"inputs", "segment_ids": int32[n_ctx], "targets",
    "target_segment_ids": int32[n_targets]}."""
    length = int(window.shape[0])
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    keys = [tf.random.experimental.stateless_fold_in(key, i) for i in range(2)]
    mask = noise_mask(tf, length, noise_density, mean_span_length, keys)
    ids = tf.constant(sentinels, tf.int32)
    eos = tf.constant([eos_id], tf.int32)
    out = {}
    for name, segments, kept, width in (("inputs", "segment_ids", ~mask, n_ctx),
                                        ("targets", "target_segment_ids", mask, n_targets)):
        seq = tf.concat([replace_spans(tf, window, ~kept, ids), eos], 0)
        real = tf.shape(seq)[0]
        out[name] = tf.ensure_shape(tf.pad(seq, [[0, width - real]], constant_values=pad_id), [width])
        out[segments] = tf.ensure_shape(tf.pad(tf.ones([real], tf.int32), [[0, width - real]]), [width])
    return out


def span_stage(tf, windows, cfg, sentinels: list[int], eos_id: int, pad_id: int, seed: int):
    """Maps a stream of int32[raw] windows (``cfg.span_lengths[0]`` tokens) to span-corruption examples."""
    def example(i, w):
        return span_example(tf, w, i, n_ctx=cfg.n_ctx, n_targets=cfg.decoder_ctx,
                            noise_density=cfg.span_noise_density, mean_span_length=cfg.span_mean_length,
                            sentinels=sentinels, eos_id=eos_id, pad_id=pad_id, seed=seed)

    return windows.enumerate().map(as_written(tf, example), num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)


SENTINEL = "<extra_id_{}>"


def sentinel_count(cfg) -> int:
    """Sentinels an example of ``cfg`` can need: the noise spans of its raw window (the same for every example)."""
    return noise_plan(cfg.span_lengths[0], cfg.span_noise_density, cfg.span_mean_length)[1]


def sentinel_ids(tokenizer, n_vocab: int, count: int, where: str) -> list[int]:
    """The ids of sentinels 0..count-1: the tokenizer's ``<extra_id_N>`` tokens, else the top of the vocabulary
    (T5's rule: sentinel i is n_vocab - 1 - i) when no tokenizer token lives there."""
    from config import ConfigError

    found = [tokenizer.token_id(SENTINEL.format(i)) for i in range(count)]
    if all(i is not None for i in found):
        return found
    if n_vocab - count >= tokenizer.vocab_size:
        return [n_vocab - 1 - i for i in range(count)]
    raise ConfigError(f"span_corruption: {where}'s tokenizer has no {SENTINEL.format(count - 1)} token, and "
                      f"n_vocab {n_vocab} leaves no room above its {tokenizer.vocab_size} tokens for {count} "
                      "sentinels; add <extra_id_N> special tokens or raise n_vocab")
