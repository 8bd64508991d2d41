"""One process of the per-host input test in tests/test_multihost.py (run as a script, never collected).

Builds the train source of a 4-shard TFRecord dataset, assembles global batches from this process's rows with
``parallel.distributed.global_batch`` on an ``x:8`` data-parallel mesh, gathers them, and writes to ``--out``:
``batches.npy`` (process 0: the global batches), ``files_P.json`` (the TFRecord files process P read records
from). ``--save-at N`` also writes an orbax checkpoint with the input position after N batches;
``--resume-from DIR`` restores that position at N and writes the batches read from there (``resumed.npy``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH, N_CTX = 8, 16


def log_files(tf, seen: set) -> None:
    """Makes every TFRecord read add its file name to ``seen``."""
    real = tf.data.TFRecordDataset

    def counting(path, *args, **kwargs):
        def record(p):
            seen.add(os.path.basename(p.numpy().decode()))
            return p

        return real(path, *args, **kwargs).map(lambda r: (tf.py_function(record, [path], tf.string), r)[1])

    tf.data.TFRecordDataset = counting


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--dataset-configs", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-at", type=int)
    p.add_argument("--resume-from")
    p.add_argument("--coordinator")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    args = p.parse_args()

    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    import data.source
    from data.tf_import import tensorflow
    from parallel import distributed
    from parallel.mesh import make_mesh
    from tests.data_common import config
    from training.checkpoint import Checkpoints

    distributed.initialize(args.coordinator, args.num_processes, args.process_id, False)
    seen: set = set()
    log_files(tensorflow(), seen)
    data.source.DATASET_CONFIG_DIR = args.dataset_configs
    cfg = config([["a", None, "documents_fixed", None]], N_CTX, data_shards=4, train_batch_size=BATCH)
    mesh = make_mesh("x:8")
    sharding = NamedSharding(mesh, PartitionSpec("x"))  # data parallel: process p holds rows 4p..4p+3
    shape = (BATCH, N_CTX + 1)

    def read(source, steps) -> np.ndarray:
        out = []
        for step in steps:
            batch = distributed.global_batch(lambda rows: {"tokens": source.batch(step, BATCH, rows)},
                                             {"tokens": sharding}, {"tokens": shape})
            out.append(np.asarray(multihost_utils.process_allgather(batch["tokens"], tiled=True)))
            if args.save_at == step + 1:
                checkpoints = Checkpoints(os.path.join(args.out, "run"), keep=1)
                marker = jax.device_put(np.zeros(2, np.float32), NamedSharding(mesh, PartitionSpec()))
                checkpoints.save(step + 1, {"w": marker}, {}, data=source.state(BATCH))
                checkpoints.close()
        return np.stack(out)

    batches = read(data.source.make_source(cfg, "train"), range(args.steps))
    process = jax.process_index()
    with open(os.path.join(args.out, f"files_{process}.json"), "w") as f:
        json.dump(sorted(seen), f)
    if process == 0:
        np.save(os.path.join(args.out, "batches.npy"), batches)
    if args.resume_from:
        checkpoints = Checkpoints(args.resume_from, keep=1)
        step = checkpoints.latest_step()
        source = data.source.make_source(cfg, "train")
        print(source.restore(step, BATCH, distributed.process_rows(sharding, shape), checkpoints.restore_input(step)))
        np.save(os.path.join(args.out, "resumed.npy"), read(source, range(step, args.steps)))
        print(f"replayed {source.replayed}")
        checkpoints.close()


if __name__ == "__main__":
    main()
