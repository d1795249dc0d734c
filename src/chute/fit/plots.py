"""Training pictures: loss and accuracy curves, the confusion of an evaluation, and the
precision-recall curves of a multi-label one.

The confusion is a heat map up to :data:`HEAT_MAP_CLASSES` classes (the classes named
along both axes, one colour scale with its counts marked), else the most confused
pairs, each with a sample image of both classes. The curves have round values on their
axes, a grid and the best model's epoch marked. Class names are
drawn with the first font on the machine that has all their characters
(Pillow's own font covers Latin; for Kannada, Devanagari, CJK and other
scripts it looks for a system font that does). When no font can draw a name,
it is captioned with the label index alone, so a picture never shows empty
boxes in place of a name. Drawn with Pillow: nothing here imports TensorFlow.
"""

from __future__ import annotations

import glob
import io
import logging
import math
import os
import re
import unicodedata
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from chute.fit.multilabel import (
    average_precision,
    pooled_precision_recall,
    precision_recall_curve,
)
from chute.format import storage

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
_COUNT_SIZE = 11  # the counts in the confusion's cells
_NAME_ROOM = 160  # pixels a class name may take beside (or above) the confusion, then cut
_GRID = "#e5e5e5"  # grid lines, under the curves
_BEST = "#2ca02c"  # the best epoch's mark
# Matplotlib's "Blues": one colour scale from few (near white) to many (dark blue).
_BLUES = ((247, 251, 255), (222, 235, 247), (198, 219, 239), (158, 202, 225), (107, 174, 214),
          (66, 146, 198), (33, 113, 181), (8, 81, 156), (8, 48, 107))  # fmt: skip
# Scripts whose letters read at the caption's size; the others' are drawn larger.
_PLAIN = ("LATIN", "GREEK", "CYRILLIC", "ARMENIAN")
# A name that reads as a number (a folder "2") is quoted: "11: 2" would read as two numbers.
_NUMBER = re.compile(r"[-+]?(\d+([.,]\d*)?|[.,]\d+)")
# The curves: each metric's name, in the order of the panels.
METRICS = {"loss": "loss", "accuracy": "accuracy", "top5": "top-5 accuracy",
           "map": "mAP (PR-AUC estimate)"}  # fmt: skip
# What picks a run's best model, as chute.fit.train chooses it: mAP for multi-label data,
# else accuracy; on the val split when there is one.
_MONITORS = ("val_map", "map", "val_accuracy", "accuracy")
HEAT_MAP_CLASSES = 30  # the confusion is a heat map up to this many classes, else pairs
_THUMB = 48  # side of a sample image next to a confused pair
PR_LABELS = 10  # the precision-recall picture draws this many labels' curves at most
# Matplotlib's tab10: distinct at a glance, and familiar.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
            "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip


# Cached: walking the font folders takes a while, and every caption asks.
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
def _font(
    path: str | None, size: int = _CAPTION_SIZE
) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(path, size)


def covers(font, text: str) -> bool:
    """True when ``font`` has a glyph (not the .notdef box) for every character of ``text``."""
    try:
        missing = bytes(font.getmask(_MISSING))
        return all(ch.isspace() or bytes(font.getmask(ch)) != missing for ch in text)
    except (OSError, ValueError, UnicodeError):
        return False


def caption(label: int, name: str, size: int = _CAPTION_SIZE) -> tuple[str, ImageFont.ImageFont]:
    """The caption and font (of ``size`` pixels) for class ``label`` called ``name``.

    Returns ``"label: name"`` (``class label: "name"`` when the name is a number, so
    that class 11 called "2" does not read "11: 2") in a font that can draw the name
    (half as large again for scripts whose letters carry more detail than Latin's), or
    the label index alone when no font on this machine can.

    Example:
        >>> caption(3, "cat")[0]
        '3: cat'
        >>> caption(11, "2")[0]
        'class 11: "2"'
    """
    text = f'class {label}: "{name}"' if _NUMBER.fullmatch(name.strip()) else f"{label}: {name}"
    shown = size
    if any(ch.isalpha() and unicodedata.name(ch, "").split(" ")[0] not in _PLAIN for ch in name):
        # Letters of Kannada, Devanagari, CJK, ... carry more detail than Latin ones of
        # the same height: at the Latin size ಅ and ಆ look alike.
        shown = round(size * 1.5)
    # Pillow's own font first; then any system font that can draw the name (CJK, Kannada, ...).
    for path in (None, *_system_fonts()):
        try:
            font = _font(path, shown)
        except OSError:
            continue
        if covers(font, text):
            return text, font
    log.info("no font here can draw class name %r; showing its label index", name)
    return f"{label}", _font(None, size)


def _cut(text: str, font, room: float) -> str:
    """``text``, cut with "..." to fit ``room`` pixels (a long name, one character a turn)."""
    while font.getlength(text) > room and len(text) > 8:
        text = text[:-4] + "..."
    return text


def _rotated(text: str, font) -> Image.Image:
    """``text`` as a mask turned a quarter left (read from bottom to top, as a y axis's
    label and a column's name are)."""
    _, _, right, bottom = font.getbbox(text)
    mask = Image.new("L", (max(1, int(right) + 2), max(1, int(bottom) + 2)), 0)
    ImageDraw.Draw(mask).text((0, 0), text, fill=255, font=font)
    return mask.rotate(90, expand=True)


def axis_ticks(low: float, high: float, *, most: int = 6, whole: bool = False) -> list[float]:
    """Round values 1, 2, 2.5 or 5 times a power of ten apart, from ``low`` or below to
    ``high`` or above, ``most`` at most (``whole``: whole numbers only, for counts).

    Example:
        >>> axis_ticks(0.1, 0.955)
        [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        >>> axis_ticks(0, 37, whole=True)
        [0.0, 10.0, 20.0, 30.0, 40.0]
    """
    # one value (a flat curve, one epoch; or two that differ in their last bits): a tick
    # either side
    if not high - low > 1e-9 * max(1.0, abs(low), abs(high)):
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    power = math.floor(math.log10((high - low) / most))
    for exponent in range(power - 1, power + 3):
        for mantissa in (1, 2, 2.5, 5):
            step = mantissa * 10.0**exponent
            if whole and step < 1:
                continue
            # the tolerance: 0.6 / 0.2 is 2.9999999999999996 in floats
            first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
            if last - first < most:
                return [round(k * step, 12) for k in range(first, last + 1)]
    return [low, high]  # not reached: a step of 10**(power + 2) leaves one interval


def tick_texts(ticks: list[float]) -> list[str]:
    """The ticks as text, with as many decimals as tell them apart, all alike.

    Example:
        >>> tick_texts([0.0, 0.25, 0.5]), tick_texts([0.0, 10.0])
        (['0.00', '0.25', '0.50'], ['0', '10'])
    """
    decimals = next(d for d in range(7) if all(abs(round(t, d) - t) < 1e-9 for t in ticks))
    return [f"{t:.{decimals}f}" for t in ticks]


def _shade(fraction: float) -> tuple[int, int, int]:
    """The colour scale's colour for ``fraction`` (0: none, 1: the scale's top)."""
    position = min(1.0, max(0.0, fraction)) * (len(_BLUES) - 1)
    below = min(int(position), len(_BLUES) - 2)
    share = position - below
    return tuple(  # type: ignore[return-value]
        round(a + (b - a) * share) for a, b in zip(_BLUES[below], _BLUES[below + 1], strict=True)
    )


def _canvas(width: int, height: int):
    image = Image.new("RGB", (width, height), "white")
    return image, ImageDraw.Draw(image)


def save_png(image: Image.Image, path: str | os.PathLike) -> str:
    """Writes a Pillow image as a PNG file, atomically (local or TF filesystem); returns
    the path."""
    path = os.fspath(path)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    storage.write_atomic(path, buffer.getvalue())
    return path


def epoch_ticks(epochs: int, *, most: int = 10) -> list[int]:
    """The epochs (counted from 1, as Keras shows them) labelled on a curve's x axis:
    each one up to ``most`` epochs, else the first and every 2nd, 5th, 10th, 20th, ...,
    whichever step keeps the labels to about ``most``.

    Example:
        >>> epoch_ticks(3)
        [1, 2, 3]
        >>> epoch_ticks(40)
        [1, 5, 10, 15, 20, 25, 30, 35, 40]
    """
    step = 1
    while -(-epochs // step) > most:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2  # 1, 2, 5, 10, 20, 50, ...
    return sorted({1, *range(step, epochs + 1, step)})


def best_epoch(history: dict[str, list[float]]) -> tuple[str, int] | None:
    """The metric that picks a run's best model (as :mod:`chute.fit.train` does: mAP for
    multi-label data, else accuracy; on the val split when there is one) and its best
    epoch, counted from 0; None when the history has neither.

    Example:
        >>> best_epoch({"accuracy": [0.5, 0.9], "val_accuracy": [0.6, 0.5]})
        ('val_accuracy', 0)
    """
    monitor = next((name for name in _MONITORS if history.get(name)), None)
    return None if monitor is None else (monitor, int(np.argmax(history[monitor])))


def _dashed(draw, x: float, top: float, bottom: float, fill: str) -> None:
    y = top
    while y < bottom:
        draw.line((x, y, x, min(bottom, y + 4)), fill=fill, width=2)
        y += 8


def draw_curves(history: dict[str, list[float]], out_png: str | os.PathLike) -> str:
    """Training curves, one panel per metric (loss; accuracy and top-5 accuracy, or a
    multi-label run's mAP), training and validation, each panel named, with round
    values on its y axis, a grid, the epochs on its x axis (:func:`epoch_ticks`), and
    the epoch of the best model (:func:`best_epoch`) marked.

    Example:
        >>> draw_curves({"loss": [1.0, 0.5]}, "curves.png")  # doctest: +SKIP
        'curves.png'
    """
    panels = [name for name in METRICS if history.get(name) or history.get(f"val_{name}")]
    width, height, top, bottom = 420, 300, 48, 40
    image, draw = _canvas(width * max(1, len(panels)), height)
    font, small = _font(None), _font(None, 12)
    colours = {"train": "#1f77b4", "val": "#d62728"}
    best = best_epoch(history)
    for index, name in enumerate(panels):
        left = index * width
        series = {"train": history.get(name, []), "val": history.get(f"val_{name}", [])}
        values = [v for s in series.values() for v in s]
        ticks = axis_ticks(min(values), max(values), most=7)
        texts = tick_texts(ticks)
        # room for the y axis's values, beside the box
        margin = max(40, max(int(font.getlength(text)) for text in texts) + 10)
        epochs = max(len(s) for s in series.values())
        box = (left + margin, top, left + width - 15, height - bottom)

        def x_of(i: int, box=box, epochs=epochs) -> float:  # i counted from 0
            return box[0] + (box[2] - box[0]) * (i / max(1, epochs - 1))

        def y_of(value: float, box=box, ticks=ticks) -> float:
            return box[3] - (box[3] - box[1]) * (value - ticks[0]) / (ticks[-1] - ticks[0])

        # the grid first, under the curves; the y values right of the box's left edge end
        # above the x axis's "1" (centred on their line, the lowest one's on the axis)
        for tick, text in zip(ticks, texts, strict=True):
            y = y_of(tick)
            draw.line((box[0], y, box[2], y), fill=_GRID)
            draw.line((box[0] - 4, y, box[0], y), fill="black")
            draw.text((box[0] - 6, y), text, fill="black", font=font, anchor="rm")
        for epoch in epoch_ticks(epochs):
            x = x_of(epoch - 1)
            draw.line((x, box[1], x, box[3]), fill=_GRID)
            draw.line((x, box[3], x, box[3] + 4), fill="black")
            draw.text((x, box[3] + 6), str(epoch), fill="black", font=font, anchor="mt")
        draw.rectangle(box, outline="black")
        draw.text((left + margin, 8), f"{METRICS[name]} per epoch", fill="black", font=font)
        draw.text(((box[0] + box[2]) / 2, box[3] + 22), "epoch", fill="black", font=font,
                  anchor="mt")  # fmt: skip
        legend_x = box[2]
        for label in ("val", "train"):  # top right, right to left
            if series[label]:
                draw.text((legend_x, 8), label, fill=colours[label], font=font, anchor="ra")
                legend_x -= int(font.getlength(label)) + 10
        if best is not None:
            monitor, at = best
            x = x_of(at)
            _dashed(draw, x, box[1], box[3], _BEST)
            note = f"best model: epoch {at + 1}"
            if monitor.removeprefix("val_") == name:  # the panel of the metric that picks it
                note += f", {monitor} {history[monitor][at]:.3g}"
            draw.text((box[2], 28), note, fill=_BEST, font=small, anchor="ra")
        for label, points in series.items():
            if not points:
                continue
            xy = [(x_of(i), y_of(v)) for i, v in enumerate(points)]
            if len(xy) > 1:
                draw.line(xy, fill=colours[label], width=2)
            for x, y in xy:
                draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colours[label])
        if best is not None and best[0] == f"{'val_' if series['val'] else ''}{name}":
            x, y = x_of(best[1]), y_of(history[best[0]][best[1]])
            draw.ellipse((x - 6, y - 6, x + 6, y + 6), outline=_BEST, width=2)
    return save_png(image, out_png)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A sample image (HxWxC uint8) at the size :func:`draw_confusion` shows it.

    Example:
        >>> thumbnail(np.zeros((224, 224, 3), np.uint8)).shape
        (48, 48, 3)
    """
    picture = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    small = np.asarray(picture.resize((_THUMB, _THUMB), Image.Resampling.NEAREST))
    return small[..., None] if small.ndim == 2 else small


def draw_confusion(
    report,
    out_png: str | os.PathLike,
    *,
    max_classes: int = HEAT_MAP_CLASSES,
    samples: dict | None = None,
) -> str:
    """The confusion matrix as a heat map: the classes named along both axes (the
    columns' names upright), each cell with its count, one colour scale with its
    counts marked beside it; with more than ``max_classes`` classes, the most confused
    pairs, each with a sample image of both classes when ``samples`` (label ->
    HxWxC uint8 image) has them.

    ``report`` is a :class:`chute.fit.evaluate.EvalReport`.
    """
    names = report.class_names
    if len(names) > max_classes:
        pairs = report.most_confused(25)
        row_height, thumb = 52, _THUMB
        image, draw = _canvas(760, 40 + row_height * max(1, len(pairs)))
        draw.text(
            (10, 10),
            f"most confused pairs ({report.split}): true -> predicted, times",
            fill="black",
            font=_font(None),
        )
        for row, (true, predicted, times) in enumerate(pairs):
            top = 34 + row_height * row
            for column, name in enumerate((true, predicted)):
                sample = (samples or {}).get(names.index(name))
                if sample is not None:
                    picture = Image.fromarray(
                        sample.squeeze(-1) if sample.shape[-1] == 1 else sample
                    )
                    picture = picture.convert("RGB").resize(
                        (thumb, thumb), Image.Resampling.NEAREST
                    )
                    image.paste(picture, (10 + column * (thumb + 6), top))
            # Each part in its own font: one that draws a Kannada name may lack Latin letters.
            x, plain = 10 + 2 * (thumb + 6) + 10, _font(None)
            parts = (
                caption(names.index(true), true),
                ("  ->  ", plain),
                caption(names.index(predicted), predicted),
                (f"   x{times}", plain),
            )
            for text, face in parts:
                draw.text((x, top + thumb / 2), text, fill="black", font=face, anchor="lm")
                x += face.getlength(text)
        return save_png(image, out_png)
    size, matrix = len(names), report.confusion_matrix().tolist()
    peak = max(1, max(max(row) for row in matrix))
    # One colour scale for every cell, from 0 to a round count at or above the largest.
    scale = axis_ticks(0, peak, whole=True)
    counts, font = _font(None, _COUNT_SIZE), _font(None)
    captions = [caption(i, name) for i, name in enumerate(names)]
    # each cell shows its count (wide enough for the largest) beside its row's name and
    # below its column's (as high and as wide as the tallest name)
    tallest = max(face.getbbox(text)[3] - face.getbbox(text)[1] for text, face in captions)
    cell = max(22, int(counts.getlength(str(peak))) + 6, int(tallest) + 6)
    captions = [(_cut(text, face, _NAME_ROOM), face) for text, face in captions]
    rows_width = max(int(face.getlength(text)) for text, face in captions)
    columns = [_rotated(text, face) for text, face in captions]  # the same names, upright
    title = f"confusion ({report.split}): how often each class (row) was predicted as each (column)"
    true_label, predicted_label = _rotated("true class", font), "predicted class"
    left = 6 + true_label.width + 8 + rows_width + 8
    top = 28 + 20 + max(column.height for column in columns) + 6
    matrix_side = cell * size
    bar_left, bar, bar_height = left + matrix_side + 20, 16, max(matrix_side, 100)
    texts = tick_texts(scale)
    image, draw = _canvas(
        max(
            bar_left + bar + 10 + max(int(font.getlength(text)) for text in texts) + 10,
            6 + int(font.getlength(title)) + 10,
        ),
        top + bar_height + 10,
    )
    draw.text((6, 6), title, fill="black", font=font)
    draw.text((left + matrix_side / 2, 28), predicted_label, fill="black", font=font, anchor="mt")
    image.paste("black", (6, top + (matrix_side - true_label.height) // 2), true_label)
    for i, row in enumerate(matrix):
        text, face = captions[i]
        draw.text((left - 8, top + i * cell + cell / 2), text, fill="black", font=face, anchor="rm")
        column = columns[i]
        x = left + i * cell + (cell - column.width) // 2
        image.paste("black", (x, top - 6 - column.height), column)
        for j, count in enumerate(row):
            fill = _shade(count / scale[-1])
            x, y = left + j * cell, top + i * cell
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=fill, outline="#dddddd")
            # White on a dark cell, black on a light one; zeros greyed so the errors stand out.
            ink = "#bbbbbb" if count == 0 else ("white" if sum(fill) < 3 * 128 else "black")
            draw.text((x + cell / 2, y + cell / 2), str(count), fill=ink, font=counts,
                      anchor="mm")  # fmt: skip
    # The colour scale: from 0 at the bottom to the top tick at the top, each tick marked.
    for y in range(bar_height):
        draw.line(
            (bar_left, top + y, bar_left + bar - 1, top + y),
            fill=_shade((bar_height - 1 - y) / max(1, bar_height - 1)),
        )
    draw.rectangle((bar_left, top, bar_left + bar - 1, top + bar_height - 1), outline="#999999")
    for tick, text in zip(scale, texts, strict=True):
        y = top + (bar_height - 1) * (1 - tick / scale[-1])
        draw.line((bar_left + bar, y, bar_left + bar + 4, y), fill="black")
        draw.text((bar_left + bar + 7, y), text, fill="black", font=font, anchor="lm")
    draw.text((bar_left, top - 12), "images", fill="black", font=font, anchor="lb")
    return save_png(image, out_png)


def _steps(recall: np.ndarray, precision: np.ndarray, *, most: int = 1000) -> list:
    """A precision-recall curve as the steps average precision sums (precision ``P_n``
    over recall from ``R_(n-1)`` to ``R_n``), thinned to about ``most`` points (a
    picture has fewer pixels than a large split has scores)."""
    if len(recall) > most:
        keep = np.searchsorted(recall, np.linspace(0, 1, most + 1))
        keep = np.unique(np.minimum(keep, len(recall) - 1))
        recall, precision = recall[keep], precision[keep]
    before = np.concatenate([[0.0], recall[:-1]])
    return [xy for r0, r, p in zip(before, recall, precision, strict=True)
            for xy in ((r0, p), (r, p))]  # fmt: skip


def draw_precision_recall(
    y_true,
    scores,
    class_names,
    out_png: str | os.PathLike,
    *,
    split: str = "val",
    max_labels: int = PR_LABELS,
    ap=None,
) -> str:
    """Precision against recall: one curve per label for the ``max_labels`` labels with
    the most positives, the micro-average (every label's examples pooled) in black on
    top, each with its AP in the legend, the mAP in the title.

    ``y_true`` is multi-hot and ``scores`` the model's, both ``(examples, labels)``;
    ``ap``: the labels' average precision when already computed (as
    :func:`chute.fit.multilabel.label_report` has it), else computed here.

    Example:
        >>> draw_precision_recall(y, scores, names, "pr-val.png")  # doctest: +SKIP
        'pr-val.png'
    """
    y_true, scores = np.asarray(y_true), np.asarray(scores)
    ap = average_precision(y_true, scores) if ap is None else np.asarray(ap, np.float64)
    support = (y_true > 0.5).sum(0)
    # The most frequent labels: their curves are the smoothest and matter to the most images.
    shown = [i for i in np.argsort(-support, kind="stable")[:max_labels] if support[i] > 0]
    font = _font(None)
    side, left, top, legend_x = 380, 50, 52, 460
    captions = [caption(int(label), class_names[label]) for label in shown]
    # a legend row as high as its tallest name (Kannada, CJK are drawn larger)
    step = max(20, *(face.getbbox(text)[3] - face.getbbox(text)[1] + 6 for text, face in captions))
    image, draw = _canvas(760, max(top + side + 40, top + step * (len(shown) + 2)))
    box = (left, top, left + side, top + side)

    def xy(r: float, p: float) -> tuple[float, float]:
        return box[0] + side * r, box[3] - side * p

    for tick in np.linspace(0, 1, 6):
        x, y = xy(tick, tick)
        draw.line((x, box[1], x, box[3]), fill="#e5e5e5")
        draw.line((box[0], y, box[2], y), fill="#e5e5e5")
        draw.text((x, box[3] + 4), f"{tick:.1f}", fill="black", font=font, anchor="mt")
        draw.text((box[0] - 4, y), f"{tick:.1f}", fill="black", font=font, anchor="rm")
    draw.rectangle(box, outline="black")
    draw.text(((box[0] + box[2]) / 2, box[3] + 20), "recall", fill="black", font=font,
              anchor="mt")  # fmt: skip
    draw.text((5, top - 24), "precision", fill="black", font=font)
    seen = support > 0
    # Named: the one mAP chute reports (evaluate's too), not the micro-average drawn below.
    title = f"precision-recall ({split}): mAP " + (f"{ap[seen].mean():.3f}" if seen.any() else "-")
    title += " (macro, labels with a positive)"
    if len(shown) < int(seen.sum()):
        title += f", curves of the {len(shown)} most frequent of {int(seen.sum())} labels"
    draw.text((5, 6), title, fill="black", font=font)
    entries = []  # (colour, line width, caption and its font, recall, precision, AP)
    for n, label in enumerate(shown):
        text, caption_font = captions[n]
        curve = precision_recall_curve(y_true[:, label], scores[:, label])
        entries.append((_PALETTE[n % len(_PALETTE)], 2, text, caption_font, *curve, ap[label]))
    recall, precision = pooled_precision_recall(y_true, scores)
    pooled = np.sum(np.diff(recall, prepend=0.0) * precision) if len(recall) else np.nan
    entries.append(("black", 3, "micro-average", font, recall, precision, pooled))
    for row, (colour, width, text, caption_font, recall, precision, figure) in enumerate(entries):
        if len(recall):
            draw.line([xy(r, p) for r, p in _steps(recall, precision)], fill=colour, width=width)
        y = top + step * row
        draw.line((legend_x, y + 7, legend_x + 20, y + 7), fill=colour, width=width)
        room = image.width - 80 - (legend_x + 26)  # up to the AP figure
        while caption_font.getlength(text) > room and len(text) > 8:
            text = text[:-4] + "..."  # a long name is cut, one character a turn
        draw.text((legend_x + 26, y + 7), text, fill="black", font=caption_font, anchor="lm")
        ap_text = "AP -" if np.isnan(figure) else f"AP {figure:.3f}"
        draw.text((image.width - 10, y + 7), ap_text, fill="black", font=font, anchor="rm")
    return save_png(image, out_png)
