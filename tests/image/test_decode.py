"""From a file to model pixels: the same pixels from a path, bytes, an array or a Pillow
image; why a file is refused; the PNG chunk walk that picks OpenCV's fast path."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import write_image
from PIL import Image

from chute.format.spec import ImageSpec
from chute.image import decode as image_decode
from chute.image.decode import load_pixels
from chute.image.header import Rejected


@pytest.mark.parametrize("channels", [1, 3])
def test_every_kind_of_payload_gives_the_same_pixels(tmp_path, channels):
    pixels = np.random.default_rng(channels).integers(0, 256, (12, 9, 3), dtype=np.uint8)
    path = write_image(tmp_path / "x.png", pixels)
    spec = ImageSpec(6, 6, channels, "raw", resize="crop", interpolation="area")
    expected, original = load_pixels(str(path), spec)
    assert expected.shape == ((6, 6) if channels == 1 else (6, 6, 3)) and original is None
    for payload in (path.read_bytes(), pixels, Image.open(path)):
        np.testing.assert_array_equal(load_pixels(payload, spec)[0], expected)


def test_unreadable_files_are_refused_with_the_reason(tmp_path):
    spec = ImageSpec(4, 4, 1, "raw")
    with pytest.raises(Rejected, match=r"^cannot read file: "):
        load_pixels(str(tmp_path / "missing.png"), spec)
    (tmp_path / "cut.png").write_bytes(write_image(tmp_path / "x.png").read_bytes()[:60])
    with pytest.raises(Rejected, match=r"corrupt or truncated image data|unreadable image header"):
        load_pixels(str(tmp_path / "cut.png"), spec)


def test_an_upright_jpeg_kept_at_its_size_is_stored_as_it_came_without_metadata(tmp_path):
    path = write_image(tmp_path / "x.jpg", mode="RGB", comment=b"a note")
    pixels, original = load_pixels(str(path), ImageSpec(None, None, 3, "jpeg"))
    assert pixels.shape == (12, 10, 3)
    assert original is not None and b"a note" in path.read_bytes() and b"a note" not in original
    _, kept = load_pixels(str(path), ImageSpec(None, None, 3, "jpeg", keep_metadata=True))
    assert kept == path.read_bytes()


def _chunk(kind: bytes, body: bytes = b"") -> bytes:
    import zlib

    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def test_png_chunk_walk_finds_chunk_types_not_their_letters():
    ihdr = _chunk(b"IHDR", bytes(13))
    signature = b"\x89PNG\r\n\x1a\n"
    texted = signature + ihdr + _chunk(b"tEXt", b"note\0tRNS eXIf") + _chunk(b"IEND")
    assert not image_decode._png_has_chunk(texted, (b"eXIf", b"tRNS"))
    with_trns = signature + ihdr + _chunk(b"tRNS", bytes(6)) + _chunk(b"IEND")
    assert image_decode._png_has_chunk(with_trns, (b"eXIf", b"tRNS"))
    after_data = signature + ihdr + _chunk(b"IDAT", b"x") + _chunk(b"eXIf", b"y") + _chunk(b"IEND")
    assert image_decode._png_has_chunk(after_data, (b"eXIf", b"tRNS"))
    assert image_decode._png_has_chunk(texted[:-20], (b"eXIf",))  # truncated: Pillow decides


def test_arrays_in_the_stored_mode_skip_the_round_trip_through_pillow(monkeypatch):
    """A pixel array already in the stored mode is taken as it is (a round trip through
    Pillow cost 30 us an image, 3/4 of a tiny raw image's conversion); the same pixels
    come out, and arrays in another mode still go through Pillow's conversion."""
    from chute.image import decode as decode_lib

    rng = np.random.default_rng(0)
    gray, rgb = rng.integers(0, 255, (9, 7), np.uint8), rng.integers(0, 255, (9, 7, 3), np.uint8)
    rgba = rng.integers(0, 255, (9, 7, 4), np.uint8)
    one, three = (ImageSpec(None, None, channels=c, encoding="raw") for c in (1, 3))
    expected = [load_pixels(a, spec)[0] for a, spec in ((gray, one), (rgb, three))]
    converted = load_pixels(rgba, three)[0]

    def no_pillow(*args, **kwargs):
        raise AssertionError("an array in the stored mode went through Pillow")

    monkeypatch.setattr(decode_lib.Image, "fromarray", no_pillow)
    np.testing.assert_array_equal(load_pixels(gray, one)[0], gray)
    np.testing.assert_array_equal(load_pixels(rgb, three)[0], rgb)
    for got, want in zip(expected, (gray, rgb), strict=True):
        np.testing.assert_array_equal(got, want)
    assert converted.shape == (9, 7, 3)
    with pytest.raises(Exception, match="stored mode"):
        load_pixels(rgba, three)  # another mode: Pillow converts it
