"""What happens to a batch after shuffling: resize, augment, cast, labels.

Augmentations are Keras 3 preprocessing layers, by name or as layers,
applied to training batches only.

Example:
    >>> augmenter = make_augmenter(["flip", "zoom"], seed=1)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from chute import checks
from chute.lazy import keras, tf
from chute.read.plan import ReadPlan

AUGMENTATIONS = {
    "flip": ("RandomFlip", {"mode": "horizontal"}),
    "rotation": ("RandomRotation", {"factor": 0.1}),
    "zoom": ("RandomZoom", {"height_factor": 0.1}),
    "translation": ("RandomTranslation", {"height_factor": 0.1, "width_factor": 0.1}),
    "contrast": ("RandomContrast", {"factor": 0.2}),
    "brightness": ("RandomBrightness", {"factor": 0.2, "value_range": (0, 255)}),
}


def make_augmenter(augment: Any, seed: int | None):
    """A ``keras.Sequential`` of the augmentations named (or given as layers), or None.

    With a seed, layer ``i`` is seeded ``seed + i``.

    Raises:
        ChuteError: an unknown name, or something that is neither a name nor a Keras layer.
    """
    if not augment:
        return None
    allowed = f"names from {sorted(AUGMENTATIONS)} or Keras layers"
    if isinstance(augment, str) or not isinstance(augment, list | tuple):
        raise checks.bad_value("augment", augment, f"a list of {allowed}")
    layers = []
    for number, item in enumerate(augment):
        if isinstance(item, str) and item in AUGMENTATIONS:
            name, kwargs = AUGMENTATIONS[item]
            layer_seed = None if seed is None else seed + number
            layers.append(getattr(keras.layers, name)(**kwargs, seed=layer_seed))
        elif isinstance(item, keras.layers.Layer):
            layers.append(item)
        else:
            raise checks.bad_value("augment", item, allowed)
    return keras.Sequential(layers)


def labelled(plan: ReadPlan, images, labels):
    """``(images, labels)`` in the label mode asked for (or images alone), with static shapes."""
    images = tf.ensure_shape(images, (None, *plan.shape))
    labels = tf.ensure_shape(labels, (None,))
    if plan.label_mode is None:
        return images
    if plan.label_mode == "int":
        return images, tf.cast(labels, tf.int32)
    if plan.label_mode == "binary":
        return images, tf.cast(tf.reshape(labels, (-1, 1)), tf.float32)
    return images, tf.one_hot(labels, plan.num_classes, dtype=tf.float32)


def finisher(plan: ReadPlan, augmenter):
    """``(images, labels) -> batch``: resize, augment, cast and labels, as ``plan`` says."""

    def finish(images, labels):
        if plan.resize:
            images = tf.cast(tf.round(tf.image.resize(images, plan.shape[:2])), tf.uint8)
        if augmenter is not None:
            images = augmenter(tf.cast(images, tf.float32), training=True)
            images = tf.cast(tf.clip_by_value(tf.round(images), 0, 255), tf.uint8)
        if plan.dtype != "uint8":
            images = tf.cast(images, tf.float32) / 255.0
            if plan.dtype == "bfloat16":
                images = tf.cast(images, tf.bfloat16)
        return labelled(plan, images, labels)

    return finish
