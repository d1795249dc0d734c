"""Multi-label figures: average precision, per-label thresholds tuned for F1, the report,
and the loss and metrics a multi-label model is compiled with.

A multi-label model has a sigmoid per label; ``y_true`` is multi-hot ``(examples,
labels)`` and ``scores`` the model's outputs of the same shape. Everything but the
Keras loss and metrics is NumPy, so ``chute evaluate`` computes it on any backend.

Example:
    >>> y = np.array([[1, 0], [0, 1], [1, 1]])
    >>> s = np.array([[0.9, 0.2], [0.4, 0.7], [0.6, 0.1]])
    >>> average_precision(y, s).round(3).tolist()
    [1.0, 0.833]
    >>> tune_thresholds(y, s).tolist()
    [0.5, 0.1]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.lazy import keras

__all__ = [
    "DEFAULT_WEIGHT_CAP",
    "average_precision",
    "format_report",
    "label_report",
    "make_loss",
    "positive_weights",
    "precision_recall_curve",
    "register_serializables",
    "training_metrics",
    "tune_thresholds",
    "weighted_binary_crossentropy",
]

DEFAULT_WEIGHT_CAP = 100.0
"""The largest positive weight :func:`positive_weights` gives: a label seen once in
100,000 images would otherwise weigh each of its positives 100,000 times, and one
batch holding it would swamp the step."""


def _check_pair(y_true: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """``y_true`` as booleans and ``scores`` as an array, both ``(examples, labels)``."""
    truth, scores = np.asarray(y_true), np.asarray(scores)
    if truth.ndim != 2 or truth.shape != scores.shape:
        raise ChuteError(
            "y_true and scores must be 2-D arrays of one shape (examples, labels). Received: "
            f"y_true of shape {truth.shape}, scores of shape {scores.shape}"
        )
    # Multi-hot 0/1 (int, float or bool): above one half is a positive.
    return truth > 0.5, scores


def _by_label(positive: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per label: a label's column, read as a row, is contiguous (twice as fast
    to sort as a strided column)."""
    return np.ascontiguousarray(positive.T), np.ascontiguousarray(scores.T)


def _ranked(positive: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One label's examples by descending score: the sorted scores, the true positives
    among the first ``i + 1``, and whether row ``i`` ends a run of equal scores (a cut
    can only fall there: equal scores are predicted alike)."""
    # Not a stable sort: the order within equal scores never shows (only run ends count).
    order = np.argsort(-score)
    ranked = score[order]
    hits = np.cumsum(positive[order], dtype=np.int64)
    ends = np.ones(len(ranked), bool)
    ends[:-1] = ranked[:-1] != ranked[1:]
    return ranked, hits, ends


def precision_recall_curve(positive: Any, score: Any) -> tuple[np.ndarray, np.ndarray]:
    """One label's ``(recall, precision)`` at each distinct score, highest score first
    (predicting positive at ``score >= s``); empty arrays when it has no positive.

    Example:
        >>> r, p = precision_recall_curve([1, 0, 1], [0.9, 0.8, 0.8])
        >>> r.tolist(), p.round(3).tolist()
        ([0.5, 1.0], [1.0, 0.667])
    """
    positive = np.asarray(positive).reshape(-1) > 0.5
    score = np.asarray(score).reshape(-1)
    total = int(positive.sum())
    if total == 0:
        return np.zeros(0), np.zeros(0)
    _, hits, ends = _ranked(positive, score)
    cut = np.flatnonzero(ends)
    return hits[cut] / total, hits[cut] / (cut + 1)


_EXACT_CELLS = 1 << 22  # (examples x labels) pooled exactly up to this many; binned above
_BINS, _BIN_ROWS = 1 << 16, 1024


def pooled_precision_recall(y_true: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """The micro-average ``(recall, precision)`` of every label's examples pooled, as
    :func:`precision_recall_curve` of the flattened arrays; above ~4M cells (10,000
    images of 10,000 labels are 100M: sorting them held GBs), scores are counted in 65,536
    equal bins, a block of rows at a time, and equal-bin scores make one step (the curve
    within 1/65,536 of the score).

    Example:
        >>> r, p = pooled_precision_recall([[1, 0], [0, 1]], [[0.9, 0.2], [0.3, 0.8]])
        >>> r.tolist(), p.round(3).tolist()
        ([0.5, 1.0, 1.0, 1.0], [1.0, 1.0, 0.667, 0.5])
    """
    positive, scores = _check_pair(y_true, scores)
    if positive.size <= _EXACT_CELLS:
        return precision_recall_curve(positive.ravel(), scores.ravel())
    hits, seen = np.zeros(_BINS, np.int64), np.zeros(_BINS, np.int64)
    for start in range(0, len(positive), _BIN_ROWS):
        block = np.clip(np.asarray(scores[start : start + _BIN_ROWS], np.float64), 0.0, 1.0)
        bins = np.minimum((block * _BINS).astype(np.int64), _BINS - 1)
        seen += np.bincount(bins.ravel(), minlength=_BINS)
        hits += np.bincount(bins[positive[start : start + _BIN_ROWS]], minlength=_BINS)
    total = int(hits.sum())
    if total == 0:
        return np.zeros(0), np.zeros(0)
    used = seen[::-1] > 0  # highest scores first; empty bins are no threshold
    tp, predicted = np.cumsum(hits[::-1])[used], np.cumsum(seen[::-1])[used]
    return tp / total, tp / predicted


def average_precision(y_true: Any, scores: Any) -> np.ndarray:
    """Average precision per label (column): ``sum_n (R_n - R_(n-1)) * P_n`` over the
    distinct scores in descending order, equal scores making one step (as
    scikit-learn's ``average_precision_score``); NaN for a label with no positive.

    Example:
        >>> average_precision([[1, 0], [0, 0], [1, 0]], [[0.9, 0.1], [0.8, 0.2], [0.8, 0.3]])
        array([0.83333333,        nan])
    """
    positive, scores = _by_label(*_check_pair(y_true, scores))
    result = np.full(len(positive), np.nan)
    for label in range(len(positive)):
        recall, precision = precision_recall_curve(positive[label], scores[label])
        if len(recall):
            result[label] = float(np.sum(np.diff(recall, prepend=0.0) * precision))
    return result


def tune_thresholds(y_true: Any, scores: Any, *, default: float = 0.5) -> np.ndarray:
    """Per label, the threshold that maximises F1 on these (validation) examples,
    predicting positive where ``score >= threshold``.

    Only the distinct scores can change the predictions, so each is tried as a cut (one
    sort per label). The threshold returned is the midpoint between the lowest score
    predicted positive at the best cut and the next lower score (that score itself when
    none is lower), so that new examples between the two fall on the nearer side rather
    than on the validation set's exact value. Among cuts of equal F1, the one predicting
    fewer positives wins. A label with no positive in the data keeps ``default``.

    Example:
        >>> tune_thresholds([[1], [0], [1], [0]], [[0.9], [0.7], [0.6], [0.2]]).tolist()
        [0.4]
    """
    positive, scores = _by_label(*_check_pair(y_true, scores))
    thresholds = np.full(len(positive), float(default))
    for label in range(len(positive)):
        total = int(positive[label].sum())
        if total == 0:
            continue
        ranked, hits, ends = _ranked(positive[label], scores[label])
        cut = np.flatnonzero(ends)
        # F1 = 2 TP / (predicted + actual); argmax takes the first best: the fewest positives.
        best = cut[np.argmax(2 * hits[cut] / (cut + 1 + total))]
        low = ranked[best]
        if best + 1 == len(ranked):
            thresholds[label] = float(low)
            continue
        below = ranked[best + 1]
        middle = low / 2 + below / 2  # halves first: no overflow at the dtype's extremes
        # Adjacent float32 scores: the midpoint may round onto the lower one, which would
        # then be predicted positive too; the lowest positive score itself is exact.
        thresholds[label] = float(middle if middle > below else low)
    return thresholds


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator else None


def _none_if_nan(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def label_report(
    y_true: Any, scores: Any, thresholds: Any, class_names: Sequence[str]
) -> dict[str, Any]:
    """Per-label AP, F1, precision, recall, support (positives) and threshold, with the
    mAP (mean AP over labels with a positive), micro F1, precision and recall (every
    label's counts summed) and macro F1 (mean over labels with a positive). JSON-ready:
    plain floats, ``None`` where a figure is undefined (precision with nothing
    predicted positive, anything that divides by a support of 0).

    Example:
        >>> report = label_report([[1, 0], [0, 1]], [[0.8, 0.3], [0.2, 0.6]], [0.5, 0.5],
        ...                       ["cat", "dog"])
        >>> report["map"], report["micro_f1"], report["labels"][0]["f1"]
        (1.0, 1.0, 1.0)
    """
    positive, scores = _check_pair(y_true, scores)
    thresholds = np.asarray(thresholds, np.float64).reshape(-1)
    if len(thresholds) != positive.shape[1] or len(class_names) != positive.shape[1]:
        raise ChuteError(
            f"label_report needs one threshold and one name per label ({positive.shape[1]}). "
            f"Received: {len(thresholds)} thresholds, {len(class_names)} class names"
        )
    predicted = scores >= thresholds
    tp = (predicted & positive).sum(0)
    fp = (predicted & ~positive).sum(0)
    support = positive.sum(0)
    ap = average_precision(positive, scores)
    labels = []
    for i, name in enumerate(class_names):
        fn = support[i] - tp[i]
        labels.append(
            {
                "name": str(name),
                "ap": _none_if_nan(ap[i]),
                "f1": _ratio(2 * tp[i], 2 * tp[i] + fp[i] + fn),
                "precision": _ratio(tp[i], tp[i] + fp[i]),
                "recall": _ratio(tp[i], support[i]),
                "support": int(support[i]),
                "threshold": float(thresholds[i]),
            }
        )
    seen = support > 0
    tp_all, fp_all, total = int(tp.sum()), int(fp.sum()), int(support.sum())
    f1s = [label["f1"] for label, kept in zip(labels, seen, strict=True) if kept]
    return {
        "examples": int(positive.shape[0]),
        "map": float(np.mean(ap[seen])) if seen.any() else None,
        "micro_f1": _ratio(2 * tp_all, tp_all + fp_all + total),
        "micro_precision": _ratio(tp_all, tp_all + fp_all),
        "micro_recall": _ratio(tp_all, total),
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "labels": labels,
    }


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_report(report: dict[str, Any], *, split: str = "val", most: int | None = None) -> str:
    """:func:`label_report`'s figures as text: a summary line, then one row per label
    (all of them, or the ``most`` of lowest AP), ``-`` for a figure that is undefined.

    Example:
        >>> report = label_report([[1, 0], [0, 1]], [[0.8, 0.3], [0.2, 0.6]], [0.5, 0.5],
        ...                       ["cat", "dog"])
        >>> print(format_report(report))  # doctest: +NORMALIZE_WHITESPACE
        val: 2 images, mAP 1.000 (macro, labels with a positive), micro F1 1.000 (precision
        1.000, recall 1.000), macro F1 1.000
        label     AP     F1  precision  recall  support  threshold
        cat    1.000  1.000      1.000   1.000        1      0.500
        dog    1.000  1.000      1.000   1.000        1      0.500
    """
    rows = report["labels"]
    heading = "label"
    if most is not None and len(rows) > most:
        # The weakest first: what a reader of a long report looks for (no AP sorts last).
        rows = sorted(rows, key=lambda r: (r["ap"] is None, r["ap"] or 0.0))[:most]
        heading = f"label ({most} of lowest AP)"
    width = max([len(heading), *(len(r["name"]) for r in rows)])
    lines = [
        f"{split}: {report['examples']} images, mAP {_figure(report['map'])} "
        "(macro, labels with a positive), "
        f"micro F1 {_figure(report['micro_f1'])} (precision "
        f"{_figure(report['micro_precision'])}, recall {_figure(report['micro_recall'])}), "
        f"macro F1 {_figure(report['macro_f1'])}",
        f"{heading:<{width}}     AP     F1  precision  recall  support  threshold",
    ]
    for r in rows:
        lines.append(
            f"{r['name']:<{width}}  {_figure(r['ap']):>5}  {_figure(r['f1']):>5}  "
            f"{_figure(r['precision']):>9}  {_figure(r['recall']):>6}  {r['support']:>7}  "
            f"{r['threshold']:>9.3f}"
        )
    return "\n".join(lines)


def positive_weights(
    label_counts: Any, num_examples: int, *, cap: float = DEFAULT_WEIGHT_CAP
) -> np.ndarray:
    """Per label, the weight of a positive in the loss: negatives / positives, so each
    label's positives weigh as much as its negatives, clipped to ``[1, cap]`` (a common
    label is never weighed down); 1 for a label with no positive.

    Example:
        >>> positive_weights([10, 50, 0, 1], 100, cap=50).tolist()
        [9.0, 1.0, 1.0, 50.0]

    Raises:
        ChuteError: a count below 0 or above ``num_examples``, or ``cap`` below 1.
    """
    counts = np.asarray(label_counts, np.float64).reshape(-1)
    if cap < 1:
        raise ChuteError(f"cap must be 1 or more. Received: cap={cap}")
    if len(counts) and (counts.min() < 0 or counts.max() > num_examples):
        raise ChuteError(
            f"label_counts must lie between 0 and num_examples ({num_examples}). "
            f"Received: counts from {counts.min():g} to {counts.max():g}"
        )
    ratio = np.divide(num_examples - counts, counts, out=np.ones_like(counts), where=counts > 0)
    return np.clip(ratio, 1.0, cap)


@functools.cache
def _weighted_class() -> type:
    """The Keras loss class, defined (and registered for ``load_model``) on first use:
    defining it needs Keras, which this module does not import until then."""

    @keras.saving.register_keras_serializable(package="chute")
    class WeightedBinaryCrossentropy(keras.losses.Loss):
        """Binary cross-entropy per label, each label's positive term times its weight,
        averaged over the labels (as ``keras.losses.BinaryCrossentropy``)."""

        def __init__(
            self,
            positive_weights: Sequence[float],
            from_logits: bool = False,
            reduction: str = "sum_over_batch_size",
            name: str = "weighted_binary_crossentropy",
            label_smoothing: float = 0.0,
            **kwargs: Any,
        ):
            super().__init__(reduction=reduction, name=name, **kwargs)
            self.positive_weights = [float(w) for w in positive_weights]
            self.from_logits = bool(from_logits)
            self.label_smoothing = float(label_smoothing)

        def call(self, y_true: Any, y_pred: Any) -> Any:
            if self.label_smoothing:  # towards 0.5, as keras.losses.BinaryCrossentropy does
                y_true = keras.ops.cast(y_true, y_pred.dtype)
                y_true = y_true * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
            return weighted_binary_crossentropy(
                y_true, y_pred, self.positive_weights, from_logits=self.from_logits
            )

        def get_config(self) -> dict[str, Any]:
            return super().get_config() | {
                "positive_weights": self.positive_weights,
                "from_logits": self.from_logits,
                "label_smoothing": self.label_smoothing,
            }

    return WeightedBinaryCrossentropy


def register_serializables() -> None:
    """Registers chute's Keras objects (the weighted loss), so that ``load_model`` with
    ``compile=True`` rebuilds a model compiled with them. Call before loading."""
    _weighted_class()


def weighted_binary_crossentropy(
    y_true: Any, y_pred: Any, weights: Sequence[float], *, from_logits: bool = False
) -> Any:
    """Per example, the mean over labels of ``-(w y log p + (1 - y) log(1 - p))`` in
    ``keras.ops`` (any backend); ``p`` clipped to Keras's epsilon as its own loss does.

    With logits, the stable form ``(1 - y) x + (1 + (w - 1) y) softplus(-x)``."""
    ops = keras.ops
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(y_true, y_pred.dtype)
    weight = ops.cast(ops.convert_to_tensor(weights), y_pred.dtype)
    if from_logits:
        per_label = (1 - y_true) * y_pred + (1 + (weight - 1) * y_true) * ops.softplus(-y_pred)
    else:
        eps = keras.config.epsilon()
        p = ops.clip(y_pred, eps, 1 - eps)
        per_label = -(weight * y_true * ops.log(p) + (1 - y_true) * ops.log(1 - p))
    return ops.mean(per_label, axis=-1)


def make_loss(
    weights: Sequence[float] | None = None,
    *,
    from_logits: bool = False,
    reduction: str = "sum_over_batch_size",
    label_smoothing: float = 0.0,
) -> Any:
    """The multi-label loss: Keras's own ``BinaryCrossentropy`` when no ``weights`` are
    asked, else binary cross-entropy with each label's positives times its weight
    (:func:`positive_weights`), saved in the model as ``chute>WeightedBinaryCrossentropy``;
    ``label_smoothing`` moves each 0/1 target towards 0.5 by that much, in both.

    Example:
        >>> make_loss([4.0, 1.0]).positive_weights  # doctest: +SKIP
        [4.0, 1.0]
    """
    if weights is None:
        return keras.losses.BinaryCrossentropy(
            from_logits=from_logits, reduction=reduction, label_smoothing=label_smoothing
        )
    return _weighted_class()(
        list(weights), from_logits=from_logits, reduction=reduction,
        label_smoothing=label_smoothing,
    )  # fmt: skip


def training_metrics(num_labels: int, present: Any = None) -> list:
    """The metrics a multi-label model is compiled with: ``map`` (PR-AUC per label,
    averaged over the labels with a positive: the training-time estimate of the mAP that
    ``evaluate`` reports), ``auc`` (ROC-AUC per label, averaged alike), and ``micro_f1``
    and ``macro_f1`` at threshold 0.5 (Keras counts ``score > 0.5`` positive; the tuned
    thresholds come after training, :func:`tune_thresholds`).

    ``present``: per label, whether the split the best model is picked on (val, else
    train) holds a positive of it. Keras's PR-AUC of a label with no positive is 0: averaged
    in, 1,000 such labels of 10,000 would pull every mAP down by a tenth. None: every label.
    """
    weights = None
    if present is not None:
        weights = np.asarray(present, np.float32).reshape(-1)
        if weights.shape != (num_labels,) or not weights.any():
            weights = None  # no label with a positive: every label, as Keras would
    return [
        keras.metrics.AUC(
            curve="PR", multi_label=True, num_labels=num_labels, name="map", label_weights=weights
        ),
        keras.metrics.AUC(
            multi_label=True, num_labels=num_labels, name="auc", label_weights=weights
        ),
        keras.metrics.F1Score(average="micro", threshold=0.5, name="micro_f1"),
        keras.metrics.F1Score(average="macro", threshold=0.5, name="macro_f1"),
    ]
