"""``chute evaluate``: loss, accuracy, top-5, per-class report and confusion of a model on a split.

A multi-label model (a bundle with per-label thresholds) gets a
:class:`~chute.fit.evaluate_labels.MultiLabelReport` instead (see
:mod:`chute.fit.evaluate_labels`).

Example:
    >>> report = evaluate("./runs/kn", "./kn-shards", split="val")  # doctest: +SKIP
    >>> report.accuracy  # doctest: +SKIP
    0.97
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os

import numpy as np

from chute.errors import ChuteError
from chute.fit.evaluate_labels import MultiLabelReport, evaluate_labels
from chute.fit.plots import HEAT_MAP_CLASSES, draw_confusion, thumbnail
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.bundle import Bundle, load_bundle
from chute.lazy import installed

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EvalReport:
    """Figures of one evaluation.

    ``confusion`` is sparse, so that 10,000 classes cost no more than 10: one
    ``(true label, predicted label, times)`` triple per pair seen, the diagonal
    included, sorted by labels; :meth:`confusion_matrix` makes the dense matrix.
    """

    split: str
    examples: int
    loss: float
    accuracy: float
    top5: float
    per_class: list[dict]
    confusion: list[tuple[int, int, int]]
    class_names: list[str]

    def confusion_matrix(self) -> np.ndarray:
        """The dense ``classes × classes`` counts: ``[i, j]`` is class i predicted as j.

        Example:
            >>> report.confusion_matrix()[0, 1]  # doctest: +SKIP
            3
        """
        k = len(self.class_names)
        matrix = np.zeros((k, k), np.int64)
        for true, predicted, times in self.confusion:
            matrix[true, predicted] = times
        return matrix

    def most_confused(self, count: int = 10) -> list[tuple[str, str, int]]:
        """The ``(true, predicted, times)`` pairs seen most often off the diagonal."""
        names = self.class_names
        pairs = [(names[i], names[j], n) for i, j, n in self.confusion if i != j]
        return sorted(pairs, key=lambda p: (-p[2], p[0], p[1]))[:count]


def top_labels(probs: np.ndarray, k: int) -> np.ndarray:
    """Per row, the labels of the ``k`` highest scores, highest first; equal scores
    in label order (as a stable sort would give), in ``O(classes)`` per row.

    Example:
        >>> top_labels(np.array([[0.1, 0.5, 0.1, 0.3]]), 3).tolist()
        [[1, 3, 0]]
    """
    classes = probs.shape[1]
    k = min(k, classes)
    # Every class asked for: a full sort is needed anyway.
    if k == classes:
        return np.argsort(-probs, axis=1, kind="stable")
    # argpartition is O(classes) per row; a full sort of 10,000 classes per row is not.
    chosen = np.argpartition(-probs, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(probs, chosen, 1)
    # a score equal to the k-th highest outside the chosen: pick as the stable sort would
    tied = (probs >= values.min(1, keepdims=True)).sum(1) > k
    # Rare (exact ties at the cut), so the slow stable sort runs only on those rows.
    for row in np.flatnonzero(tied):
        chosen[row] = np.argsort(-probs[row], kind="stable")[:k]
        values[row] = probs[row, chosen[row]]
    # Highest score first, ties by label: the stable sort's order, without sorting every class.
    order = np.lexsort((chosen, -values), axis=-1)
    return np.take_along_axis(chosen, order, 1)


class Tally:
    """An evaluation's running sums, batch by batch: memory grows with the examples
    (a few numbers each) and one batch of scores, not with examples × classes or
    classes².

    Example:
        >>> tally = Tally(num_classes=3)
        >>> tally.add(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]), np.array([0, 1]))
        >>> tally.report("val", ["a", "b", "c"]).accuracy
        0.5
    """

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self._chosen: list[np.ndarray] = []  # the true class's score
        self._labels: list[np.ndarray] = []
        self._predicted: list[np.ndarray] = []
        self._in_top: list[np.ndarray] = []

    def add(self, probs: np.ndarray, labels: np.ndarray) -> None:
        """One batch: scores ``(batch, classes)`` and integer labels ``(batch,)``."""
        probs = np.asarray(probs, np.float32)
        labels = np.asarray(labels, np.int64)
        # Only the true class's score is kept: enough for the loss, and memory stays O(examples).
        self._chosen.append(probs[np.arange(len(labels)), labels])
        self._labels.append(labels)
        self._predicted.append(probs.argmax(1))  # the first of equal scores, as top_labels
        top = top_labels(probs, 5)
        self._in_top.append((top == labels[:, None]).any(1))

    def report(self, split: str, class_names: list[str]) -> EvalReport:
        """The figures of every batch added."""
        k = self.num_classes
        labels = np.concatenate(self._labels) if self._labels else np.zeros(0, np.int64)
        predicted = np.concatenate(self._predicted) if self._labels else labels
        chosen = np.concatenate(self._chosen) if self._labels else np.zeros(0, np.float32)
        in_top = np.concatenate(self._in_top) if self._labels else np.zeros(0, bool)
        # Each (true, predicted) pair as one integer: np.unique counts them without a k × k matrix.
        pairs, times = np.unique(labels * k + predicted, return_counts=True)
        confusion = [
            (int(pair // k), int(pair % k), int(n)) for pair, n in zip(pairs, times, strict=True)
        ]
        totals = np.bincount(labels, minlength=k)
        right = np.bincount(labels[labels == predicted], minlength=k)
        per_class = [
            {
                "class": name,
                "examples": int(totals[label]),
                "accuracy": float(right[label] / totals[label]) if totals[label] else None,
            }
            for label, name in enumerate(class_names)
        ]
        # A score of 0 would make the loss infinite: 1e-12 bounds one example's share.
        clipped = np.clip(chosen.astype(np.float64), 1e-12, 1.0)
        return EvalReport(
            split=split,
            examples=len(labels),
            loss=float(-np.log(clipped).mean()) if len(labels) else float("nan"),
            accuracy=float((predicted == labels).mean()) if len(labels) else float("nan"),
            top5=float(in_top.mean()) if len(labels) else float("nan"),
            per_class=per_class,
            confusion=confusion,
            class_names=list(class_names),
        )


def evaluate(
    run_or_model: str | os.PathLike | Bundle,
    data: str | os.PathLike | manifest_lib.Manifest,
    *,
    split: str = "val",
    batch_size: int = 256,
    out_dir: str | os.PathLike | None = None,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
) -> EvalReport | MultiLabelReport:
    """Evaluates a trained model (run directory or bundle) on a converted split.

    ``run_or_model`` may be a loaded :class:`~chute.format.bundle.Bundle` and
    ``data`` the dataset's ``Manifest`` (as ``chute train`` passes them). Every
    example is seen exactly once. With ``out_dir``, writes
    ``evaluation-<split>.json``, ``per-class-<split>.csv`` and
    ``confusion-<split>.png`` there. ``cache_dir`` and ``cache_limit``: the shard
    cache of data in a bucket (see :class:`~chute.read.options.LoadOptions`).

    A multi-label model (its bundle has per-label thresholds) on a multi-label
    dataset gives a :class:`MultiLabelReport` at those thresholds; ``out_dir`` then
    gets ``evaluation-<split>.json``, ``per-label-<split>.txt`` (the table) and
    ``precision-recall-<split>.png``. Its scores and labels are kept for the whole
    split (``examples × labels`` floats): average precision ranks them all.

    Raises:
        ChuteError: the model's classes differ from the data's, one is multi-label
            and the other not, or a bad split.
    """
    from chute.read.load import load

    storage.check_locations(run_or_model=run_or_model, data=data, out_dir=out_dir)
    loaded = load_bundle(run_or_model)
    if loaded.tta == "flip":  # trained on flipped images: each image's mirror scored too
        log.info("test-time flips: each image's and its mirror's probabilities averaged")
    manifest = manifest_lib.load(data)
    _check_label_modes(loaded, manifest)
    # Same names in the same order: a label is an index into them.
    if list(loaded.class_names) != list(manifest.class_names):
        raise ChuteError(
            f"The model was trained on other classes than {manifest.location!r} holds "
            f"({len(loaded.class_names)} vs {manifest.num_classes} classes)"
        )
    manifest.check_split(split)
    dataset = load(
        manifest,
        split,
        batch_size=batch_size,
        training=False,
        cache=None,
        image_size=loaded.input_size,  # prepared as the model was trained and predicts
        crop_fraction=loaded.crop_fraction,
        # tf.data cannot open s3:// (TensorFlow has no filesystem for it), nor run without
        # TensorFlow; Grain reads both
        engine="tf" if _tf_data_reads(manifest.location) else "grain",
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        label_mode="multi_hot" if loaded.multi_label else "int",
    )
    if loaded.multi_label:
        return evaluate_labels(loaded, dataset, split, out_dir)
    tally = Tally(manifest.num_classes)
    # one image per class for the picture of the most confused pairs, as a thumbnail
    samples: dict[int, np.ndarray] = {}
    # Thumbnails only where the picture shows pairs rather than the whole heat map.
    wanted = manifest.num_classes if manifest.num_classes > HEAT_MAP_CLASSES else 0
    for batch_images, batch_labels in dataset:
        # NumPy in and out: the model may run on JAX or torch (on a GPU), not TensorFlow
        images, labels = np.asarray(batch_images), np.asarray(batch_labels)
        tally.add(loaded.scores(images), labels)
        # Stops looking once every class has one.
        if len(samples) < wanted:
            for image, label in zip(images, labels, strict=True):
                if int(label) not in samples:
                    samples[int(label)] = thumbnail(image)
    result = tally.report(split, list(manifest.class_names))
    if out_dir is not None:
        _write_reports(result, os.fspath(out_dir), samples)
    log.info(
        "%s: loss %.4f, accuracy %.4f, top-5 %.4f", split, result.loss, result.accuracy, result.top5
    )
    return result


def _check_label_modes(bundle: Bundle, manifest: manifest_lib.Manifest) -> None:
    """A sigmoid model scored on single labels (or a softmax one on label sets) means nothing."""
    if bundle.multi_label != manifest.multi_label:
        kind = {True: "multi-label", False: "single-label"}
        raise ChuteError(
            f"The model {bundle.location!r} is {kind[bundle.multi_label]} but the dataset "
            f"{manifest.location!r} is {kind[manifest.multi_label]}: evaluate a model on "
            "data labelled the way it was trained"
        )


def _tf_data_reads(location: str) -> bool:
    """Whether the tf.data engine can read the dataset at ``location`` here."""
    return installed("tensorflow") and storage.tensorflow_opens(location)


def _write_reports(result: EvalReport, out_dir: str, samples: dict) -> None:
    """``evaluation-<split>.json``, ``per-class-<split>.csv`` and ``confusion-<split>.png``."""
    split, per_class = result.split, result.per_class
    storage.makedirs(out_dir)
    body = dataclasses.asdict(result) | {"most_confused": result.most_confused(20)}
    storage.write_atomic(
        storage.join(out_dir, f"evaluation-{split}.json"), json.dumps(body, indent=1).encode()
    )
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["class", "examples", "accuracy"])
    for c in per_class:
        accuracy = "" if c["accuracy"] is None else round(c["accuracy"], 4)
        writer.writerow([c["class"], c["examples"], accuracy])
    storage.write_atomic(storage.join(out_dir, f"per-class-{split}.csv"), table.getvalue().encode())
    draw_confusion(result, storage.join(out_dir, f"confusion-{split}.png"), samples=samples)
