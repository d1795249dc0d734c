"""The one description of how images are stored and prepared: :class:`ImageSpec`.

A conversion resolves its options into an ``ImageSpec``; the manifest keeps
it, the reader decodes by it, the model's input shape comes from it, a model
bundle carries it so that ``predict`` prepares a new image exactly as
``convert`` prepared the training images.

Example:
    >>> spec = ImageSpec(height=75, width=75, channels=1, encoding="raw")
    >>> spec.shape
    (75, 75, 1)
    >>> ImageSpec.from_dict(spec.to_dict()) == spec
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute import checks
from chute.errors import ChuteError

ENCODINGS = ("raw", "png", "jpeg")
RESIZE_MODES = ("stretch", "crop", "pad")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "area", "lanczos")
# JPEG's own limit on a side: its header holds each as 16 bits.
MAX_SIDE = 65535


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How every image of a dataset is stored, and how a new one is prepared like them.

    Attributes:
        height: stored height; ``None`` when each image keeps its own size.
        width: stored width; ``None`` likewise.
        channels: 1 (grayscale) or 3 (RGB).
        encoding: ``"raw"`` uint8 pixels, ``"png"`` or ``"jpeg"``.
        resize: how the aspect ratio was reached: ``"stretch"``, ``"crop"`` or ``"pad"``.
        interpolation: the resampling filter's name.
        quality: JPEG quality.
        shorter_side: with ``height``/``width`` None: each image kept at its
            aspect ratio, scaled down so that its shorter side is at most this
            (room for training-time cropping); None keeps every size.
        keep_metadata: JPEGs stored as they came keep their EXIF, XMP, IPTC,
            comments and trailing bytes; by default these are stripped (GPS
            positions and the like do not travel into shards).
    """

    height: int | None
    width: int | None
    channels: int
    encoding: str = "raw"
    resize: str = "stretch"
    interpolation: str = "bilinear"
    quality: int = 90
    shorter_side: int | None = None
    keep_metadata: bool = False

    def __post_init__(self) -> None:
        if (self.height is None) != (self.width is None):
            raise ChuteError(
                "`height` and `width` are both set or both None. "
                f"Received: height={self.height!r}, width={self.width!r}"
            )
        if self.height is not None:
            checks.int_in("height", self.height, 1, MAX_SIDE)
            checks.int_in("width", self.width, 1, MAX_SIDE)
        checks.one_of("channels", self.channels, (1, 3))
        checks.one_of("encoding", self.encoding, ENCODINGS)
        checks.one_of("resize", self.resize, RESIZE_MODES)
        checks.one_of("interpolation", self.interpolation, INTERPOLATIONS)
        checks.int_in("quality", self.quality, 1, 100)
        if self.shorter_side is not None:
            checks.int_in("shorter_side", self.shorter_side, 1, MAX_SIDE)
            if self.fixed_size:
                raise ChuteError(
                    "`shorter_side` applies to images kept at their aspect ratio, not to a "
                    f"fixed size. Received: shorter_side={self.shorter_side!r}, "
                    f"height={self.height!r}, width={self.width!r}"
                )

    @property
    def fixed_size(self) -> bool:
        """Whether every image has the same stored size."""
        return self.height is not None

    @property
    def size(self) -> tuple[int, int] | None:
        """``(height, width)``, or None when sizes vary."""
        return (self.height, self.width) if self.height is not None else None

    @property
    def shape(self) -> tuple[int | None, int | None, int]:
        """``(height, width, channels)`` of a stored image."""
        return (self.height, self.width, self.channels)

    def describe(self) -> str:
        """``"75x75x1 raw"``, ``"original sizes x3 jpeg"`` or ``"shorter side <= 256 x3 jpeg"``."""
        if self.fixed_size:
            size = f"{self.height}x{self.width}"
        elif self.shorter_side:
            size = f"shorter side <= {self.shorter_side} "
        else:
            size = "original sizes "
        return f"{size}x{self.channels} {self.encoding}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ImageSpec:
        """Builds a spec from :meth:`to_dict` output; unknown keys are ignored, so a
        newer file's additions do not stop an older reader."""
        if not isinstance(values, dict):
            raise ChuteError(f"An image spec must be a JSON object. Received: {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in values.items() if k in known})
        except TypeError as error:  # a required field is missing
            raise ChuteError(f"Incomplete image spec {values!r}: {error}") from None
