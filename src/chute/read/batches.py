"""From blocks of records to batches: decode PNG/JPEG images, shuffle windows, batch, pad.

Example:
    >>> batches = shuffled_batches(plan, blocks, keys)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.lazy import tf
from chute.read.augment import labelled
from chute.read.plan import BLOCK, ReadPlan


def decoded(plan: ReadPlan, blocks, counters: dict, parallel: dict):
    """Blocks of PNG/JPEG bytes -> blocks of uint8 images, one image per parallel call.

    Decoders take one image at a time. With ``skip_corrupt`` an image that does
    not decode is dropped; ``started - decoded`` counts the drops.
    """
    stored, shape = plan.stored, plan.shape

    def decode_one(data, label):
        if stored.encoding == "png":
            image = tf.io.decode_png(data, channels=stored.channels)
        else:
            image = tf.io.decode_jpeg(data, channels=stored.channels)
        if stored.size != shape[:2]:  # stored at another size, or each at its own
            image = tf.cast(tf.round(tf.image.resize(image, shape[:2])), tf.uint8)
        return tf.ensure_shape(image, shape), label

    def count(name):
        def add(data, label):
            with tf.control_dependencies([counters[name].assign_add(1)]):
                return tf.identity(data), label

        return add

    images = blocks.unbatch()
    if plan.skip_corrupt:
        images = images.map(count("started")).map(decode_one, **parallel)
        images = images.ignore_errors().map(count("decoded"))
    else:
        images = images.map(decode_one, **parallel)
    return images.batch(BLOCK)


def shuffled_batches(plan: ReadPlan, blocks, parallel: dict, *, finished: bool):
    """Training batches, all full: blocks regrouped into windows of ``plan.window``
    records, each window permuted with one gather and cut into whole batches.

    Blocks come from several shards at once, and shards were written in
    random order, so a permuted window mixes records from several shards. The
    permutation is one gather on decoded pixels, a cost per window rather than
    per record. Only the split's last partial batch is dropped (windows hold
    whole batches). With ``finished`` (see :func:`finished_in_window`), labels
    are made per window too, and no per-batch step follows.
    """
    batch_size = plan.batch_size
    # one key per window; not the stream of block sizes
    keys = tf.data.Dataset.random(
        seed=None if plan.seed is None else plan.seed + 1, rerandomize_each_iteration=True
    )

    def cut(block, key):
        images, labels = block
        count = tf.shape(labels)[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count), seed=tf.stack([key, tf.constant(0, tf.int64)])
        )
        order = order[: count // batch_size * batch_size]  # whole batches
        window = (tf.gather(images, order), tf.gather(labels, order))
        if finished:
            window = labelled(plan, *window)
        parts = window if isinstance(window, tuple) else (window,)
        batches = tuple(tf.reshape(t, [-1, batch_size, *t.shape[1:]]) for t in parts)
        return batches if isinstance(window, tuple) else batches[0]

    windows = tf.data.Dataset.zip(blocks.rebatch(plan.window), keys)
    # Two windows cut at a time (a memory copy each): with the one being filled
    # and the one being handed out, about four windows are held at the most.
    return windows.map(cut, num_parallel_calls=2, deterministic=parallel["deterministic"]).unbatch()


def finished_in_window(plan: ReadPlan, augmenter) -> bool:
    """Whether training batches can leave the shuffle window finished, with no per-batch
    step after it: when finishing is only labels and shapes (no resize, no
    augmentation, uint8 images)."""
    return plan.training and not plan.resize and augmenter is None and plan.dtype == "uint8"


def padded(batches, batch_size: int):
    """The last batch padded to ``batch_size``, with weights 1 (real) and 0 (padding)."""

    def pad(*batch):
        real = tf.shape(batch[0])[0]
        missing = batch_size - real
        weights = tf.concat([tf.ones([real]), tf.zeros([missing])], 0)

        def pad_one(t):
            paddings = [[0, missing]] + [[0, 0]] * (len(t.shape) - 1)
            return tf.ensure_shape(tf.pad(t, paddings), (batch_size, *t.shape[1:]))

        return (*(pad_one(t) for t in batch), weights)

    return batches.map(pad)
