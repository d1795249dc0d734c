"""Items to framed records: hash, prepare the image, encode, frame.

Worker processes run :func:`encode_chunk` (and
:func:`chute.ingest.decode.probe_chunk`) on chunks of items, one result per
chunk, which keeps inter-process traffic low; results depend only on the
inputs, so output is the same whatever the number of workers. The image
itself is prepared by :mod:`chute.image` (decode, orientation, mode, resize,
encoding).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator, Sequence
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


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A chunk of items to encode, by column: what a worker task carries.

    ``payloads`` is a list (paths, archive members), or one array whose rows are the
    images: a worker task then pickles one array, not an array object per image.

    Example:
        >>> chunk = Chunk(["a", "b"], [0, 1], ["a.png", "b.png"])
        >>> len(chunk), list(chunk)[1]
        (2, ('b', 1, 'b.png'))
    """

    keys: list[str]
    targets: list[int | records.Target]
    payloads: Sequence[Any]
    split: str = ""  # the split the chunk's shard belongs to, for its fingerprint text

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[str, int | records.Target, Any]]:
        return zip(self.keys, self.targets, self.payloads, strict=True)


def encode_chunk(
    items: Iterable[tuple[str, int | records.Target, Any]], spec: ImageSpec, max_pixels: int
) -> list[Encoded]:
    """Hashes, decodes, converts, resizes and encodes a chunk; frames the records.

    Args:
        items: ``(key, label, payload)`` triples (or a :class:`Chunk`); payload is a
            path, an archive :class:`~chute.ingest.sources.members.Member` or an array.
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


def encode_columns(
    chunk: Chunk, spec: ImageSpec, max_pixels: int
) -> tuple[list[bytes | None], list[bytes | None], list[str | None], str]:
    """:func:`encode_chunk`'s outcomes as three lists, digests, records and rejects (a
    worker's reply that the converter unpickles without an object per image), and the
    chunk's :func:`fingerprint_text`.

    Example:
        >>> spec = ImageSpec(2, 2, 1, "raw")
        >>> chunk = Chunk(["a"], [0], np.zeros((1, 2, 2), np.uint8), "train")
        >>> digests, framed, rejects, text = encode_columns(chunk, spec, 100)
        >>> len(digests[0]), rejects, text.count("\\0")
        (32, [None], 4)
    """
    encoded = encode_chunk(chunk, spec, max_pixels)
    digests = [outcome.digest for outcome in encoded]
    shown = ["None" if digest is None else digest.hex() for digest in digests]
    return (
        digests,
        [outcome.record for outcome in encoded],
        [outcome.reject for outcome in encoded],
        fingerprint_text(chunk.keys, chunk.targets, chunk.split, shown),
    )


def fingerprint_text(
    keys: Sequence[str], targets: Sequence[Any], split: str, digests: Sequence[str]
) -> str:
    """What a conversion's source fingerprint hashes of each image, in order: its key,
    target, split and content sha256 (hex, or ``"None"``), each ended by a NUL (no key
    or label holds one, so no two inputs hash alike).

    Example:
        >>> fingerprint_text(["a/1.png"], [3], "val", ["None"])
        'a/1.png\\x003\\x00val\\x00None\\x00'
    """
    return "".join(
        f"{key}\0{target}\0{split}\0{digest}\0"
        for key, target, digest in zip(keys, targets, digests, strict=True)
    )


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
