"""Multi-label evaluation: per-label AP, F1, precision, recall and support at a bundle's
thresholds, the mAP, and a precision-recall picture (``chute evaluate`` on a model with
per-label thresholds; :func:`chute.fit.evaluate.evaluate` picks it).

Example:
    >>> report = evaluate("runs/tags", "./tag-shards")  # doctest: +SKIP
    >>> print(report.table())  # doctest: +SKIP
    val: 120 images, mAP 0.812 (macro, labels with a positive), micro F1 0.774 (precision
    0.801, recall 0.749), macro F1 0.702
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from chute.fit import multilabel
from chute.fit.plots import draw_precision_recall
from chute.format import storage
from chute.format.bundle import Bundle

log = logging.getLogger(__name__)

REPORT_ROWS = 20  # labels the CLI lists of a long multi-label report (the lowest AP)
_EPSILON = 1e-7  # Keras's epsilon: its binary cross-entropy clips the scores to it


@dataclasses.dataclass
class MultiLabelReport:
    """Figures of one multi-label evaluation, at the bundle's per-label thresholds:
    those of :func:`chute.fit.multilabel.label_report`, plus the split and the loss.

    ``labels`` holds one dict per label, in label order: ``name``, ``ap``, ``f1``,
    ``precision``, ``recall``, ``support`` (images carrying the label) and
    ``threshold``; a figure that is undefined (no positive, nothing predicted) is None,
    as are ``map`` and the F1s when no label has a positive.

    Example:
        >>> report = evaluate("runs/tags", "./tag-shards")  # doctest: +SKIP
        >>> report.map, report.labels[0]["name"], report.labels[0]["ap"]  # doctest: +SKIP
        (0.81, 'cat', 0.93)
    """

    split: str
    examples: int
    loss: float  # binary cross-entropy, averaged over labels and images (as Keras's)
    map: float | None
    micro_f1: float | None
    micro_precision: float | None
    micro_recall: float | None
    macro_f1: float | None
    labels: list[dict]
    class_names: list[str]

    @classmethod
    def from_scores(
        cls,
        split: str,
        y_true: np.ndarray,
        scores: np.ndarray,
        thresholds: Sequence[float],
        class_names: Sequence[str],
    ) -> MultiLabelReport:
        """The report of multi-hot ``y_true`` and sigmoid ``scores``, ``(examples, labels)``.

        Example:
            >>> r = MultiLabelReport.from_scores(
            ...     "val", np.array([[1, 0], [0, 1]]), np.array([[0.8, 0.3], [0.2, 0.6]]),
            ...     [0.5, 0.5], ["cat", "dog"])
            >>> r.map, r.micro_f1
            (1.0, 1.0)
        """
        figures = multilabel.label_report(y_true, scores, thresholds, class_names)
        loss = _binary_cross_entropy(y_true, scores)
        return cls(split=split, loss=loss, class_names=list(class_names), **figures)

    def table(self, most: int | None = None) -> str:
        """The figures as text (:func:`chute.fit.multilabel.format_report`): a summary
        line, then a row per label, or the ``most`` of lowest AP."""
        return multilabel.format_report(dataclasses.asdict(self), split=self.split, most=most)


_LOSS_ROWS = 1024  # rows a step: float64 temporaries of 1024 x labels, not of the whole split


def _binary_cross_entropy(y_true: np.ndarray, scores: np.ndarray) -> float:
    """The mean binary cross-entropy of ``scores`` against ``y_true`` (NaN when empty),
    computed a block of rows at a time in float64: whole, its temporaries held 6 float64
    copies of (examples x labels) at once, 5 GB for 10,000 images of 10,000 labels."""
    y_true, scores = np.asarray(y_true), np.asarray(scores)
    if not y_true.size:
        return float("nan")
    total = 0.0
    for start in range(0, len(y_true), _LOSS_ROWS):
        truth = np.asarray(y_true[start : start + _LOSS_ROWS], np.float64)
        p = np.clip(np.asarray(scores[start : start + _LOSS_ROWS], np.float64), _EPSILON,
                    1 - _EPSILON)  # fmt: skip
        total -= float((truth * np.log(p) + (1 - truth) * np.log1p(-p)).sum())
    return total / y_true.size


def evaluate_labels(
    bundle: Bundle, dataset: Iterable[Any], split: str, out_dir: str | os.PathLike | None
) -> MultiLabelReport:
    """Scores a multi-label model on ``dataset`` (``(images, multi-hot labels)`` batches,
    each example once) at the bundle's thresholds; writes the reports to ``out_dir``.

    Every score is kept, as average precision ranks them all.

    Example:
        >>> evaluate_labels(bundle, dataset, "val", None).map  # doctest: +SKIP
        0.81
    """
    multilabel.register_serializables()  # a bundle loaded with compile=True needs the loss
    truths, outputs = [], []
    for batch_images, batch_labels in dataset:
        outputs.append(bundle.scores(batch_images))
        truths.append(np.asarray(batch_labels, np.float32))
    k = bundle.num_classes
    y_true = np.concatenate(truths) if truths else np.zeros((0, k), np.float32)
    scores = np.concatenate(outputs) if outputs else np.zeros((0, k), np.float32)
    result = MultiLabelReport.from_scores(
        split, y_true, scores, bundle.thresholds, list(bundle.class_names)
    )
    if out_dir is not None:
        _write_label_reports(result, os.fspath(out_dir), y_true, scores)
    log.info(
        "%s: loss %.4f, mAP %s, micro F1 %s, macro F1 %s",
        split,
        result.loss,
        *(_figure(v) for v in (result.map, result.micro_f1, result.macro_f1)),
    )
    return result


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _write_label_reports(
    result: MultiLabelReport, out_dir: str, y_true: np.ndarray, scores: np.ndarray
) -> None:
    """``evaluation-<split>.json``, ``per-label-<split>.txt``, ``precision-recall-<split>.png``."""
    split = result.split
    storage.makedirs(out_dir)
    body = json.dumps(dataclasses.asdict(result), indent=1, ensure_ascii=False)
    storage.write_atomic(storage.join(out_dir, f"evaluation-{split}.json"), body.encode())
    table = result.table() + "\n"
    storage.write_atomic(storage.join(out_dir, f"per-label-{split}.txt"), table.encode())
    ap = [np.nan if row["ap"] is None else row["ap"] for row in result.labels]
    draw_precision_recall(
        y_true,
        scores,
        result.class_names,
        storage.join(out_dir, f"precision-recall-{split}.png"),
        split=split,
        ap=ap,
    )
