"""From an image file (or array) to model pixels: read the header, decode, convert, resize.

The one place where an input image becomes the pixels a model sees: ``chute
convert`` stores them (see :mod:`chute.ingest.encode`) and ``predict``
feeds them to a model, so both see the same pixels. Nothing here imports
TensorFlow: this runs in worker processes that start in a fraction of a
second.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from typing import Any, NamedTuple

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from chute.format import storage
from chute.format.spec import ImageSpec
from chute.ingest.options import DEFAULT_MAX_PIXELS
from chute.ingest.sources.members import Member, MemberError, open_member, read_member

cv2.setNumThreads(1)  # parallelism comes from worker processes
_FILTERS = {
    "nearest": cv2.INTER_NEAREST_EXACT,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
    "lanczos": cv2.INTER_LANCZOS4,
}
_ORIENTATION = 0x0112
_EXIF_FORMATS = frozenset({"JPEG", "MPO", "TIFF", "WEBP"})
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


class Probe(NamedTuple):
    """What a header tells about one item, without decoding its pixels."""

    reject: str | None  # why the item cannot be used, or None
    grayscale: bool
    height: int  # after EXIF orientation
    width: int
    format: str  # Pillow's format name ("PNG", "JPEG", ...), "ARRAY" for arrays
    nbytes: int


class Rejected(Exception):
    """An input that cannot be converted; the message is the reason."""


def _open(source: bytes | Any, max_pixels: int) -> Image.Image:
    """Opens (bytes or a file object) and checks the header; pixels stay undecoded."""
    if isinstance(source, bytes):
        if not source:
            raise Rejected("empty file (0 bytes)")
        source = io.BytesIO(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = Image.open(source)
    except UnidentifiedImageError:
        raise Rejected("not an image Pillow can identify") from None
    except Image.DecompressionBombError as error:  # Pillow's own guard (outside workers)
        raise Rejected(f"too many pixels: {error}") from None
    except MemberError as reason:  # the archive's data, not the image's header, is damaged
        raise Rejected(str(reason)) from None
    except Exception as error:  # untrusted bytes: any parser failure is a bad file
        raise Rejected(f"unreadable image header: {_describe(error)}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise Rejected(
            f"too many pixels: {width}x{height} = {width * height} > max_pixels {max_pixels}"
        )
    return image


def _orientation(image: Image.Image) -> int:
    # Image.getexif() on a PNG without an eXIf chunk in its header decodes the
    # whole image to look further; only ask where an orientation can be.
    if image.format not in _EXIF_FORMATS and "exif" not in image.info:
        return 1
    try:
        return int(image.getexif().get(_ORIENTATION, 1))
    except Exception:  # a broken EXIF block is not worth rejecting the image for
        return 1


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
    try:
        return storage.read_bytes(payload)
    except OSError as error:
        raise Rejected(f"cannot read file: {error.strerror or error}") from None


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
                return _probe_header(handle, size, max_pixels)  # reads the header only
        if storage.is_local(payload):
            with open(storage.local_path(payload), "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                return _probe_header(handle, size, max_pixels)  # reads the header only
        data = read(payload)
        return _probe_header(io.BytesIO(data), len(data), max_pixels)
    except OSError as error:
        return Probe(f"cannot read file: {error.strerror or error}", False, 0, 0, "", 0)
    except (Rejected, MemberError) as reason:
        return Probe(str(reason), False, 0, 0, "", 0)
    except Exception as error:  # untrusted bytes: any failure rejects this file only
        return Probe(f"unreadable image header: {_describe(error)}", False, 0, 0, "", 0)


def _describe(error: BaseException) -> str:
    """An exception as one short line: its type and message."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


def _probe_header(handle: Any, size: int, max_pixels: int) -> Probe:
    if size == 0:
        raise Rejected("empty file (0 bytes)")
    image = _open(handle, max_pixels)
    width, height = image.size
    if _orientation(image) in (5, 6, 7, 8):
        width, height = height, width
    gray = image.mode in _GRAY_MODES or (image.mode == "P" and _palette_is_gray(image))
    return Probe(None, gray, height, width, image.format or "?", size)


def _palette_is_gray(image: Image.Image) -> bool:
    palette = image.getpalette() or []
    rgb = np.asarray(palette[: len(palette) // 3 * 3]).reshape(-1, 3)
    return bool(len(rgb)) and bool((rgb == rgb[:, :1]).all())


def to_channels(image: Image.Image, channels: int) -> Image.Image:
    """Converts any Pillow mode (CMYK, palette, alpha, 16-bit, ...) to L or RGB.

    Alpha is dropped, as Keras's loaders do; 16-bit data is scaled to 8 bits.
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


def resize(
    pixels: np.ndarray, height: int, width: int, mode: str, interpolation: str
) -> np.ndarray:
    """Resizes HxW or HxWx3 uint8 pixels to ``(height, width)``.

    ``crop`` first cuts the centred window of the target aspect ratio,
    ``pad`` first pads with black to it, ``stretch`` ignores the aspect ratio
    (Keras's ``crop_to_aspect_ratio`` and ``pad_to_aspect_ratio``). The
    resampling is OpenCV's; for nearest, bilinear and area it computes what
    ``tf.image.resize`` does (no antialiasing, half-pixel centres), so the
    images match the ones Keras's own loaders produce.
    """
    src_h, src_w = pixels.shape[:2]
    if mode != "stretch" and src_w * height != src_h * width:
        if (src_w * height > src_h * width) == (mode == "crop"):
            # crop: too wide -> narrow the window; pad: too tall -> widen the canvas
            new_w, new_h = max(1, round(src_h * width / height)), src_h
        else:
            new_w, new_h = src_w, max(1, round(src_w * height / width))
        if mode == "crop":
            left, top = (src_w - new_w) // 2, (src_h - new_h) // 2
            pixels = pixels[top : top + new_h, left : left + new_w]
        else:
            canvas = np.zeros((new_h, new_w, *pixels.shape[2:]), np.uint8)
            left, top = (new_w - src_w) // 2, (new_h - src_h) // 2
            canvas[top : top + src_h, left : left + src_w] = pixels
            pixels = canvas
    if pixels.shape[:2] == (height, width):
        return pixels
    return cv2.resize(
        np.ascontiguousarray(pixels), (width, height), interpolation=_FILTERS[interpolation]
    )


def stored_size(spec: ImageSpec, height: int, width: int) -> tuple[int, int] | None:
    """``(height, width)`` at which ``spec`` stores an upright image of ``height x width``;
    None when it is kept at its own size.

    Example:
        >>> stored_size(ImageSpec(None, None, 3, "jpeg", shorter_side=256), 1000, 1500)
        (256, 384)
    """
    if spec.fixed_size:
        return spec.height, spec.width
    if spec.shorter_side and min(height, width) > spec.shorter_side:
        scale = spec.shorter_side / min(height, width)
        return max(1, round(height * scale)), max(1, round(width * scale))
    return None


def _decoded_size(spec: ImageSpec, height: int, width: int) -> tuple[int, int] | None:
    """The least ``(height, width)`` the decoder must return for an upright image of
    ``height x width``: the source at the scale :func:`resize` brings it to (with
    ``crop``, the centred window reaches the target; with ``pad``, the whole image
    fits it). None when no resize follows."""
    target = stored_size(spec, height, width)
    if target is None:
        return None
    if not spec.fixed_size or spec.resize == "stretch":
        return target
    pick = max if spec.resize == "crop" else min
    scale = pick(target[0] / height, target[1] / width)
    return math.ceil(height * scale), math.ceil(width * scale)


def _png_has_chunk(data: bytes, types: tuple[bytes, ...]) -> bool:
    """Whether a PNG has a chunk of one of ``types`` (or a chunk list that does not add up).

    Walks the chunk headers: a few per file, cheaper than searching the bytes
    (and a type's letters inside compressed data are not a chunk).
    """
    position, end = 8, len(data)
    while position + 8 <= end:
        length = int.from_bytes(data[position : position + 4], "big")
        kind = data[position + 4 : position + 8]
        if kind in types:
            return True
        if kind == b"IEND":
            return False
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
    if bit_depth != 8 or color_type != wanted or width * height > max_pixels:
        return None
    if _png_has_chunk(data, (b"eXIf", b"tRNS")):  # orientation or transparency: Pillow decides
        return None
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if pixels is None or pixels.shape[:2] != (height, width):
        return None
    return pixels if spec.channels == 1 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def _load(payload: Any, spec: ImageSpec, max_pixels: int) -> tuple[Image.Image, bytes | None]:
    """Decodes an item; also returns the original bytes when they can be stored as is."""
    if isinstance(payload, np.ndarray):
        return Image.fromarray(np.ascontiguousarray(payload)), None  # L, RGB or RGBA
    data = None
    if isinstance(payload, Image.Image):
        image = payload
    else:
        data = payload if isinstance(payload, bytes) else read(payload, max_pixels)
        image = _open(data, max_pixels)
    orientation = _orientation(image)
    # an upright JPEG kept at its size, in the right mode, is stored untouched
    keep = (
        orientation == 1
        and image.format == "JPEG"
        and spec.encoding == "jpeg"
        and stored_size(spec, image.height, image.width) is None
    )
    if image.format == "JPEG":
        _scale_while_decoding(image, spec, orientation)
    try:
        image.load()  # full decode: truncated and corrupt data fail here
    except Exception as error:  # untrusted bytes: any decoder failure is a bad file
        raise Rejected(f"corrupt or truncated image data: {error}") from None
    if orientation != 1:
        image = ImageOps.exif_transpose(image)
    original = data if keep else None
    if original is not None and not spec.keep_metadata:
        original = strip_jpeg_metadata(original)  # None when it is not well formed
    return image, original


# Segments kept when stripping: APP0 (JFIF), APP2 (ICC colour profile), APP14 (Adobe
# colour transform) and everything that is not APPn or a comment (the image itself).
_KEPT_APPS = frozenset({0xE0, 0xE2, 0xEE})


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


def _scale_while_decoding(image: Image.Image, spec: ImageSpec, orientation: int) -> None:
    """Asks libjpeg for a DCT-domain downscaled decode (1/2, 1/4 or 1/8) that is still
    at least as large as what the resize that follows needs (Pillow's ``draft``).

    Decoding a camera photo at 1/4 or 1/8 scale is several times less work than a
    full decode; the exact resize to the stored size follows as usual.
    """
    width, height = image.size
    sideways = orientation in (5, 6, 7, 8)  # the stored frame is the upright one turned
    upright = (width, height) if sideways else (height, width)
    needed = _decoded_size(spec, *upright)
    if needed is None:
        return
    needed_height, needed_width = needed
    if sideways:
        needed_height, needed_width = needed_width, needed_height
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
        payload: a path (local or TF filesystem), an archive
            :class:`~chute.ingest.sources.members.Member`, the file's bytes, a pixel
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
        >>> load_pixels("glyph.png", spec)[0].shape  # doctest: +SKIP
        (75, 75)
    """
    try:
        original = None
        pixels = _png_fast(payload, spec, max_pixels) if isinstance(payload, bytes) else None
        if pixels is None:
            image, original = _load(payload, spec, max_pixels)
            if image.mode != ("L" if spec.channels == 1 else "RGB"):
                original = None  # the stored JPEG must already be in the target mode
            pixels = np.asarray(to_channels(image, spec.channels))
        if spec.fixed_size:
            pixels = resize(pixels, spec.height, spec.width, spec.resize, spec.interpolation)
        elif (size := stored_size(spec, *pixels.shape[:2])) is not None:  # shorter side capped
            pixels = resize(pixels, *size, "stretch", spec.interpolation)
    except Rejected:
        raise
    except Exception as error:  # untrusted images: a failure rejects this one only
        raise Rejected(f"cannot convert image: {error}") from None
    return pixels, original
