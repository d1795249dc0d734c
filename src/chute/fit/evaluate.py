"""``chute evaluate``: loss, accuracy, top-5, per-class report and confusion of a model on a split.

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
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.bundle import Bundle, load_bundle

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EvalReport:
    """Figures of one evaluation; ``confusion[i][j]`` counts class i predicted as j."""

    split: str
    examples: int
    loss: float
    accuracy: float
    top5: float
    per_class: list[dict]
    confusion: list[list[int]]
    class_names: list[str]

    def most_confused(self, count: int = 10) -> list[tuple[str, str, int]]:
        """The ``(true, predicted, times)`` pairs seen most often off the diagonal."""
        pairs = [
            (self.class_names[i], self.class_names[j], n)
            for i, row in enumerate(self.confusion)
            for j, n in enumerate(row)
            if i != j and n
        ]
        return sorted(pairs, key=lambda p: (-p[2], p[0], p[1]))[:count]


def evaluate(
    run_or_model: str | os.PathLike | Bundle,
    data: str | os.PathLike | manifest_lib.Manifest,
    *,
    split: str = "val",
    batch_size: int = 256,
    out_dir: str | os.PathLike | None = None,
) -> EvalReport:
    """Evaluates a trained model (run directory or bundle) on a converted split.

    ``run_or_model`` may be a loaded :class:`~chute.format.bundle.Bundle` and
    ``data`` the dataset's ``Manifest`` (as ``chute train`` passes them). Every
    example is seen exactly once. With ``out_dir``, writes
    ``evaluation-<split>.json``, ``per-class-<split>.csv`` and
    ``confusion-<split>.png`` there.

    Raises:
        ChuteError: the model's classes differ from the data's, or a bad split.
    """
    from chute.read.load import load

    loaded = load_bundle(run_or_model)
    manifest = manifest_lib.load(data)
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
    )
    probabilities, labels = [], []
    samples: dict[int, np.ndarray] = {}  # one image per class, for the confusion picture
    for images, batch_labels in dataset:
        probabilities.append(np.asarray(loaded.model(images, training=False), np.float64))
        labels.append(batch_labels.numpy())
        if len(samples) < manifest.num_classes:
            for image, label in zip(images.numpy(), labels[-1], strict=True):
                samples.setdefault(int(label), image)
    probs, labels = np.concatenate(probabilities), np.concatenate(labels)
    k = manifest.num_classes
    chosen = probs[np.arange(len(labels)), labels]
    predicted = probs.argmax(1)
    top5 = np.argsort(-probs, 1)[:, : min(5, k)]
    confusion = np.zeros((k, k), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    per_class = []
    for label, name in enumerate(manifest.class_names):
        total = int(confusion[label].sum())
        per_class.append(
            {
                "class": name,
                "examples": total,
                "accuracy": float(confusion[label, label] / total) if total else None,
            }
        )
    result = EvalReport(
        split=split,
        examples=len(labels),
        loss=float(-np.log(np.clip(chosen, 1e-12, 1.0)).mean()),
        accuracy=float((predicted == labels).mean()),
        top5=float((top5 == labels[:, None]).any(1).mean()),
        per_class=per_class,
        confusion=confusion.tolist(),
        class_names=list(manifest.class_names),
    )
    if out_dir is not None:
        _write_reports(result, os.fspath(out_dir), samples)
    log.info(
        "%s: loss %.4f, accuracy %.4f, top-5 %.4f", split, result.loss, result.accuracy, result.top5
    )
    return result


def _write_reports(result: EvalReport, out_dir: str, samples: dict) -> None:
    """``evaluation-<split>.json``, ``per-class-<split>.csv`` and ``confusion-<split>.png``."""
    from chute.tools.report import draw_confusion

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
