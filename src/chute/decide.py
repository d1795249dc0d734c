"""What a conversion decides from its options and from what the probe saw.

``auto`` options are resolved here: grayscale when every image is, the common
size when there is one, raw pixels for small images (barely larger than PNG
and the fastest to read), JPEG for photographs, PNG otherwise. Shard counts
are planned from the expected bytes per record.
"""

from __future__ import annotations

import collections
import logging

from chute import encode
from chute.errors import ChuteError
from chute.options import ConvertOptions

log = logging.getLogger(__name__)

RAW_AUTO_MAX_PIXELS = 128 * 128  # up to here raw pixels are barely larger than PNG


def needs_headers(options: ConvertOptions) -> bool:
    """Whether some option is left for the images' headers to decide."""
    return (
        options.color_mode == "auto"
        or options.encoding == "auto"
        or (options.image_size is None and not options.keep_size)
    )


def image_spec(options: ConvertOptions, probes: list[encode.Probe] | None) -> encode.ImageSpec:
    """The one image spec of a conversion: explicit options, else what the headers say.

    Args:
        options: the conversion's options.
        probes: every item's header; needed only when :func:`needs_headers`.

    Raises:
        ChuteError: every input was rejected, or sizes differ and no size was given.
    """
    probes = probes or []
    usable = [p for p in probes if p.reject is None]
    if needs_headers(options) and not usable:
        raise ChuteError(
            f"No usable image: all {len(probes)} inputs were rejected (first: "
            f"{next((p.reject for p in probes), '')}). Check the source"
        )
    if options.color_mode == "auto":
        channels = 1 if all(p.grayscale for p in usable) else 3
    else:
        channels = 1 if options.color_mode == "grayscale" else 3
    height = width = None
    if options.image_size is not None:
        height, width = options.image_size
    elif not options.keep_size:
        sizes = collections.Counter((p.height, p.width) for p in usable)
        if len(sizes) > 1:
            common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4))
            raise ChuteError(
                f"Images have {len(sizes)} different sizes ({common}, ...). Received: "
                "image_size=None; pass image_size (--image-size H or HxW) to resize them, or "
                "keep_size=True (--keep-size) to store each at its own size"
            )
        height, width = next(iter(sizes))
    encoding = options.encoding
    if encoding == "auto":
        jpeg_share = sum(p.format == "JPEG" for p in usable) / len(usable)
        if options.keep_size:
            encoding = "jpeg" if jpeg_share == 1.0 else "png"
        elif height * width <= RAW_AUTO_MAX_PIXELS:
            encoding = "raw"
        else:
            encoding = "jpeg" if jpeg_share >= 0.5 else "png"
    log.info(
        "storing %s images as %s, %s channel(s)",
        f"{height}x{width}" if height else "original-size",
        encoding,
        channels,
    )
    return encode.ImageSpec(
        height=height,
        width=width,
        channels=channels,
        encoding=encoding,
        quality=options.quality,
        resize=options.resize,
        interpolation=options.interpolation,
        max_pixels=options.max_pixels,
    )


def bytes_per_record(spec: encode.ImageSpec, probes: list[encode.Probe]) -> float:
    """Expected size of one record: exact for raw pixels, else from (a sample of) the
    source files' headers, assuming their compression ratio carries over."""
    overhead = 128  # framing, feature names, size, key
    if spec.height is not None and spec.encoding == "raw":
        return spec.height * spec.width * spec.channels + overhead
    usable = [p for p in probes if p.reject is None]
    total = 0.0
    for p in usable:
        if spec.height is None:
            total += p.nbytes
        else:
            raw = spec.height * spec.width * spec.channels
            scale = (spec.height * spec.width) / (p.height * p.width) if p.height else 1.0
            total += min(raw, p.nbytes * scale)
    return total / max(1, len(usable)) + overhead
