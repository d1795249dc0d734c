"""The pipeline's random keys: each random choice of ``chute.load`` (block sizes, window
permutations, crops and flips, Keras's layers on the host) takes a key from a stream of
its own, so that a seed gives the same choices whatever the parallelism.

A stream is ``tf.data.Dataset.random`` with the plan's seed plus the stream's offset,
new draws each epoch (each iterator). Through the ``tf.data`` service each epoch is a
job that runs the registered graph afresh: the op seeds in that graph (fixed by a seed,
or by a global ``tf.random.set_seed`` as ``chute.train`` sets) would give every job the
same keys, and the epochs would differ only by which worker read which shard when. There
each key is mixed with the worker's clock as it is drawn, so each job draws its own.

Example:
    >>> crops = stream(plan, 2)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.lazy import tf
from chute.read.tf.plan import ReadPlan


def stream(plan: ReadPlan, offset: int, seed: int | None = None):
    """The int64 keys of the stream ``offset`` (a new sequence each iteration).

    Args:
        plan: the pipeline's plan (its ``seed``, and whether the service runs it).
        offset: added to the plan's seed: one stream per purpose.
        seed: the base seed instead of the plan's (a class stream's own).
    """
    base = plan.seed if seed is None else seed
    keys = tf.data.Dataset.random(
        seed=None if base is None else base + offset, rerandomize_each_iteration=True
    )
    return keys.map(_with_the_clock) if plan.data_service else keys


def _with_the_clock(key):
    """Another key in ``Dataset.random``'s range, [0, 2**32) (a negative draw tells
    :mod:`chute.read.tf.shards` to read fixed blocks), keyed by ``key`` and the clock."""
    clock = tf.bitcast(tf.timestamp(), tf.int64)  # microseconds apart: another value
    return tf.random.stateless_uniform(
        [], seed=tf.stack([key, clock]), minval=0, maxval=2**32, dtype=tf.int64
    )
