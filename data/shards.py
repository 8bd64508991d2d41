"""The input stream as ``data_shards`` interleaved shards, so that each process reads only its share of the data
while every global batch stays a pure function of (config, step), whatever the number of processes.

The stream is defined per shard, not per process: shard ``k`` of ``S`` reads its own part of the data (every
S-th file, or every S-th record of each file when there are fewer files than shards; for TFDS, the k-th of S even
sub-splits) and makes its own window stream (own seeds, own mixing). Global batch ``b`` (B rows) is the
concatenation over shards of their next blocks: shard ``k`` fills rows ``bounds[k]:bounds[k+1]`` (``bounds[k] =
k * B // S``), from its windows ``b * c_k ... (b+1) * c_k - 1`` where ``c_k`` is its block's size.

A process builds only the shards whose rows its devices hold. With ``data_shards`` a multiple of the process
count (and the batch split over processes, as a ``batch:x`` layout does), every process reads a disjoint
``S / P`` of the shards; one process reads them all and assembles the very same batches. ``S`` comes from the
config, never from the process count, so a run can resume on another number of processes bit-identically.
"""

from __future__ import annotations


def shard_bounds(batch_size: int, shards: int) -> list[int]:
    """Row boundaries of the shards in a global batch: shard k fills rows ``bounds[k]:bounds[k+1]``."""
    return [k * batch_size // shards for k in range(shards + 1)]


def shards_for_rows(bounds: list[int], rows: slice) -> list[int]:
    """The shards whose blocks overlap ``rows`` (a contiguous range of global batch rows); empty blocks skipped."""
    start, stop = rows.start or 0, rows.stop
    return [k for k in range(len(bounds) - 1)
            if bounds[k] < bounds[k + 1] and bounds[k] < stop and bounds[k + 1] > start]


def shard_files(files: list[str], shards: int, shard: int) -> tuple[list[str], tuple[int, int] | None]:
    """(files, record_shard) that shard ``shard`` of ``shards`` reads: every S-th file where there are at least as
    many files as shards (record_shard None), else every file with ``record_shard = (shard, shards)``: keep the
    records whose index in their file is ``shard`` modulo ``shards``."""
    if shards == 1:
        return files, None
    if len(files) >= shards:
        return files[shard::shards], None
    return files, (shard, shards)


def shard_seed(seed: int, shard: int) -> int:
    """Shard 0 keeps the single-stream seeds (a 1-shard stream is the stream of before); the others draw apart."""
    return seed + 1_000_003 * shard


def reading_note(source, processes: int) -> str | None:
    """A line for a multi-process run whose processes would read shards in common (None when they do not)."""
    shards = getattr(source, "shards", None)  # in-memory sources have none: they read nothing
    if shards is None or processes == 1 or shards % processes == 0:
        return None
    share = "every process reads the whole input" if shards == 1 else "processes read some shards in common"
    return (f"note: data_shards {shards} is not a multiple of the {processes} processes, so {share}; a multiple of "
            f"{processes} (dividing train_batch_size) splits the reading")
