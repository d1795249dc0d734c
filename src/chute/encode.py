"""Pillow work done in worker processes: probe and encode images.

Nothing here imports TensorFlow, so worker processes start in a fraction of
a second. Both entry points take a chunk of items and return one result per
chunk, which keeps inter-process traffic low; results depend only on the
inputs, so output is the same whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import warnings
from typing import Any, NamedTuple

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from chute import records, storage

# We enforce our own pixel limit (ImageSpec.max_pixels) and reject, rather
# than letting Pillow warn or raise at its built-in one.
Image.MAX_IMAGE_PIXELS = None

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
    """What the first pass learns about one item without decoding its pixels."""

    digest: bytes | None  # sha256 of the file (or of the array's shape and pixels)
    reject: str | None  # why the item cannot be used, or None
    grayscale: bool
    height: int  # after EXIF orientation
    width: int
    format: str  # Pillow's format name ("PNG", "JPEG", ...), "ARRAY" for arrays
    nbytes: int


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How every image of a conversion is stored.

    ``height``/``width`` are ``None`` when images keep their own size.
    """

    height: int | None
    width: int | None
    channels: int
    encoding: str
    quality: int = 90
    resize: str = "stretch"
    interpolation: str = "bilinear"
    max_pixels: int = 89_478_485


class Rejected(Exception):
    """An input that cannot be converted; the message is the reason."""


def _open(data: bytes, max_pixels: int) -> Image.Image:
    if not data:
        raise Rejected("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise Rejected("not an image Pillow can identify") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise Rejected(f"unreadable image header: {error}") from None
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


def _read(path: str) -> bytes:
    try:
        return storage.read_bytes(path)
    except OSError as error:
        raise Rejected(f"cannot read file: {error.strerror or error}") from None


def probe_chunk(payloads: list[Any], max_pixels: int, header: bool = True) -> list[Probe]:
    """Hashes and probes a chunk of items (paths or pixel arrays).

    With ``header=False`` files are only read and hashed (enough for
    deduplication when the options leave nothing to decide from the images);
    bad images are then caught when they are encoded.
    """
    return [_probe(payload, max_pixels, header) for payload in payloads]


def _probe(payload: Any, max_pixels: int, header: bool = True) -> Probe:
    if isinstance(payload, np.ndarray):
        digest = hashlib.sha256(str(payload.shape).encode() + payload.tobytes()).digest()
        gray = payload.ndim == 2
        return Probe(
            digest, None, gray, payload.shape[0], payload.shape[1], "ARRAY", payload.nbytes
        )
    try:
        data = _read(payload)
        if not data:
            raise Rejected("empty file (0 bytes)")
        digest = hashlib.sha256(data).digest()
        if not header:
            return Probe(digest, None, False, 0, 0, "", len(data))
        image = _open(data, max_pixels)
        width, height = image.size
        if _orientation(image) in (5, 6, 7, 8):
            width, height = height, width
        gray = image.mode in _GRAY_MODES or (image.mode == "P" and _palette_is_gray(image))
        return Probe(digest, None, gray, height, width, image.format or "?", len(data))
    except Rejected as reason:
        return Probe(None, str(reason), False, 0, 0, "", 0)


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
    image: Image.Image, height: int, width: int, mode: str, interpolation: str
) -> np.ndarray:
    """Resizes to ``(height, width)`` pixels (HxW or HxWx3 uint8).

    ``crop`` first cuts the centred window of the target aspect ratio,
    ``pad`` first pads with black to it, ``stretch`` ignores the aspect ratio
    (Keras's ``crop_to_aspect_ratio`` and ``pad_to_aspect_ratio``). The
    resampling is OpenCV's; for nearest, bilinear and area it computes what
    ``tf.image.resize`` does (no antialiasing, half-pixel centres), so the
    images match the ones Keras's own loaders produce.
    """
    src_w, src_h = image.size
    if mode != "stretch" and src_w * height != src_h * width:
        if (src_w * height > src_h * width) == (mode == "crop"):
            # crop: too wide -> narrow the window; pad: too tall -> widen the canvas
            new_w, new_h = max(1, round(src_h * width / height)), src_h
        else:
            new_w, new_h = src_w, max(1, round(src_w * height / width))
        if mode == "crop":
            left, top = (src_w - new_w) // 2, (src_h - new_h) // 2
            image = image.crop((left, top, left + new_w, top + new_h))
        else:
            canvas = Image.new(image.mode, (new_w, new_h), 0)
            canvas.paste(image, ((new_w - src_w) // 2, (new_h - src_h) // 2))
            image = canvas
    pixels = np.asarray(image)
    if pixels.shape[:2] == (height, width):
        return pixels
    return cv2.resize(pixels, (width, height), interpolation=_FILTERS[interpolation])


def _load(payload: Any, spec: ImageSpec) -> tuple[Image.Image, bytes | None]:
    """Decodes an item; also returns the original bytes when they can be stored as is."""
    if isinstance(payload, np.ndarray):
        return Image.fromarray(np.ascontiguousarray(payload)), None  # L, RGB or RGBA
    data = _read(payload)
    image = _open(data, spec.max_pixels)
    try:
        image.load()  # full decode: truncated and corrupt data fail here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise Rejected(f"corrupt or truncated image data: {error}") from None
    original = None
    orientation = _orientation(image)
    if orientation != 1:
        image = ImageOps.exif_transpose(image)
    elif image.format == "JPEG" and spec.encoding == "jpeg" and spec.height is None:
        original = data  # keep_size: an upright JPEG in the right mode is stored untouched
    return image, original


def encode_chunk(
    items: list[tuple[str, int, Any]], spec: ImageSpec
) -> tuple[bytes, list[int], list[tuple[str, str]]]:
    """Decodes, converts, resizes and encodes a chunk; frames the records.

    Args:
        items: ``(key, label, payload)`` triples; payload is a path or an array.
        spec: how to store the images.

    Returns:
        ``(framed_records, labels_written, [(key, reject_reason), ...])``.
    """
    out = bytearray()
    labels: list[int] = []
    rejects: list[tuple[str, str]] = []
    for key, label, payload in items:
        try:
            out += encode_one(key, label, payload, spec)
            labels.append(label)
        except Rejected as reason:
            rejects.append((key, str(reason)))
    return bytes(out), labels, rejects


def encode_one(key: str, label: int, payload: Any, spec: ImageSpec) -> bytes:
    """The framed record of one item (raises :class:`Rejected` for bad input)."""
    try:
        image, original = _load(payload, spec)
        mode_ok = image.mode == ("L" if spec.channels == 1 else "RGB")
        image = to_channels(image, spec.channels)
        if spec.height is not None and spec.width is not None:
            pixels = resize(image, spec.height, spec.width, spec.resize, spec.interpolation)
        else:
            pixels = np.asarray(image)
        height, width = pixels.shape[:2]
        if original is not None and mode_ok:
            data = original
        elif spec.encoding == "raw":
            data = pixels.tobytes()
        else:
            buffer = io.BytesIO()
            if spec.encoding == "png":
                Image.fromarray(pixels).save(buffer, format="PNG", compress_level=6)
            else:
                Image.fromarray(pixels).save(buffer, format="JPEG", quality=spec.quality)
            data = buffer.getvalue()
    except Rejected:
        raise
    except (OSError, ValueError, SyntaxError, MemoryError) as error:
        raise Rejected(f"cannot convert image: {error}") from None
    return records.image_example(
        image=data,
        label=label,
        height=height,
        width=width,
        channels=spec.channels,
        encoding=spec.encoding,
        key=key,
    )
