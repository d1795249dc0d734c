"""Pixels to the bytes a record stores: raw, PNG or JPEG; and JPEG metadata stripping.

Nothing here imports TensorFlow: worker processes encode, and ``predict``
encodes a JPEG as conversion would before decoding it as the reader does.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from chute.format.spec import ImageSpec
from chute.image.header import Rejected

# Segments kept when stripping: APP0 (JFIF), APP2 (ICC colour profile), APP14 (Adobe
# colour transform) and everything that is not APPn or a comment (the image itself).
_KEPT_APPS = frozenset({0xE0, 0xE2, 0xEE})


def stored_bytes(pixels: np.ndarray, original: bytes | None, spec: ImageSpec) -> bytes:
    """The ``image`` bytes of a record: ``original`` when it can be stored as it is, else
    the pixels as ``spec.encoding`` says (raw, PNG, or JPEG at ``spec.quality``).

    Raises:
        Rejected: the pixels cannot be encoded.

    Example:
        >>> stored_bytes(np.zeros((2, 2), np.uint8), None, ImageSpec(2, 2, 1, "raw"))
        b'\\x00\\x00\\x00\\x00'
        >>> stored_bytes(np.zeros((2, 2), np.uint8), None, ImageSpec(2, 2, 1, "png"))[:4]
        b'\\x89PNG'
    """
    # An upright JPEG kept at its size: its own bytes, not a second lossy encoding.
    if original is not None:
        return original
    if spec.encoding == "raw":
        return pixels.tobytes()
    buffer = io.BytesIO()
    try:
        if spec.encoding == "png":
            Image.fromarray(pixels).save(buffer, format="PNG", compress_level=6)
        else:
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=spec.quality)
    except (OSError, ValueError) as error:
        raise Rejected(f"cannot convert image: {error}") from None
    return buffer.getvalue()


def strip_jpeg_metadata(data: bytes) -> bytes | None:
    """``data`` without its EXIF/XMP (APP1), IPTC (APP13) and other APPn segments but
    APP0/APP2/APP14, without comments and without bytes after the end marker. The
    image data are copied as they are (lossless). None when the markers do not parse.

    Example:
        >>> strip_jpeg_metadata(b"not a jpeg") is None
        True
    """
    if data[:2] != b"\xff\xd8":
        return None
    out = bytearray(data[:2])
    position, end = 2, len(data)
    while position + 2 <= end:
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0xD9:  # end of image: what follows is dropped
            out += data[position : position + 2]
            return bytes(out)
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        segment_end = position + 2 + length
        if position + 4 > end or length < 2 or segment_end > end:
            return None
        if marker == 0xDA:  # start of scan: the entropy-coded data run to the next marker
            scan = segment_end
            while scan + 1 < end and not (
                data[scan] == 0xFF and data[scan + 1] not in (0x00, *range(0xD0, 0xD8), 0xFF)
            ):
                scan += 1
            out += data[position:scan]
            position = scan
            continue
        if not (0xE0 <= marker <= 0xEF and marker not in _KEPT_APPS) and marker != 0xFE:
            out += data[position:segment_end]
        position = segment_end
    return None
