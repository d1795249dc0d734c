"""The order the Grain engine reads a split in, epoch by epoch: a global permutation, or a
shard-block shuffle when the split is larger than the local shard cache.

Both are pure functions of ``(seed, epoch)`` and of the split's shard sizes, the same in
every input pipeline and for any number of them, so a run resumes exactly and a resumed
run may have another number of hosts or devices (:mod:`chute.read.grain.dataset` gives
each pipeline its places in this one order).

**Global permutation** (the default): every record of the split in a new random order
each epoch. Any batch may need any shard, so the whole split has to be at hand: local,
or in the cache.

**Shard-block shuffle** (``window`` shards): the shards in a new random order each epoch,
taken ``window`` at a time; the records of those shards are shuffled together, then the
next ``window``. Only two blocks (the one being read, the next one being downloaded)
need to be in the cache. Records that sit in the same shard are more likely to share a
batch than under a global permutation; a wider window mixes more.

Example:
    >>> order = epoch_order([3, 3, 2], seed=0, epoch=0, window=1)
    >>> sorted(order.tolist()) == list(range(8))
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def epoch_order(
    shard_records: Sequence[int], *, seed: int, epoch: int, window: int | None
) -> np.ndarray:
    """Every record number of the split (shards numbered in manifest order, records in
    shard order), in epoch ``epoch``'s order: a permutation (``window`` None) or a
    shard-block shuffle of ``window`` shards (see the module docstring)."""
    rng = np.random.default_rng([seed, epoch])
    total = int(sum(shard_records))
    if window is None:
        return rng.permutation(total)
    starts = np.concatenate([[0], np.cumsum(shard_records)]).astype(np.int64)
    shards = rng.permutation(len(shard_records))
    blocks = []
    for first in range(0, len(shards), window):
        block = [np.arange(starts[s], starts[s + 1]) for s in shards[first : first + window]]
        blocks.append(rng.permutation(np.concatenate(block)))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.int64)


def shard_blocks(
    shard_records: Sequence[int], *, seed: int, epoch: int, window: int
) -> tuple[list[list[int]], np.ndarray]:
    """The blocks of epoch ``epoch``'s shard-block shuffle: the shards of each, in the
    order read, and the position in the epoch's order where each block ends.

    Example:
        >>> blocks, ends = shard_blocks([3, 3, 2], seed=0, epoch=0, window=2)
        >>> sorted(sum(blocks, [])), int(ends[-1])
        ([0, 1, 2], 8)
    """
    # The same first draw as epoch_order's: its shard order.
    shards = np.random.default_rng([seed, epoch]).permutation(len(shard_records)).tolist()
    blocks = [shards[first : first + window] for first in range(0, len(shards), window)]
    ends = np.cumsum([sum(shard_records[s] for s in block) for block in blocks])
    return blocks, ends


def window_for(limit: int, shard_bytes: Sequence[int]) -> int | None:
    """The shard-block window for a cache of ``limit`` bytes: None when the whole split
    (``shard_bytes``: each shard's, its record index included) fits, so the global
    permutation can run; else the most shards of which two blocks fit (one read, the next
    downloaded), at least 1.

    Example:
        >>> window_for(1000, [100, 100]), window_for(450, [100] * 8)
        (None, 2)
    """
    if sum(shard_bytes) <= limit:
        return None
    largest = max(shard_bytes)
    # Two blocks in the cache at once: the one being read and the next being fetched.
    return max(1, int(limit // largest) // 2)


def shards_by_first_use(records: np.ndarray, starts: Sequence[int]) -> list[int]:
    """The shards holding ``records`` (record numbers), in the order first needed.

    Example:
        >>> shards_by_first_use(np.array([7, 1, 8, 2]), [0, 3, 6, 9])
        [2, 0]
    """
    shards = np.searchsorted(np.asarray(starts), records, side="right") - 1
    _, first = np.unique(shards, return_index=True)
    return [int(shards[i]) for i in np.sort(first)]
