"""Sharding invariance: every layout computes the same training run; parameters are born sharded."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from models import registry
from parallel.batched_random import batch_random_draws
from parallel.layout import Layout
from parallel.mesh import make_mesh, parse_mesh_shape
from parallel.state import create_train_state, traced_rngs
from parallel.steps import microbatch_count
from tests.common import jaxpr_equations, on_a_tpu, random_batches, tiny_config, train_losses, train_metrics
from training.optimizer import make_optimizer

LAYOUTS = [
    ("x:8", "batch:x"),  # data parallel
    ("x:4,y:2", "batch:x,heads:y,embd:y"),  # Megatron-like tensor parallel
    ("x:2,y:4", "batch:x,embd:y,vocab:y"),  # FSDP-like: every parameter split over y
]


@pytest.fixture(scope="module")
def reference():
    cfg = tiny_config(warmup_steps=0)
    batches = random_batches(cfg, 3)
    return cfg, batches, train_losses(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])


@pytest.mark.parametrize("mesh_shape, layout", LAYOUTS)
def test_losses_match_one_device(reference, mesh_shape, layout):
    cfg, batches, single = reference
    sharded = train_losses(cfg, batches, mesh_shape, layout)
    assert single[-1] < single[0]  # the run is training, not idling
    np.testing.assert_allclose(sharded, single, rtol=0, atol=1e-5)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])  # the targets' logits gathered, or picked as on GPUs
def test_chunked_loss_on_a_vocab_split_mesh_matches_one_device(reference, platform, monkeypatch):
    """loss_chunk's scan over sequence chunks, with the vocabulary (and tied embedding) split over y."""
    from training import token_losses

    monkeypatch.setattr(token_losses, "target_platform", lambda: platform)
    cfg, batches, single = reference
    chunked = train_losses(cfg.replace(loss_chunk=cfg.n_ctx // 4), batches, "x:2,y:4", "batch:x,embd:y,vocab:y")
    np.testing.assert_allclose(chunked, single, rtol=0, atol=1e-5)


def test_parameters_are_created_sharded():
    cfg = tiny_config()
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,heads:y,embd:y")
    _, state, _ = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), layout, 0)
    q = state.params["blocks"][0]["attn"]["q"]["kernel"]  # (D, N, H): heads over y
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "y", None)
    assert q.addressable_shards[0].data.shape == (64, 2, 16)
    fc = state.params["blocks"][0]["mlp"]["c_fc"]["kernel"]  # (D, F): embd over y
    assert fc.addressable_shards[0].data.shape == (32, 256)
    mu = optax.tree.get(state.opt_state, "mu")["blocks"][0]["attn"]["q"]["kernel"]  # Adam moment follows q
    assert mu.sharding.spec == q.sharding.spec
    # Born on a mesh or on one device, the parameters are the same, bit for bit.
    one_device = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, alone, _ = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), one_device, 0)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state.params, alone.params)
    # parallel.state's own rng streams (fast under a trace) draw the keys flax's nnx.Rngs(params=seed) draws: the
    # same initialiser on flax's streams gives these parameters bit for bit; flax's unbatched init gives them to
    # float32's last bit (XLA rounds a draw's scaling as it fuses it: its flags alone move that bit).
    ours, flax_rngs = traced_rngs(0), nnx.Rngs(params=0)
    for _ in range(3):
        np.testing.assert_array_equal(jax.random.key_data(ours.params()), jax.random.key_data(flax_rngs.params()))
    flax_init = lambda: nnx.to_pure_dict(nnx.state(registry.build(cfg, nnx.Rngs(params=0)), nnx.Param))  # noqa: E731
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 state.params, jax.jit(batch_random_draws(flax_init))())
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2.4e-7, atol=0),
                 state.params, jax.jit(flax_init)())


def test_gradient_accumulation_equals_one_big_batch():
    cfg = tiny_config(train_batch_size=32, warmup_steps=0)
    batches = random_batches(cfg, 2, seed=1)
    whole = train_losses(cfg, batches, "x:8", "batch:x")
    accumulated = train_losses(cfg, batches, "x:8", "batch:x", microbatches=4)
    np.testing.assert_allclose(accumulated, whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout,batch_ways,extra", [
    ("x:8", "batch:x", 8, {}),  # data parallel: one all-reduce per step instead of one per microbatch
    # FSDP over two axes with tensor parallelism, layers scanned: one reduce-scatter of each stacked gradient
    ("x:2,z:2,y:2", "batch:x+z,embd:x+z,heads:y", 4, {"scan_layers": True}),
], ids=["data_parallel", "fsdp_2d_tensor_scanned"])
def test_unreduced_accumulation_trains_as_the_reduced_one_and_reduces_once(mesh_shape, layout, batch_ways, extra):
    """accumulate_unreduced: each device sums its own microbatches' gradients and the batch axes reduce them once
    per step. Losses and gradient norms equal the per-microbatch reduction's; the compiled step reduces
    gradients once per step where it did so after each of the 4 microbatches, sending a quarter of the bytes."""
    from parallel.hlo_stats import parse_hlo
    from tests.common import train_step_for

    cfg = tiny_config(train_batch_size=32, warmup_steps=0, lr=3e-3, **extra)
    batches = random_batches(cfg, 2, seed=1)

    def trained(accumulate_unreduced):  # (metrics per step, the compiled step's gradient reductions over the batch)
        step, state, data, shapes = train_step_for(cfg, mesh_shape, layout, microbatches=4,
                                                   accumulate_unreduced=accumulate_unreduced)
        step = step.lower(state, {name: jax.ShapeDtypeStruct(shape, np.int32, sharding=data[name])
                                  for name, shape in shapes.items()}).compile()
        metrics = []
        for batch in batches:
            state, row = step(state, jax.device_put(batch, data))
            metrics.append(jax.device_get(row))
        kind = "reduce-scatter" if "embd" in layout else "all-reduce"
        found = [c for c in parse_hlo(step.as_text(), 8).collectives if c.kind == kind and c.group_size == batch_ways]
        return metrics, ({c.count for c in found}, sum(c.count * c.wire_bytes for c in found))

    reduced, (per_microbatch, sent) = trained(False)
    unreduced, (once, sent_once) = trained(True)
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([m[key] for m in unreduced], [m[key] for m in reduced], rtol=0, atol=1e-5)
    assert reduced[1]["loss"] < reduced[0]["loss"] - 1e-4  # the first update counts in the second loss
    assert per_microbatch == {4} and once == {1}, (per_microbatch, once)  # executions per step
    assert sent_once * 4 == pytest.approx(sent, rel=0.05)  # bytes each device sends per step


def test_microbatches_from_tokens_per_mb_per_replica():
    layout = Layout.from_config(make_mesh("x:8"), "batch:x")
    # 32 sequences over 8 replicas = 4 each; 64 tokens per microbatch = 2 sequences -> 2 microbatches.
    assert microbatch_count(tiny_config(train_batch_size=32, tokens_per_mb_per_replica=64), layout) == 2
    assert microbatch_count(tiny_config(train_batch_size=32), layout) == 1
    # A replica's share that fits in one microbatch is one, as in mesh-tensorflow: GPT-Neo's 4096 tokens (2
    # sequences of 2048) on a mesh that leaves each replica 1 sequence was an error that they do not divide it.
    assert microbatch_count(tiny_config(train_batch_size=8, tokens_per_mb_per_replica=64), layout) == 1
    assert microbatch_count(tiny_config(train_batch_size=8, tokens_per_mb_per_replica=1000), layout) == 1
    from config import ConfigError
    with pytest.raises(ConfigError, match="tokens_per_mb_per_replica: 48 tokens"):
        microbatch_count(tiny_config(train_batch_size=32, tokens_per_mb_per_replica=48), layout)


def test_bfloat16_compute_keeps_float32_masters():
    cfg = tiny_config(precision="bfloat16", warmup_steps=0)
    batches = random_batches(cfg, 3)
    losses = train_losses(cfg, batches, "x:4,y:2", "batch:x,heads:y")
    reference = train_losses(cfg.replace(precision="float32"), batches, "x:4,y:2", "batch:x,heads:y")
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, reference, atol=0.05)  # bf16 rounding, same trajectory
    assert not np.allclose(losses, reference, rtol=0, atol=1e-6)  # and it really ran in bf16


def matmul_operand_dtypes(jaxpr) -> set[str]:
    """The dtypes of every dot_general's operands in ``jaxpr`` and the jaxprs nested in it."""
    return {v.aval.dtype.name for eqn in jaxpr_equations(jaxpr) if eqn.primitive.name == "dot_general"
            for v in eqn.invars}


@pytest.mark.parametrize("family", [
    dict(),  # GPT-Neo: global and local layers, tied logits
    dict(model="bert", task="masked_lm", attention_types=None),
    dict(model="t5", task="seq2seq", attention_types=None, n_decoder_layer=1),
    dict(model="vit", task="image_classification", image_size=8, patch_size=4, num_channels=1, num_labels=3,
         n_embd=32, n_head=4, n_layer=2, d_ff=64),
], ids=["gpt_neo", "bert", "t5", "vit"])
def test_bfloat16_precision_runs_every_matmul_in_bfloat16(family):
    """precision bfloat16 casts the parameters for the forward pass: every matmul of the train step's loss and
    gradients then takes bfloat16 operands (an embedding computing in the float32 it was created in would
    promote every activation after it back to float32)."""
    from parallel.steps import batch_shapes, objective_sums
    from training.objectives import objective_for

    from config import from_dict

    cfg = (from_dict({**family, "precision": "bfloat16"})[0] if family.get("model") == "vit"
           else tiny_config(precision="bfloat16", **family))
    graphdef, params = nnx.split(registry.build(cfg, nnx.Rngs(0)), nnx.Param)
    objective = objective_for(cfg)
    batch = {name: jax.numpy.zeros(shape, jax.numpy.int32)
             for name, shape in batch_shapes(objective, cfg, 2).items()}

    def loss(params):
        return objective_sums(graphdef, objective, params, batch, jax.numpy.bfloat16)[0]["loss"]

    assert matmul_operand_dtypes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr) == {"bfloat16"}


def test_dropout_keys_come_from_the_tpus_own_generator_on_tpus():
    """On TPUs the dropout masks come from XLA's RngBitGenerator (threefry's hash compiles slowly there), elsewhere
    from threefry; either way the key is a function of the seed and the step, which is what a resumed run needs."""
    from models.axes import placing
    from parallel.steps import dropout_key

    def impl(key):
        return str(jax.random.key_impl(key))

    assert impl(dropout_key(0, 3)) == "threefry2x32"
    with placing(on_a_tpu()):
        assert impl(dropout_key(0, 3)) == "rbg"
        same, other = dropout_key(0, 3), dropout_key(0, 4)
        assert (jax.random.key_data(same) == jax.random.key_data(dropout_key(0, 3))).all()
        assert not (jax.random.key_data(same) == jax.random.key_data(other)).all()


@pytest.mark.parametrize("policy", [True, "dots_saveable"])
def test_remat_gives_the_same_losses(policy):
    """GPT-Neo's recompute_grad true (everything recomputed) and the policy keeping matmul outputs train as
    without recomputation."""
    cfg = tiny_config(recompute_grad=policy, warmup_steps=0)
    batches = random_batches(cfg, 2)
    np.testing.assert_allclose(train_losses(cfg, batches), train_losses(cfg.replace(recompute_grad=False), batches),
                               atol=1e-6)


def test_mesh_shape_parsing():
    assert parse_mesh_shape("x:4,y:2", 8) == {"x": 4, "y": 2}
    assert parse_mesh_shape("x:-1,y:2", 8) == {"x": 4, "y": 2}
    from config import ConfigError
    for text, message in [("x:3", "needs 3 devices but 8 are available"), ("x:-1,y:-1", "only one axis"),
                          ("x:3,y:-1", "does not divide the 8 devices"), ("x=4", "is not axis:size"),
                          ("x:4,x:2", "appears twice"), ("AUTO", r"is not axis:size .*; did you mean 'auto'\?$")]:
        with pytest.raises(ConfigError, match=message):
            parse_mesh_shape(text, 8)
    assert parse_mesh_shape("x: 4, y :2", 8) == {"x": 4, "y": 2}  # spaces around the colon, as around commas
    with pytest.raises(ConfigError, match="'x:1' needs 1 device but 8 are available"):
        parse_mesh_shape("x:1", 8)
    with pytest.raises(ConfigError, match="'x:2' needs 2 devices but 1 is available"):
        parse_mesh_shape("x:2", 1)
    from parallel.layout import layout_rules
    with pytest.raises(ConfigError, match="did you mean 'auto'"):
        layout_rules("Auto")


def test_every_attention_kind_and_experts_train_sharded_as_on_one_device():
    """global (with memory key/values), local, linear and none layers, rotary, and two MoE layers in one model:
    on 8 devices with data, tensor and expert parallelism it computes what one device does, and it learns."""
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local", "linear", "none"], 1]], moe_layers=[1, 3],
                      moe_params={"num_experts": 4, "top_k": 2}, num_mem_kv=2, rotary_emb=True,
                      rotary_emb_fraction=0.5, local_attention_radius=4, recompute_grad=True, warmup_steps=0)
    batches = random_batches(cfg, 1, seed=3) * 3  # one batch again and again: the loss must fall
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,experts:x,heads:y,intermediate_expanded:y")
    assert single[-1]["loss"] < single[0]["loss"] - 0.1
    for key in ("loss", "aux_loss", "z_loss", "dropped_tokens_fraction"):
        np.testing.assert_allclose([m[key] for m in sharded], [m[key] for m in single], rtol=0, atol=1e-5)
