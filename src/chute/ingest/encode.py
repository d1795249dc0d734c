"""Images to framed records: hash, decode, convert, resize, encode, frame.

Worker processes run :func:`encode_chunk` (and
:func:`chute.ingest.decode.probe_chunk`) on chunks of items, one result per
chunk, which keeps inter-process traffic low; results depend only on the
inputs, so output is the same whatever the number of workers.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from chute.format import records
from chute.format.spec import ImageSpec
from chute.ingest.decode import Rejected, load_pixels, read
from chute.ingest.options import DEFAULT_MAX_PIXELS


class Encoded(NamedTuple):
    """The outcome for one item: its framed record, or why it was rejected."""

    digest: bytes | None  # sha256 of the file (or of the array's shape and pixels)
    record: bytes | None
    reject: str | None


def encode_chunk(
    items: list[tuple[str, int, Any]], spec: ImageSpec, max_pixels: int
) -> list[Encoded]:
    """Hashes, decodes, converts, resizes and encodes a chunk; frames the records.

    Args:
        items: ``(key, label, payload)`` triples; payload is a path, an archive
            :class:`~chute.ingest.sources.members.Member` or an array.
        spec: how to store the images.
        max_pixels: larger images are rejected.

    Returns:
        One :class:`Encoded` per item, in order.
    """
    out = []
    for key, label, payload in items:
        digest = None
        try:
            if isinstance(payload, np.ndarray):
                digest = hashlib.sha256(str(payload.shape).encode() + payload.tobytes()).digest()
            else:
                payload = read(payload, max_pixels)
                digest = hashlib.sha256(payload).digest()
            out.append(Encoded(digest, encode_one(key, label, payload, spec, max_pixels), None))
        except Rejected as reason:
            out.append(Encoded(digest, None, str(reason)))
        except Exception as error:  # untrusted input: any failure rejects this one only
            reason = f"cannot convert image: {type(error).__name__}: {error}"
            out.append(Encoded(digest, None, reason.splitlines()[0][:300]))
    return out


def encode_one(
    key: str, label: int, payload: Any, spec: ImageSpec, max_pixels: int = DEFAULT_MAX_PIXELS
) -> bytes:
    """The framed record of one item (raises :class:`Rejected` for bad input).

    ``payload`` is a path, the file's bytes, or a pixel array.
    """
    pixels, original = load_pixels(payload, spec, max_pixels)
    height, width = pixels.shape[:2]
    return records.image_example(
        image=stored_bytes(pixels, original, spec),
        label=label,
        height=height,
        width=width,
        channels=spec.channels,
        encoding=spec.encoding,
        key=key,
    )


def stored_bytes(pixels: np.ndarray, original: bytes | None, spec: ImageSpec) -> bytes:
    """The ``image`` bytes of a record: ``original`` when it can be stored as it is, else
    the pixels as ``spec.encoding`` says (raw, PNG, or JPEG at ``spec.quality``).

    Example:
        >>> stored_bytes(np.zeros((2, 2), np.uint8), None, ImageSpec(2, 2, 1, "raw"))
        b'\\x00\\x00\\x00\\x00'
    """
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
