"""GPT-Neo's last model and loss options against numpy transcriptions of its formulas: share_parameters (one set of
block weights for every layer), moe_activation, the logits z-loss, entmax (GPT-Neo's bisection and backward), the
entmax loss and entmax sampling."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import predict
from models import registry
from models.entmax import entmax
from models.generate import Sampling, choose
from models.moe import MoeMlp
from models.spec import block_spec, gpt_neo_attention_init, gpt_neo_mlp_init
from parallel.steps import objective_sums
from tests import references as ref
from tests.common import random_batches, tiny_config
from tests.test_blocks import numpy_block, randomized
from tests.test_moe import numpy_moe, run
from training.objectives import objective_for, report
from training.token_losses import entmax_loss


# ---------------------------------------------------------------------------------------------------------------
# Numpy transcriptions of GPT-Neo's models/utils.py.

def gpt_neo_entmax(x, alpha=1.3, n_iter=50):
    """GPT-Neo's entmax_forward: bisection on the threshold tau, float64."""
    x = np.asarray(x, np.float64) * (alpha - 1)
    d = x.shape[-1]

    def p(v):
        return np.maximum(v, 0) ** (1 / (alpha - 1))

    max_val = x.max(-1, keepdims=True)
    tau_lo, tau_hi = max_val - 1 ** (alpha - 1), max_val - (1 / d) ** (alpha - 1)
    f_lo = p(x - tau_lo).sum(-1, keepdims=True) - 1
    dm = tau_hi - tau_lo
    for _ in range(n_iter):
        dm = dm / 2
        tau_m = tau_lo + dm
        p_m = p(x - tau_m)
        f_m = p_m.sum(-1, keepdims=True) - 1
        tau_lo = np.where(f_m * f_lo >= 0, tau_m, tau_lo)
    return p_m / p_m.sum(-1, keepdims=True)


def gpt_neo_entmax_backward(y, dy, alpha=1.3):
    """GPT-Neo's entmax_backward."""
    gppr = np.where(y > 0, y ** (2 - alpha), 0.0)
    dx = dy * gppr
    q = dx.sum(-1, keepdims=True) / gppr.sum(-1, keepdims=True)
    return dx - q * gppr


def sorted_entmax15(z):
    """Exact 1.5-entmax by sorting (Peters et al. 2019, Algorithm 2): an independent check of the bisection."""
    out = []
    for row in np.asarray(z, np.float64).reshape(-1, z.shape[-1]) / 2:
        s = np.sort(row)[::-1]
        k = np.arange(1, len(s) + 1)
        mean, mean_sq = np.cumsum(s) / k, np.cumsum(s ** 2) / k
        tau = mean - np.sqrt(np.maximum((1 - k * (mean_sq - mean ** 2)) / k, 0))
        out.append(np.maximum(row - tau[(tau <= s).sum() - 1], 0) ** 2)
    return np.array(out).reshape(z.shape)


def numpy_entmax_loss(z, y, alpha=1.3):
    """The entmax loss: (p - one_hot(y)).z + (1 - sum p^alpha) / (alpha (alpha - 1))."""
    z = np.asarray(z, np.float64)
    p = gpt_neo_entmax(z, alpha)
    target = np.take_along_axis(z, y[..., None], -1)[..., 0]
    return (p * z).sum(-1) - target + (1 - (p ** alpha).sum(-1)) / (alpha * (alpha - 1))


SCORES = np.random.default_rng(0).normal(size=(3, 4, 11)).astype(np.float32) * 3  # (B, T, V)


# ---------------------------------------------------------------------------------------------------------------
# entmax, its loss and sampling.

def test_entmax_is_gpt_neos_and_sparse():
    p = np.asarray(entmax(jnp.asarray(SCORES)))
    np.testing.assert_allclose(p, gpt_neo_entmax(SCORES), atol=1e-6)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    assert 0.2 < (p == 0).mean() < 0.9  # sparse, yet more than the top token survives
    np.testing.assert_allclose(np.asarray(entmax(jnp.asarray(SCORES), 1.5)), sorted_entmax15(SCORES), atol=1e-6)


def test_entmax_gradient_is_gpt_neos_and_the_true_derivative():
    z, dy = SCORES[0], np.random.default_rng(1).normal(size=SCORES[0].shape)
    p, vjp = jax.vjp(entmax, jnp.asarray(z))
    got = np.asarray(vjp(jnp.asarray(dy, jnp.float32))[0])
    np.testing.assert_allclose(got, gpt_neo_entmax_backward(np.asarray(p, np.float64), dy), atol=1e-5)
    eps = 1e-5  # central differences of the float64 transcription
    numeric = np.stack([((gpt_neo_entmax(z + eps * e) - gpt_neo_entmax(z - eps * e)) * dy).sum(-1) / (2 * eps)
                        for e in np.eye(z.shape[-1])], -1)
    np.testing.assert_allclose(got, numeric, atol=1e-4)


@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_entmax_loss_value_and_gradient(platform, monkeypatch):
    """The same loss and gradient with the target's score picked (GPUs: no scatter in the gradient) or gathered."""
    from tests.common import jaxpr_equations
    from training import token_losses

    monkeypatch.setattr(token_losses, "target_platform", lambda: platform)
    targets = np.random.default_rng(2).integers(0, SCORES.shape[-1], SCORES.shape[:-1])
    z, y = jnp.asarray(SCORES), jnp.asarray(targets)
    gradient = jax.make_jaxpr(jax.grad(lambda z: entmax_loss(z, y).sum()))(z)
    scatters = sum(e.primitive.name.startswith("scatter") for e in jaxpr_equations(gradient.jaxpr))
    assert (scatters == 0) == (platform == "gpu")
    got = np.asarray(entmax_loss(z, y))
    np.testing.assert_allclose(got, numpy_entmax_loss(SCORES, targets), rtol=1e-5, atol=1e-5)
    assert (got >= -1e-6).all()
    grad = np.asarray(jax.grad(lambda z: entmax_loss(z, y).sum())(z))
    np.testing.assert_allclose(grad, gpt_neo_entmax(SCORES) - np.eye(SCORES.shape[-1])[targets], atol=1e-5)
    sure = jnp.asarray(np.eye(11)[targets] * 20.0)  # entmax puts all mass on the target: no loss left
    np.testing.assert_allclose(np.asarray(entmax_loss(sure, y)), 0.0, atol=1e-6)


def test_entmax_sampling_draws_entmax_probabilities_and_never_outside_the_support():
    logits = jnp.asarray(SCORES[0, :1])  # (1, V)
    settings = Sampling(entmax=True)
    seen = jnp.zeros(logits.shape, bool)
    draws = jax.jit(jax.vmap(lambda key: choose(logits, seen, settings, key)[0]))(
        jax.random.split(jax.random.key(0), 4000))
    p = gpt_neo_entmax(SCORES[0, 0])
    freq = np.bincount(np.asarray(draws), minlength=p.size) / 4000
    assert (freq[p == 0] == 0).all() and (p == 0).any()
    np.testing.assert_allclose(freq, p, atol=0.03)  # 4000 draws: a standard error under 0.008


# ---------------------------------------------------------------------------------------------------------------
# The objectives' z-loss and entmax loss.

@pytest.fixture(scope="module")
def lm():
    """A one-layer causal LM, its parameters, a batch, and its (B, T, V) logits for that batch."""
    cfg = tiny_config(n_layer=1, attention_types=None, train_batch_size=2, n_ctx=8)
    graphdef, params = nnx.split(registry.build(cfg, nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)
    batch = {"tokens": jnp.asarray(random_batches(cfg, 1)[0]["tokens"])}
    logits = np.asarray(nnx.merge(graphdef, nnx.State(params))(batch["tokens"][:, :-1])[0], np.float64)
    return cfg, graphdef, params, batch, logits


def test_z_loss_is_added_to_training_only_and_reported(lm):
    cfg, graphdef, params, batch, logits = lm
    plain, no_penalty, no_metrics = objective_sums(graphdef, objective_for(cfg), params, batch, jnp.float32)
    z_cfg = cfg.replace(z_loss=1e-2)
    sums, penalty, metrics = objective_sums(graphdef, objective_for(z_cfg), params, batch, jnp.float32)
    lse = np.log(np.exp(logits).sum(-1))  # GPT-Neo: loss += z_loss * square(log_z), then the mean
    np.testing.assert_allclose(float(metrics["logits_z_loss"]), np.mean(lse ** 2), rtol=1e-5)
    np.testing.assert_allclose(float(penalty), 1e-2 * np.mean(lse ** 2), rtol=1e-5)
    assert float(no_penalty) == 0.0 and no_metrics == {}
    assert float(sums["loss"]) == float(plain["loss"])  # loss, eval and perplexity stay the cross-entropy
    # Masked LM: the mean over the positions whose loss counts.
    mask = np.zeros(logits.shape[:2], np.float32)
    mask[:, ::3] = 1.0
    mlm = {"inputs": batch["tokens"][:, :-1], "targets": batch["tokens"][:, 1:], "mask": jnp.asarray(mask)}
    objective = objective_for(z_cfg.replace(task="masked_lm", causal=False))
    _, penalty, metrics = objective_sums(graphdef, objective, params, mlm, jnp.float32)
    np.testing.assert_allclose(float(metrics["logits_z_loss"]), np.mean(lse[:, ::3] ** 2), rtol=1e-5)


def objective_loss(graphdef, cfg, batch):
    """params -> (the mean loss plus penalties, the metrics) of ``cfg``'s objective on ``batch``."""
    def loss(params):
        sums, penalty, metrics = objective_sums(graphdef, objective_for(cfg), params, batch, jnp.float32)
        return sums["loss"] / sums["weight"] + penalty, metrics
    return loss


def loss_and_grads(graphdef, cfg, params, batch):
    return jax.jit(jax.value_and_grad(objective_loss(graphdef, cfg, batch), has_aux=True))(params)


def assert_same_loss_and_grads(got, want):
    """Two ``loss_and_grads`` results agree: loss, z-loss and every gradient."""
    (loss, metrics), grads = got
    (want_loss, want_metrics), want_grads = want
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["logits_z_loss"]), float(want_metrics["logits_z_loss"]), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, want_grads)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_cross_entropy_picks_the_targets_logits_as_a_gather_would_and_on_gpus_its_gradient_scatters_nothing(
        dtype, platform, monkeypatch):
    """For a GPU the targets' logits are picked by comparison with the vocabulary's positions
    (token_losses.target_logits), elsewhere gathered: the losses and gradients are those of optax's gather to
    float32 rounding either way, and for a GPU the gradient's program has no scatter (a gather's writes a float32
    (..., V) array of zeros first: 3.3 GB for GPT-Neo 125M at T=2048, batch 8)."""
    import optax

    from tests.common import jaxpr_equations
    from training import token_losses

    monkeypatch.setattr(token_losses, "target_platform", lambda: platform)
    logits = (3 * jax.random.normal(jax.random.key(0), (2, 5, 37))).astype(dtype)
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 37)
    weights = jax.random.uniform(jax.random.key(2), (2, 5))

    def gathered(x, y):
        return optax.softmax_cross_entropy_with_integer_labels(x.astype(jnp.float32), y)

    ours = token_losses.cross_entropy
    np.testing.assert_allclose(ours(logits, targets), gathered(logits, targets), rtol=1e-6, atol=1e-6)
    grads = [jax.grad(lambda x, f=f: jnp.sum(weights * f(x, targets)))(logits) for f in (ours, gathered)]
    assert grads[0].dtype == dtype
    np.testing.assert_allclose(np.float32(grads[0]), np.float32(grads[1]), rtol=1e-6, atol=1e-7)

    def scatters(f) -> int:
        gradient = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(weights * f(x, targets))))(logits)
        return sum(e.primitive.name.startswith("scatter") for e in jaxpr_equations(gradient.jaxpr))

    assert scatters(gathered) > 0 and (scatters(ours) == 0) == (platform == "gpu")


@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_log_normaliser_is_logsumexp_and_on_gpus_reads_the_logits_once(platform, monkeypatch):
    """token_losses.log_normaliser equals jax.nn.logsumexp, value and derivatives, for logits near 0, far from it in
    either direction and with masked (-inf) entries; for a GPU its forward pass is one reduction over the
    vocabulary (maximum and sum together), where logsumexp's is two, unless the layout splits the vocabulary."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from tests.common import jaxpr_equations
    from training import token_losses

    monkeypatch.setattr(token_losses, "target_platform", lambda: platform)
    x = 3 * jax.random.normal(jax.random.key(0), (4, 3, 37))
    x = x + jnp.array([0.0, 200.0, -200.0, 0.0])[:, None, None]  # exp of either over- or underflows float32
    x = x.at[3, :, ::2].set(-jnp.inf)
    cotangent = jax.random.uniform(jax.random.key(1), (4, 3))
    got, grad = jax.value_and_grad(lambda x: jnp.sum(cotangent * token_losses.log_normaliser(x)))(x)
    want, want_grad = jax.value_and_grad(lambda x: jnp.sum(cotangent * jax.nn.logsumexp(x, axis=-1)))(x)
    np.testing.assert_allclose(np.asarray(token_losses.log_normaliser(x)), np.asarray(jax.nn.logsumexp(x, -1)),
                               rtol=1e-6)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-7)
    assert (np.asarray(grad)[3, :, ::2] == 0).all()
    tangent = jax.random.normal(jax.random.key(2), x.shape)  # forward mode too
    _, got_tangent = jax.jvp(token_losses.log_normaliser, (x,), (tangent,))
    _, want_tangent = jax.jvp(lambda x: jax.nn.logsumexp(x, axis=-1), (x,), (tangent,))
    np.testing.assert_allclose(np.asarray(got_tangent), np.asarray(want_tangent), rtol=1e-5, atol=1e-6)

    def reductions() -> list[str]:
        program = jax.make_jaxpr(lambda x: token_losses.log_normaliser(x))(x)  # a new function: jax caches traces
        return [e.primitive.name for e in jaxpr_equations(program.jaxpr) if e.primitive.name.startswith("reduce")]

    two_passes = ["reduce_max", "reduce_sum"]
    assert reductions() == (["reduce"] if platform == "gpu" else two_passes)
    mesh = make_mesh("x:4,y:2", jax.devices()[:8])
    with Layout.from_config(mesh, "batch:x,vocab:y").active():  # one device's part alone: its maximum is not all
        assert reductions() == two_passes
    with Layout.from_config(mesh, "batch:x,embd:y").active():
        assert reductions() == (["reduce"] if platform == "gpu" else two_passes)
    monkeypatch.setattr(token_losses, "ONE_PASS_PLATFORMS", frozenset())  # train_step.py --normaliser two-pass
    assert reductions() == two_passes


@pytest.mark.parametrize("chunk", [3, 4])  # 3 leaves a padded last chunk of the 8 positions
def test_chunked_loss_equals_the_whole_logits_loss_with_its_gradients(lm, chunk):
    """loss_chunk computes the same losses, z-loss and gradients as the (B, T, V) logits at once, tied
    embedding included; chunks are chosen automatically only when the logits would be large."""
    cfg, graphdef, params, batch, _ = lm
    cfg = cfg.replace(z_loss=1e-2)
    assert_same_loss_and_grads(loss_and_grads(graphdef, cfg.replace(loss_chunk=chunk), params, batch),
                               loss_and_grads(graphdef, cfg, params, batch))
    from training.objectives import loss_chunk
    assert loss_chunk(cfg) == 0 and loss_chunk(cfg.replace(loss_chunk=chunk)) == chunk
    assert objective_for(cfg).loss_chunk == 0 and objective_for(cfg.replace(loss_chunk=chunk)).loss_chunk == chunk


def padded_vocab(f, *args, rows: int = 144) -> list[tuple[int, ...]]:
    """The shapes of what ``f``'s program pads (jnp.pad: a ``pad`` equation) to ``rows`` vocabulary rows."""
    from tests.common import jaxpr_equations

    traced = jax.make_jaxpr(lambda *a: f(*a))(*args)  # a new function each time: jax caches traces by function
    return [tuple(e.outvars[0].aval.shape) for e in jaxpr_equations(traced.jaxpr)
            if e.primitive.name == "pad" and rows in e.outvars[0].aval.shape]


@pytest.mark.parametrize("untied, chunk", [(False, 3), (True, 0)], ids=["tied-chunked", "untied"])
def test_logits_padded_to_a_multiple_give_the_same_loss_and_gradients(lm, untied, chunk, monkeypatch):
    """logits_pad_multiple runs the output head's matmul over 144 vocabulary rows instead of 128 (a multiple of
    48), the padding's logits dropped: the same loss, z-loss and gradients, the chunked loss's too."""
    from models import layers

    monkeypatch.setattr(layers, "PAD_MIN_POSITIONS", 1)  # this batch's 16 positions pad too
    cfg, _, _, batch, _ = lm
    cfg = cfg.replace(z_loss=1e-2, loss_chunk=chunk, no_weight_tie=untied)
    graphdef, params = nnx.split(registry.build(cfg, nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)
    padded_graphdef = nnx.graphdef(registry.build(cfg.replace(logits_pad_multiple=48), nnx.Rngs(0)))
    assert_same_loss_and_grads(loss_and_grads(padded_graphdef, cfg, params, batch),
                               loss_and_grads(graphdef, cfg, params, batch))
    weight = (cfg.n_vocab + 16, cfg.n_embd) if not untied else (cfg.n_embd, cfg.n_vocab + 16)
    assert padded_vocab(lambda p: objective_loss(padded_graphdef, cfg, batch)(p)[0], params) == [weight]
    assert padded_vocab(lambda p: objective_loss(graphdef, cfg, batch)(p)[0], params) == []


@pytest.mark.parametrize("family", ["gpt_neo", "t5", "t5_untied", "bert"])
def test_every_family_pads_its_output_head_unless_the_layout_splits_the_vocabulary(family, monkeypatch):
    """GPT-Neo's, T5's (tied and untied) and BERT's masked-LM heads pad to logits_pad_multiple and compute the
    logits they compute unpadded; a layout that splits the vocabulary over devices keeps it as is, and so does a
    call over fewer than PAD_MIN_POSITIONS positions (a decode step, bound by reading the weight)."""
    from models import layers
    from parallel.layout import Layout
    from parallel.mesh import make_mesh

    settings = {"gpt_neo": dict(attention_types=None), "t5": dict(model="t5", attention_types=None, n_decoder_layer=1),
                "t5_untied": dict(model="t5", attention_types=None, n_decoder_layer=1, no_weight_tie=True),
                "bert": dict(model="bert", task="masked_lm", causal=False, attention_types=None)}[family]
    cfg = tiny_config(n_layer=1, **settings)
    tokens = jnp.asarray(random_batches(cfg, 1)[0]["tokens"][:2, :8])

    def logits(model):
        kwargs = {"decoder_inputs": tokens[:, :5]} if cfg.model == "t5" else {}
        return model(tokens, **kwargs)[0]

    plain = registry.build(cfg, nnx.Rngs(0))
    padded = registry.build(cfg.replace(logits_pad_multiple=48), nnx.Rngs(0))
    assert padded_vocab(logits, padded) == []  # 16 positions or fewer
    monkeypatch.setattr(layers, "PAD_MIN_POSITIONS", 1)
    np.testing.assert_allclose(jax.jit(logits)(padded), jax.jit(logits)(plain), rtol=1e-5, atol=1e-6)
    assert sorted(padded_vocab(logits, padded)[0]) == [cfg.n_embd, 144]
    assert padded_vocab(logits, plain) == []
    mesh = make_mesh("x:4,y:2", jax.devices()[:8])
    with Layout.from_config(mesh, "batch:x,vocab:y").active():
        assert padded_vocab(logits, padded) == []
    with Layout.from_config(mesh, "batch:x,embd:y").active():
        assert len(padded_vocab(logits, padded)) == 1


@pytest.mark.parametrize("platform, setting, want", [("gpu", None, 128), ("cpu", None, 0), ("tpu", None, 0),
                                                      ("gpu", 0, 0), ("cpu", 64, 64)])
def test_unset_the_output_head_pads_to_128_on_gpus_alone(platform, setting, want, monkeypatch):
    """logits_pad_multiple null pads the head's matmul to a multiple of 128 where the model is built for a GPU
    (measured faster there, slower on a CPU); a value set is kept on every platform; tied and untied heads alike."""
    from models import layers

    monkeypatch.setattr(layers, "target_platform", lambda: platform)
    cfg = tiny_config(n_layer=1, attention_types=None, logits_pad_multiple=setting)
    assert registry.build(cfg, nnx.Rngs(0)).wte.logits_multiple == want
    assert registry.build(cfg.replace(no_weight_tie=True), nnx.Rngs(0)).lm_head.logits_multiple == want


def test_loss_is_chunked_by_default_where_the_logits_would_crowd_a_devices_memory():
    """Unset, loss_chunk chunks once one device's float32 logits would pass an eighth of its memory: GPT-Neo
    125M's 3.3 GB at T=2048, batch 8 on a 16 GB device, not on an 80 GB one, nor split over 8 devices."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from training.objectives import loss_chunk

    big = tiny_config(n_ctx=2048, n_vocab=50257, train_batch_size=8)
    assert loss_chunk(big, memory=16e9) == 512 and loss_chunk(big, memory=80e9) == 0
    assert loss_chunk(big.replace(loss_chunk=256), memory=80e9) == 256
    split = Layout.from_config(make_mesh("x:4,y:2", jax.devices()[:8]), "batch:x,vocab:y")
    assert loss_chunk(big, split, memory=16e9) == 0 and loss_chunk(big, split, memory=2e9) == 512
    one = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    accumulated = big.replace(tokens_per_mb_per_replica=2048)  # 8 microbatches of one sequence: 0.4 GB of logits
    assert loss_chunk(big, one, memory=16e9) == 512 and loss_chunk(accumulated, one, memory=16e9) == 0
    assert loss_chunk(big.replace(n_ctx=512), memory=1e6) == 0  # one chunk would be the whole sequence


def test_entmax_loss_objective_reports_no_perplexity(lm):
    cfg, graphdef, params, batch, logits = lm
    objective = objective_for(cfg.replace(entmax_loss=True))
    sums, _, _ = objective_sums(graphdef, objective, params, batch, jnp.float32)
    want = numpy_entmax_loss(logits, np.asarray(batch["tokens"][:, 1:])).mean()
    np.testing.assert_allclose(float(sums["loss"] / sums["weight"]), want, rtol=1e-5)
    assert "perplexity" not in report(objective, {"loss": float(want)}, bytes_per_token=1.0)
    assert "perplexity" in report(objective_for(cfg), {"loss": float(want)})


# ---------------------------------------------------------------------------------------------------------------
# share_parameters and moe_activation.

def test_shared_parameters_are_one_block_applied_per_layer():
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local"], 2]], local_attention_radius=3, n_ctx=9,
                      share_parameters=True)
    model = registry.build(cfg, nnx.Rngs(0))
    p = randomized(model)
    assert list(p["blocks"]) == [0]  # every weight lives in the first layer
    tokens = np.random.default_rng(1).integers(0, cfg.n_vocab, (2, 9))
    got = np.asarray(model(jnp.asarray(tokens))[0])
    x = p["wte"]["embedding"][tokens] + p["wpe"]["embedding"][np.arange(9)]
    for block in model.blocks:  # GPT-Neo: block(h, scope "") for every layer, each with its attention kind
        spec = block.spec
        x = numpy_block(spec, p["blocks"][0], x, ref.mask(9, 9, spec.attention.window))
    x = ref.layer_norm(x, p["ln_f"]["scale"], p["ln_f"]["bias"], 1e-5)
    np.testing.assert_allclose(got, x @ p["wte"]["embedding"].T, atol=2e-4, rtol=2e-4)


def test_shared_parameters_follow_gpt_neos_names():
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "none", "local", "global"], 1]], num_mem_kv=2,
                      moe_layers=[2, 3], moe_params={"num_experts": 2})

    def shapes(cfg):
        return nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))), nnx.Param))

    shared = shapes(cfg.replace(share_parameters=True))
    blocks = shared["blocks"]
    # Layer 0 owns attention (memory slots too), norms and the dense MLP; layer 2 the experts; layers 1, 3 nothing.
    assert sorted(blocks) == [0, 2] and set(blocks[0]["attn"]) == {"q", "k", "v", "out", "mem_k", "mem_v"}
    assert set(blocks[2]) == {"mlp"} and "router" in blocks[2]["mlp"]
    count = sum(x.size for x in jax.tree.leaves(shared))
    assert count < sum(x.size for x in jax.tree.leaves(shapes(cfg))) / 2
    bert = tiny_config(model="bert", attention_types=None, share_parameters=True)
    assert list(shapes(bert)["blocks"]) == [0]  # every family's blocks share alike (BERT: ALBERT's cross-layer sharing)


def test_moe_activation_is_the_experts_activation():
    cfg = tiny_config(moe_layers=[1], moe_activation="relu", moe_params={"num_experts": 4, "capacity_factor": 4.0})
    init = gpt_neo_attention_init(cfg), gpt_neo_mlp_init(cfg)
    assert block_spec(cfg, 0, *init).mlp.activation == "gelu" and block_spec(cfg, 1, *init).mlp.activation == "relu"
    assert block_spec(cfg.replace(moe_activation=None), 1, *init).mlp.activation == "gelu"
    moe = MoeMlp(block_spec(cfg, 1, *init).mlp, rngs=nnx.Rngs(0))
    state = nnx.state(moe, nnx.Param)
    rng = np.random.default_rng(0)
    nnx.update(moe, jax.tree.map(lambda a: jnp.asarray(0.3 * rng.standard_normal(a.shape), jnp.float32), state))
    x = np.random.default_rng(1).standard_normal((2, 6, cfg.n_embd)).astype(np.float32)
    want, _, _ = numpy_moe(nnx.to_pure_dict(nnx.state(moe, nnx.Param)), x, 2, activation=lambda h: np.maximum(h, 0))
    np.testing.assert_allclose(run(moe, jnp.asarray(x))[0], want, atol=1e-4, rtol=1e-4)


def test_predict_refuses_entmax_sampling_with_beams(capsys):
    assert predict.main(["--model-path", "nowhere", "--prompt", "x", "--num-beams", "2", "--entmax_sampling"]) == 2
    assert "--entmax-sampling samples; it does not combine with --num-beams" in capsys.readouterr().err
