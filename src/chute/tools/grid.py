"""Pictures of a dataset: a grid of sample images per class with class names.

A multi-label dataset gets one row per label, of images carrying that label (an
image carrying several shows in each of their rows), under a title that says so.

Class names are captioned as in the training pictures (:func:`chute.fit.plots.caption`):
in a font on the machine that can draw them, else with the label index alone; a name
that is a number is quoted (``class 11: "2"``).
"""

from __future__ import annotations

import io
import logging
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from chute import checks
from chute.fit.plots import caption, save_png
from chute.format import manifest as manifest_lib
from chute.format import parse, records
from chute.tools import labels

log = logging.getLogger(__name__)
_TITLE_HEIGHT = 24  # the title row: drawn when some classes are left out, or multi-label
_CAPTION_SHARE = 0.28  # a caption's font size, as a share of a row's height (18 of 64 px)


def _samples(manifest: manifest_lib.Manifest, split: str, classes: list[int], per_class: int):
    wanted = {label: [] for label in classes}
    channels = manifest.image.channels
    # read in plain Python (no TensorFlow), so a dataset in any bucket fsspec reaches too
    for record in labels.shard_records(manifest, split):
        example = parse.record_values(record)
        if manifest.multi_label:  # the image goes in the row of each label it carries
            carried = [int(label) for label in example[records.LABELS]]
        else:
            carried = [int(example[records.CLASS])]
        rows = [label for label in carried if label in wanted and len(wanted[label]) < per_class]
        if rows:
            image = _image(example, channels, manifest.image.encoding)
            for label in rows:
                wanted[label].append(image)
        # Stops at the first full set: a large split is not read to its end for a picture.
        if all(len(v) >= per_class for v in wanted.values()):
            return wanted
    return wanted


def _image(example: dict, channels: int, encoding: str) -> Image.Image:
    """One record's image as Pillow's."""
    data = example[records.IMAGE]
    if encoding == "raw":
        h, w = example[records.SIZE].tolist()
        pixels = np.frombuffer(data, np.uint8).reshape(h, w, channels)
        return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels)
    return Image.open(io.BytesIO(data)).convert("RGB")


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

    With more classes than ``max_classes``, rows are spread evenly over the labels,
    and a title says how many of the classes are shown (so is it logged).

    Returns:
        The path of the PNG written.

    Example:
        >>> draw_grid("./kn-shards", "grid.png")  # doctest: +SKIP
        'grid.png'
    """
    manifest = manifest_lib.load(path)
    manifest.check_split(split)
    for name, value in (("per_class", per_class), ("max_classes", max_classes), ("cell", cell)):
        checks.positive_int(name, value)
    count = min(max_classes, manifest.num_classes)
    classes = sorted(
        # Spread evenly over the labels, first and last included, not just the first few classes.
        {round(i * (manifest.num_classes - 1) / max(1, count - 1)) for i in range(count)}
    )
    samples = _samples(manifest, split, classes, per_class)
    # Names large enough to tell apart at a glance in any script (caption() draws those
    # whose letters carry more detail, Kannada, CJK, ..., half as large again)
    size = max(10, round(cell * _CAPTION_SHARE))
    captions = [caption(label, manifest.class_names[label], size) for label in classes]
    text_width = max(int(font.getlength(text)) for text, font in captions) + 18
    width, title_height = text_width + per_class * (cell + 2), 0
    title = None
    if manifest.multi_label:  # a row is not a class: the title says what a row holds
        title = f"{split}: images carrying each label (multi-label)"
    if len(classes) < manifest.num_classes:  # a picture must not pass for the whole dataset
        title = f"{split}: {len(classes)} of {manifest.num_classes} classes (labels spread evenly)"
        if manifest.multi_label:
            title = f"{split}: images carrying {len(classes)} of the {manifest.num_classes} labels"
        log.info(
            "the grid %s shows %d of the %d classes of %s, spread evenly over the labels "
            "(max_classes=%d)",
            os.fspath(out_png), len(classes), manifest.num_classes, split, max_classes,
        )  # fmt: skip
    if title:
        title_font = ImageFont.load_default(size=14)
        width = max(width, int(title_font.getlength(title)) + 12)
        title_height = _TITLE_HEIGHT
    grid = Image.new("RGB", (width, title_height + len(classes) * (cell + 2)), "white")
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((6, title_height / 2), title, fill="black", font=title_font, anchor="lm")
    for row, label in enumerate(classes):
        top = title_height + row * (cell + 2)
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
    return save_png(grid, out_png)
