"""T5 span corruption (data/spans.py) against a plain-Python reference of T5's random_spans_noise_mask and
sentinel replacement, fed the same random draws; T5's lengths; exact replay by example index; the source seam."""

import numpy as np
import pytest

from data.spans import SENTINEL, corrupted_lengths, noise_plan, sentinel_ids, span_corruption_lengths, span_example
from data.tf_import import tensorflow

tf = tensorflow()  # as the data code imports it (quiet, without Keras)


def reference_example(window, noise_draws, nonnoise_draws, *, n_ctx, n_targets, noise_density, mean_span_length,
                      sentinels, eos_id, pad_id):
    """T5's span corruption written out in plain Python, given the two segmentations' random draws."""
    length = len(window)
    n_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    n_spans = min(max(int(round(n_noise / mean_span_length)), 1), n_noise, length - n_noise)  # non-empty spans

    def segmentation(items, draws):  # items split into n_spans non-empty runs: T5's _random_segmentation
        # shuffle [1]*(n_spans-1) + [0]*... by the draws' stable argsort: these items start a new run
        order = sorted(range(len(draws)), key=lambda i: (draws[i], i))
        starts = [0] + [1 if order[i] < n_spans - 1 else 0 for i in range(items - 1)]
        lengths, current = [], 0
        for i in range(items):
            if starts[i] and i:
                lengths.append(current)
                current = 0
            current += 1
        return lengths + [current]

    noise_lengths, kept_lengths = segmentation(n_noise, noise_draws), segmentation(length - n_noise, nonnoise_draws)
    assert len(noise_lengths) == len(kept_lengths) == n_spans
    mask = []
    for kept, noise in zip(kept_lengths, noise_lengths):  # spans alternate, starting with kept tokens
        mask += [False] * kept + [True] * noise

    def replace(dropped):
        out, run = [], -1
        for i, token in enumerate(window):
            if not dropped[i]:
                out.append(token)
            elif i == 0 or not dropped[i - 1]:
                run += 1
                out.append(sentinels[run])
        return out + [eos_id]

    inputs, targets = replace(mask), replace([not m for m in mask])

    def padded(seq, width):
        return seq + [pad_id] * (width - len(seq)), [1] * len(seq) + [0] * (width - len(seq))

    (inputs, input_segments), (targets, target_segments) = padded(inputs, n_ctx), padded(targets, n_targets)
    return {"inputs": inputs, "segment_ids": input_segments, "targets": targets,
            "target_segment_ids": target_segments}


def draws(seed, index, length, noise_density, mean_span_length):
    """The two stateless draw vectors span_example makes for example ``index``."""
    n_noise, _ = noise_plan(length, noise_density, mean_span_length)
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    keys = [tf.random.experimental.stateless_fold_in(key, i) for i in range(2)]
    full = dict(minval=None, maxval=None, dtype=tf.int64)
    return (tf.random.stateless_uniform([n_noise - 1], keys[0], **full).numpy().tolist(),
            tf.random.stateless_uniform([length - n_noise - 1], keys[1], **full).numpy().tolist())


def test_lengths_are_t5s():
    assert span_corruption_lengths(512, 0.15, 3.0) == (568, 114)  # T5's published span-corruption lengths
    raw, targets = span_corruption_lengths(128, 0.15, 3.0)
    n_noise, n_spans = noise_plan(raw, 0.15, 3.0)
    assert raw - n_noise + n_spans + 1 == 128 and targets == n_noise + n_spans + 1
    assert corrupted_lengths(raw + 1, 0.15, 3.0)[0] > 128  # the longest raw window that fits


@pytest.mark.parametrize("n_ctx, density, mean", [(32, 0.15, 3.0), (64, 0.3, 2.0), (16, 0.5, 1.0)])
def test_span_corruption_matches_plain_python(n_ctx, density, mean):
    raw, n_targets = span_corruption_lengths(n_ctx, density, mean)
    sentinels = [900 - i for i in range(noise_plan(raw, density, mean)[1])]
    settings = dict(n_ctx=n_ctx, n_targets=n_targets, noise_density=density, mean_span_length=mean,
                    sentinels=sentinels, eos_id=1, pad_id=0)
    rng = np.random.default_rng(0)
    for index in range(6):
        window = rng.integers(10, 800, raw).astype(np.int32)
        got = {k: v.numpy().tolist() for k, v in span_example(tf, tf.constant(window), tf.constant(index, tf.int64),
                                                               seed=7, **settings).items()}
        want = reference_example(window.tolist(), *draws(7, index, raw, density, mean), **settings)
        assert got == want
        # Inputs and targets together give the window back: sentinel i marks where target span i was.
        inputs = [t for t, s in zip(got["inputs"], got["segment_ids"]) if s][:-1]
        targets = [t for t, s in zip(got["targets"], got["target_segment_ids"]) if s][:-1]
        spans, current = {}, None
        for t in targets:
            current = t if t in sentinels else current
            if t not in sentinels:
                spans.setdefault(current, []).append(t)
        rebuilt = [x for t in inputs for x in (spans[t] if t in sentinels else [t])]
        assert rebuilt == window.tolist()
        assert sum(1 for t in inputs if t in sentinels) == noise_plan(raw, density, mean)[1]


def test_examples_replay_by_index_and_differ_between_indices():
    raw, n_targets = span_corruption_lengths(32, 0.15, 3.0)
    settings = dict(n_ctx=32, n_targets=n_targets, noise_density=0.15, mean_span_length=3.0,
                    sentinels=list(range(900, 890, -1)), eos_id=1, pad_id=0, seed=3)
    window = tf.range(100, 100 + raw, dtype=tf.int32)
    first = span_example(tf, window, tf.constant(5, tf.int64), **settings)["inputs"].numpy()
    assert (first == span_example(tf, window, tf.constant(5, tf.int64), **settings)["inputs"].numpy()).all()
    others = [span_example(tf, window, tf.constant(i, tf.int64), **settings)["inputs"].numpy() for i in range(6)]
    assert sum((first == other).all() for other in others) == 1


def test_sentinels_come_from_the_tokenizer_or_the_top_of_the_vocabulary():
    from config import ConfigError
    from data.tokenizer import ByteTokenizer, train_bpe

    bpe = train_bpe(["some text to train on"] * 4, 300, special_tokens=[SENTINEL.format(i) for i in range(4)])
    assert sentinel_ids(bpe, 300, 3, "x") == [bpe.token_id(SENTINEL.format(i)) for i in range(3)]
    assert sentinel_ids(ByteTokenizer(), 300, 3, "x") == [299, 298, 297]  # T5's rule: the top ids, descending
    with pytest.raises(ConfigError, match="no <extra_id_9> token, and n_vocab 260 leaves no room"):
        sentinel_ids(ByteTokenizer(), 260, 10, "x")
