"""From blocks of records to batches: decode, shuffle windows, batch, pad.

Example:
    >>> batches = shuffled_batches(plan, blocks, parallel, finished=False)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.image import tf_ops
from chute.lazy import tf
from chute.read.tf import keys as random_keys
from chute.read.tf.finish import labelled
from chute.read.tf.plan import BLOCK, ReadPlan


def decoded(plan: ReadPlan, blocks, counters: dict, parallel: dict):
    """Blocks of PNG/JPEG bytes (stored at the size read) -> blocks of uint8 images,
    one image per parallel call.

    Decoders take one image at a time. With ``skip_corrupt`` an image that does
    not decode is dropped; ``started - decoded`` counts the drops.
    """
    stored, shape = plan.stored, plan.shape

    def decode_one(data, label):
        if stored.encoding == "png":
            image = tf.io.decode_png(data, channels=stored.channels)
        else:
            # The same DCT method as every other decoder in chute, so the pixels match across paths.
            image = tf.io.decode_jpeg(data, channels=stored.channels, dct_method=tf_ops.DCT_METHOD)
        # The decoders leave the shape unknown; batching needs it fixed.
        return tf.ensure_shape(image, shape), label

    return _decode_counted(blocks.unbatch(), decode_one, counters, parallel).batch(BLOCK)


def each_image(plan: ReadPlan, records, counters: dict, parallel: dict):
    """Records ``(bytes, label)`` -> ``(image, label)``: each decoded, cropped and resized
    on its own (:mod:`chute.image.tf_ops`), one image per parallel call.

    In training, a random-resized crop (and flip) keyed by a per-image key drawn
    in read order from a seeded stream (a new one each epoch): with a seed the
    crops are the same whatever the number of cores. In evaluation, the centre
    crop of ``plan.crop_fraction``.
    """
    stored, size = plan.stored, plan.shape[:2]
    whole = stored.size == size  # stored at the size read: decoding is all it takes

    def fitted(data, fraction):
        if whole and fraction == 1:
            return tf.ensure_shape(tf_ops.decode(data, stored), plan.shape)
        return tf_ops.centre_crop(data, stored, size, fraction)

    if plan.training:
        # seed + 2: a stream of its own, apart from the shuffle's (seed + 1).
        keys = random_keys.stream(plan, 2)
        records = tf.data.Dataset.zip(records, keys)
        crop = plan.random_crop

        def transform(record, key):
            data, label = record
            if crop is None:
                image = fitted(data, 1.0)
                if plan.flip:
                    # Keyed per image: with a seed, the same flips whatever the number of cores.
                    seed = tf.stack([key, tf.constant(1, tf.int64)])
                    image = tf.image.stateless_random_flip_left_right(image, seed=seed)
            else:
                image = tf_ops.random_crop(
                    data, stored, size, key, scale=crop[0], ratio=crop[1], flip=plan.flip
                )
            return image, label
    else:

        def transform(data, label):
            return fitted(data, plan.crop_fraction), label

    return _decode_counted(records, transform, counters, parallel)


def _decode_counted(records, decode, counters: dict, parallel: dict):
    """``records.map(decode)``; with ``skip_corrupt``'s counters, what fails to decode is
    dropped, and ``started - decoded`` counts the drops."""
    if not counters:
        return records.map(decode, **parallel)

    def count(name):
        def add(*element):
            with tf.control_dependencies([counters[name].assign_add(1)]):
                return tf.nest.map_structure(tf.identity, element)

        return add

    # Counted before and after the decode: ignore_errors drops silently, the difference tells.
    records = records.map(count("started")).map(decode, **parallel)
    return records.ignore_errors().map(count("decoded"))


def shuffled_records(plan: ReadPlan, blocks):
    """Training: blocks of encoded records regrouped into windows of ``plan.window``,
    each permuted with one gather, then record by record (images are decoded after)."""
    keys = random_keys.stream(plan, 1)

    def permute(block, key):
        data, labels = block
        order = tf.random.experimental.stateless_shuffle(
            tf.range(tf.shape(labels)[0]), seed=tf.stack([key, tf.constant(0, tf.int64)])
        )
        return tf.gather(data, order), tf.gather(labels, order)

    windows = tf.data.Dataset.zip(blocks.rebatch(plan.window), keys)
    return windows.map(permute).unbatch()


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
    keys = random_keys.stream(plan, 1)

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
    step after it: when finishing is only labels and shapes (no augmentation on
    the host, uint8 images)."""
    # Any other dtype or a host augmentation is a per-batch step after the window.
    return plan.training and not augmenter and plan.dtype == "uint8"


def padded(batches, batch_size: int, extra: int = 0):
    """The last batch padded to ``batch_size``, with weights 1 (real) and 0 (padding),
    then ``extra`` batches of padding alone (all weights 0)."""

    def pad(*batch):
        real = tf.shape(batch[0])[0]
        missing = batch_size - real
        # Keras weighs each example: padding at 0 leaves the metrics those of the real examples.
        weights = tf.ensure_shape(
            tf.concat([tf.ones([real]), tf.zeros([missing])], 0), [batch_size]
        )

        def pad_one(t):
            paddings = [[0, missing]] + [[0, 0]] * (len(t.shape) - 1)
            return tf.ensure_shape(tf.pad(t, paddings), (batch_size, *t.shape[1:]))

        return (*(pad_one(t) for t in batch), weights)

    out = batches.map(pad)
    if extra > 0:
        empty = tf.nest.map_structure(
            lambda spec: tf.zeros(spec.shape, spec.dtype), out.element_spec
        )
        # Batches of padding alone, so every input pipeline yields the same number of batches.
        out = out.concatenate(tf.data.Dataset.from_tensors(empty).repeat(extra))
    return out
