"""From an image file (or array) to model pixels: decode, orient, convert, resize.

The one place where an input image becomes the pixels a model sees: ``chute
convert`` stores them and ``predict`` feeds them to a model, so both see the
same pixels. Camera JPEGs are decoded at a reduced scale when the resize that
follows allows it (libjpeg's DCT-domain downscaling). Nothing here imports
TensorFlow: this runs in worker processes that start in a fraction of a
second.
"""

from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO

import cv2
import numpy as np
from PIL import Image, ImageOps

from chute.format import storage
from chute.format.spec import ImageSpec
from chute.image.encode import strip_jpeg_metadata
from chute.image.header import Rejected, open_image, orientation
from chute.image.resize import decoded_size, resize, stored_size
from chute.image.size import DEFAULT_MAX_PIXELS

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # (not on Windows, which has no named pipes to open)
_BINARY = getattr(os, "O_BINARY", 0)


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of an image file (local or on a TF filesystem).

    Raises:
        Rejected: the file cannot be read (the message says why).

    Example:
        >>> read_file("/no/such/file.png")
        Traceback (most recent call last):
        ...
        chute.image.header.Rejected: cannot read file: No such file or directory
    """
    try:
        if storage.is_local(os.fspath(path)):
            with open_local(os.fspath(path), buffering=0) as handle:
                return handle.readall()
        return storage.read_bytes(path)
    except OSError as error:
        raise Rejected(f"cannot read file: {error.strerror or error}") from None


def open_local(path: str, buffering: int = -1) -> BinaryIO:
    """Local file ``path`` open for reading, if it is a regular file (a symlink to one
    too): a named pipe named like an image would block its ``open()`` for ever, a device
    stream without end. Opened without blocking, then checked, so nothing is read first.

    Raises:
        Rejected: not a regular file (the message says what it is).
        OSError: it cannot be opened.

    Example:
        >>> open_local("/dev/null")
        Traceback (most recent call last):
        ...
        chute.image.header.Rejected: not a regular file: a character device
    """
    fd = os.open(storage.local_path(path), os.O_RDONLY | _NONBLOCK | _BINARY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Rejected(f"not a regular file: {_kind(mode)}")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a named pipe (FIFO)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
        stat.S_ISDIR: "a folder",
    }
    return next((name for test, name in kinds.items() if test(mode)), "a special file")


def to_channels(image: Image.Image, channels: int) -> Image.Image:
    """Converts any Pillow mode (CMYK, palette, alpha, 16-bit, ...) to L or RGB.

    Alpha is dropped, as Keras's loaders do; 16-bit data is scaled to 8 bits.

    Example:
        >>> to_channels(Image.new("RGBA", (2, 2)), 1).mode
        'L'
        >>> to_channels(Image.new("I;16", (2, 2)), 3).mode
        'RGB'
    """
    if image.mode.startswith("I") or image.mode == "F":
        pixels = np.asarray(image)
        if image.mode.startswith("I;16") or pixels.max(initial=0) > 255:
            pixels = pixels.astype(np.float64) / 257.0  # 0..65535 -> 0..255
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "L")
    if channels == 1:
        if image.mode not in ("L", "1", "LA", "RGB"):
            image = image.convert("RGBA" if image.mode in ("P", "PA") else "RGB")
        return image if image.mode == "L" else image.convert("L")
    return image if image.mode == "RGB" else image.convert("RGB")


def _png_has_chunk(data: bytes, types: tuple[bytes, ...]) -> bool:
    """Whether a PNG has a chunk of one of ``types`` (or a chunk list that does not add up).

    Walks the chunk headers: a few per file, cheaper than searching the bytes
    (and a type's letters inside compressed data are not a chunk).
    """
    # 8: past the PNG signature, at the first chunk.
    position, end = 8, len(data)
    while position + 8 <= end:
        length = int.from_bytes(data[position : position + 4], "big")
        kind = data[position + 4 : position + 8]
        if kind in types:
            return True
        if kind == b"IEND":
            return False
        # 12: the chunk's length, type and CRC around its data.
        position += 12 + length
    return True  # truncated or malformed: let Pillow look at it


def _png_fast(data: bytes, spec: ImageSpec, max_pixels: int) -> np.ndarray | None:
    """Decodes a plain 8-bit grayscale or RGB PNG that needs no conversion with
    OpenCV (faster than Pillow here, and lossless either way: same pixels).

    Returns None for anything else (other modes, bit depths, EXIF, bad data),
    which then takes the Pillow path with its full checks and messages.
    """
    if len(data) < 33 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    bit_depth, color_type = data[24], data[25]
    wanted = {1: 0, 3: 2}[spec.channels]  # PNG colour type 0: grayscale, 2: RGB
    # Anything unusual, or too large, goes to Pillow, whose checks give the reject messages.
    if bit_depth != 8 or color_type != wanted or width * height > max_pixels:
        return None
    if _png_has_chunk(data, (b"eXIf", b"tRNS")):  # orientation or transparency: Pillow decides
        return None
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if pixels is None or pixels.shape[:2] != (height, width):
        return None
    return pixels if spec.channels == 1 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def _array_as_is(pixels: np.ndarray, channels: int) -> np.ndarray | None:
    """A uint8 pixel array already in the stored mode (``(H, W)`` for one channel,
    ``(H, W, 3)`` for three) as it is, without a round trip through Pillow (the same
    pixels; about 30 us an image, most of a tiny raw image's conversion); None otherwise."""
    if pixels.dtype != np.uint8:
        return None
    if (channels == 1 and pixels.ndim == 2) or (
        channels == 3 and pixels.ndim == 3 and pixels.shape[-1] == 3
    ):
        return np.ascontiguousarray(pixels)
    return None


def _load(payload: Any, spec: ImageSpec, max_pixels: int) -> tuple[Image.Image, bytes | None]:
    """Decodes an item; also returns the original bytes when they can be stored as is."""
    if isinstance(payload, np.ndarray):
        return Image.fromarray(np.ascontiguousarray(payload)), None  # L, RGB or RGBA
    data = None
    if isinstance(payload, Image.Image):
        image = payload
    else:
        data = payload if isinstance(payload, bytes) else read_file(payload)
        image = open_image(data, max_pixels)
    exif_orientation = orientation(image)
    # an upright JPEG kept at its size, in the right mode, is stored untouched
    keep = (
        exif_orientation == 1
        and image.format == "JPEG"
        and spec.encoding == "jpeg"
        and stored_size(spec, image.height, image.width) is None
    )
    if image.format == "JPEG":
        _scale_while_decoding(image, spec, exif_orientation)
    try:
        image.load()  # full decode: truncated and corrupt data fail here
    except Exception as error:  # untrusted bytes: any decoder failure is a bad file
        raise Rejected(f"corrupt or truncated image data: {error}") from None
    # After the decode: the draft above was sized for the frame as stored, turned or not.
    if exif_orientation != 1:
        image = ImageOps.exif_transpose(image)
    original = data if keep else None
    if original is not None and not spec.keep_metadata:
        original = strip_jpeg_metadata(original)  # None when it is not well formed
    return image, original


def _scale_while_decoding(image: Image.Image, spec: ImageSpec, exif_orientation: int) -> None:
    """Asks libjpeg for a DCT-domain downscaled decode (1/2, 1/4 or 1/8) that is still
    at least as large as what the resize that follows needs (Pillow's ``draft``).

    Decoding a camera photo at 1/4 or 1/8 scale is several times less work than a
    full decode; the exact resize to the stored size follows as usual.
    """
    width, height = image.size
    sideways = exif_orientation in (5, 6, 7, 8)  # the stored frame is the upright one turned
    upright = (width, height) if sideways else (height, width)
    needed = decoded_size(spec, *upright)
    if needed is None:
        return
    needed_height, needed_width = needed
    if sideways:
        needed_height, needed_width = needed_width, needed_height
    # Only when at least a halving fits: draft's scales are 1/2, 1/4 and 1/8.
    if needed_width * 2 <= width and needed_height * 2 <= height:
        image.draft(image.mode, (needed_width, needed_height))


def load_pixels(
    payload: Any, spec: ImageSpec, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray, bytes | None]:
    """One item as ``spec`` stores it: decoded, upright, converted and resized.

    The single place where an input image becomes model pixels: ``chute
    convert`` stores them, and prediction feeds them to a model, so both see
    the same pixels.

    Args:
        payload: a path (local or TF filesystem), the file's bytes, a pixel
            array, or a Pillow image.
        spec: size, channels, resize mode and interpolation (``height`` None:
            the image keeps its size).
        max_pixels: larger images are rejected.

    Returns:
        ``(pixels, original)``: uint8 pixels, ``(H, W)`` for one channel or
        ``(H, W, 3)``; and the file's bytes when they can be stored unchanged
        (an upright JPEG kept at its size as JPEG), else None.

    Raises:
        Rejected: the item cannot be read, decoded or converted (the message says why).

    Example:
        >>> spec = ImageSpec(height=75, width=75, channels=1, encoding="raw")
        >>> load_pixels(np.zeros((150, 100, 3), np.uint8), spec)[0].shape
        (75, 75)
        >>> load_pixels("glyph.png", spec)[0].shape  # doctest: +SKIP
        (75, 75)
    """
    try:
        original = None
        pixels = _png_fast(payload, spec, max_pixels) if isinstance(payload, bytes) else None
        if isinstance(payload, np.ndarray):
            pixels = _array_as_is(payload, spec.channels)
        if pixels is None:
            image, original = _load(payload, spec, max_pixels)
            if image.mode != ("L" if spec.channels == 1 else "RGB"):
                original = None  # the stored JPEG must already be in the target mode
            pixels = np.asarray(to_channels(image, spec.channels))
        if spec.fixed_size:
            pixels = resize(pixels, spec.height, spec.width, spec.resize, spec.interpolation)
        elif (size := stored_size(spec, *pixels.shape[:2])) is not None:  # shorter side capped
            pixels = resize(pixels, *size, "stretch", spec.interpolation)
    # Already a reject with its reason: not wrapped again.
    except Rejected:
        raise
    except Exception as error:  # untrusted images: a failure rejects this one only
        raise Rejected(f"cannot convert image: {error}") from None
    return pixels, original
