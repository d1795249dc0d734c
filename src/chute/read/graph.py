"""The pipeline of ``chute.load``, as one straight run of ``tf.data`` steps, each with its reason.

Example:
    >>> dataset = build(plan, counters={}, augmenter=None)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.lazy import tf
from chute.read import batches
from chute.read.augment import finisher
from chute.read.plan import BLOCK, ReadPlan
from chute.read.shards import shard_blocks

CYCLE = 16  # shards read at a time when the order must not depend on the machine


def build(plan: ReadPlan, *, counters: dict, augmenter):
    """The ``tf.data.Dataset`` of ``plan``.

    Args:
        plan: what to read and how (see :class:`~chute.read.plan.ReadPlan`).
        counters: with ``skip_corrupt``, int64 variables ``corrupt``,
            ``started`` and ``decoded`` that count what is skipped.
        augmenter: a Keras model applied to training batches, or None.
    """
    names = tf.constant(plan.files, tf.string)
    expected = tf.constant(plan.counts, tf.int64)
    count = len(plan.files)
    seed = plan.seed
    # A fixed width where the order must not depend on the machine; else enough
    # shards for the cores.
    width = min(count, CYCLE if plan.deterministic else max(4, plan.cores))
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": plan.deterministic}
    finished = batches.finished_in_window(plan, augmenter)

    # Files are the unit of parallel reading: a new shard order each epoch varies
    # what is read together, and a random block size per shard and epoch moves
    # the block boundaries (-1: fixed blocks of 256).
    if plan.reshuffle_each_epoch:
        ds = tf.data.Dataset.range(count).shuffle(count, seed=seed, reshuffle_each_iteration=True)
        draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    else:
        ds = tf.data.Dataset.range(count)
        draws = tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat()
    # Several shards read at once, out of order unless asked: a slow file never
    # stalls the rest. Each shard arrives as checked blocks: parsed, and raw
    # images decoded, one call per block (per-record steps cost more than parsing).
    corrupt = counters.get("corrupt")
    ds = tf.data.Dataset.zip(ds, draws).interleave(
        shard_blocks(plan, names, expected, corrupt),
        cycle_length=max(1, width),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=plan.deterministic,
    )
    # Fewer shards than input pipelines: each keeps every n-th record.
    if plan.every_nth is not None:
        ds = ds.unbatch().shard(*plan.every_nth).batch(BLOCK)
    # PNG/JPEG images are decoded one per call, a call per core. From here on the
    # data are dense pixels: regrouping them is a memory copy, not work per record.
    if plan.stored.encoding != "raw":
        ds = batches.decoded(plan, ds, counters, dict(parallel, num_parallel_calls=plan.cores))
    # Decoded pixels kept (in RAM, or a file): later epochs skip the shards.
    if plan.cache is not None:
        ds = ds.cache(plan.cache)
    # Blocks replayed from the cache, or read in a fixed order, would fill the same
    # windows every epoch: shuffle the blocks (about a window's worth). The prefetch
    # asks for the first block when the iterator starts, so reading begins at once.
    if plan.training and (plan.cache is not None or not plan.reshuffle_each_epoch):
        ds = ds.shuffle(max(2, plan.shuffle_buffer // BLOCK), seed=seed).prefetch(1)
    # Training: windows of several shards' blocks, each permuted and cut into full
    # batches (static shapes for TPU/XLA). Evaluation: every example once, in order.
    if plan.training:
        ds = batches.shuffled_batches(plan, ds, parallel, finished=finished)
    else:
        ds = ds.rebatch(plan.batch_size)
    # Per batch: resize, augment, cast, labels. Keras's random layers draw from a
    # seed generator: with a seed, batches take their draws in order, so that the
    # same seed augments the same way.
    if not finished:
        in_order = plan.seed is not None and augmenter is not None
        ds = ds.map(finisher(plan, augmenter), **({} if in_order else parallel))
    # The manifest knows the size, so Keras shows real step counts (skipping makes it unknown).
    if not plan.skip_corrupt:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps))
    if plan.repeat:
        ds = ds.repeat()
    # Evaluation with a padded last batch and per-example weights (0 on the padding).
    if plan.pad_final_batch:
        ds = batches.padded(ds, plan.batch_size)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


def _options():
    options = tf.data.Options()
    options.experimental_optimization.parallel_batch = True  # batches copied in parallel
    # Start reading when the iterator is made, not at the first next(): the rest of
    # setting up (Keras's, or the caller's) overlaps with reading the first shards.
    options.experimental_warm_start = True
    # Every stage is sized here (AUTOTUNE then means min(16, cores)), so tf.data's
    # autotuning model, which would cost a few percent of a pass, is off.
    options.autotune.enabled = False
    return options
