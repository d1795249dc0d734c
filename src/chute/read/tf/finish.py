"""What happens to a tf.data batch after shuffling: host augmentation, labels in the label
mode asked for, and the dtype (the Grain engine's counterpart is its ``Finish``, in NumPy).

Example:
    >>> finish = finisher(plan, augmentation=None)  # doctest: +SKIP
    >>> dataset = dataset.map(finish)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.lazy import tf
from chute.read.augment import DeviceAugmentation
from chute.read.tf import shards
from chute.read.tf.plan import ReadPlan


def labelled(plan: ReadPlan, images, labels):
    """``(images, labels)`` in the label mode asked for (or images alone), with static shapes."""
    # Static shapes from here on: Keras and XLA compile for a known image size.
    images = tf.ensure_shape(images, (None, *plan.shape))
    if plan.label_mode is None:
        return images
    rest = ()
    if plan.multi_label:  # packed label bits, then the weight's bytes (see shards.targets)
        width = shards.packed_width(plan.num_classes)
        labels = tf.ensure_shape(labels, (None, width + 4 * plan.weights))
        if plan.weights:
            labels, rest = labels[:, :width], (tf.bitcast(labels[:, width:], tf.float32),)
        return images, shards.unpacked(labels, plan.num_classes), *rest
    if plan.weights:  # float rows: the class, then the weight (see shards.targets)
        labels = tf.ensure_shape(labels, (None, 2))
        labels, rest = tf.cast(labels[:, 0], tf.int64), (labels[:, 1],)
    labels = tf.ensure_shape(labels, (None,))
    if plan.label_mode == "int":
        return images, tf.cast(labels, tf.int32), *rest
    if plan.label_mode == "binary":
        return images, tf.cast(tf.reshape(labels, (-1, 1)), tf.float32), *rest
    return images, tf.one_hot(labels, plan.num_classes, dtype=tf.float32), *rest


def finisher(plan: ReadPlan, augmentation: DeviceAugmentation | None, host=None):
    """``((images, labels), key) -> batch``: host augmentation (``host``: OpenCV,
    keyed per batch; then Keras's layers), labels and cast, as ``plan`` says."""

    def finish(batch, key):
        images, labels = batch
        if host:
            images = host(images, key)
        out = labelled(plan, images, labels)
        if augmentation:  # on the host: images (and one-hot labels, for MixUp/CutMix)
            if plan.label_mode is None:
                out = augmentation(out)
            elif augmentation.mixing:  # never with sample weights (see chute.read.target)
                out = augmentation(*out)
            else:
                out = (augmentation(out[0]), *out[1:])  # labels, and weights if any
        # uint8 leaves as it is: the models rescale their own input.
        if plan.dtype == "uint8":
            return out
        images, rest = (out, ()) if plan.label_mode is None else (out[0], out[1:])
        images = tf.cast(images, tf.float32) / 255.0
        if plan.dtype == "bfloat16":
            images = tf.cast(images, tf.bfloat16)
        return images if plan.label_mode is None else (images, *rest)

    return finish
