"""Augmentation by name, and where it is cheapest (both engines).

Names (``augment=[...]``), or Keras layers:

- ``"crop"`` (Inception-style random-resized crop) and ``"flip"`` run on the
  host per image, fused with decoding (:mod:`chute.image.tf_ops`): almost free;
- ``"rotation"``, ``"zoom"``, ``"translation"``, ``"contrast"``,
  ``"brightness"``, ``"randaugment"`` (Keras 3 layers on images) and
  ``"mixup"``, ``"cutmix"`` (Keras 3 layers on images and one-hot labels) are
  heavy: with ``augment_on="device"`` they are left out of the input pipeline
  and handed over as a :class:`DeviceAugmentation` to run inside the model's
  train step on the accelerator (``chute train`` does so when there is one),
  so the host pipeline stays at decode speed; with ``augment_on="host"`` they
  run per batch in the pipeline: the first five (and a ``"flip"`` not fused
  with decoding) with OpenCV (:mod:`chute.read.tf.host_augment`), the others as
  Keras layers.

Example:
    >>> spec = parse_augment(["crop", "flip", "zoom"])
    >>> spec.crop, spec.flip, spec.heavy
    (True, True, ('zoom',))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute import checks
from chute.lazy import keras, tf

FUSED = ("crop", "flip")
LAYERS = {
    "flip": ("RandomFlip", {"mode": "horizontal"}),
    "rotation": ("RandomRotation", {"factor": 0.1}),
    "zoom": ("RandomZoom", {"height_factor": 0.1}),
    "translation": ("RandomTranslation", {"height_factor": 0.1, "width_factor": 0.1}),
    "contrast": ("RandomContrast", {"factor": 0.2}),
    "brightness": ("RandomBrightness", {"factor": 0.2, "value_range": (0, 255)}),
    "randaugment": ("RandAugment", {"value_range": (0, 255)}),
}
MIXING = {"mixup": ("MixUp", {"alpha": 0.2}), "cutmix": ("CutMix", {})}
NAMES = (*FUSED, *[n for n in LAYERS if n not in FUSED], *MIXING)
PLACES = ("host", "device")


@dataclasses.dataclass(frozen=True)
class AugmentSpec:
    """What ``augment=[...]`` asks for.

    Attributes:
        crop: a random-resized crop per image.
        flip: a left-right flip per image, half of the time.
        heavy: the other augmentations, in order: names, or Keras layers.
    """

    crop: bool = False
    flip: bool = False
    heavy: tuple = ()

    @property
    def mixing(self) -> bool:
        """Whether MixUp or CutMix is asked for (they need one-hot labels)."""
        return any(item in MIXING for item in self.heavy if isinstance(item, str))


def parse_augment(augment: Any) -> AugmentSpec:
    """Checks ``augment`` (a list of names and Keras layers) into an :class:`AugmentSpec`.

    Raises:
        ChuteError: an unknown name, or something that is neither a name nor a Keras layer.
    """
    if not augment:
        return AugmentSpec()
    allowed = f"names from {sorted(NAMES)} or Keras layers"
    # A bare string is refused here: it would be read letter by letter.
    if isinstance(augment, str) or not isinstance(augment, list | tuple):
        raise checks.bad_value("augment", augment, f"a list of {allowed}")
    heavy = []
    for item in augment:
        if isinstance(item, str):
            if item not in NAMES:
                raise checks.bad_value("augment", item, allowed)
            if item not in FUSED:
                heavy.append(item)
        elif isinstance(item, keras.layers.Layer):
            heavy.append(item)
        else:
            raise checks.bad_value("augment", item, allowed)
    return AugmentSpec(crop="crop" in augment, flip="flip" in augment, heavy=tuple(heavy))


class DeviceAugmentation:
    """Augmentations applied to a batch ``(images, labels)``: Keras image layers, then
    MixUp/CutMix. Used inside a train step (on the accelerator), or per batch on the host.

    Images go in and come out as uint8 (rounded and clipped): the models take
    uint8 pixels.

    Example:
        >>> augmentation = DeviceAugmentation(["zoom", "mixup"], seed=1)  # doctest: +SKIP
        >>> images, labels = augmentation(images, one_hot_labels)  # doctest: +SKIP
    """

    def __init__(self, heavy: tuple | list, seed: int | None):
        self.layers, self.mixing = [], []
        for number, item in enumerate(heavy):
            # A seed per layer: two layers of one kind must not draw the same values.
            layer_seed = None if seed is None else seed + number
            if isinstance(item, str):
                name, kwargs = (LAYERS | MIXING)[item]
                layer = getattr(keras.layers, name)(**kwargs, seed=layer_seed)
                (self.mixing if item in MIXING else self.layers).append(layer)
            else:
                self.layers.append(item)
        self.names = [item if isinstance(item, str) else type(item).__name__ for item in heavy]

    def __bool__(self) -> bool:
        return bool(self.layers or self.mixing)

    def __call__(self, images, labels=None):
        """The batch augmented: ``images`` (and ``labels``, one-hot, when mixing)."""
        # Keras's random layers work in float; the result goes back to uint8 below.
        out = tf.cast(images, tf.float32)
        for layer in self.layers:
            out = layer(out, training=True)
        for layer in self.mixing:
            mixed = layer({"images": out, "labels": labels}, training=True)
            out, labels = mixed["images"], mixed["labels"]
        out = tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)
        return out if labels is None else (out, labels)
