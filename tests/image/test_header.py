"""Image headers: what opening an image checks, and whose reason a refusal gives."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from chute.image.header import Rejected, open_image, probe_header


def _png(size=(4, 3), mode="L") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format="PNG")
    return buffer.getvalue()


class _Failing(io.RawIOBase):
    """A file object whose reads fail with ``error`` (an archive member's damaged data)."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise self.error


def test_a_header_is_read_without_decoding_the_pixels():
    image = open_image(_png((40, 30)))
    assert image.size == (40, 30) and image.format == "PNG"
    assert probe_header(io.BytesIO(_png((5, 2), "RGB")), 100, 10**6)[:5] == (
        None,
        False,
        2,
        5,
        "PNG",
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file (0 bytes)"),
        (b"not an image at all", "not an image Pillow can identify"),
        (_png((40, 30)), "too many pixels: 40x30 = 1200 > max_pixels 1000"),
    ],
)
def test_what_is_refused_and_why(data, reason):
    with pytest.raises(Rejected) as caught:
        open_image(data, 1000)
    assert str(caught.value) == reason


def test_a_reason_from_the_file_object_is_kept_other_failures_are_described():
    with pytest.raises(Rejected, match=r"^corrupt archive member: bad CRC$"):
        open_image(_Failing(Rejected("corrupt archive member: bad CRC")))
    with pytest.raises(Rejected, match=r"^unreadable image header: OSError: disk gone$"):
        open_image(_Failing(OSError("disk gone")))
