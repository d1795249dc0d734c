"""Each input pipeline's share of a split, its steps and its padding: one computation for
both engines.

Several input pipelines (hosts, JAX processes, ``tf.distribute`` workers) read one split,
each its own part, and must run the same number of steps or the one that stops first
leaves the others waiting forever. The engines divide a split differently (the tf.data
engine by shard when there are enough, else every n-th record; the Grain engine in
contiguous runs of one global order), but the steps follow one rule (:func:`steps`):
training runs the smallest share's full batches everywhere, padded evaluation the largest
share's batches (the others add weight-0 padding), plain evaluation each its own.

Example:
    >>> part = Share(pipelines=2, index=1)
    >>> sizes = record_sizes(9, part.pipelines)
    >>> sizes, steps(sizes, part.index, 2, training=True, pad=False)
    ([5, 4], 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Share:
    """Which input pipeline reads: ``pipelines`` of them, this one ``index``, feeding
    ``replicas`` replicas in sync in all (a ``tf.distribute.InputContext``'s figures)."""

    pipelines: int = 1
    index: int = 0
    replicas: int = 1

    @classmethod
    def of(cls, input_context: Any) -> Share:
        """The share of a ``tf.distribute.InputContext`` (None: the only pipeline)."""
        if input_context is None:
            return cls()
        return cls(
            input_context.num_input_pipelines,
            input_context.input_pipeline_id,
            input_context.num_replicas_in_sync,
        )

    @property
    def feeds(self) -> int:
        """Replicas each pipeline feeds: the batches of one pipeline in a global batch."""
        # At least 1: a pipeline still yields batches when there are more pipelines than replicas.
        return max(1, self.replicas // self.pipelines)


def by_shard(shards: int, pipelines: int) -> bool:
    """Whether each of ``pipelines`` reads its own shards (the tf.data engine), rather than
    every ``pipelines``-th record of all: when there are at least as many shards."""
    # Fewer shards than pipelines would leave some pipeline without any: then every n-th record.
    return pipelines > 1 and shards >= pipelines


def shard_sizes(counts: Sequence[int], pipelines: int) -> list[int]:
    """Examples each of ``pipelines`` input pipelines of the tf.data engine reads, from the
    record counts of a split's shards (see :func:`by_shard`).

    Example:
        >>> shard_sizes([5, 5, 3], 2), shard_sizes([5], 2)
        ([8, 5], [3, 2])
    """
    if by_shard(len(counts), pipelines):
        return [sum(counts[i::pipelines]) for i in range(pipelines)]
    return [len(range(i, sum(counts), pipelines)) for i in range(pipelines)]


def record_sizes(records: int, pipelines: int) -> list[int]:
    """Examples each of ``pipelines`` reads in contiguous runs of ``records`` (the Grain
    engine's evaluation, and its training draws): the first ones one more.

    Example:
        >>> record_sizes(10, 3)
        [4, 3, 3]
    """
    low, extra = divmod(records, pipelines)
    # The remainder goes to the first pipelines, so shares differ by one record at most.
    return [low + (i < extra) for i in range(pipelines)]


def steps(sizes: Sequence[int], index: int, batch_size: int, *, training: bool, pad: bool) -> int:
    """Batches in an epoch of pipeline ``index`` whose shares hold ``sizes`` examples: the
    same for every pipeline in training (the smallest share's full batches: no host waits
    for another) and in padded evaluation (the largest share's, the others padding what
    they lack); in plain evaluation, every example of its own share once.

    Example:
        >>> [steps([9, 7], i, 4, training=t, pad=p) for i, t, p in
        ...  [(0, True, False), (1, False, True), (1, False, False)]]
        [1, 3, 2]
    """
    if training:
        # The smallest share's: a pipeline that stops first leaves the others waiting forever.
        return min(size // batch_size for size in sizes)
    if pad:
        # The largest share's, so every example is seen; the others pad what they lack (weight 0).
        return max(-(-size // batch_size) for size in sizes)
    # Ceiling division: the last, partial batch is kept.
    return -(-sizes[index] // batch_size)


def global_steps(steps: int, feeds: int, *, training: bool) -> int:
    """Global batches of a distributed dataset whose pipelines run ``steps`` batches, each
    pipeline feeding ``feeds`` replicas: full ones in training, every batch in evaluation.

    Example:
        >>> global_steps(7, 2, training=True), global_steps(7, 2, training=False)
        (3, 4)
    """
    return steps // feeds if training else -(-steps // feeds)
