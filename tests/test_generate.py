"""Generation and Hugging Face interop: KV-cached decoding, sampling rules and beam search against transformers,
GPT-Neo/GPT-2 import, GPT-Neo export, predict.py and train.py --init-from as a user runs them."""

import collections
import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from config import ConfigError
from convert import hf_dir
from convert.gpt_neo import config_from_hf
from convert.hf import load_hf
from models import generate as generate_module
from models.generate import Sampling, beam_search, filter_logits, sample
from models.gpt_neo import GPTNeo
from parallel.state import abstract_model
from tests import hf_fixtures
from tests.common import run_cli, run_command, tiny_config

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def neo_dir(tmp_path_factory):
    """A GPT-Neo directory whose local window (8) is shorter than prompt + generation."""
    return hf_fixtures.save(hf_fixtures.gpt_neo(n_layer=4, window=8), tmp_path_factory.mktemp("neo"))


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return hf_fixtures.save(hf_fixtures.gpt2(), tmp_path_factory.mktemp("gpt2"))


def load(path):
    """(graphdef, params, tokenizer, transformers model) for an HF directory."""
    cfg, params = load_hf(path)
    graphdef, _, _ = abstract_model(lambda rngs: GPTNeo(cfg, rngs=rngs))
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return graphdef, jax.tree.map(jnp.asarray, params), hf_dir.load_tokenizer(path), reference


def hf_generate(reference, ids, **kwargs):
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 pad_token_id=0, **kwargs)
    return out[0, len(ids):].tolist()


def ours(graphdef, params, ids, s, seed=0):
    out = sample(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32), s, jax.random.key(seed))
    return trim(np.asarray(out)[0].tolist(), s.eos_id)


def trim(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


# --- KV cache -------------------------------------------------------------------------------------------------

EVERY_KIND = dict(n_layer=5, attention_types=[[["global", "local", "linear", "none", "global"], 1]],
                  local_attention_radius=4, num_mem_kv=2, rotary_emb=True, rotary_emb_fraction=0.5, moe_layers=[1],
                  moe_params={"num_experts": 4, "top_k": 2, "capacity_factor": 8.0})


GLOBAL_LOCAL = dict(n_layer=4, attention_types=[[["global", "local"], 2]], local_attention_radius=4)


@pytest.mark.parametrize("changes", [GLOBAL_LOCAL, EVERY_KIND,
                                     dict(GLOBAL_LOCAL, attention_fn="training.peft.hooks:alibi_attention")],
                         ids=["global-local", "every-kind", "alibi"])
def test_cached_decoding_equals_full_recomputation(changes):
    """Also with a custom attention function that reads distances (ALiBi): a hooked local layer caches keys in
    position order, not as a ring (whose slot order gave ALiBi wrong distances: logits off by 0.05)."""
    from training.peft import build_model

    cfg = tiny_config(**changes)
    graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(0)))
    call = jax.jit(lambda params, tokens, cache: nnx.merge(graphdef, params)(tokens, cache=cache))
    rng = np.random.default_rng(0)
    lengths, new = [5, 9], 12  # both prompts longer than the window for part of the run; row 0 left-padded by 4
    rows = [rng.integers(1, cfg.n_vocab, n + new) for n in lengths]
    width = max(lengths)
    pad = np.array([width - n for n in lengths], np.int32)
    prompts = np.stack([np.concatenate([np.zeros(p, int), r[:n]]) for p, r, n in zip(pad, rows, lengths)])
    cache = nnx.merge(graphdef, params).init_cache(2, width + new, jnp.asarray(pad))
    logits, cache = call(params, jnp.asarray(prompts), cache)
    got = [[np.asarray(logits[b, -1])] for b in range(2)]
    for i in range(new - 1):
        step = jnp.asarray([[r[n + i]] for r, n in zip(rows, lengths)])
        logits, cache = call(params, step, cache)
        for b in range(2):
            got[b].append(np.asarray(logits[b, 0]))
    for b, (r, n) in enumerate(zip(rows, lengths)):
        full = np.asarray(call(params, jnp.asarray(r[None, :n + new - 1]), None)[0])[0, n - 1:]  # every prediction
        np.testing.assert_allclose(np.stack(got[b]), full, atol=2e-5, rtol=0)


def test_caches_keep_only_what_each_kind_needs():
    cfg = tiny_config(**EVERY_KIND)
    layers = GPTNeo(cfg, rngs=nnx.Rngs(0)).init_cache(1, 30, jnp.zeros((1,), jnp.int32)).layers
    assert layers[0].length == 30 and layers[1].length == 4  # global: everything; local: its window
    assert layers[2].kv_sum.shape == (1, 4, 16, 16) and layers[3] is None  # linear: running sums; none: nothing
    # No per-position bookkeeping besides keys and values: each layer stored a (B, L) array of segment ids, the
    # same in every layer and written again every token (two kernels per layer and token on a GPU); a key's segment
    # follows from its buffer index and the row's padding.
    assert [leaf.shape for leaf in jax.tree.leaves(layers[:2]) if leaf.dtype == jnp.int32] == [(1,), (), (1,), ()]


# --- Hugging Face import --------------------------------------------------------------------------------------

def logits_difference(path, seed=1) -> float:
    """Max abs difference of NeoMesh's logits and transformers' for the model in ``path``."""
    graphdef, params, _, reference = load(path)
    tokens = np.random.default_rng(seed).integers(0, hf_fixtures.VOCAB, (2, 40))
    with torch.no_grad():
        want = reference(torch.from_numpy(tokens)).logits.numpy()
    got = np.asarray(nnx.merge(graphdef, nnx.State(params))(jnp.asarray(tokens))[0])
    return float(np.max(np.abs(got - want)))


def test_gpt2_logits_match_transformers(gpt2_dir):
    assert logits_difference(gpt2_dir) <= 1e-4


def test_a_gpt2_that_reorders_and_upcasts_its_attention_imports_with_parity(tmp_path):
    """reorder_and_upcast_attn computes the logits in float32, as NeoMesh always does: it was refused."""
    reference = hf_fixtures.gpt2()
    reference.config.reorder_and_upcast_attn = True
    path = hf_fixtures.save(reference, tmp_path)
    assert json.loads(open(f"{path}/config.json").read())["reorder_and_upcast_attn"]
    assert logits_difference(path, seed=2) <= 1e-4


def test_a_config_json_value_of_another_type_names_the_files_key(tmp_path):
    """It said 'n_ctx: expected int, got null', a key the file does not have."""
    path = hf_fixtures.save(hf_fixtures.gpt2(), tmp_path)
    hf = json.loads(open(f"{path}/config.json").read())
    hf["n_positions"] = None
    open(f"{path}/config.json", "w").write(json.dumps(hf))
    with pytest.raises(ConfigError, match=f"^{path}/config.json: n_positions: expected int, got null \\(read as "
                                          "NeoMesh's n_ctx\\)$"):
        load_hf(path)


def test_pytorch_model_bin_imports_like_safetensors(gpt2_dir, tmp_path):
    reference = hf_fixtures.gpt2()  # an older checkpoint: config.json and a torch pickle of the state dict
    reference.config.save_pretrained(str(tmp_path))
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    def imported(path):
        return load_hf(path)[1]

    from_bin, from_safetensors = imported(str(tmp_path)), imported(gpt2_dir)
    assert jax.tree.structure(from_bin) == jax.tree.structure(from_safetensors)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, from_bin, from_safetensors)))


@pytest.mark.parametrize("which", ["neo", "gpt2"])
def test_greedy_matches_transformers_generate(which, neo_dir, gpt2_dir):
    graphdef, params, tokenizer, reference = load(neo_dir if which == "neo" else gpt2_dir)
    ids = tokenizer.encode(PROMPT)
    want = hf_generate(reference, ids, do_sample=False, max_new_tokens=24)
    assert len(set(want)) >= 4  # the reference wanders: equality below means something
    assert ours(graphdef, params, ids, Sampling(max_new_tokens=24, temperature=0, eos_id=0)) == want


def test_repetition_penalty_matches_transformers(neo_dir):
    graphdef, params, tokenizer, reference = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    want = hf_generate(reference, ids, do_sample=False, max_new_tokens=24, repetition_penalty=1.8)
    got = ours(graphdef, params, ids, Sampling(max_new_tokens=24, temperature=0, repetition_penalty=1.8, eos_id=0))
    assert got == want
    assert got != ours(graphdef, params, ids, Sampling(max_new_tokens=24, temperature=0, eos_id=0))


def test_beam_search_matches_transformers(neo_dir):
    graphdef, params, tokenizer, reference = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    want = hf_generate(reference, ids, do_sample=False, num_beams=3, max_new_tokens=16, length_penalty=1.0)
    got = beam_search(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32),
                      Sampling(max_new_tokens=16, num_beams=3, eos_id=0))
    assert trim(np.asarray(got)[0].tolist(), 0) == want
    assert want != hf_generate(reference, ids, do_sample=False, max_new_tokens=16)  # beams found another path


def test_beam_search_with_a_repetition_penalty_matches_transformers(neo_dir):
    """predict.py --num-beams 4 --repetition-penalty 1.2 (the README's command): the penalty was ignored with
    beams. Hugging Face penalises each beam's log probabilities by the tokens of that beam and its prompt."""
    graphdef, params, tokenizer, reference = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    want = hf_generate(reference, ids, do_sample=False, num_beams=3, max_new_tokens=16, repetition_penalty=1.8,
                       length_penalty=1.0)
    beams = lambda penalty: trim(np.asarray(beam_search(  # noqa: E731
        graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32),
        Sampling(max_new_tokens=16, num_beams=3, repetition_penalty=penalty, eos_id=0)))[0].tolist(), 0)
    assert beams(1.8) == want
    assert want != beams(1.0)  # the penalty changed the search


def test_beam_search_with_length_penalties_and_an_eos_matches_transformers_in_any_batch(neo_dir):
    """--length-penalty only matters once beams end, so end them with frequent tokens as eos. transformers' defaults
    (early_stopping=False) stop a row when its best beam, scored at its present length, cannot beat the worst
    finished one, and take finished hypotheses only from the best num_beams candidates; the search stopped on a
    bound at the longest length and pooled the spare candidates too, so it wrote other text for length penalties
    such as 0.5 or -1. That stop is no bound, so each row stops on its own: batching must not change a row."""
    graphdef, params, tokenizer, reference = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    other = tokenizer.encode("x = [")
    frequent = [t for t, _ in collections.Counter(hf_generate(reference, ids, do_sample=False,
                                                               max_new_tokens=30)).most_common(2)]
    batch = np.array([ids, [0] * (len(ids) - len(other)) + other], np.int32)
    pad = np.array([0, len(ids) - len(other)], np.int32)
    for eos in frequent:
        for penalty in (0.5, -1.0):
            s = Sampling(max_new_tokens=16, num_beams=3, length_penalty=penalty, eos_id=eos)
            want = hf_generate(reference, ids, do_sample=False, num_beams=3, max_new_tokens=16,
                               length_penalty=penalty, eos_token_id=eos)
            alone = beam_search(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32), s)
            assert trim(np.asarray(alone)[0].tolist(), eos) == want, (eos, penalty)
            batched = np.asarray(beam_search(graphdef, params, jnp.asarray(batch), jnp.asarray(pad), s))
            assert trim(batched[0].tolist(), eos) == want, (eos, penalty)


def test_one_beam_and_top_k_one_equal_greedy_and_seeds_reproduce(neo_dir):
    graphdef, params, tokenizer, _ = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    greedy = ours(graphdef, params, ids, Sampling(max_new_tokens=20, temperature=0, eos_id=0))
    beam = beam_search(graphdef, params, jnp.asarray([ids], jnp.int32), jnp.zeros((1,), jnp.int32),
                       Sampling(max_new_tokens=20, num_beams=1, eos_id=0))
    assert trim(np.asarray(beam)[0].tolist(), 0) == greedy
    assert ours(graphdef, params, ids, Sampling(max_new_tokens=20, temperature=1.0, top_k=1, eos_id=0)) == greedy
    sampled = Sampling(max_new_tokens=20, temperature=1.5, eos_id=0)
    first = ours(graphdef, params, ids, sampled, seed=7)
    assert first == ours(graphdef, params, ids, sampled, seed=7)
    assert first != ours(graphdef, params, ids, sampled, seed=8)


@pytest.mark.parametrize("model", ["gpt_neo", "t5"])
def test_a_single_prompt_decoded_as_two_rows_gives_the_same_tokens(model):
    """On GPUs a batch of one runs through the model as two identical rows (models.generate.model_rows): the same
    tokens as one row, greedy, sampled with a seed, stopped by eos or by a host callback; here on the CPU, whose
    programs take one row."""
    from models import registry

    cfg = tiny_config(n_layer=2) if model == "gpt_neo" else \
        tiny_config(model="t5", n_layer=2, n_decoder_layer=2, attention_types=None)
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(0)))
    params = nnx.to_pure_dict(state)
    prompts = jnp.asarray(np.random.default_rng(0).integers(1, cfg.n_vocab, (1, 6)), jnp.int32)
    pad, key = jnp.zeros((1,), jnp.int32), jax.random.key(3)
    assert generate_module.model_rows(1, "gpu") == 2 and generate_module.model_rows(1, "cpu") == 1
    assert generate_module.model_rows(4, "gpu") == 4

    def decode(s, twin, on_tokens=None):
        program = dataclasses.replace(generate_module._program(s), twin_row=twin)
        return np.asarray(generate_module._run(graphdef, program, params, prompts, pad, generate_module._knobs(s),
                                               key, on_tokens))

    greedy = Sampling(max_new_tokens=10, temperature=0)
    first = decode(greedy, False)
    eos = int(first[0, 4])  # ends the row at step 4 or before
    stop_at_6 = StopAt(6)
    cases = ((greedy, None), (Sampling(max_new_tokens=10, temperature=1.3, top_p=0.9), None),
             (Sampling(max_new_tokens=10, temperature=0, eos_id=eos), None), (greedy, stop_at_6))
    for s, callback in cases if model == "gpt_neo" else cases[:1] + cases[-1:]:  # T5: its cache, once
        one, two = decode(s, False, callback), decode(s, True, callback)
        assert one.shape == two.shape == (1, 10)
        np.testing.assert_array_equal(two, one)
    assert (decode(greedy, True, stop_at_6)[0, 7:] == 0).all()  # the callback's stop reached the one real row


class StopAt:
    """A host callback that ends every row after step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, tokens, step):
        return np.full(tokens.shape, int(step) >= self.step)


def test_a_loop_with_a_host_callback_is_found_in_the_persistent_compilation_cache(tmp_path):
    """jax writes no program that calls back to the host into its persistent compilation cache: the loop that
    streamed a single prompt or watched for --stop strings was compiled again by every predict.py run. With a
    callback the steps run from the host now: a second process (here: in-memory caches cleared) compiles nothing,
    and the tokens are the device loop's."""
    from jax.experimental.compilation_cache import compilation_cache

    cfg = tiny_config(n_layer=2)
    graphdef, state = nnx.split(GPTNeo(cfg, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(state)
    prompts = jnp.asarray(np.random.default_rng(0).integers(1, cfg.n_vocab, (1, 5)), jnp.int32)
    pad, key = jnp.zeros((1,), jnp.int32), jax.random.key(2)
    settings = Sampling(max_new_tokens=9, temperature=0.9, top_p=0.95)
    events = []

    def listen(event, **_):
        events.append(event)

    options = {"jax_compilation_cache_dir": str(tmp_path), "jax_persistent_cache_min_compile_time_secs": 0.0,
               "jax_persistent_cache_min_entry_size_bytes": 0}
    before = {name: getattr(jax.config, name) for name in options}
    jax.monitoring.register_event_listener(listen)
    try:
        for name, value in options.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
        runs = []
        for _ in range(2):
            jax.clear_caches()
            events.clear()
            runs.append(np.asarray(sample(graphdef, params, prompts, pad, settings, key, StopAt(6))))
    finally:
        jax.monitoring.unregister_event_listener(listen)
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
    requests = events.count("/jax/compilation_cache/compile_requests_use_cache")
    assert requests and events.count("/jax/compilation_cache/cache_hits") == requests
    np.testing.assert_array_equal(runs[1], runs[0])
    device_loop = np.asarray(sample(graphdef, params, prompts, pad, settings, key))
    np.testing.assert_array_equal(runs[0][:, :7], device_loop[:, :7])  # StopAt(6) ends the row after step 6
    assert (runs[0][:, 7:] == 0).all()


def test_new_values_of_the_sampling_knobs_reuse_the_compiled_loop():
    """Temperature, top-p, the penalties and eos were static jit arguments, so each new value compiled the whole
    decode loop again (2 eos ids x 2 length penalties: 8 programs). They are traced now: settings of one structure
    and shapes share one program, and give what a fresh compile for each gives."""
    cfg = tiny_config(n_layer=2)
    graphdef, state = nnx.split(GPTNeo(cfg, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(state)
    prompts = jnp.asarray(np.random.default_rng(0).integers(1, cfg.n_vocab, (2, 6)), jnp.int32)
    pad = jnp.asarray([0, 2], jnp.int32)
    key = jax.random.key(0)
    greedy = np.asarray(sample(graphdef, params, prompts, pad, Sampling(max_new_tokens=12, temperature=0), key))
    tokens, counts = np.unique(greedy, return_counts=True)
    first, second = (int(t) for t in tokens[np.argsort(-counts)][:2])  # frequent tokens as eos: beams end
    sampled = (Sampling(max_new_tokens=12, temperature=0.7, top_p=0.9, repetition_penalty=1.3, eos_id=first),
               Sampling(max_new_tokens=12, temperature=1.4, top_p=0.6, repetition_penalty=1.8, eos_id=second))
    beams = (Sampling(max_new_tokens=12, num_beams=3, length_penalty=0.5, eos_id=first),
             Sampling(max_new_tokens=12, num_beams=3, length_penalty=-1.0, eos_id=second, temperature=0, top_k=5,
                      top_p=0.5))  # sampling-only settings: beams ignore them
    for jitted, generate, settings in (
            (generate_module._sample, lambda s: sample(graphdef, params, prompts, pad, s, key), sampled),
            (generate_module._beam_search, lambda s: beam_search(graphdef, params, prompts, pad, s), beams)):
        before = jitted._cache_size()
        reused = [np.asarray(generate(s)) for s in settings]
        assert jitted._cache_size() == before + 1
        assert not np.array_equal(*reused)
        for s, got in zip(settings, reused):
            jitted.clear_cache()
            assert np.array_equal(got, np.asarray(generate(s))), s


def test_a_separately_compiled_sampling_program_gives_what_sample_gives():
    """compiled_sample (what benchmarks/generate.py --profile runs, compiled with other XLA options) is sample's
    program: the same tokens, sampled with top-p and a repetition penalty from one key."""
    cfg = tiny_config(n_layer=2)
    graphdef, state = nnx.split(GPTNeo(cfg, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(state)
    prompts = np.random.default_rng(1).integers(1, cfg.n_vocab, (2, 5))
    pad = np.asarray([1, 0], np.int32)
    settings = Sampling(max_new_tokens=6, temperature=0.8, top_p=0.9, repetition_penalty=1.2)
    run, hlo_text = generate_module.compiled_sample(graphdef, params, prompts, pad, settings, jax.random.key(3),
                                                    {"xla_embed_ir_in_executable": False})
    assert " while(" in hlo_text
    np.testing.assert_array_equal(np.asarray(run()), sample(graphdef, params, prompts, pad, settings,
                                                            jax.random.key(3)))


def test_the_decode_loop_is_traced_again_under_a_layout_that_places_activations_otherwise():
    """jax keys the loop's traces by its arguments: under a second layout that places the parameters alike but
    splits the activations otherwise, it reused the first layout's trace and its activation constraints. The
    layout is part of the program now; equal layouts (two objects) share one."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh

    cfg = tiny_config(n_layer=2)
    graphdef, state = nnx.split(GPTNeo(cfg, rngs=nnx.Rngs(0)))
    mesh = make_mesh("x:4,y:2")
    everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params, prompts, pad, key = jax.device_put((nnx.to_pure_dict(state), jnp.ones((4, 6), jnp.int32),
                                                jnp.zeros((4,), jnp.int32), jax.random.key(0)), everywhere)
    settings = Sampling(max_new_tokens=4, temperature=0)

    def lowered(layout: str) -> str:
        with Layout.from_config(mesh, layout).active():
            return generate_module.lower_sample(graphdef, params, prompts, pad, settings, key).as_text()

    whole, split, again = lowered("batch:x"), lowered("batch:x,activation_embd:y"), lowered("batch:x")
    assert split.count('"y"') > whole.count('"y"')  # the hidden states' constraints name y
    assert again == whole
    before = generate_module._sample._cache_size()
    with Layout.from_config(mesh, "batch:x").active():
        sample(graphdef, params, prompts, pad, settings, key)
    with Layout.from_config(mesh, "batch:x").active():  # an equal layout: the same program
        sample(graphdef, params, prompts, pad, settings, key)
    assert generate_module._sample._cache_size() == before + 1


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda x: (np.asarray(x)[0] > -1e8).tolist()  # noqa: E731
    assert kept(filter_logits(logits, 2, 1.0)) == [True, True, False, False, False]
    assert kept(filter_logits(logits, 0, 0.6)) == [True, True, False, False, False]  # 0.5 < 0.6 <= 0.7
    assert kept(filter_logits(logits, 0, 0.5)) == [True, False, False, False, False]
    assert kept(filter_logits(logits, 0, 0.86)) == [True, True, True, True, False]
    assert kept(filter_logits(logits, 100, 1.0)) == [True] * 5  # a k above the vocabulary keeps every token


# --- Export and round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["neo", "gpt2"])
def test_import_export_round_trip_is_lossless_and_loads_in_transformers(which, neo_dir, gpt2_dir, tmp_path):
    source = neo_dir if which == "neo" else gpt2_dir
    run = tmp_path / "run"
    result = run_command("-m", "convert", "import", source, str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((run / "config.json").read_text())["model"] == {"neo": "gpt_neo", "gpt2": "gpt2"}[which]
    out = tmp_path / "exported"
    result = run_command("-m", "convert", "export", str(run), str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    original, exported = load_file(os.path.join(source, "model.safetensors")), load_file(out / "model.safetensors")
    original = {k: v for k, v in original.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert original.keys() == exported.keys()
    for name in original:
        assert np.array_equal(original[name], exported[name]), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    reference = transformers.AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    tokens = torch.from_numpy(np.random.default_rng(2).integers(0, hf_fixtures.VOCAB, (1, 30)))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, reference(tokens).logits)
    assert (out / "tokenizer.json").exists()


@pytest.mark.parametrize("change,message", [
    (dict(rotary_emb=True), "export: rotary_emb=true has no gpt_neo equivalent"),
    (dict(qkv_bias=True), "export: qkv_bias=true has no gpt_neo equivalent"),
    (dict(model="gpt2", qkv_bias=False), "export: qkv_bias=false has no gpt2 equivalent"),
    (dict(attention_types=[[["global", "linear"], 1]]), "export: gpt_neo has only global and local layers"),
    (dict(mlp_glu=True), "export: mlp_glu=true has no gpt_neo equivalent"),
])
def test_export_refuses_what_transformers_cannot_hold(change, message):
    from config import ConfigError
    from convert.gpt_neo import config_to_hf

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_to_hf(tiny_config(**change))


# --- Command line ---------------------------------------------------------------------------------------------

def test_predict_greedy_matches_transformers(neo_dir):
    """Also past n_ctx, into the rest of the position table: a model fine-tuned on 32-token sequences (n_ctx 32) of
    a 64-position model (n_positions 64) generates to position 64, as transformers does; it stopped at n_ctx."""
    _, _, tokenizer, reference = load(neo_dir)
    assert len(tokenizer.encode(PROMPT)) + 40 > 32
    want = hf_generate(reference, tokenizer.encode(PROMPT), do_sample=False, max_new_tokens=40)
    result = run_cli("predict.py", "--hf-model", neo_dir, "--prompt", PROMPT, "--temperature", "0",
                     "--max-new-tokens", "40", "--set", "n_ctx=32", "--set", "n_positions=64")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == PROMPT + tokenizer.decode([t for t in want if t != 0]) + "\n"


@pytest.mark.e2e
def test_predict_from_a_sharded_checkpoint_on_one_device_and_on_a_mesh(neo_dir, tmp_path):
    run = tmp_path / "run"
    config = tmp_path / "neo.json"
    with open(os.path.join(neo_dir, "config.json")) as f:
        settings = config_from_hf(json.load(f))
    keys = ("n_ctx", "n_embd", "n_head", "n_layer", "n_vocab", "attention_types", "local_attention_radius")
    config.write_text(json.dumps({**{k: getattr(settings, k) for k in keys}, "train_batch_size": 8,
                                  "eval_steps": 0, "sample_tokens": 0, "lr": 0.0, "weight_decay": 0.0,
                                  "warmup_steps": 0, "mesh_shape": "x:4,y:2", "layout": "batch:x,heads:y,embd:y"}))
    result = run_command("train.py", "--config", str(config), "--model-path", str(run), "--init-from", neo_dir,
                     "--no-progress", "--set", "train_steps=1")
    assert result.returncode == 0, result.stderr[-2000:]
    hf_dir.copy_tokenizer(neo_dir, str(run / "tokenizer"))
    common = ["predict.py", "--model-path", str(run), "--prompt", PROMPT, "--prompt", "import os", "--temperature",
              "0", "--max-new-tokens", "12"]
    one = run_command(*common)
    mesh = run_command(*common, "--mesh-shape", "x:4,y:2", "--layout", "batch:x,heads:y")
    assert one.returncode == 0 and mesh.returncode == 0, one.stderr[-2000:] + mesh.stderr[-2000:]
    assert one.stdout == mesh.stdout and one.stdout.count("=== prompt") == 2
    # lr 0: the weights are still the imported ones, so greedy output equals transformers' for the first prompt.
    _, _, tokenizer, reference = load(neo_dir)
    want = hf_generate(reference, tokenizer.encode(PROMPT), do_sample=False, max_new_tokens=12)
    assert PROMPT + tokenizer.decode([t for t in want if t != 0]) in one.stdout


def test_predict_errors_are_one_line(neo_dir, tmp_path):
    cases = [
        (["--hf-model", neo_dir, "--prompt", "x " * 80], "tokens; only 48 fit in n_ctx 64 with --max-new-tokens 16 "
         "(shorten it, lower --max-new-tokens or pass --truncate-prompt)"),
        (["--hf-model", neo_dir, "--prompt", "x", "--max-new-tokens", "64", "--truncate-prompt"],
         "--max-new-tokens 64: leaves no room for a prompt in the model's n_ctx 64 (at most 63)"),
        (["--model-path", str(tmp_path / "none"), "--prompt", "x"], "none: no such run directory"),
        (["--hf-model", str(tmp_path), "--prompt", "x"], "not a Hugging Face model directory"),
        (["--hf-model", neo_dir, "--prompt", "x", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--hf-model", neo_dir, "--prompt", "x", "--num-samples", "2", "--temperature", "0"],
         "--num-samples > 1 needs sampling: --temperature 0 is greedy"),
        (["--hf-model", neo_dir, "--prompt", "x", "--stop", ""], "--stop: an empty text would end every generation"),
        (["--hf-model", neo_dir, "--prompt", "x", "--num-beams", "2", "--top-k", "3"],
         "beam search (--num-beams) does not sample"),
        (["--hf-model", neo_dir, "--prompt", "x", "--layout", "heads:x"], "--layout heads:x: give --mesh-shape too"),
        (["--hf-model", neo_dir, "--prompt", "x", "--output", str(tmp_path)], "is a directory; name a file"),
        (["--hf-model", neo_dir, "--prompt", "x", "--set", "n_ctxx=32"], "--set n_ctxx=32: unknown key 'n_ctxx'"),
        (["--hf-model", neo_dir, "--prompt", "x", "--set", "n_ctx=32"], "--set n_ctx=32: the model would change "
         f"shape (wpe/embedding: (64, 64) in {neo_dir}, (32, 64) with --set)"),
    ]
    for args, message in cases:
        result = run_command("predict.py", "--max-new-tokens", "16", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    from pretrained import load as load_any  # --set reaches a Hugging Face model's config where shapes stay
    assert load_any(neo_dir, overrides=("precision=bfloat16",))[0].precision == "bfloat16"
    no_tokenizer = tmp_path / "no_tokenizer"
    hf_fixtures.gpt_neo().save_pretrained(str(no_tokenizer))
    result = run_command("predict.py", "--hf-model", str(no_tokenizer), "--prompt", "x")
    assert result.returncode == 2 and "no tokenizer" in result.stderr


@pytest.mark.parametrize("flag, value", [("--length-penalty", "nan"), ("--length-penalty", "inf"),
                                         ("--temperature", "inf"), ("--repetition-penalty", "inf")])
def test_predict_refuses_numbers_that_are_not_finite(flag, value):
    """--length-penalty nan printed the prompt with nothing after it (every beam scored nan), and an infinite
    temperature or penalty was taken as given."""
    import predict
    from config import ConfigError

    args = predict.parse_args(["--hf-model", "nowhere", "--prompt", "x", flag, value])
    with pytest.raises(ConfigError, match=f"^{flag} must be a number"):
        predict.check_options(args)


def test_a_configs_predict_max_steps_too_long_for_n_ctx_is_named(neo_dir):
    """Without --max-new-tokens the error named that flag, which the command never gave, as if it had."""
    result = run_command("predict.py", "--hf-model", neo_dir, "--prompt", "x", "--set", "predict_max_steps=64")
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: predict_max_steps (the config's default --max-new-tokens) 64: leaves no room for a prompt in the "
        "model's n_ctx 64 (at most 63)"), result.stderr[-2000:]
    result = run_command("predict.py", "--hf-model", neo_dir, "--prompt", "x")  # predict.py's own default
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: the default --max-new-tokens 64: leaves no room for a prompt in the model's n_ctx 64 (at most 63)")


def test_predict_truncates_long_prompts_and_stops_at_stop_strings(neo_dir):
    _, _, tokenizer, reference = load(neo_dir)
    result = run_command("predict.py", "--hf-model", neo_dir, "--prompt", "x " * 80, "--truncate-prompt",
                     "--temperature", "0", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    given = len(tokenizer.encode("x " * 80))
    assert f"note: prompt 1: its last 56 of {given} tokens are read (--truncate-prompt)" in result.stderr
    # the output shows what the model read, not the whole prompt given (n_ctx 64 - 8 new tokens)
    assert result.stdout.startswith(tokenizer.decode(tokenizer.encode("x " * 80)[-56:])) and \
        not result.stdout.startswith("x " * 80)
    full = hf_generate(reference, tokenizer.encode(PROMPT), do_sample=False, max_new_tokens=20)
    text = tokenizer.decode([t for t in full if t != 0])
    stop = text[5:8]  # a piece of what greedy decoding will produce
    result = run_command("predict.py", "--hf-model", neo_dir, "--prompt", PROMPT, "--temperature", "0",
                     "--max-new-tokens", "20", "--stop", stop)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == PROMPT + text[:text.find(stop)] + "\n"


def test_python_api_runs_and_generates_like_transformers(neo_dir):
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(neo_dir)
    _, _, tokenizer, reference = load(neo_dir)
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits.numpy()
    assert np.max(np.abs(np.asarray(model([PROMPT])) - want)) <= 1e-4
    greedy = hf_generate(reference, ids, do_sample=False, max_new_tokens=12)
    assert model.generate(PROMPT, max_new_tokens=12, temperature=0) == tokenizer.decode(
        [t for t in greedy if t != 0])
    # predict.py's sampling options (generate took temperature and seed alone): top_k 1 is greedy at any temperature
    assert model.generate(PROMPT, max_new_tokens=12, temperature=1.5, top_k=1, top_p=0.5) == tokenizer.decode(
        [t for t in greedy if t != 0])
    penalised = hf_generate(reference, ids, do_sample=False, max_new_tokens=12, repetition_penalty=1.8)
    assert penalised != greedy
    assert model.generate(PROMPT, max_new_tokens=12, temperature=0, repetition_penalty=1.8) == tokenizer.decode(
        [t for t in penalised if t != 0])


def test_python_api_computes_with_its_one_module_as_changed_in_place(neo_dir):
    """The README's snippets change ``pretrained.model`` in place (apply_peft, merge, set_attention_fn, a weight
    set); calls, hidden states and greedy generation then compute with it, as a fresh load of its state does."""
    from models.attention import softmax_attention
    from pretrained import Pretrained
    from training.peft import apply_peft
    from training.peft.hooks import set_attention_fn
    from training.peft.lora import merge

    model = Pretrained.from_pretrained(neo_dir)
    assert model.model is model.model
    logits, hidden = np.asarray(model([PROMPT])), np.asarray(model.hidden_states([PROMPT]))
    text = model.generate(PROMPT, max_new_tokens=12, temperature=0)
    compiled = model._forward._cache_size()
    model([PROMPT])
    assert model._forward._cache_size() == compiled  # an unchanged module reuses the compiled call
    apply_peft(model.model, {"lora": {"targets": ["q", "v"]}})
    np.testing.assert_allclose(np.asarray(model([PROMPT])), logits, atol=1e-5, rtol=0)  # B starts at zero
    for block in model.model.blocks:
        block.attn.q.lora_b[...] = jnp.full_like(block.attn.q.lora_b[...], 0.3)
    tuned = np.asarray(model([PROMPT]))
    assert np.max(np.abs(tuned - logits)) > 0.1
    assert np.max(np.abs(np.asarray(model.hidden_states([PROMPT])) - hidden)) > 0.1
    fresh = Pretrained(model.config, model.graphdef, model.params, model.tokenizer)  # the state as it is now
    np.testing.assert_allclose(np.asarray(fresh([PROMPT])), tuned, atol=1e-5, rtol=0)
    tuned_text = model.generate(PROMPT, max_new_tokens=12, temperature=0)
    assert tuned_text != text and tuned_text == fresh.generate(PROMPT, max_new_tokens=12, temperature=0)
    merge(model.model)  # the factors folded into the kernels: the same outputs from another graph
    np.testing.assert_allclose(np.asarray(model([PROMPT])), tuned, atol=1e-4, rtol=0)

    def silent(q, k, v, **options):  # attention that reads nothing: every attention output is zero
        return jnp.zeros_like(softmax_attention(q, k, v, **options))

    set_attention_fn(model.model, silent)
    assert np.max(np.abs(np.asarray(model([PROMPT])) - tuned)) > 0.1


def test_python_api_names_bad_arguments_in_one_line(neo_dir, tmp_path, monkeypatch):
    """Pretrained checks what predict.py checks, and load names a bad kind and a missing local directory."""
    from config import ConfigError
    from pretrained import Pretrained, load as load_model

    model = Pretrained.from_pretrained(neo_dir)
    for kwargs, culprit in ((dict(max_new_tokens=0), "max_new_tokens 0 must be"),
                            (dict(max_new_tokens=-1), "max_new_tokens -1 must be"),
                            (dict(temperature=-1), "temperature -1 must be"),
                            (dict(top_k=-1), "top_k -1 must be an integer >= 0"),
                            (dict(top_p=0), r"top_p 0 must be in \(0, 1\]"), (dict(top_p=1.5), "top_p 1.5 must be"),
                            (dict(repetition_penalty=0.0), "repetition_penalty 0.0 must be a number > 0"),
                            (dict(prompt=["a", "b"]), "prompt must be one string, not a list")):
        with pytest.raises(ConfigError, match=culprit):
            model.generate(**{"prompt": PROMPT, **kwargs})
    with pytest.raises(ConfigError, match="texts is empty"):
        model([])
    with pytest.raises(ConfigError, match="kind 'bogus' is not one of 'auto', 'run', 'hf'"):
        load_model(neo_dir, kind="bogus")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError, match="^load runs/missing: no such directory$"):
        Pretrained.from_pretrained("runs/missing")
    with pytest.raises(ConfigError, match="huggingface-cli download org/missing"):
        Pretrained.from_pretrained("org/missing")


def test_python_api_takes_the_commands_mesh_shape_and_layout_strings(neo_dir):
    """from_pretrained(path, layout="batch:x,heads:y") was an AttributeError deep in parallel/state.py: layout took
    only a Layout object. It takes predict.py's strings now, with the same checks."""
    from pretrained import Pretrained

    one = np.asarray(Pretrained.from_pretrained(neo_dir)([PROMPT]))
    sharded = Pretrained.from_pretrained(neo_dir, layout="batch:x,heads:y", mesh_shape="x:4,y:2")
    assert dict(sharded.layout.mesh.shape) == {"x": 4, "y": 2}
    np.testing.assert_allclose(np.asarray(sharded([PROMPT])), one, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="^layout batch:x,heads:y: give mesh_shape too"):
        Pretrained.from_pretrained(neo_dir, layout="batch:x,heads:y")

def test_a_set_that_changes_the_models_shapes_is_named_before_any_restore():
    from config import ConfigError, load_config
    from pretrained import check_same_shapes

    trained = load_config("quickstart")[0]
    check_same_shapes(trained, load_config("quickstart", ("precision=bfloat16",))[0], ("precision=bfloat16",),
                      "checkpoint C")  # same parameters: fine
    with pytest.raises(ConfigError, match=r"^--set n_ctx=64: the model would change shape \(wpe/embedding: "
                                          r"\(128, 192\) in checkpoint C, \(64, 192\) with --set\)"):
        check_same_shapes(trained, load_config("quickstart", ("n_ctx=64",))[0], ("n_ctx=64",), "checkpoint C")


def test_prompt_files_saved_with_a_byte_order_mark_lose_it(tmp_path):
    """A BOM (Windows editors' UTF-8) became the first prompt's first token, printed back as its first text."""
    import predict

    path = tmp_path / "prompts.txt"
    path.write_bytes(b"\xef\xbb\xbfdef f\r\n\r\nclass A\r\n")
    assert predict.read_prompts(predict.parse_args(["--prompt-file", str(path)])) == ["def f", "class A"]
    assert predict.read_prompts(predict.parse_args(["--prompt-from-file", str(path)])) == ["def f\n\nclass A\n"]


def test_a_prompt_file_line_of_spaces_is_a_prompt_as_the_same_prompt_flag_is(tmp_path):
    """--prompt '    ' was a prompt, the same line in --prompt-file was dropped: whitespace is text (indentation to a
    code model, as a prompt's trailing space is); only empty lines separate prompts."""
    import predict

    path = tmp_path / "prompts.txt"
    path.write_text("def f \n\n    \n\t\nclass A\n\n")
    assert predict.read_prompts(predict.parse_args(["--prompt-file", str(path)])) == ["def f ", "    ", "\t", "class A"]
    assert predict.read_prompts(predict.parse_args(["--prompt", "    "])) == ["    "]


def test_a_prompt_file_of_dash_reads_standard_input(monkeypatch):
    """``--prompt-file -`` was "-: No such file or directory": prompts piped in, as Unix tools read them."""
    import io

    import predict
    from config import ConfigError

    def piped(data: bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))

    piped("\ufeffdef f\n\nclass A\n".encode())
    assert predict.read_prompts(predict.parse_args(["--prompt-file", "-"])) == ["def f", "class A"]
    piped(b"import os\n\nx = 1\n")
    assert predict.read_prompts(predict.parse_args(["--prompt-from-file", "-"])) == ["import os\n\nx = 1\n"]
    piped(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"^standard input: not UTF-8 text \(byte 0\)$"):
        predict.read_prompts(predict.parse_args(["--prompt-file", "-"]))
