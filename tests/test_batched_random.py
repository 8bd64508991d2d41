"""parallel.batched_random: identical random draws made as one call give each draw its own values."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import registry
from parallel.batched_random import batch_random_draws
from parallel.state import traced_rngs
from tests.common import tiny_config


def draws():
    """Draws of several kinds and shapes, with keys derived as a model's are, and one key made from another draw."""
    key = jax.random.key(7)
    keys = [jax.random.fold_in(key, i) for i in range(12)]
    normals = [jax.random.normal(k, (16, 8)) for k in keys[:5]]
    uniforms = [jax.random.uniform(k, (8,), minval=-0.5, maxval=0.5) for k in keys[5:8]]
    bits = [jax.random.bits(k, (4, 4)) for k in keys[8:10]]
    truncated = [jax.random.truncated_normal(k, -2.0, 2.0, (16, 8), jnp.bfloat16) for k in keys[10:12]]
    chained = jax.random.normal(jax.random.fold_in(key, bits[0][0, 0]), (16, 8))  # a key from a draw: a second wave
    return normals, uniforms, bits, truncated, chained


def compiled(fn):
    return jax.jit(fn).lower().compile()


def loops(program) -> int:
    """The while loops of a compiled program: on CPU each threefry call is one."""
    return len(re.findall(r"\bwhile\(", program.as_text()))


def test_batched_draws_equal_their_own_calls_bit_for_bit():
    alone = jax.jit(draws)()
    for max_elements in (1 << 26, 200):  # everything of a kind together; at most one (16, 8) draw per call
        together = jax.jit(batch_random_draws(draws, max_elements))()
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), together, alone)
    # 13 key derivations and 13 draws, one threefry loop each, against one per kind and wave: the fold_ins, then
    # the normals, uniforms, bits and truncated normals, then the chained draw's fold_in and normal.
    assert loops(compiled(draws)) == 26
    assert loops(compiled(batch_random_draws(draws))) == 7
    assert loops(compiled(batch_random_draws(draws, 200))) == 7 + 4 + 1  # normals, truncated normals: one per call


def test_each_batched_draw_is_made_once_not_fused_into_each_of_its_slices():
    """XLA:GPU fused a stacked draw into every slice taken of it, compiling threefry once per parameter again (the
    1.3B initialiser: over 150 s on an H200); behind an optimization barrier the draw is made once."""
    program = jax.jit(batch_random_draws(draws)).lower().as_text()
    # five kinds drawn together (the fold_ins, normals, uniforms, bits, truncated normals); the chained wave's
    # draws are single calls, made as they are
    assert program.count("optimization_barrier") == 5


def test_a_model_is_initialised_with_one_threefry_loop_per_parameter_shape():
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local"], 2]])
    init = lambda: nnx.to_pure_dict(nnx.state(registry.build(cfg, traced_rngs(0)), nnx.Param))  # noqa: E731
    shapes = {a.shape for a in jax.tree.leaves(jax.eval_shape(init))}
    plain, batched = compiled(init), compiled(batch_random_draws(init))
    assert loops(batched) <= len(shapes) + 1 < loops(plain)  # the keys' fold_ins are one more call
    # The same draws; XLA may round a draw's scaling (normal(key) * stddev) apart by float32's last bit.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2.4e-7, atol=0),
                 batched(), plain())


def test_an_initialiser_with_side_effects_runs_in_its_written_order(capfd):
    def noisy():
        first = jax.random.normal(jax.random.key(1), (4,))
        jax.debug.print("first {}", first[0], ordered=True)  # waits for a draw: a later wave, if batched
        jax.debug.print("second", ordered=True)
        return first, jax.random.normal(jax.random.key(2), (4,))

    together = jax.jit(batch_random_draws(noisy))()
    jax.effects_barrier()
    printed = capfd.readouterr().out
    assert printed.index("first") < printed.index("second"), printed
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), together, jax.jit(noisy)())
