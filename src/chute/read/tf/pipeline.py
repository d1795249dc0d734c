"""The pipeline of ``chute.load``: one straight run of ``tf.data`` steps, each with its reason.

:func:`build` reads as the pipeline's order; each step that applies only to
some plans is a named step that leaves the others' data unchanged.

Example:
    >>> dataset = build(plan, counters={}, augmentation=None, host=None)  # doctest: +SKIP
"""

from __future__ import annotations

import logging

from chute.lazy import tf
from chute.read.tf import batches
from chute.read.tf import keys as random_keys
from chute.read.tf.finish import finisher
from chute.read.tf.plan import BLOCK, ReadPlan
from chute.read.tf.shards import shard_blocks

log = logging.getLogger(__name__)

CYCLE = 16  # shards read at a time when the order must not depend on the machine


def build(plan: ReadPlan, *, counters: dict, augmentation=None, host=None):
    """The ``tf.data.Dataset`` of ``plan``.

    Args:
        plan: what to read and how (see :class:`~chute.read.tf.plan.ReadPlan`).
        counters: with ``skip_corrupt``, int64 variables ``corrupt``, ``shards``
            (one per shard), ``started`` and ``decoded`` that count what is skipped.
        augmentation: Keras layers applied to training batches on the host
            (:class:`~chute.read.augment.DeviceAugmentation`), or None.
        host: OpenCV augmentation of training batches
            (:class:`~chute.read.tf.host_augment.HostAugmentation`), or None.
    """
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": plan.deterministic}
    per_core = dict(parallel, num_parallel_calls=plan.cores)
    names, expected = tf.constant(plan.files, tf.string), tf.constant(plan.counts, tf.int64)
    # Training batches leave the shuffle window finished when finishing is only labels.
    finished = not plan.per_image and batches.finished_in_window(plan, augmentation or host)
    read = shard_blocks(plan, names, expected, counters.get("shards"))

    # Blocks of the shards (see _blocks: shard order, parallel reads, every n-th record).
    # With class sampling, records drawn instead from a stream per class, each reading
    # only the shards that hold its class and keeping its records by label before any
    # decoding, mixed by weight into an epoch as long as one without sampling.
    ds = _sampled(plan, read) if plan.sampling else _blocks(plan, read)
    # PNG/JPEG read at their stored size: one image per call, a call per core; from here
    # on the data are dense pixels, and regrouping them is a copy, not work per record.
    ds = ds.apply(_decoded_blocks(plan, counters, per_core))
    # What is read is kept (RAM, or a file), so later epochs skip the shards: decoded
    # pixels, or the encoded records of images decoded (and cropped) anew each epoch.
    # (With class sampling, the class streams keep their own.)
    ds = ds.cache(plan.cache) if plan.cache is not None and not plan.sampling else ds
    # Blocks replayed from the cache, or read in a fixed order, would fill the same
    # windows every epoch: in training they are shuffled (about a window's worth).
    ds = ds.apply(_reshuffled_blocks(plan))
    # Training: windows of several shards' blocks, each permuted (decoded pixels cut into
    # full batches: static shapes for TPU/XLA). Evaluation: every example once, in order.
    ds = ds.apply(_shuffled(plan, parallel, finished))
    if plan.images_alone:  # a mixture's part: the images, which the mixture batches
        ds = batches.each_image(plan, ds, counters, per_core)
        return ds.repeat().prefetch(tf.data.AUTOTUNE).with_options(dataset_options())
    # Images cropped or resized as they are read: one per call, a call per core (decode,
    # a JPEG's crop window only; crop, resize, flip, all on uint8), then batched.
    ds = ds.apply(_each_image(plan, counters, per_core))
    # Per batch: host augmentation (OpenCV's keyed per batch; then Keras's layers), labels
    # and cast.
    ds = ds.apply(_finished(plan, augmentation, host, parallel)) if not finished else ds
    # Every input pipeline yields the same number of batches: in training the smallest
    # share's (a multi-host loop would wait forever for a host that ran out).
    ds = ds.take(plan.steps) if _cut_to_steps(plan) else ds
    # Evaluation: the last batch padded, with per-example weights (0 on the padding), and
    # batches of padding alone where another input pipeline has more batches.
    ds = ds.apply(_padded(plan))
    # The manifest knows the size, so Keras shows real step counts (unknown when skipping,
    # and through the tf.data service, whose workers deliver the epoch together).
    ds = ds.apply(_known_length(plan))
    # Repeated here, or after the tf.data service (see chute.read.tf.engine).
    ds = ds.repeat() if plan.repeat and not plan.data_service else ds
    # The next batches are ready while the accelerator works.
    return ds.prefetch(tf.data.AUTOTUNE).with_options(dataset_options())


def _unchanged(ds):
    return ds


def _blocks(plan: ReadPlan, read, label: int | None = None):
    """Blocks ``(images, labels)`` of the plan's shards; with ``label``, of the shards
    holding that class, its records alone (the parsed labels kept before any decoding)."""
    shards, seed = range(len(plan.files)), plan.seed
    if label is not None:
        shards = [i for i, held in enumerate(plan.shard_classes) if label in held]
        seed = _class_seed(plan, label)
    # Files are the unit of parallel reading: a new shard order each epoch varies what is
    # read together, and a random block size per shard and epoch moves block boundaries.
    ds = _shard_order(plan, shards, seed)
    # Several shards read at once, out of order unless asked: a slow file never stalls the
    # rest. Each arrives as checked blocks: parsed, and raw images decoded, one call per
    # block (per-record steps cost more than parsing).
    ds = ds.interleave(
        read,
        cycle_length=_cycle_length(plan, len(shards)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=plan.deterministic,
    )
    # Class sampling: this class's records only, picked by the label parsed with the block.
    ds = ds.map(_of_class(label, plan.weights)) if label is not None else ds
    # Fewer shards than input pipelines: each keeps every n-th record (of the class).
    return ds.apply(_every_nth(plan))


def _of_class(label: int, weighted: bool):
    def keep(data, labels):
        # with sample weights a label is a float row (class, weight): see shards.targets
        mine = tf.equal(labels[:, 0], label) if weighted else tf.equal(labels, label)
        return tf.boolean_mask(data, mine), tf.boolean_mask(labels, mine)

    return keep


def _sampled(plan: ReadPlan, read):
    """Training with class sampling: records ``(bytes, label)`` drawn class by class with
    the plan's probabilities (seeded, new draws each epoch), as many as an epoch without
    sampling has in full batches.

    Each class drawn has its own stream: the shards holding the class read (in a new
    order each pass), its records kept by label, shuffled, repeated. Each stream
    reads all of the shards holding its class, so with classes mixed in every shard
    reading multiplies by up to the number of classes: fine for tens of classes,
    costly for hundreds. A class drawn at least twice over in an epoch is cached
    after its first pass (when the plan has a cache), so its repeats are not read
    again. Records are drawn, then decoded, one by one: a cost per record that
    the block path of small raw images avoids.
    """
    streams = plan.class_streams
    buffer = max(BLOCK, (plan.window or plan.shuffle_buffer) // len(streams))
    _log_cost(plan, streams)
    records = []
    for label, kept in streams:
        ds = _blocks(plan, read, label).unbatch()
        ds = ds.cache(_class_cache(plan.cache, label)) if kept else ds
        ds = ds.shuffle(
            min(buffer, max(1, plan.class_counts[label])), seed=_class_seed(plan, label)
        )
        records.append(ds.repeat())
    mixed = tf.data.Dataset.sample_from_datasets(
        records,
        weights=[plan.sampling[label] for label, _ in streams],
        seed=None if plan.seed is None else plan.seed + 4,
        rerandomize_each_iteration=True,  # new draws each epoch, the same for a seed
    )
    return mixed.take(plan.steps * plan.batch_size)


def _class_seed(plan: ReadPlan, label: int) -> int | None:
    """A class stream's own seed (shard order, block sizes, shuffle)."""
    return None if plan.seed is None else plan.seed + 16 + label


def _class_cache(cache: str, label: int) -> str:
    """One class stream's cache: in memory (``""``), or a file of its own."""
    return cache and f"{cache}-class{label}"


def _log_cost(plan: ReadPlan, streams) -> None:
    """What the class streams read in an epoch, against one epoch without sampling."""
    draws, total = plan.steps * plan.batch_size, max(1, sum(plan.counts))
    first = later = 0.0
    for label, kept in streams:
        holding = sum(
            n for n, held in zip(plan.counts, plan.shard_classes, strict=True) if label in held
        )
        passes = plan.sampling[label] * draws / max(1, plan.class_counts[label])
        first += holding * (1.0 if kept else passes)
        later += 0.0 if kept else holding * passes
    log.info(
        "class sampling (tf engine): %d class streams, each reading the shards that hold its "
        "class; about %.1fx the records of an epoch without sampling read in the first "
        "epoch, %.1fx in later ones (%d class(es) cached after one pass%s)",
        len(streams),
        first / total,
        later / total,
        sum(kept for _, kept in streams),
        "" if plan.cache is not None else "; cache=None keeps none",
    )


def _shard_order(plan: ReadPlan, shards, seed: int | None):
    """``(shard index, draw)`` pairs: ``shards`` reshuffled each epoch with a random draw
    each (the block size), or in order with -1 (fixed blocks of 256)."""
    order = tf.data.Dataset.from_tensor_slices(tf.constant(list(shards), tf.int64))
    # (Sampling where pipelines share records: one fixed order, so that they stay disjoint.)
    if plan.reshuffle_each_epoch or (plan.sampling and plan.every_nth is None):
        order = order.shuffle(len(shards), seed=seed, reshuffle_each_iteration=True)
        draws = random_keys.stream(plan, 0, seed)
    else:
        draws = tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat()
    return tf.data.Dataset.zip(order, draws)


def _cycle_length(plan: ReadPlan, shards: int) -> int:
    """Shards read at once: a fixed number where the order must not depend on the
    machine, else enough for the cores."""
    return max(1, min(shards, CYCLE if plan.deterministic else max(4, plan.cores)))


def _every_nth(plan: ReadPlan):
    if plan.every_nth is None:
        return _unchanged
    return lambda ds: ds.unbatch().shard(*plan.every_nth).batch(BLOCK)


def _decoded_blocks(plan: ReadPlan, counters: dict, per_core: dict):
    if plan.per_image or plan.stored.encoding == "raw":  # raw: decoded with the block
        return _unchanged
    return lambda ds: batches.decoded(plan, ds, counters, per_core)


def _reshuffled_blocks(plan: ReadPlan):
    """The prefetch asks for the first block when the iterator starts, so reading begins
    at once."""
    if plan.sampling:  # drawn at random already
        return _unchanged
    if plan.training and (plan.cache is not None or not plan.reshuffle_each_epoch):
        return lambda ds: ds.shuffle(plan.shuffled_blocks, seed=plan.seed).prefetch(1)
    return _unchanged


def _shuffled(plan: ReadPlan, parallel: dict, finished: bool):
    """Blocks of decoded pixels into batches, or (images decoded one by one) blocks of
    records into records, in training through shuffle windows."""
    if plan.sampling:  # records drawn at random already
        return _unchanged
    if plan.per_image:
        return (lambda ds: batches.shuffled_records(plan, ds)) if plan.training else _unbatch
    if plan.training:
        return lambda ds: batches.shuffled_batches(plan, ds, parallel, finished=finished)
    return lambda ds: ds.rebatch(plan.batch_size)


def _unbatch(ds):
    return ds.unbatch()


def _each_image(plan: ReadPlan, counters: dict, per_core: dict):
    """Each training batch full except through the service: each worker's last batch is
    kept short, and the trainer regroups them."""
    if not plan.per_image:
        return _unchanged
    full = plan.training and not plan.data_service
    return lambda ds: batches.each_image(plan, ds, counters, per_core).batch(
        plan.batch_size, drop_remainder=full
    )


def _finished(plan: ReadPlan, augmentation, host, parallel: dict):
    """Keras's random layers draw from a seed generator: with a seed, batches take their
    draws in order, so that the same seed augments the same way."""
    keys = random_keys.stream(plan, 3)
    in_order = plan.seed is not None and bool(augmentation)
    return lambda ds: tf.data.Dataset.zip(ds, keys).map(
        finisher(plan, augmentation, host), **({} if in_order else parallel)
    )


def _cut_to_steps(plan: ReadPlan) -> bool:
    return plan.training and not plan.data_service and plan.steps < plan.own_steps


def _padded(plan: ReadPlan):
    if not plan.pad_final_batch:
        return _unchanged
    return lambda ds: batches.padded(ds, plan.batch_size, extra=plan.steps - plan.own_steps)


def _known_length(plan: ReadPlan):
    if plan.skip_corrupt or plan.data_service:
        return _unchanged
    return tf.data.experimental.assert_cardinality(plan.steps)


def dataset_options():
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
