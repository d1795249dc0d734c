"""Pixels to stored bytes: the encodings, and lossless JPEG metadata stripping."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from chute.format.spec import ImageSpec
from chute.image.encode import stored_bytes, strip_jpeg_metadata


@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg"])
def test_stored_bytes_decode_to_the_pixels(encoding):
    pixels = np.tile(np.arange(0, 240, 15, dtype=np.uint8), (8, 1))
    data = stored_bytes(pixels, None, ImageSpec(8, 16, 1, encoding, quality=100))
    if encoding == "raw":
        back = np.frombuffer(data, np.uint8).reshape(pixels.shape)
    else:
        back = np.asarray(Image.open(io.BytesIO(data)))
    assert np.abs(back.astype(int) - pixels.astype(int)).max() <= (2 if encoding == "jpeg" else 0)
    assert stored_bytes(pixels, b"as it came", ImageSpec(8, 16, 1, encoding)) == b"as it came"


def test_stripping_keeps_every_image_segment_of_baseline_and_progressive_jpegs():
    pixels = np.random.default_rng(1).integers(0, 256, (17, 23, 3), dtype=np.uint8)
    for progressive in (False, True):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", progressive=progressive)
        plain = buffer.getvalue()
        assert strip_jpeg_metadata(plain) == plain  # nothing to strip
        assert strip_jpeg_metadata(plain + b"junk") == plain
    assert strip_jpeg_metadata(plain[:40]) is None  # cut inside a segment
