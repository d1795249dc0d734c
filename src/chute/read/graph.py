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


def build(plan: ReadPlan, *, counters: dict, augmentation, host=None):
    """The ``tf.data.Dataset`` of ``plan``.

    Args:
        plan: what to read and how (see :class:`~chute.read.plan.ReadPlan`).
        counters: with ``skip_corrupt``, int64 variables ``corrupt``,
            ``started`` and ``decoded`` that count what is skipped.
        augmentation: Keras layers applied to training batches on the host
            (:class:`~chute.read.augment.DeviceAugmentation`), or None.
        host: OpenCV augmentation of training batches
            (:class:`~chute.read.host_augment.HostAugmentation`), or None.
    """
    names = tf.constant(plan.files, tf.string)
    expected = tf.constant(plan.counts, tf.int64)
    count = len(plan.files)
    seed = plan.seed
    # A fixed width where the order must not depend on the machine; else enough
    # shards for the cores.
    width = min(count, CYCLE if plan.deterministic else max(4, plan.cores))
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": plan.deterministic}
    finished = not plan.per_image and batches.finished_in_window(plan, augmentation or host)

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
    if plan.per_image:
        ds = _each_image(plan, ds, counters, parallel)
    else:
        ds = _decoded_blocks(plan, ds, counters, parallel, finished)
    # Per batch: host augmentation (OpenCV's keyed per batch, in read order; then Keras's
    # layers), labels, cast. Keras's random layers draw from a seed generator: with a
    # seed, batches take their draws in order, so that the same seed augments the same way.
    if not finished:
        keys = tf.data.Dataset.random(
            seed=None if seed is None else seed + 3, rerandomize_each_iteration=True
        )
        in_order = plan.seed is not None and bool(augmentation)
        ds = tf.data.Dataset.zip(ds, keys).map(
            finisher(plan, augmentation, host), **({} if in_order else parallel)
        )
    # Run by the tf.data service's workers: each has a part of the split, and the epoch
    # is what they deliver together (see chute.read.service), so no count is fixed here.
    if plan.data_service:
        return ds.prefetch(tf.data.AUTOTUNE).with_options(options())
    # Every input pipeline yields the same number of batches: in training the smallest
    # share's (a multi-host loop would wait forever for a host that ran out).
    if plan.training and plan.steps < plan.own_steps:
        ds = ds.take(plan.steps)
    # Evaluation with a padded last batch and per-example weights (0 on the padding), and
    # batches of padding alone where another input pipeline has more batches.
    if plan.pad_final_batch:
        ds = batches.padded(ds, plan.batch_size, extra=plan.steps - plan.own_steps)
    # The manifest knows the size, so Keras shows real step counts (skipping makes it unknown).
    if not plan.skip_corrupt:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps))
    if plan.repeat:
        ds = ds.repeat()
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options())


def _decoded_blocks(plan: ReadPlan, ds, counters: dict, parallel: dict, finished: bool):
    """Images stored at the size read: blocks of decoded pixels, cached and shuffled."""
    # PNG/JPEG images are decoded one per call, a call per core. From here on the
    # data are dense pixels: regrouping them is a memory copy, not work per record.
    if plan.stored.encoding != "raw":
        ds = batches.decoded(plan, ds, counters, dict(parallel, num_parallel_calls=plan.cores))
    # Decoded pixels kept (in RAM, or a file): later epochs skip the shards.
    if plan.cache is not None:
        ds = ds.cache(plan.cache)
    ds = _reshuffled_blocks(plan, ds)
    # Training: windows of several shards' blocks, each permuted and cut into full
    # batches (static shapes for TPU/XLA). Evaluation: every example once, in order.
    if plan.training:
        return batches.shuffled_batches(plan, ds, parallel, finished=finished)
    return ds.rebatch(plan.batch_size)


def _each_image(plan: ReadPlan, ds, counters: dict, parallel: dict):
    """Images cropped or resized when read: records shuffled, then each image decoded,
    cropped and resized on its own (training: random crops, new every epoch)."""
    # Encoded records kept (decoding, with its random crop, is done anew each epoch).
    if plan.cache is not None:
        ds = ds.cache(plan.cache)
    ds = _reshuffled_blocks(plan, ds)
    # Training: windows of encoded records from several shards, each permuted.
    ds = batches.shuffled_records(plan, ds) if plan.training else ds.unbatch()
    # One image per call, a call per core: decode (a JPEG's crop window only), crop,
    # resize, flip, all on uint8.
    ds = batches.each_image(plan, ds, counters, dict(parallel, num_parallel_calls=plan.cores))
    return ds.batch(plan.batch_size, drop_remainder=plan.training and not plan.data_service)


def _reshuffled_blocks(plan: ReadPlan, ds):
    """Blocks replayed from the cache, or read in a fixed order, would fill the same
    windows every epoch: in training they are shuffled (about a window's worth). The
    prefetch asks for the first block when the iterator starts, so reading begins at once."""
    if plan.training and (plan.cache is not None or not plan.reshuffle_each_epoch):
        return ds.shuffle(plan.shuffled_blocks, seed=plan.seed).prefetch(1)
    return ds


def options():
    """The tf.data options of chute.load's pipelines."""
    options = tf.data.Options()
    options.experimental_optimization.parallel_batch = True  # batches copied in parallel
    # Start reading when the iterator is made, not at the first next(): the rest of
    # setting up (Keras's, or the caller's) overlaps with reading the first shards.
    options.experimental_warm_start = True
    # Every stage is sized here (AUTOTUNE then means min(16, cores)), so tf.data's
    # autotuning model, which would cost a few percent of a pass, is off.
    options.autotune.enabled = False
    # Parallelism comes from the parallel calls: an op inside one (a resize) that
    # splits its own work across the cores only competes with the other calls.
    options.threading.max_intra_op_parallelism = 1
    return options
