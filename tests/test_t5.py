"""T5 against transformers on random local weights: relative position buckets, logits of padded batches (original
T5 and T5 v1.1 shapes, an encoder alone), KV-cached decoding against full recomputation, greedy and beam
generation against ``generate``, import/export round trips; the seq2seq objective; sharded training equal to one
device; predict.py as a user runs it."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from convert.hf import export_params, load_hf
from convert.hf_dir import load_tokenizer
from models import registry
from models.generate import Sampling, beam_search, sample
from models.relative_position import relative_position_bucket
from tests import hf_fixtures
from tests.common import run_cli, run_command, tiny_config, train_metrics

SHAPES = {  # name -> hf_fixtures.t5 arguments
    "t5-relu-tied": dict(),
    "t5v1.1-gated-gelu-untied-dkv16": dict(ffn="gated-gelu", tied=False, d_kv=16, n_layer=3, n_decoder_layer=2),
    "t5-gated-silu-3heads": dict(ffn="gated-silu", n_embd=36, n_head=3, buckets=16, max_distance=40),
    "t5v1.1-config-as-transformers5-saves-it": dict(ffn="gated-gelu", tied=False),
}
# config.json as transformers 5 writes it for v1.1: tie_word_embeddings true, scale_decoder_outputs false; the
# other untied shape says tie_word_embeddings false, as older transformers and the Hub's v1.1 checkpoints do
SAVED_BY_TRANSFORMERS5 = {"t5v1.1-config-as-transformers5-saves-it"}
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    return {name: hf_fixtures.save_t5(hf_fixtures.t5(**kw), tmp_path_factory.mktemp(name),
                                      old_config=name not in SAVED_BY_TRANSFORMERS5) for name, kw in SHAPES.items()}


def reference(path, encoder_only=False):
    cls = transformers.T5EncoderModel if encoder_only else transformers.T5ForConditionalGeneration
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def ours(path):
    """(config, graphdef, params, model) of an HF directory."""
    cfg, params = load_hf(path)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    params = jax.tree.map(jnp.asarray, params)
    return cfg, graphdef, params, nnx.merge(graphdef, nnx.State(params))


def padded(rng, lengths, width):
    tokens = rng.integers(3, hf_fixtures.VOCAB, (len(lengths), width))
    return tokens, (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int64)


def test_relative_position_buckets_match_transformers():
    relative = np.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20)):
            want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
                torch.from_numpy(relative), bidirectional=bidirectional, num_buckets=buckets, max_distance=distance)
            got = relative_position_bucket(jnp.asarray(relative, jnp.int32), bidirectional, buckets, distance)
            assert np.array_equal(np.asarray(got), want.numpy())
            # the grid reaches every bucket (bidirectional: all but "after the query at distance 0")
            assert len(np.unique(np.asarray(got))) == (buckets - 1 if bidirectional else buckets)
    # by hand, causal with 16 buckets: distances 0..7 exact, then log-spaced up to 128, farther ones in bucket 15
    for d in (0, 5, 7, 8, 30, 127, 500):
        want = d if d < 8 else min(8 + int(math.log(d / 8) / math.log(128 / 8) * 8), 15)
        assert int(relative_position_bucket(jnp.asarray([-d]), False, 16, 128)[0]) == want


def test_attention_bias_goes_through_every_softmax_path():
    """The additive logits bias against numpy: the kernel-flag path (causal, no mask), the explicit-mask path
    (padding), the materialised path (dropout's) and a cached decoding step's explicit mask."""
    from models.attention import masked_softmax_attention, softmax_attention
    from tests import references as ref

    q, k, v = ref.random_qkv(b=2, t=7, n=3, h=8)
    bias = np.random.default_rng(5).normal(size=(1, 3, 7, 7)).astype(np.float32)
    segments = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)

    def numpy_attention(allowed):
        logits = np.einsum("btnh,bsnh->bnts", q.astype(np.float64), k.astype(np.float64)) + bias
        allowed = np.broadcast_to(allowed if allowed.ndim == 3 else allowed[None], (2, 7, 7))[:, None]
        p = np.where(allowed, np.exp(logits - np.where(allowed, logits, -np.inf).max(-1, keepdims=True)), 0.0)
        return np.einsum("bnts,bsnh->btnh", p / np.maximum(p.sum(-1, keepdims=True), 1e-300), v)

    causal = ref.mask(7, 7)
    got = softmax_attention(q, k, v, causal=True, window=None, bias=jnp.asarray(bias))
    np.testing.assert_allclose(np.asarray(got), numpy_attention(causal), atol=1e-5)
    padded = ref.mask(7, 7, None, False, segments, segments)
    got = softmax_attention(q, k, v, causal=False, window=None, segment_ids=jnp.asarray(segments),
                            bias=jnp.asarray(bias))
    real = segments == 1
    np.testing.assert_allclose(np.asarray(got)[real], numpy_attention(padded)[real], atol=1e-5)
    got = masked_softmax_attention(q, k, v, jnp.asarray(causal)[None, None], bias=jnp.asarray(bias))
    np.testing.assert_allclose(np.asarray(got), numpy_attention(causal), atol=1e-5)
    got = softmax_attention(q[:, -1:], k, v, causal=True, window=None, mask=jnp.asarray(causal[-1:])[None],
                            bias=jnp.asarray(bias[:, :, -1:]))
    np.testing.assert_allclose(np.asarray(got), numpy_attention(causal)[:, -1:], atol=1e-5)


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_match_transformers_on_padded_batches(name, directories):
    model = reference(directories[name])
    cfg, _, _, neo = ours(directories[name])
    assert cfg.model == "t5" and cfg.task == "seq2seq" and cfg.no_weight_tie == (SHAPES[name].get("tied") is False)
    rng = np.random.default_rng(len(name))
    tokens, mask = padded(rng, [30, 17, 5], 30)
    decoder, decoder_mask = padded(rng, [25, 12, 3], 25)
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                     decoder_input_ids=torch.from_numpy(decoder),
                     decoder_attention_mask=torch.from_numpy(decoder_mask)).logits.numpy()
    got, _ = jax.jit(lambda t, m, d, dm: neo(t, segment_ids=m, decoder_inputs=d, decoder_segment_ids=dm))(
        tokens, mask, decoder, decoder_mask)
    real = decoder_mask == 1
    diff = float(np.max(np.abs(np.asarray(got)[real] - want[real])))
    print(f"{name}: max abs logit diff {diff:.3g}")
    assert diff <= 1e-4


def test_encoder_model_hidden_states_match_transformers(tmp_path):
    path = hf_fixtures.save_t5(hf_fixtures.t5(encoder_only=True, ffn="gated-gelu"), tmp_path)
    cfg, _, _, neo = ours(path)
    assert cfg.decoder_layers == 0 and neo.decoder is None
    tokens, mask = padded(np.random.default_rng(3), [20, 9], 20)
    with torch.no_grad():
        want = reference(path, encoder_only=True)(input_ids=torch.from_numpy(tokens),
                                                  attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    hidden_states = nnx.jit(lambda neo, tokens, mask: neo.hidden_states(tokens, segment_ids=mask))
    got = np.asarray(hidden_states(neo, jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.max(np.abs(got[mask == 1] - want[mask == 1])) <= 1e-4
    from config import ConfigError
    from training.objectives import objective_for
    with pytest.raises(ConfigError, match="this t5 has none"):
        objective_for(cfg)


def test_cached_decoding_equals_full_recomputation(directories):
    """Left-padded prompts: the encoder runs once, cross keys/values are cached, and each step's relative
    positions are the buffer's: every step's logits equal a teacher-forced pass over the whole output."""
    cfg, _, _, neo = ours(directories["t5v1.1-gated-gelu-untied-dkv16"])
    rng = np.random.default_rng(0)
    lengths, new = [6, 11], 9
    prompts = np.stack([np.concatenate([np.zeros(11 - n, int), rng.integers(3, 300, n)]) for n in lengths])
    pad = jnp.asarray([11 - n for n in lengths], jnp.int32)
    outputs = rng.integers(3, 300, (2, new))
    logits, cache, seen = jax.jit(lambda p, pad: neo.prefill(p, pad, new, jnp.float32))(jnp.asarray(prompts), pad)
    assert cache.cross[0].k.shape == (2, cfg.n_head, 11, 16) and cache.layers[0].length == new + 1
    assert np.asarray(seen).sum() == 2 and bool(seen[0, 0])  # the repetition penalty counts the start token
    step = jax.jit(neo.decode_step)
    got = [np.asarray(logits)]
    for i in range(new - 1):
        logits, cache = step(jnp.asarray(outputs[:, i]), cache)
        got.append(np.asarray(logits))
    decoder_inputs = np.concatenate([np.zeros((2, 1), int), outputs[:, :new - 1]], 1)
    teacher_forced = nnx.jit(lambda model, prompt, inputs: model(prompt, decoder_inputs=inputs)[0])
    for b, n in enumerate(lengths):  # each row alone, unpadded
        full = teacher_forced(neo, jnp.asarray(prompts[b:b + 1, 11 - n:]), jnp.asarray(decoder_inputs[b:b + 1]))
        np.testing.assert_allclose(np.stack(got)[:, b], np.asarray(full)[0], atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["t5-gated-silu-3heads", "t5v1.1-gated-gelu-untied-dkv16"])
def test_greedy_and_beam_search_equal_transformers_generate(name, directories):
    model = reference(directories[name])
    _, graphdef, params, _ = ours(directories[name])
    tokenizer = load_tokenizer(directories[name])
    ids = tokenizer.encode(PROMPT) + [tokenizer.eos_id]  # T5's encoder inputs end with </s>, as predict.py makes them
    assert ids[-1] == 1

    def theirs(**kwargs):  # no cache: transformers' cache misses decoder layers beyond the encoder's count
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, use_cache=False, **kwargs)
        return out[0, 1:].tolist()  # without the start token

    prompt, pad = jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32)
    want = theirs(max_new_tokens=20)
    assert len(set(want)) >= 3  # the reference wanders: equality below means something
    got = sample(graphdef, params, prompt, pad, Sampling(max_new_tokens=20, temperature=0, eos_id=1),
                 jax.random.key(0))
    assert np.asarray(got)[0, :len(want)].tolist() == want
    want = theirs(max_new_tokens=12, num_beams=3)
    got = beam_search(graphdef, params, prompt, pad, Sampling(max_new_tokens=12, num_beams=3, eos_id=1))
    assert np.asarray(got)[0, :len(want)].tolist() == want


@pytest.mark.parametrize("name", list(SHAPES) + ["encoder"])
def test_export_round_trip_is_lossless_and_loads_in_transformers(name, directories, tmp_path):
    source = hf_fixtures.save_t5(hf_fixtures.t5(encoder_only=True), tmp_path / "in") if name == "encoder" else \
        directories[name]
    cfg, params = load_hf(source)
    export_params(cfg, params, str(tmp_path / "out"), source)
    original, exported = load_file(f"{source}/model.safetensors"), load_file(str(tmp_path / "out/model.safetensors"))
    assert original.keys() == exported.keys()
    for key in original:
        assert np.array_equal(original[key], exported[key]), key
    untied = SHAPES.get(name, {}).get("tied") is False
    hf = json.loads((tmp_path / "out/config.json").read_text())  # older transformers read tie_word_embeddings alone
    assert (hf["tie_word_embeddings"], hf["scale_decoder_outputs"]) == (not untied, not untied)
    reloaded = reference(str(tmp_path / "out"), encoder_only=name == "encoder")
    tokens = torch.from_numpy(np.random.default_rng(1).integers(3, hf_fixtures.VOCAB, (2, 12)))
    with torch.no_grad():
        if name == "encoder":
            a, b = (m(input_ids=tokens).last_hidden_state for m in (reloaded, reference(source, True)))
        else:
            a, b = (m(input_ids=tokens, decoder_input_ids=tokens[:, :7]).logits for m in (reloaded, reference(source)))
    assert torch.equal(a, b)


def test_v1_1_config_with_the_head_tied_to_the_embedding(tmp_path):
    """transformers 5 builds T5Config(tie_word_embeddings=False) tied (its config keeps only scale_decoder_outputs:
    false) and saves no lm_head.weight: the head is the shared embedding, unscaled, on import and after export."""
    model = hf_fixtures.t5(ffn="gated-gelu", tied=False)
    model.lm_head.weight = model.shared.weight
    source = hf_fixtures.save_t5(model, tmp_path / "in")
    assert "lm_head.weight" not in load_file(f"{source}/model.safetensors")
    cfg, _, params, neo = ours(source)
    assert cfg.no_weight_tie
    tokens = np.random.default_rng(2).integers(3, hf_fixtures.VOCAB, (2, 12))
    with torch.no_grad():
        want = reference(source)(input_ids=torch.from_numpy(tokens), decoder_input_ids=torch.from_numpy(tokens[:, :7]))
    got, _ = neo(tokens, decoder_inputs=tokens[:, :7])
    assert float(np.max(np.abs(np.asarray(got) - want.logits.numpy()))) <= 1e-4
    export_params(cfg, params, str(tmp_path / "out"), source)
    with torch.no_grad():
        again = reference(str(tmp_path / "out"))(input_ids=torch.from_numpy(tokens),
                                                 decoder_input_ids=torch.from_numpy(tokens[:, :7]))
    assert torch.equal(again.logits, want.logits)


@pytest.mark.parametrize("name", ["t5-relu-tied", "t5-gated-silu-3heads", "t5v1.1-gated-gelu-untied-dkv16"])
def test_init_from_takes_the_checkpoints_t5_shape_and_keeps_the_configs_length(name, directories):
    """train.py --init-from with configs/t5_small_spans.json (v1.1-style, 32 buckets, 3+3 layers): the model takes
    every key that shapes the checkpoint's parameters, T5's own included (buckets, gating, decoder depth, d_kv
    were kept from the config: a wrong bias table, or a gate initialised fresh beside the checkpoint's MLP), but
    not n_ctx, which sizes only its data."""
    from training import init_from
    from config import load_config
    from parallel.state import match_params

    cfg, _ = load_config("configs/t5_small_spans.json")
    path = directories[name]
    notes = []
    cfg = init_from.with_architecture_of(cfg.replace(init_from=path), "--init-from", notes)
    theirs, params = load_hf(path)
    for key in init_from.ARCHITECTURE:
        assert getattr(cfg, key) == getattr(theirs, key) or key == "n_ctx", key
    assert cfg.n_ctx == 128 and "relative_attention_num_buckets" in notes[0]
    _, state = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    found, missing, _ = match_params(params, nnx.to_pure_dict(state))
    assert not missing, missing
    assert init_from.imported_params(cfg, path) is not None  # the check before loading agrees


def test_pytorch_model_bin_and_a_missing_sentencepiece(tmp_path, monkeypatch):
    model = hf_fixtures.t5(ffn="gated-gelu")
    model.config.save_pretrained(str(tmp_path))
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # an old checkpoint: tied copies included
    (tmp_path / "spiece.model").write_bytes(b"not read")
    _, from_bin = load_hf(str(tmp_path))
    safetensors_dir = hf_fixtures.save_t5(model, tmp_path / "st")
    _, from_safetensors = load_hf(safetensors_dir)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, from_bin, from_safetensors)))
    import sys

    from config import ConfigError
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # not installed: one line saying what to do
    with pytest.raises(ConfigError, match="spiece.model: a SentencePiece model needs the sentencepiece package"):
        load_tokenizer(str(tmp_path))


def seq2seq_batches(cfg, steps, seed=0):
    """Random seq2seq batches with right padding of different lengths on both sides."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        b, s, t = cfg.train_batch_size, cfg.n_ctx, cfg.decoder_ctx
        segment_ids = (np.arange(s)[None] < rng.integers(s // 2, s + 1, (b, 1))).astype(np.int32)
        target_segment_ids = (np.arange(t)[None] < rng.integers(2, t + 1, (b, 1))).astype(np.int32)
        out.append({"inputs": rng.integers(0, cfg.n_vocab, (b, s)).astype(np.int32), "segment_ids": segment_ids,
                    "targets": (rng.integers(0, cfg.n_vocab, (b, t)) * target_segment_ids).astype(np.int32),
                    "target_segment_ids": target_segment_ids})
    return out


def test_seq2seq_trains_sharded_as_on_one_device_and_accumulates_exactly():
    cfg = tiny_config(model="t5", n_decoder_layer=1, n_decoder_ctx=12, attention_types=None, mlp_glu=True,
                      activation_function="gelu", no_weight_tie=True, warmup_steps=0, lr=1e-3)
    batches = seq2seq_batches(cfg, 1) * 3  # one batch again and again: the loss must fall
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y,vocab:y")
    accumulated = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1], microbatches=2)
    # each device accumulating its own rows' gradients, reduced once per step
    unreduced = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y,vocab:y",
                              microbatches=2, accumulate_unreduced=True)
    for key in ("loss", "accuracy", "grad_norm"):
        for run in (sharded, accumulated, unreduced):
            np.testing.assert_allclose([m[key] for m in run], [m[key] for m in single], rtol=0, atol=1e-5)
    assert single[-1]["loss"] < single[0]["loss"] - 0.1


def test_a_packed_row_gives_each_pair_the_losses_it_has_alone():
    """Two pairs in one row (segment ids 1 and 2 on both sides, as pack_pairs makes them) give every target token
    the loss it has with its pair alone in a row: the encoder, the decoder's causal attention, cross-attention and
    the shifted-right targets restart at each pair, and T5's relative positions need no reset."""
    from data.pairs import packed
    from training.objectives import objective_for

    cfg = tiny_config(model="t5", n_layer=1, n_decoder_layer=1, n_decoder_ctx=12, attention_types=None,
                      mlp_glu=True, activation_function="gelu", no_weight_tie=True)
    model = registry.build(cfg, nnx.Rngs(3))
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(3, cfg.n_vocab, n), rng.integers(3, cfg.n_vocab, t)) for n, t in ((9, 5), (14, 7))]

    def rows(groups):  # pair indices per row, laid out by data/pairs.py's packing
        batch = {}
        for side, (tokens, segments, width) in enumerate((("inputs", "segment_ids", cfg.n_ctx),
                                                          ("targets", "target_segment_ids", 12))):
            lengths = np.array([len(pair[side]) for pair in pairs])
            ids = np.zeros((len(pairs), width), np.int32)
            for i, pair in enumerate(pairs):
                ids[i, :lengths[i]] = pair[side]
            batch[tokens], batch[segments] = packed(ids, lengths, groups, 0)
        return batch

    losses = nnx.jit(lambda model, batch: objective_for(cfg)(model, batch)[0])  # (rows, 12) per target token
    alone, together = losses(model, rows([[0], [1]])), losses(model, rows([[0, 1], []]))  # one shape, one compile
    np.testing.assert_allclose(together[0, :5], alone[0, :5], rtol=0, atol=2e-5)
    np.testing.assert_allclose(together[0, 5:12], alone[1, :7], rtol=0, atol=2e-5)
    unmasked = rows([[0, 1], []])
    unmasked["target_segment_ids"] = (unmasked["target_segment_ids"] > 0).astype(np.int32)  # as one pair
    assert np.abs(losses(model, unmasked)[0, 5:12] - alone[1, :7]).max() > 1e-3


def test_layout_names_cover_encoder_decoder_and_cross_attention():
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import abstract_model, param_shardings

    cfg = tiny_config(model="t5", attention_types=None, n_decoder_layer=1)
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,heads:y,intermediate_expanded:y,vocab:x")
    _, abstract, logical = abstract_model(lambda rngs: registry.build(cfg, rngs))
    specs = jax.tree.map(lambda s: tuple(s.spec), param_shardings(layout, abstract, logical))
    split_heads = (None, "y", None)
    assert specs["encoder"]["blocks"][0]["attn"]["q"]["kernel"] == split_heads
    assert specs["decoder"]["blocks"][0]["crossattention"]["k"]["kernel"] == split_heads
    assert specs["decoder"]["blocks"][0]["crossattention"]["out"]["kernel"] == ("y", None, None)
    assert specs["decoder"]["relative_attention_bias"]["embedding"] == (None, "y")
    assert specs["decoder"]["blocks"][0]["mlp"]["c_fc"]["kernel"] == (None, "y")
    assert specs["wte"]["embedding"] == ("x", None)


def test_shift_right_restarts_every_segment():
    from training.objectives import shift_right

    targets = jnp.asarray([[5, 6, 7, 8, 9, 0], [4, 3, 0, 0, 0, 0]])
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0]])
    assert shift_right(targets, segments, 0).tolist() == [[0, 5, 6, 0, 8, 0], [0, 4, 0, 0, 0, 0]]


@pytest.mark.parametrize("change, message", [
    (dict(attention_types=[[["global", "local"], 1]]), "model t5 has global layers only"),
    (dict(moe_layers=[0]), "moe_layers: \\[0\\] is not available in model t5"),
    (dict(task="causal_lm"), "task: causal_lm does not fit model t5"),
    (dict(task="masked_lm"), "task: masked_lm does not fit model t5"),  # not "set causal false"
    (dict(n_ctx=32, n_decoder_ctx=4), "n_decoder_ctx: 4 is shorter than the 8 target tokens"),
])
def test_config_errors_name_the_key(change, message):
    from config import ConfigError, from_dict

    with pytest.raises(ConfigError, match=message):
        from_dict({"model": "t5", "n_embd": 64, "n_head": 4, "n_layer": 2, **change})
    with pytest.raises(ConfigError, match="task: seq2seq does not fit model gpt_neo"):
        from_dict({"task": "seq2seq"})


def test_predict_writes_what_transformers_generates(directories):
    path = directories["t5v1.1-gated-gelu-untied-dkv16"]
    tokenizer = load_tokenizer(path)
    with torch.no_grad():
        ids = tokenizer.encode(PROMPT) + [tokenizer.eos_id]  # T5's encoder inputs end with </s>
        want = reference(path).generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16,
                                        use_cache=False)[0, 1:].tolist()
    want = want[:want.index(1)] if 1 in want else want
    result = run_cli("predict.py", "--hf-model", path, "--prompt", PROMPT, "--temperature", "0",
                     "--max-new-tokens", "16")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == tokenizer.decode(want) + "\n"  # the output text alone, not the prompt
    two = run_command("predict.py", "--hf-model", path, "--prompt", PROMPT, "--prompt", "import os", "--temperature",
                      "0", "--max-new-tokens", "16", "--num-beams", "2")  # in-process: a clean stdout is checked above
    assert two.returncode == 0 and two.stdout.count("=== output ===") == 2, two.stderr[-2000:]
    config = json.loads(open(f"{path}/config.json").read())
    assert config["architectures"] == ["T5ForConditionalGeneration"]


def test_python_api_generates_and_embeds_like_transformers(directories):
    from config import ConfigError
    from pretrained import Pretrained

    path = directories["t5v1.1-gated-gelu-untied-dkv16"]
    model = Pretrained.from_pretrained(path)
    ids = model.tokenizer.encode(PROMPT) + [model.tokenizer.eos_id]  # T5's encoder inputs end with </s>
    with torch.no_grad():
        hf = reference(path)
        want = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=10, use_cache=False)[0, 1:].tolist()
        hidden = hf.encoder(input_ids=torch.tensor([ids])).last_hidden_state.numpy()
    want = want[:want.index(1)] if 1 in want else want
    assert model.generate(PROMPT, max_new_tokens=10, temperature=0) == model.tokenizer.decode(want)
    assert np.max(np.abs(np.asarray(model.hidden_states([PROMPT])) - hidden)) <= 1e-4  # the encoder's output
    first = np.asarray(model([PROMPT]))  # the first output token's logits: the decoder reads the start token alone
    assert first.shape == (1, 1, model.config.n_vocab)
    batch = {**model.tokenize([PROMPT]), "decoder_inputs": np.array([[0] + want[:3]], np.int32)}
    steps = np.asarray(model(batch))  # (B, T, V) for the decoder inputs given, as the README says
    assert steps.shape == (1, 4, model.config.n_vocab)
    np.testing.assert_allclose(steps[:, :1], first, atol=1e-5, rtol=0)
    assert [int(t) for t in steps[0, :3].argmax(-1)] == want[:3]  # greedy: each step's argmax is the next token
    with pytest.raises(ConfigError, match="^read_images: a t5 model reads text, not images; call the model on texts"):
        model.read_images(path)


def test_a_long_prompt_keeps_its_start_and_end_of_text_as_training_cut_its_inputs(directories, capsys):
    """predict.py --truncate-prompt, Pretrained's tokenize and generate cut a T5 input too long for n_ctx at its end,
    as data/pairs.py cut training pairs (transformers' truncation=True): the task prefix stays. They kept the last
    tokens, dropping it."""
    import predict
    from data.pairs import encode_ended
    from pretrained import Pretrained

    path = directories["t5v1.1-gated-gelu-untied-dkv16"]
    tokenizer = load_tokenizer(path)
    prompt = "reverse: " + " ".join(f"w{i}" for i in range(40))
    given = [t for t in tokenizer.encode(prompt) if t != tokenizer.eos_id]
    kept = encode_ended(tokenizer, [prompt], 16)[0][0].tolist()  # (16,): as training reads it
    assert kept == given[:15] + [tokenizer.eos_id] and len(given) > 16
    with torch.no_grad():
        want = reference(path).generate(torch.tensor([kept]), do_sample=False, max_new_tokens=8,
                                        use_cache=False)[0, 1:].tolist()
    want = tokenizer.decode(want[:want.index(1)] if 1 in want else want)
    assert predict.main(["--hf-model", path, "--set", "n_ctx=16", "--prompt", prompt, "--truncate-prompt",
                         "--temperature", "0", "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert f"note: prompt 1: its first 15 of {len(given)} tokens and end-of-text are read (--truncate-prompt)" in err
    assert out == want + "\n"
    # Without --truncate-prompt the error names the n_ctx that reads it whole, and that reads it as transformers does
    argv = ["--hf-model", path, "--set", "n_ctx=16", "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "8"]
    assert predict.main(argv) == 2
    assert capsys.readouterr().err == (f"error: prompt 1 has {len(given) + 1} tokens; only 16 fit in the encoder's "
                                       f"n_ctx 16 (shorten it, --set n_ctx={len(given) + 1} (relative positions read "
                                       "any length) or pass --truncate-prompt)\n")
    with torch.no_grad():
        whole = reference(path).generate(torch.tensor([given + [tokenizer.eos_id]]), do_sample=False,
                                         max_new_tokens=8, use_cache=False)[0, 1:].tolist()
    assert predict.main(argv + ["--set", f"n_ctx={len(given) + 1}"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(whole[:whole.index(1)] if 1 in whole else whole) + "\n"
    model = Pretrained.from_pretrained(path, overrides="n_ctx=16")
    assert model.tokenize([prompt])["inputs"][0].tolist() == kept
    assert model.generate(prompt, max_new_tokens=8, temperature=0) == want


def test_generated_padding_is_not_text(directories, monkeypatch, capsys):
    """A T5's <pad> (a random model writes some) is left out of predict.py's and Pretrained.generate's text, as
    transformers' decode(skip_special_tokens=True) leaves it out; the text still ends at </s>."""
    import models.generate
    import predict
    from pretrained import Pretrained

    path = directories["t5-relu-tied"]
    tokenizer = load_tokenizer(path)
    pad, eos = tokenizer.padding_id, tokenizer.eos_id
    assert (pad, eos) == (0, 1)
    a, b = tokenizer.encode("ab")[:2]
    written = [a, pad, b, pad, eos, a]
    printer = predict.Printer(tokenizer, 1, [], stream=False)
    for token in written:
        printer(np.array([token]), 0)
    assert printer.text(0) == tokenizer.decode([a, b]) and "<pad>" not in tokenizer.decode([a, b])
    monkeypatch.setattr(models.generate, "sample", lambda *args, **kwargs: np.array([written]))
    assert Pretrained.from_pretrained(path).generate("x", max_new_tokens=6) == tokenizer.decode([a, b])
    # two prompts: one batch, printed when it is done (the path that printed the <pad>s)
    monkeypatch.setattr(models.generate, "sample", lambda *args, **kwargs: np.array([written, written[::-1]]))
    capsys.readouterr()
    assert predict.main(["--hf-model", path, "--prompt", "x", "--prompt", "y", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out == (f"=== prompt 1 ===\nx\n=== output ===\n{tokenizer.decode([a, b])}\n"
                                       f"=== prompt 2 ===\ny\n=== output ===\n{tokenizer.decode([a])}\n")


@pytest.mark.e2e
def test_span_corruption_run_resumes_bit_identically(tmp_path, capsys):
    """configs/t5_small_spans.json made tiny, through train.py's main (in-process: three start-ups of TensorFlow
    and jax fewer): span-corruption batches from TFRecords, dropout on; a run stopped after step 2 and resumed
    equals the uninterrupted run bit for bit (predict.py on T5: test_predict_writes_what_transformers_generates)."""
    import os

    import train as train_py
    from tests.common import ROOT, metrics_rows

    sets = ["n_layer=1", "n_decoder_layer=1", "n_embd=64", "n_head=4", "d_ff=128", "n_ctx=32", "train_batch_size=8",
            "eval_batch_size=8", "train_steps=4", "steps_per_checkpoint=2", "warmup_steps=1", "eval_steps=1",
            "eval_every=0", "res_dropout=0.1", "attn_dropout=0.1"]

    def train(path, *extra) -> str:
        args = ["--config", os.path.join(ROOT, "configs/t5_small_spans.json"), "--model-path", str(path),
                "--no-progress"]
        code = train_py.main(args + [a for s in sets for a in ("--set", s)] + list(extra))
        out, err = capsys.readouterr()
        assert code == 0, err[-3000:]
        return out

    train(tmp_path / "whole")
    train(tmp_path / "parts", "--stop-at-step", "2")
    assert "at step 2" in train(tmp_path / "parts")

    def rows(path, kind="train"):
        return [(r["step"], r["loss"], r.get("grad_norm"), r.get("accuracy")) for r in metrics_rows(path, kind)]

    assert rows(tmp_path / "parts") == rows(tmp_path / "whole") and len(rows(tmp_path / "whole")) == 4
    assert rows(tmp_path / "parts", "eval") == rows(tmp_path / "whole", "eval")
