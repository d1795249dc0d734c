"""Image sizes: the ``image_size`` a user may give, and the most pixels an input may have.

Light on purpose (no Pillow, no NumPy): option classes import it, and so does
``chute --help``.
"""

from __future__ import annotations

import re
from typing import Any

from chute import checks
from chute.format.spec import MAX_SIDE

DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb threshold


def parse_image_size(value: Any) -> tuple[int, int] | None:
    """Reads ``75``, ``"75"``, ``"75x100"`` or ``(75, 100)`` as ``(height, width)``.

    Raises:
        ChuteError: anything else, naming ``image_size`` and the value received.

    Example:
        >>> parse_image_size("75x100")
        (75, 100)
        >>> parse_image_size(32)
        (32, 32)
        >>> parse_image_size(None) is None
        True
    """
    if value is None:
        return None
    allowed = "a positive integer H or 'HxW' (or a (height, width) pair)"
    if isinstance(value, bool):
        raise checks.bad_value("image_size", value, allowed)
    if isinstance(value, int):
        size: tuple[Any, ...] = (value, value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX×,]\s*(\d+)\s*)?", value)
        if not match:
            raise checks.bad_value("image_size", value, allowed)
        size = (int(match[1]), int(match[2] or match[1]))
    elif isinstance(value, tuple | list) and len(value) == 2:
        size = tuple(value)
    else:
        raise checks.bad_value("image_size", value, allowed)
    if not all(checks.is_int(v) and 0 < v <= MAX_SIDE for v in size):
        raise checks.bad_value("image_size", value, f"{allowed} up to {MAX_SIDE}")
    return int(size[0]), int(size[1])
