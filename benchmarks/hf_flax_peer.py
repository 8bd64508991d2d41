"""Hugging Face's Flax GPT-Neo train step, timed in a process of its own.

transformers 5 dropped its Flax models, so this peer needs a transformers 4.x installed beside the project's, e.g.

    pip install --no-deps --target /tmp/hf4 transformers==4.46.3 tokenizers==0.20.3 huggingface-hub==0.26.5

and ``benchmarks/train_step.py --hf-flax /tmp/hf4`` runs this file with that directory first on ``PYTHONPATH``
(the project's own transformers stays untouched). The step is what NeoMesh's is: forward, next-token loss,
backward and an AdamW update in one ``jax.jit``, the batch given, bf16 compute on fp32 weights with ``--precision
bfloat16`` (the model's ``dtype``). Reads a JSON request on stdin, prints one JSON line of results:

    {"config": {transformers' GPTNeoConfig as a dict}, "tokens": [[B x (T + 1) ids]], "precision": "float32",
     "steps": 5}  ->  {"seconds": median per step, "compile": s, "peak": bytes or null, "version": "4.46.3"}

It is not meant to be run by hand: ``train_step.py --hf-flax DIR`` writes the request.
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            allow_abbrev=False).parse_args(argv)  # only --help: the request comes on stdin
    if sys.stdin.isatty():
        print("error: hf_flax_peer.py reads a JSON request on stdin; run benchmarks/train_step.py --hf-flax DIR "
              "(--help says what it reads)", file=sys.stderr)
        return 2
    try:
        request = json.loads(sys.stdin.read())
        args = request["config"], request["tokens"], request["precision"], request["steps"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        what = f"no key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        print(f"error: hf_flax_peer.py: the request on stdin is not the JSON train_step.py --hf-flax writes: "
              f"{what}", file=sys.stderr)
        return 2
    print(json.dumps(measure(*args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
