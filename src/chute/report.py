"""Pictures of a dataset: a grid of sample images per class with class names.

Class names are drawn with the first font on the machine that has all their
characters (Pillow's own font covers Latin; for Kannada, Devanagari, CJK and
other scripts it looks for a system font that does). When no font can draw a
name, the row is captioned with the label index alone, so a grid never
shows empty boxes in place of a name.
"""

from __future__ import annotations

import glob
import io
import logging
import os
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from chute import manifest as manifest_lib
from chute import records, storage
from chute.errors import ChuteError

log = logging.getLogger(__name__)

_FONT_DIRS = (
    "/usr/share/fonts",
    "/usr/local/share/fonts",
    "~/.fonts",
    "~/.local/share/fonts",
    "/Library/Fonts",
    "/System/Library/Fonts",
    "C:/Windows/Fonts",
)
_MISSING = "\U0010fffd"  # a private-use code point no font draws: its mask is .notdef's
_CAPTION_SIZE = 14


@cache
def _system_fonts() -> tuple[str, ...]:
    found: list[str] = []
    for folder in _FONT_DIRS:
        for ext in ("ttf", "otf", "ttc"):
            found += glob.glob(
                os.path.join(os.path.expanduser(folder), "**", f"*.{ext}"), recursive=True
            )
    return tuple(sorted(found))


@cache
def _font(path: str | None) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if path is None:
        return ImageFont.load_default(size=_CAPTION_SIZE)
    return ImageFont.truetype(path, _CAPTION_SIZE)


def covers(font, text: str) -> bool:
    """True when ``font`` has a glyph (not the .notdef box) for every character of ``text``."""
    try:
        missing = bytes(font.getmask(_MISSING))
        return all(ch.isspace() or bytes(font.getmask(ch)) != missing for ch in text)
    except (OSError, ValueError, UnicodeError):
        return False


def caption(label: int, name: str) -> tuple[str, ImageFont.ImageFont]:
    """The caption and font for class ``label`` called ``name``.

    Returns ``"label: name"`` in a font that can draw the name, or the label
    index alone when no font on this machine can.

    Example:
        >>> caption(3, "cat")[0]
        '3: cat'
    """
    text = f"{label}: {name}"
    for path in (None, *_system_fonts()):
        try:
            font = _font(path)
        except OSError:
            continue
        if covers(font, text):
            return text, font
    log.info("no font here can draw class name %r; showing its label index", name)
    return f"{label}", _font(None)


def _samples(manifest: manifest_lib.Manifest, split: str, classes: list[int], per_class: int):
    import tensorflow as tf

    wanted = {label: [] for label in classes}
    features = {
        records.IMAGE: tf.io.FixedLenFeature([], tf.string),
        records.CLASS: tf.io.FixedLenFeature([], tf.int64),
        records.SIZE: tf.io.FixedLenFeature([2], tf.int64),
    }
    channels = manifest.image["channels"]
    for path in manifest.shard_paths(split):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            example = tf.io.parse_single_example(raw, features)
            label = int(example[records.CLASS])
            if label in wanted and len(wanted[label]) < per_class:
                data = example[records.IMAGE].numpy()
                if manifest.image["encoding"] == "raw":
                    h, w = example[records.SIZE].numpy()
                    pixels = np.frombuffer(data, np.uint8).reshape(h, w, channels)
                    wanted[label].append(
                        Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels)
                    )
                else:
                    wanted[label].append(Image.open(io.BytesIO(data)).convert("RGB"))
            if all(len(v) >= per_class for v in wanted.values()):
                return wanted
    return wanted


def draw_grid(
    path: str | os.PathLike,
    out_png: str | os.PathLike,
    *,
    split: str = "train",
    per_class: int = 8,
    max_classes: int = 24,
    cell: int = 64,
) -> str:
    """Draws ``per_class`` sample images for up to ``max_classes`` classes, one row each.

    With more classes than ``max_classes``, rows are spread evenly over the labels.

    Returns:
        The path of the PNG written.

    Example:
        >>> draw_grid("./kn-shards", "grid.png")  # doctest: +SKIP
        'grid.png'
    """
    manifest = manifest_lib.load(path)
    if split not in manifest.splits:
        raise ChuteError(
            f"`split` must be one of {sorted(manifest.splits)}. Received: split={split!r}"
        )
    for name, value in (("per_class", per_class), ("max_classes", max_classes), ("cell", cell)):
        if not isinstance(value, int) or value < 1:
            raise ChuteError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    count = min(max_classes, manifest.num_classes)
    classes = sorted(
        {round(i * (manifest.num_classes - 1) / max(1, count - 1)) for i in range(count)}
    )
    samples = _samples(manifest, split, classes, per_class)
    captions = [caption(label, manifest.class_names[label]) for label in classes]
    text_width = max(int(font.getlength(text)) for text, font in captions) + 12
    grid = Image.new(
        "RGB", (text_width + per_class * (cell + 2), len(classes) * (cell + 2)), "white"
    )
    draw = ImageDraw.Draw(grid)
    for row, label in enumerate(classes):
        top = row * (cell + 2)
        text, font = captions[row]
        draw.text((6, top + cell / 2), text, fill="black", font=font, anchor="lm")
        for column, image in enumerate(samples[label]):
            image = image.convert("RGB")
            scale = cell / max(image.size)
            image = image.resize(
                (max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                Image.Resampling.NEAREST,
            )
            grid.paste(image, (text_width + column * (cell + 2), top))
    out_png = os.fspath(out_png)
    buffer = io.BytesIO()
    grid.save(buffer, format="PNG")
    with storage.gfile().GFile(out_png, "wb") as handle:
        handle.write(buffer.getvalue())
    return out_png
