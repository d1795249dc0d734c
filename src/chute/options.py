"""The options of a conversion: one frozen, validated dataclass.

Every value is checked when the object is built, before any file is read or
written, and a bad one raises :class:`~chute.errors.ChuteError` naming the
option, the value received and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from chute.errors import ChuteError

RESIZE_MODES = ("stretch", "crop", "pad")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "area", "lanczos")
COLOR_MODES = ("grayscale", "rgb", "auto")
ENCODINGS = ("raw", "png", "jpeg", "auto")
DEFAULT_SHARD_SIZE_MB = 128.0  # the TF performance guide advises 100-200 MB per file
DEFAULT_MIN_SHARDS = 16
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb threshold
DEFAULT_RESIZE = "stretch"
DEFAULT_INTERPOLATION = "bilinear"
DEFAULT_QUALITY = 90


def bad_value(name: str, value: Any, allowed: str) -> ChuteError:
    """Builds the error for option ``name``: what is allowed and what was received."""
    return ChuteError(f"`{name}` must be {allowed}. Received: {name}={value!r}")


def one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """Returns ``value`` if it is one of ``allowed``, else raises a ChuteError."""
    if value not in allowed:
        raise bad_value(name, value, "one of {" + ", ".join(repr(a) for a in allowed) + "}")
    return value


def parse_image_size(value: Any) -> tuple[int, int] | None:
    """Reads ``75``, ``"75"``, ``"75x100"`` or ``(75, 100)`` as ``(height, width)``.

    Example:
        >>> parse_image_size("75x100")
        (75, 100)
    """
    if value is None:
        return None
    allowed = "a positive integer H or 'HxW' (or a (height, width) pair)"
    if isinstance(value, bool):
        raise bad_value("image_size", value, allowed)
    if isinstance(value, int):
        size: tuple[Any, ...] = (value, value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX×,]\s*(\d+)\s*)?", value)
        if not match:
            raise bad_value("image_size", value, allowed)
        size = (int(match[1]), int(match[2] or match[1]))
    elif isinstance(value, tuple | list) and len(value) == 2:
        size = tuple(value)
    else:
        raise bad_value("image_size", value, allowed)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65535 for v in size):
        raise bad_value("image_size", value, allowed + " up to 65535")
    return int(size[0]), int(size[1])


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What a conversion produces. Two runs with equal options on the same source
    write the same bytes.

    Attributes:
        image_size: ``(height, width)`` to resize to; ``None`` keeps the size
            when every image has the same one (an error otherwise, unless
            ``keep_size``). Also accepts ``75`` or ``"75x100"``.
        resize: ``"stretch"`` (ignore aspect ratio), ``"crop"`` (centre crop
            to the target aspect ratio, Keras's ``crop_to_aspect_ratio``) or
            ``"pad"`` (pad with black to it, Keras's ``pad_to_aspect_ratio``).
        interpolation: resampling filter by name. ``nearest``, ``bilinear`` and
            ``area`` compute what ``tf.image.resize`` does (no antialiasing);
            ``bicubic`` and ``lanczos`` are OpenCV's (Keys a=-0.75, Lanczos-4).
        keep_size: store every image at its own size (PNG or JPEG only).
        color_mode: ``"grayscale"``, ``"rgb"`` or ``"auto"`` (grayscale when
            every image is grayscale).
        encoding: ``"raw"`` uint8 pixels, ``"png"``, ``"jpeg"`` or ``"auto"``
            (raw for small images, JPEG for photographs, PNG otherwise).
        quality: JPEG quality, 1-100.
        val_fraction: share of each class held out for validation.
        test_fraction: share of each class held out for testing.
        seed: seed of the split and of the record order.
        shard_size_mb: target size of one shard file.
        min_shards: minimum shards per split; ``None`` means 16 when the split
            has enough images (at least 64 per shard).
        max_pixels: images with more pixels are rejected (decompression bombs).

    Example:
        >>> ConvertOptions(image_size="75", color_mode="grayscale").image_size
        (75, 75)
    """

    image_size: tuple[int, int] | None = None
    resize: str = DEFAULT_RESIZE
    interpolation: str = DEFAULT_INTERPOLATION
    keep_size: bool = False
    color_mode: str = "auto"
    encoding: str = "auto"
    quality: int = DEFAULT_QUALITY
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    seed: int = 1337
    shard_size_mb: float = DEFAULT_SHARD_SIZE_MB
    min_shards: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))
        one_of("resize", self.resize, RESIZE_MODES)
        one_of("interpolation", self.interpolation, INTERPOLATIONS)
        one_of("color_mode", self.color_mode, COLOR_MODES)
        one_of("encoding", self.encoding, ENCODINGS)
        _check_int("quality", self.quality, 1, 100)
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0.0 <= value < 1.0
            ):
                raise bad_value(name, value, "a number in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise bad_value(
                "val_fraction + test_fraction",
                self.val_fraction + self.test_fraction,
                "below 1 so that every class keeps training images",
            )
        _check_int("seed", self.seed, 0, 2**63 - 1)
        if (
            isinstance(self.shard_size_mb, bool)
            or not isinstance(self.shard_size_mb, int | float)
            or not math.isfinite(self.shard_size_mb)
            or self.shard_size_mb <= 0
        ):
            raise bad_value("shard_size_mb", self.shard_size_mb, "a positive number of megabytes")
        if self.min_shards is not None:
            _check_int("min_shards", self.min_shards, 1, 100_000)
        _check_int("max_pixels", self.max_pixels, 1, 2**40)
        if self.keep_size:
            if self.image_size is not None:
                raise ChuteError(
                    "`keep_size` and `image_size` exclude each other: keep_size stores every "
                    "image at its own size. "
                    f"Received: keep_size=True, image_size={self.image_size!r}"
                )
            if self.encoding == "raw":
                raise bad_value(
                    "encoding", self.encoding, "'png', 'jpeg' or 'auto' when keep_size=True"
                )
        elif self.resize != "stretch" and self.image_size is None:
            raise ChuteError(
                f"`resize` only applies with `image_size`. Received: resize={self.resize!r}, "
                "image_size=None"
            )

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["image_size"] = list(self.image_size) if self.image_size else None
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ConvertOptions:
        """Builds options from :meth:`to_dict` output."""
        values = dict(values)
        if values.get("image_size"):
            values["image_size"] = tuple(values["image_size"])
        return cls(**values)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_value(name, value, f"an integer from {low} to {high}")
