"""An input item's bytes and header: read a path or an archive member, probe its header.

What a conversion reads from its sources before the image itself is prepared
(by :mod:`chute.image`): :func:`read` gives the bytes of a file or of an
archive member, :func:`probe_chunk` what the headers of a chunk of items tell
(size, grayscale, format), in worker processes. Nothing here imports
TensorFlow.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from chute.format import storage
from chute.image.decode import open_local, read_file
from chute.image.header import Probe, Rejected, describe_error, probe_header
from chute.image.size import DEFAULT_MAX_PIXELS
from chute.ingest.sources.members import Member, MemberError, open_member, read_member


def read(payload: str | Member, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The bytes of an image file (a path) or of an archive member: where every input
    file is read. ``max_pixels`` bounds what a member may hold (see
    :mod:`chute.ingest.sources.members`).

    Raises:
        Rejected: the file cannot be read (the message says why).

    Example:
        >>> read(Member("data.zip", "zip", "cats/1.png", 0, 912))[:4]  # doctest: +SKIP
        b'\\x89PNG'
    """
    if isinstance(payload, Member):
        try:
            return read_member(payload, max_pixels)
        except MemberError as reason:
            raise Rejected(str(reason)) from None
    return read_file(payload)


def probe_chunk(payloads: list[Any], max_pixels: int) -> list[Probe]:
    """Reads the headers of a chunk of items (paths, archive members or pixel arrays),
    not their pixels."""
    return [_probe(payload, max_pixels) for payload in payloads]


def _probe(payload: Any, max_pixels: int) -> Probe:
    if isinstance(payload, np.ndarray):
        gray = payload.ndim == 2
        return Probe(None, gray, payload.shape[0], payload.shape[1], "ARRAY", payload.nbytes)
    try:
        if isinstance(payload, Member):
            with open_member(payload, max_pixels) as (handle, size):
                return probe_header(handle, size, max_pixels)  # reads the header only
        if storage.is_local(payload):
            with open_local(payload) as handle:  # a regular file only: a FIFO blocks
                size = os.fstat(handle.fileno()).st_size
                return probe_header(handle, size, max_pixels)  # reads the header only
        data = read(payload)
        return probe_header(io.BytesIO(data), len(data), max_pixels)
    except OSError as error:
        return Probe(f"cannot read file: {error.strerror or error}", False, 0, 0, "", 0)
    except (Rejected, MemberError) as reason:
        return Probe(str(reason), False, 0, 0, "", 0)
    except Exception as error:  # untrusted bytes: any failure rejects this file only
        return Probe(f"unreadable image header: {describe_error(error)}", False, 0, 0, "", 0)
