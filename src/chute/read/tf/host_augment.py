"""Geometric and photometric augmentation on the host, fast: one OpenCV warp per image.

On the host, ``flip`` (left-right, half of the time; when it is not fused with
decoding), ``rotation``, ``zoom`` and ``translation`` are composed into one
affine transform per image and applied with ``cv2.warpAffine`` on uint8
(reflecting at the borders, bilinear), and ``contrast`` and ``brightness``
are a scale and an offset per image: several times cheaper than Keras's layers
on the CPU (whose projective transform costs more than decoding the image).
The ranges are those of chute's Keras layers (``chute.read.augment.LAYERS``):
rotation up to ±0.1 of a turn, zoom and translation up to ±10%, contrast
×[0.8, 1.2] around each channel's mean, brightness ±0.2 × 255. On an
accelerator (``augment_on="device"``) Keras's layers run instead, inside the
train step.

Random choices come from a NumPy generator keyed by a per-batch key drawn in
batch order from a seeded stream: a seed gives the same augmentation on any
number of cores. The batches go through ``tf.numpy_function``, so a dataset
that uses this is not serialisable to other processes (the tf.data service).

Example:
    >>> augment = HostAugmentation(["rotation", "contrast"])
    >>> images = augment(batch_uint8, key)  # doctest: +SKIP
"""

from __future__ import annotations

import cv2
import numpy as np

from chute.lazy import tf

cv2.setNumThreads(1)  # parallelism comes from tf.data's parallel calls
NAMES = ("flip", "rotation", "zoom", "translation", "contrast", "brightness")
ROTATION, ZOOM, TRANSLATION, CONTRAST, BRIGHTNESS = 0.1, 0.1, 0.1, 0.2, 0.2


class HostAugmentation:
    """The host-side ``flip``, ``rotation``, ``zoom``, ``translation``, ``contrast``
    and ``brightness`` of a batch of uint8 images ``(n, height, width, channels)``."""

    def __init__(self, names: list[str] | tuple[str, ...]):
        unknown = sorted(set(names) - set(NAMES))
        if unknown:
            raise ValueError(f"not host augmentations: {unknown}")
        self.names = tuple(names)

    def __bool__(self) -> bool:
        return bool(self.names)

    def __call__(self, images, key):
        """The batch augmented, as a tensor of the same shape and dtype (uint8)."""
        if self.names == ("flip",):
            return flipped(images, key)
        # stateful=False: the randomness comes from the key, so tf.data may treat the call as pure.
        out = tf.numpy_function(self._apply, [images, key], tf.uint8, stateful=False)
        # numpy_function forgets the shape; the batch comes back as it went in.
        return tf.ensure_shape(out, images.shape)

    def apply(self, images: np.ndarray, key: np.int64) -> np.ndarray:
        """NumPy/OpenCV: each image of ``images`` augmented, choices drawn from ``key``
        (a flip alone runs in the graph instead, see :func:`flipped`)."""
        return self._apply(images, key)

    def _apply(self, images: np.ndarray, key: np.int64) -> np.ndarray:
        # The key is a signed int64: masked to a non-negative seed, which NumPy requires.
        rng = np.random.default_rng(int(key) & (2**63 - 1))
        out = np.empty_like(images)
        height, width = images.shape[1:3]
        for index, image in enumerate(images):
            matrix = self._affine(rng, height, width)
            if matrix is not None:
                image = cv2.warpAffine(
                    image, matrix, (width, height), flags=cv2.INTER_LINEAR,
                    borderMode=cv2.BORDER_REFLECT,
                )  # fmt: skip
                image = image.reshape(out.shape[1:])
            out[index] = self._photometric(rng, image)
        return out

    def _affine(self, rng: np.random.Generator, height: int, width: int) -> np.ndarray | None:
        flip = "flip" in self.names and rng.uniform() < 0.5
        if not flip and not {"rotation", "zoom", "translation"} & set(self.names):
            return None
        angle = rng.uniform(-ROTATION, ROTATION) * 360 if "rotation" in self.names else 0.0
        scale = 1.0 / (1 + rng.uniform(-ZOOM, ZOOM)) if "zoom" in self.names else 1.0
        matrix = cv2.getRotationMatrix2D(((width - 1) / 2, (height - 1) / 2), angle, scale)
        if "translation" in self.names:
            matrix[0, 2] += rng.uniform(-TRANSLATION, TRANSLATION) * width
            matrix[1, 2] += rng.uniform(-TRANSLATION, TRANSLATION) * height
        if flip:  # mirror the output: x -> width - 1 - x
            matrix[0] = -matrix[0]
            matrix[0, 2] += width - 1
        return matrix

    def _photometric(self, rng: np.random.Generator, image: np.ndarray) -> np.ndarray:
        """Contrast around each channel's mean and brightness, as one lookup table."""
        factor = rng.uniform(1 - CONTRAST, 1 + CONTRAST) if "contrast" in self.names else 1.0
        shift = rng.uniform(-BRIGHTNESS, BRIGHTNESS) * 255 if "brightness" in self.names else 0.0
        if factor == 1.0 and shift == 0.0:
            return image
        channels = image.shape[-1]
        mean = np.asarray(cv2.mean(image)[:channels], np.float32)
        levels = np.arange(256, dtype=np.float32)[:, None]
        # A lookup table of 256 levels per channel: one pass over the image, whatever its size.
        table = np.clip(np.rint((levels - mean) * factor + mean + shift), 0, 255)
        table = table.astype(np.uint8).T.reshape(channels, 256)
        if channels == 1:
            return cv2.LUT(image, table[0]).reshape(image.shape)
        return cv2.LUT(image, np.ascontiguousarray(table.T).reshape(256, 1, channels))


def flipped(images, key):
    """A batch with half of its images (each a coin toss keyed by ``key``) mirrored left to
    right, in the graph: a flip alone needs no warp, and no trip through Python per batch
    (which cost a raw glyph batch more than reading it, see benchmarks/README.md).

    Example:
        >>> batch = tf.zeros((4, 2, 3, 1), tf.uint8)
        >>> flipped(batch, tf.constant(7, tf.int64)).shape
        TensorShape([4, 2, 3, 1])
    """
    seed = tf.stack([tf.cast(key, tf.int64), tf.constant(0x666C6970, tf.int64)])
    coins = tf.random.stateless_uniform(tf.shape(images)[:1], seed=seed) < 0.5
    return tf.where(coins[:, None, None, None], tf.reverse(images, axis=[2]), images)
