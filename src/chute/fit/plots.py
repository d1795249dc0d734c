"""Training pictures: loss and accuracy curves, the confusion of an evaluation, and the
precision-recall curves of a multi-label one.

The confusion is a heat map up to :data:`HEAT_MAP_CLASSES` classes, else the
most confused pairs, each with a sample image of both classes. Class names are
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
import os
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from chute.fit.multilabel import average_precision, precision_recall_curve
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


def caption(label: int, name: str) -> tuple[str, ImageFont.ImageFont]:
    """The caption and font for class ``label`` called ``name``.

    Returns ``"label: name"`` in a font that can draw the name, or the label
    index alone when no font on this machine can.

    Example:
        >>> caption(3, "cat")[0]
        '3: cat'
    """
    text = f"{label}: {name}"
    # Pillow's own font first; then any system font that can draw the name (CJK, Kannada, ...).
    for path in (None, *_system_fonts()):
        try:
            font = _font(path)
        except OSError:
            continue
        if covers(font, text):
            return text, font
    log.info("no font here can draw class name %r; showing its label index", name)
    return f"{label}", _font(None)


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


def draw_curves(history: dict[str, list[float]], out_png: str | os.PathLike) -> str:
    """Training curves: loss and accuracy per epoch, training and validation, with
    the epochs marked on the x axis (:func:`epoch_ticks`).

    Example:
        >>> draw_curves({"loss": [1.0, 0.5]}, "curves.png")  # doctest: +SKIP
        'curves.png'
    """
    panels = [name for name in ("loss", "accuracy", "top5") if history.get(name)]
    width, height, margin = 420, 300, 40
    image, draw = _canvas(width * max(1, len(panels)), height)
    font = _font(None)
    colours = {"train": "#1f77b4", "val": "#d62728"}
    for index, name in enumerate(panels):
        left = index * width
        series = {"train": history.get(name, []), "val": history.get(f"val_{name}", [])}
        values = [v for s in series.values() for v in s]
        low, high = min(values), max(values)
        # A flat curve (one epoch, or a constant) would otherwise divide by zero.
        span = (high - low) or 1.0
        epochs = max(len(s) for s in series.values())
        box = (left + margin, margin, left + width - 15, height - margin)

        def x_of(i: int, box=box, epochs=epochs) -> float:  # i counted from 0
            return box[0] + (box[2] - box[0]) * (i / max(1, epochs - 1))

        draw.rectangle(box, outline="black")
        draw.text((left + margin, 10), f"{name} per epoch", fill="black", font=font)
        draw.text((left + 5, margin), f"{high:.3g}", fill="black", font=font)
        draw.text((left + 5, height - margin - 14), f"{low:.3g}", fill="black", font=font)
        for epoch in epoch_ticks(epochs):
            x = x_of(epoch - 1)
            draw.line((x, box[3], x, box[3] + 4), fill="black")
            draw.text((x, box[3] + 6), str(epoch), fill="black", font=font, anchor="mt")
        draw.text(((box[0] + box[2]) / 2, box[3] + 22), "epoch", fill="black", font=font,
                  anchor="mt")  # fmt: skip
        legend_x = box[2]
        for label in ("val", "train"):  # top right, right to left
            if series[label]:
                draw.text((legend_x, 10), label, fill=colours[label], font=font, anchor="ra")
                legend_x -= int(font.getlength(label)) + 10
        for label, points in series.items():
            if not points:
                continue
            xy = [
                (x_of(i), box[3] - (box[3] - box[1]) * ((v - low) / span))
                for i, v in enumerate(points)
            ]
            if len(xy) > 1:
                draw.line(xy, fill=colours[label], width=2)
            for x, y in xy:
                draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colours[label])
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
    """The confusion matrix as a heat map, each cell with its count and a colour
    scale beside it; with more than ``max_classes`` classes, the most confused
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
            text_true, font_true = caption(names.index(true), true)
            text_pred, _ = caption(names.index(predicted), predicted)
            draw.text(
                (10 + 2 * (thumb + 6) + 10, top + thumb / 2),
                f"{text_true}  ->  {text_pred}   x{times}",
                fill="black",
                font=font_true,
                anchor="lm",
            )
        return save_png(image, out_png)
    size, matrix = len(names), report.confusion_matrix().tolist()
    peak = max(1, max(max(row) for row in matrix))
    counts = _font(None, _COUNT_SIZE)
    # each cell shows its count: wide enough for the largest
    cell = max(22, int(counts.getlength(str(peak))) + 6)
    left, top, bar = 170, 30, 14
    matrix_side = cell * size
    scale_height = max(matrix_side, 80)  # the colour scale, beside the matrix
    scale_left = left + matrix_side + 16
    title = f"confusion ({report.split}): rows true, columns predicted; blue right, red wrong"
    image, draw = _canvas(
        max(
            scale_left + 2 * bar + 8 + int(_font(None).getlength(str(peak))) + 10,
            5 + int(_font(None).getlength(title)) + 10,
        ),
        top + scale_height + 10,
    )

    def colour(count: float, right: bool) -> tuple[int, int, int]:
        shade = 255 - int(255 * count / peak)
        return (shade, shade, 255) if right else (255, shade, shade)

    for i, row in enumerate(matrix):
        text, font = caption(i, names[i])
        draw.text((5, top + i * cell + cell / 2), text, fill="black", font=font, anchor="lm")
        for j, count in enumerate(row):
            fill = colour(count, i == j)
            x, y = left + j * cell, top + i * cell
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=fill, outline="#dddddd")
            # White on a dark cell, black on a light one; zeros greyed so the errors stand out.
            ink = "#bbbbbb" if count == 0 else ("white" if min(fill) < 128 else "black")
            draw.text((x + cell / 2, y + cell / 2), str(count), fill=ink, font=counts,
                      anchor="mm")  # fmt: skip
    # The colour scale: one bar for the diagonal (right), one for the rest (wrong),
    # from 0 at the bottom to the largest count at the top.
    for y in range(scale_height):
        count = peak * (scale_height - 1 - y) / max(1, scale_height - 1)
        for k, right in enumerate((True, False)):
            x = scale_left + k * (bar + 2)
            draw.line((x, top + y, x + bar - 1, top + y), fill=colour(count, right))
    labels_x = scale_left + 2 * bar + 8
    draw.text((labels_x, top), str(peak), fill="black", font=_font(None), anchor="lt")
    draw.text((labels_x, top + scale_height), "0", fill="black", font=_font(None), anchor="lb")
    draw.text((5, 8), title, fill="black", font=_font(None))
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
    image, draw = _canvas(760, max(top + side + 40, top + 20 * (len(shown) + 2)))
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
        text, caption_font = caption(int(label), class_names[label])
        curve = precision_recall_curve(y_true[:, label], scores[:, label])
        entries.append((_PALETTE[n % len(_PALETTE)], 2, text, caption_font, *curve, ap[label]))
    recall, precision = precision_recall_curve(y_true.ravel(), scores.ravel())
    pooled = np.sum(np.diff(recall, prepend=0.0) * precision) if len(recall) else np.nan
    entries.append(("black", 3, "micro-average", font, recall, precision, pooled))
    for row, (colour, width, text, caption_font, recall, precision, figure) in enumerate(entries):
        if len(recall):
            draw.line([xy(r, p) for r, p in _steps(recall, precision)], fill=colour, width=width)
        y = top + 20 * row
        draw.line((legend_x, y + 7, legend_x + 20, y + 7), fill=colour, width=width)
        room = image.width - 80 - (legend_x + 26)  # up to the AP figure
        while caption_font.getlength(text) > room and len(text) > 8:
            text = text[:-4] + "..."  # a long name is cut, one character a turn
        draw.text((legend_x + 26, y), text, fill="black", font=caption_font)
        ap_text = "AP -" if np.isnan(figure) else f"AP {figure:.3f}"
        draw.text((image.width - 10, y), ap_text, fill="black", font=font, anchor="ra")
    return save_png(image, out_png)
