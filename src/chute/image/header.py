"""What an image file's header tells, without decoding its pixels; and why an image is refused.

Opening an image reads its header only: format, mode, size and EXIF
orientation. That is enough to refuse a file (not an image, too many pixels)
and to plan a conversion (:func:`probe_header`) before any pixel is decoded.
Nothing here imports TensorFlow or OpenCV.
"""

from __future__ import annotations

import io
import warnings
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, UnidentifiedImageError

from chute.image.size import DEFAULT_MAX_PIXELS

_ORIENTATION = 0x0112  # the EXIF tag
_EXIF_FORMATS = frozenset({"JPEG", "MPO", "TIFF", "WEBP"})
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


class Rejected(Exception):
    """An input that cannot be converted; the message is the reason.

    Example:
        >>> str(Rejected("empty file (0 bytes)"))
        'empty file (0 bytes)'
    """


class Probe(NamedTuple):
    """What a header tells about one item, without decoding its pixels."""

    reject: str | None  # why the item cannot be used, or None
    grayscale: bool
    height: int  # after EXIF orientation
    width: int
    format: str  # Pillow's format name ("PNG", "JPEG", ...), "ARRAY" for arrays
    nbytes: int


def describe_error(error: BaseException) -> str:
    """An exception as one short line: its type and message.

    Example:
        >>> describe_error(ValueError("bad marker\\nmore detail"))
        'ValueError: bad marker'
    """
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


def open_image(source: bytes | Any, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Opens an image (its bytes or a file object) and checks its header; pixels stay
    undecoded.

    A :class:`Rejected` raised by the file object itself (an archive member
    that cannot be read, say) passes through with its own reason.

    Raises:
        Rejected: empty, not an image, an unreadable header, or more than
            ``max_pixels`` pixels.

    Example:
        >>> buffer = io.BytesIO()
        >>> Image.new("L", (4, 3)).save(buffer, format="PNG")
        >>> open_image(buffer.getvalue()).size
        (4, 3)
        >>> open_image(b"")
        Traceback (most recent call last):
        ...
        chute.image.header.Rejected: empty file (0 bytes)
    """
    if isinstance(source, bytes):
        if not source:
            raise Rejected("empty file (0 bytes)")
        source = io.BytesIO(source)
    try:
        with warnings.catch_warnings():
            # Pillow warns about odd files while opening; what matters is whether they decode.
            warnings.simplefilter("ignore")
            image = Image.open(source)
    except UnidentifiedImageError:
        raise Rejected("not an image Pillow can identify") from None
    except Image.DecompressionBombError as error:  # Pillow's own guard (outside workers)
        raise Rejected(f"too many pixels: {error}") from None
    except Rejected:  # the file object's own reason (an archive's data is damaged)
        raise
    except Exception as error:  # untrusted bytes: any parser failure is a bad file
        raise Rejected(f"unreadable image header: {describe_error(error)}") from None
    width, height = image.size
    # From the header alone: a bomb is refused before a single pixel is decoded.
    if width * height > max_pixels:
        raise Rejected(
            f"too many pixels: {width}x{height} = {width * height} > max_pixels {max_pixels}"
        )
    return image


def orientation(image: Image.Image) -> int:
    """The EXIF orientation of an opened image, 1 (upright) when it has none.

    Example:
        >>> orientation(Image.new("RGB", (2, 2)))
        1
    """
    # Image.getexif() on a PNG without an eXIf chunk in its header decodes the
    # whole image to look further; only ask where an orientation can be.
    if image.format not in _EXIF_FORMATS and "exif" not in image.info:
        return 1
    try:
        return int(image.getexif().get(_ORIENTATION, 1))
    except Exception:  # a broken EXIF block is not worth rejecting the image for
        return 1


def probe_header(handle: Any, size: int, max_pixels: int) -> Probe:
    """The :class:`Probe` of an image file of ``size`` bytes open in ``handle``; reads
    its header only.

    Raises:
        Rejected: the file cannot be used (the message says why).

    Example:
        >>> buffer = io.BytesIO()
        >>> Image.new("RGB", (5, 2)).save(buffer, format="PNG")
        >>> probe_header(buffer, buffer.tell(), 10**6)[:5]
        (None, False, 2, 5, 'PNG')
    """
    if size == 0:
        raise Rejected("empty file (0 bytes)")
    image = open_image(handle, max_pixels)
    width, height = image.size
    # These orientations turn the image a quarter: its upright height is the stored width.
    if orientation(image) in (5, 6, 7, 8):
        width, height = height, width
    gray = image.mode in _GRAY_MODES or (image.mode == "P" and _palette_is_gray(image))
    return Probe(None, gray, height, width, image.format or "?", size)


def _palette_is_gray(image: Image.Image) -> bool:
    palette = image.getpalette() or []
    rgb = np.asarray(palette[: len(palette) // 3 * 3]).reshape(-1, 3)
    return bool(len(rgb)) and bool((rgb == rgb[:, :1]).all())
