"""Pixels to a size: crop, pad or stretch to the aspect ratio, then resample; and the
size an image is stored at.

The resampling is OpenCV's; for nearest, bilinear and area it computes what
``tf.image.resize`` does (no antialiasing, half-pixel centres), so the images
match the ones Keras's own loaders produce. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from chute.format.spec import ImageSpec

cv2.setNumThreads(1)  # parallelism comes from worker processes
# chute's interpolation names -> OpenCV's (what tf.image.resize computes, for the first three)
FILTERS = {
    "nearest": cv2.INTER_NEAREST_EXACT,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
    "lanczos": cv2.INTER_LANCZOS4,
}


def resize(
    pixels: np.ndarray, height: int, width: int, mode: str, interpolation: str
) -> np.ndarray:
    """Resizes HxW or HxWx3 uint8 pixels to ``(height, width)``.

    ``crop`` first cuts the centred window of the target aspect ratio,
    ``pad`` first pads with black to it, ``stretch`` ignores the aspect ratio
    (Keras's ``crop_to_aspect_ratio`` and ``pad_to_aspect_ratio``). The
    resampling is OpenCV's; for nearest, bilinear and area it computes what
    ``tf.image.resize`` does (no antialiasing, half-pixel centres), so the
    images match the ones Keras's own loaders produce.

    Example:
        >>> wide = np.arange(8, dtype=np.uint8).reshape(2, 4)
        >>> resize(wide, 2, 2, "crop", "nearest").tolist()  # the centred 2x2 window
        [[1, 2], [5, 6]]
        >>> resize(wide, 4, 4, "pad", "nearest")[0].tolist()  # black above and below
        [0, 0, 0, 0]
    """
    src_h, src_w = pixels.shape[:2]
    # Aspect ratios compared by cross-multiplying: no float rounding decides a tie.
    if mode != "stretch" and src_w * height != src_h * width:
        if (src_w * height > src_h * width) == (mode == "crop"):
            # crop: too wide -> narrow the window; pad: too tall -> widen the canvas
            new_w, new_h = max(1, round(src_h * width / height)), src_h
        else:
            new_w, new_h = src_w, max(1, round(src_w * height / width))
        if mode == "crop":
            left, top = (src_w - new_w) // 2, (src_h - new_h) // 2
            pixels = pixels[top : top + new_h, left : left + new_w]
        else:
            canvas = np.zeros((new_h, new_w, *pixels.shape[2:]), np.uint8)
            left, top = (new_w - src_w) // 2, (new_h - src_h) // 2
            canvas[top : top + src_h, left : left + src_w] = pixels
            pixels = canvas
    if pixels.shape[:2] == (height, width):
        return pixels
    return cv2.resize(
        np.ascontiguousarray(pixels), (width, height), interpolation=FILTERS[interpolation]
    )


def stored_size(spec: ImageSpec, height: int, width: int) -> tuple[int, int] | None:
    """``(height, width)`` at which ``spec`` stores an upright image of ``height x width``;
    None when it is kept at its own size.

    Example:
        >>> stored_size(ImageSpec(None, None, 3, "jpeg", shorter_side=256), 1000, 1500)
        (256, 384)
    """
    if spec.fixed_size:
        return spec.height, spec.width
    if spec.shorter_side and min(height, width) > spec.shorter_side:
        scale = spec.shorter_side / min(height, width)
        return max(1, round(height * scale)), max(1, round(width * scale))
    return None


def decoded_size(spec: ImageSpec, height: int, width: int) -> tuple[int, int] | None:
    """The least ``(height, width)`` the decoder must return for an upright image of
    ``height x width``: the source at the scale :func:`resize` brings it to (with
    ``crop``, the centred window reaches the target; with ``pad``, the whole image
    fits it). None when no resize follows.

    Example:
        >>> decoded_size(ImageSpec(100, 100, 3, "raw", resize="crop"), 1000, 2000)
        (100, 200)
    """
    target = stored_size(spec, height, width)
    if target is None:
        return None
    if not spec.fixed_size or spec.resize == "stretch":
        return target
    # crop: the window must cover the target, so the larger scale; pad: the whole image fits.
    pick = max if spec.resize == "crop" else min
    scale = pick(target[0] / height, target[1] / width)
    # Rounded up: a decode at this size must never fall short of what the resize needs.
    return math.ceil(height * scale), math.ceil(width * scale)
