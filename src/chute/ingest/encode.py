"""Items to framed records: hash, prepare the image, encode, frame.

Worker processes run :func:`encode_chunk` (and
:func:`chute.ingest.decode.probe_chunk`) on chunks of items, one result per
chunk, which keeps inter-process traffic low; results depend only on the
inputs, so output is the same whatever the number of workers. The image
itself is prepared by :mod:`chute.image` (decode, orientation, mode, resize,
encoding).
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from chute.format import records
from chute.format.spec import ImageSpec
from chute.image.decode import load_pixels
from chute.image.encode import stored_bytes
from chute.image.header import Rejected
from chute.image.size import DEFAULT_MAX_PIXELS
from chute.ingest.decode import read
from chute.ingest.sources.members import Member


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
                # The shape in the hash: the same bytes in another shape are another image.
                digest = hashlib.sha256(str(payload.shape).encode() + payload.tobytes()).digest()
            else:
                payload = read(payload, max_pixels)
                # The file's own bytes, hashed as read: each file is read only once.
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
    """The framed record of one item (raises :class:`~chute.image.header.Rejected` for
    bad input).

    ``payload`` is a path, an archive member, the file's bytes, or a pixel array.
    """
    if isinstance(payload, Member):  # chute.image reads paths, not archive members
        payload = read(payload, max_pixels)
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
