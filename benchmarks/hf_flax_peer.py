"""Hugging Face's Flax GPT-Neo train step, timed in a process of its own.

transformers 5 dropped its Flax models, so this peer needs a transformers 4.x installed beside the project's, e.g.

    pip install --no-deps --target /tmp/hf4 transformers==4.46.3 tokenizers==0.20.3 huggingface-hub==0.26.5

and ``benchmarks/train_step.py --hf-flax /tmp/hf4`` runs this file with that directory first on ``PYTHONPATH``
(the project's own transformers stays untouched). The step is what NeoMesh's is: forward, next-token loss,
backward and an AdamW update in one ``jax.jit``, the batch given, bf16 compute on fp32 weights with ``--precision
bfloat16`` (the model's ``dtype``). Reads a JSON request on stdin, prints one JSON line of results.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

INSTALL = ("pip install --no-deps --target DIR transformers==4.46.3 tokenizers==0.20.3 "
           "huggingface-hub==0.26.5")


def measure(hf_config: dict, tokens, precision: str, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    import transformers

    try:
        from transformers import FlaxGPTNeoForCausalLM, GPTNeoConfig
    except ImportError:
        raise SystemExit(f"transformers {transformers.__version__} (from {transformers.__file__}) has no Flax "
                         f"GPT-Neo; install a 4.x into the --hf-flax directory: {INSTALL}") from None

    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    model = FlaxGPTNeoForCausalLM(GPTNeoConfig(**hf_config), dtype=dtype, seed=0)
    tx = optax.adamw(1e-4)
    params = model.params
    opt_state = tx.init(params)
    tokens = jnp.asarray(tokens, jnp.int32)

    def loss_fn(params, tokens):
        logits = model(tokens[:, :-1], params=params, train=True, dropout_rng=jax.random.key(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:]).mean()

    @jax.jit
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    start = time.perf_counter()
    compiled = step.lower(params, opt_state, tokens).compile()
    compile_seconds = time.perf_counter() - start
    params, opt_state, loss = compiled(params, opt_state, tokens)  # the first run allocates; not timed
    jax.block_until_ready(loss)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, tokens)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    stats = jax.devices()[0].memory_stats() or {}
    return {"seconds": statistics.median(times), "compile": compile_seconds, "peak": stats.get("peak_bytes_in_use"),
            "version": transformers.__version__}


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())
    print(json.dumps(measure(request["config"], request["tokens"], request["precision"], request["steps"])))
