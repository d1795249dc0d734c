"""Images brought to another number of channels: grayscale repeated into colour, colour
to luma by ITU-R 601-2 (Pillow's ``"L"``, what ``chute convert --color-mode grayscale``
stores), in the integer arithmetic both reading engines share, so they agree exactly.

Example:
    >>> import numpy as np
    >>> to_channels(np.array([[[255, 0, 0]]], np.uint8), 1).tolist()
    [[[76]]]
"""

from __future__ import annotations

import numpy as np

# Pillow's "L" weights, in 1/65536ths: 0.299, 0.587, 0.114
LUMA = (19595, 38470, 7471)


def to_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """uint8 images (``(..., height, width, c)``, ``c`` 1 or 3) with ``channels`` channels
    (1 or 3); the same array when they have them already.

    Example:
        >>> to_channels(np.full((1, 1, 1), 7, np.uint8), 3).tolist()
        [[[7, 7, 7]]]
    """
    have = images.shape[-1]
    if have == channels:
        return images
    if have == 1 and channels == 3:
        return np.repeat(images, 3, axis=-1)
    if have == 3 and channels == 1:
        weighted = images.astype(np.uint32) @ np.array(LUMA, np.uint32)
        return ((weighted + 32768) >> 16).astype(np.uint8)[..., None]
    raise ValueError(f"cannot bring {have}-channel images to {channels} channels")
