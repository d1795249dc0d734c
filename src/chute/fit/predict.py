"""Classify image files with a model bundle, on the CPU.

The "train on a TPU, recognise on a CPU" case: whatever the model was trained
on, prediction runs on the CPU. Each image goes through the steps its record
went through: what ``chute convert`` did (:func:`chute.image.decode.load_pixels`
with the bundle's image spec: EXIF orientation, channels, size, resize mode,
interpolation, and the stored encoding), then what evaluation does
(:func:`chute.image.tf_ops.centre_crop` to the model's input size), so a file
gets exactly the pixels its record gets in ``chute evaluate``. A file that
cannot be read is reported, not fatal.

A multi-label model (a bundle with per-label thresholds) also gives each image its
``labels``: every label whose score reaches its threshold, highest score first.

Example:
    >>> result = predict("runs/kn", ["new/", "more/*.png"], top_k=3)  # doctest: +SKIP
    >>> result.predictions[0].top  # doctest: +SKIP
    [('ka', 0.91), ('kha', 0.05), ('ga', 0.01)]
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute import checks
from chute.errors import ChuteError
from chute.fit import multilabel
from chute.fit.evaluate import top_labels
from chute.format import storage
from chute.format.bundle import Bundle, load_bundle
from chute.format.spec import ImageSpec
from chute.image import crop
from chute.image.decode import load_pixels
from chute.image.encode import stored_bytes
from chute.image.files import IMAGE_EXTENSIONS, image_files, text_key
from chute.image.header import Rejected
from chute.image.tf_ops import centre_crop
from chute.lazy import installed, tf

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 5
_PATTERN_CHARS = frozenset("*?[")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The top classes of one image, most probable first; for a multi-label model, the
    ``top`` scores and the ``labels`` predicted.

    Example:
        >>> Prediction("x.png", [("ka", 0.9), ("ga", 0.1)]).class_name
        'ka'
        >>> Prediction("y.png", [("cat", 0.8), ("dog", 0.3)], labels=[("cat", 0.8)]).labels
        [('cat', 0.8)]
    """

    path: str
    top: list[tuple[str, float]]
    # Multi-label: every label at or above its threshold, highest score first (maybe none);
    # None for a single-label model.
    labels: list[tuple[str, float]] | None = None

    @property
    def text_path(self) -> str:
        """``path`` as text that can be printed or written anywhere: a name that is not
        UTF-8 keeps its bytes as ``\\xNN``, as ``chute convert`` writes its keys
        (:func:`chute.image.files.text_key`); ``path`` itself still opens the file."""
        return text_key(self.path)

    @property
    def class_name(self) -> str:
        """The most probable class."""
        return self.top[0][0]

    @property
    def probability(self) -> float:
        """The probability of the most probable class."""
        return self.top[0][1]


@dataclasses.dataclass
class PredictResult:
    """What :func:`predict` found: predictions, and files it could not use.

    Example:
        >>> result = PredictResult([Prediction("x.png", [("ka", 0.75)])], [("y.jpg", "empty")])
        >>> print(result.to_csv(), end="")
        path,rank,class,probability
        x.png,1,ka,0.75
    """

    predictions: list[Prediction]
    failures: list[tuple[str, str]]  # (path, reason)
    multi_label: bool = False  # from a multi-label model: each prediction has its labels

    def to_json(self) -> str:
        """Predictions and failures as JSON (``{"predictions": [...], "failures": [...]}``),
        valid UTF-8 whatever the file names (names as :attr:`Prediction.text_path`).
        A multi-label prediction adds ``"labels": [{"label": ..., "score": ...}]`` (the
        labels predicted, maybe none) before its ``top`` scores."""
        body = {
            "predictions": [
                {
                    "path": p.text_path,
                    **_labels_json(p),
                    "top": [{"class": text_key(name), "probability": prob} for name, prob in p.top],
                }
                for p in self.predictions
            ],
            "failures": [{"path": path, "reason": reason} for path, reason in self.text_failures],
        }
        return json.dumps(body, indent=1, ensure_ascii=False) + "\n"

    def to_csv(self, *, top: bool = False) -> str:
        """One row per image and rank: ``path,rank,class,probability`` (failures left out;
        names as :attr:`Prediction.text_path`).

        A multi-label result lists the labels predicted instead, ``path,rank,label,score``,
        an image with none as one row holding only its path; with ``top``, its top
        scores as above."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if self.multi_label and not top:
            writer.writerow(["path", "rank", "label", "score"])
            for p in self.predictions:
                # An image with no label still gets its row: a missing line reads as a failure.
                if not p.labels:
                    writer.writerow([p.text_path, "", "", ""])
                for rank, (name, score) in enumerate(p.labels or [], start=1):
                    writer.writerow([p.text_path, rank, text_key(name), repr(score)])
            return buffer.getvalue()
        writer.writerow(["path", "rank", "class", "probability"])
        for p in self.predictions:
            for rank, (name, prob) in enumerate(p.top, start=1):
                writer.writerow([p.text_path, rank, text_key(name), repr(prob)])
        return buffer.getvalue()

    @property
    def text_failures(self) -> list[tuple[str, str]]:
        """``failures`` as text that can be printed anywhere (names as
        :attr:`Prediction.text_path`, in the reasons too)."""
        return [(text_key(path), text_key(reason)) for path, reason in self.failures]


def predict(
    model_path: str | os.PathLike | Bundle,
    images: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    top_k: int | None = None,
    batch_size: int = 32,
    threshold: float | None = None,
) -> PredictResult:
    """Classifies image files with a model bundle, on the CPU.

    Args:
        model_path: a bundle folder, its ``chute.json``, a training run folder
            holding ``bundle/``, or an already loaded :class:`~chute.format.bundle.Bundle`.
        images: files, folders (every image file inside, recursively, sorted,
            hidden entries skipped) and glob patterns. A file named
            explicitly is tried whatever its extension.
        top_k: how many classes to report per image, 1 to the number of
            classes; ``None`` means 5, or every class when there are fewer.
        batch_size: images per model call.
        threshold: a multi-label model only: one threshold, 0 to 1, for every label
            in place of the bundle's tuned ones; ``None``: the bundle's.

    Returns:
        A :class:`PredictResult`: one :class:`Prediction` per readable image,
        in input order, and ``(path, reason)`` for every input that gave none.
        A multi-label model's predictions also hold their ``labels``: each
        label whose score is at or above its threshold (``top_k`` still gives
        the highest scores, whatever the thresholds).

    Raises:
        ChuteError: a bad argument, no bundle at ``model_path``, ``threshold``
            for a single-label model, or no image file found at all.

    Example:
        >>> result = predict("runs/kn/bundle", "test.png", top_k=1)  # doctest: +SKIP
        >>> result.predictions[0].class_name  # doctest: +SKIP
        'ka'
    """
    if top_k is not None and not checks.is_int(top_k):
        raise checks.bad_value("top_k", top_k, "a positive integer")
    checks.positive_int("batch_size", batch_size)
    if threshold is not None:
        checks.number_in("threshold", threshold, 0.0, 1.0, what="a number from 0 to 1")
    # The arguments before the bundle: loading a model is the slow part.
    storage.check_locations(model_path=model_path, images=images)
    entries = _entries(images)
    bundle = load_bundle(model_path)
    if bundle.tta == "flip":  # trained on flipped images: each image's mirror scored too
        log.info("test-time flips: each image's and its mirror's probabilities averaged")
    if threshold is not None and not bundle.multi_label:
        raise ChuteError(
            f"`threshold` applies to a multi-label model; {bundle.location!r} is single-label "
            f"(softmax: top_k chooses how many classes to show). Received: threshold={threshold!r}"
        )
    if bundle.multi_label:
        multilabel.register_serializables()  # a bundle loaded with compile=True needs the loss
    if top_k is None:
        top_k = min(DEFAULT_TOP_K, bundle.num_classes)
    if not 1 <= top_k <= bundle.num_classes:
        raise ChuteError(
            f"`top_k` must be from 1 to the number of classes ({bundle.num_classes}). "
            f"Received: top_k={top_k!r}"
        )
    files, failures = _expand(entries)
    if not files:
        missing = "; ".join(f"{path}: {reason}" for path, reason in failures)
        raise ChuteError(
            f"`images` must name image files, folders holding images or glob patterns "
            f"matching some; none was found ({missing}). Received: images={entries!r}"
        )

    # Images are decoded one batch at a time: memory holds a batch, not the input.
    paths: list[str] = []
    outputs = []
    # No bigger than the input: a few images are not padded up to a whole batch_size.
    size = min(batch_size, len(files))
    with _on_cpu():
        for start in range(0, len(files), size):
            pixels = []
            for path in files[start : start + size]:
                try:
                    pixels.append(prepare_image(path, bundle))
                    paths.append(path)
                except Rejected as reason:
                    failures.append((path, str(reason)))
            if not pixels:
                continue
            chunk = np.stack(pixels)
            if len(chunk) < size:  # one batch shape: the predict function is traced once
                padding = np.zeros((size - len(chunk), *chunk.shape[1:]), np.uint8)
                chunk = np.concatenate([chunk, padding])
            out = np.asarray(bundle.scores(chunk), np.float64)
            outputs.append(out[: len(pixels)])
    if not outputs:
        log.warning("none of the %d files found could be read as an image", len(files))
        return PredictResult([], _in_order(failures, entries, files), bundle.multi_label)
    predictions = _predictions(bundle, paths, np.concatenate(outputs), top_k, threshold)
    log.info("classified %d images, %d failures", len(predictions), len(failures))
    return PredictResult(predictions, _in_order(failures, entries, files), bundle.multi_label)


def _predictions(
    bundle: Bundle, paths: list[str], probs: np.ndarray, top_k: int, threshold: float | None
) -> list[Prediction]:
    """The model's outputs as predictions: the top classes, and a multi-label model's labels."""
    if probs.ndim != 2 or probs.shape[1] != bundle.num_classes:
        raise ChuteError(
            f"The model at {bundle.location!r} outputs shape {probs.shape[1:]}, but its "
            f"bundle names {bundle.num_classes} classes"
        )
    # 1e-6 of slack: float32 softmax outputs can stray just outside [0, 1].
    if ((probs < -1e-6) | (probs > 1 + 1e-6)).any():
        if bundle.multi_label:
            log.info("the model outputs logits, not scores: applying the sigmoid")
            probs = 1 / (1 + np.exp(-probs))
        else:
            log.info("the model outputs logits, not probabilities: applying softmax")
            # The row's maximum subtracted first, so exp cannot overflow.
            probs = np.exp(probs - probs.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
    names = bundle.class_names
    if bundle.multi_label:
        cut = np.asarray(bundle.thresholds if threshold is None else [threshold] * len(names))
    predictions = []
    for path, row, order in zip(paths, probs, top_labels(probs, top_k), strict=True):
        top = [(names[i], float(row[i])) for i in order]
        labels = None
        if bundle.multi_label:
            chosen = np.flatnonzero(row >= cut)
            # Highest score first; equal scores in label order (a stable sort).
            chosen = chosen[np.argsort(-row[chosen], kind="stable")]
            labels = [(names[i], float(row[i])) for i in chosen]
        predictions.append(Prediction(path, top, labels))
    return predictions


def prepare_image(source: str | bytes | Any, bundle: Bundle) -> np.ndarray:
    """An image as the model's evaluation data looks: ``(height, width, channels)`` uint8.

    The same steps as ``chute convert`` (:func:`chute.image.decode.load_pixels`
    and the stored encoding), then as evaluation (the centre crop of the
    bundle's ``crop_fraction``, resized to its input size).

    Args:
        source: a path (local or TF filesystem), the file's bytes, or a Pillow image.
        bundle: gives the size, channels, resize mode and interpolation.

    Raises:
        chute.image.header.Rejected: the file cannot be read or decoded (the message says why).

    Example:
        >>> prepare_image("photo.jpg", load_bundle("runs/kn")).shape  # doctest: +SKIP
        (75, 75, 1)
    """
    if not isinstance(source, bytes) and isinstance(source, str | os.PathLike):
        source = os.fspath(source)
    spec = bundle.image
    pixels, original = load_pixels(source, spec)
    # A grayscale decode may come without its channel axis.
    pixels = pixels.reshape(*pixels.shape[:2], spec.channels)
    if spec.encoding == "jpeg":  # lossy: the record's bytes, decoded as a reader does
        data, stored = stored_bytes(pixels, original, spec), spec
    else:  # raw and PNG keep the pixels as they are
        stored = ImageSpec(*pixels.shape, "raw", interpolation=spec.interpolation)
        data = pixels.tobytes()
    if not installed("tensorflow"):  # the Grain engine's crop: the same pixels (bilinear, nearest)
        height, width = pixels.shape[:2]
        window = crop.centre_window(height, width, bundle.input_size, bundle.crop_fraction)
        return crop.window_pixels(
            data, stored.encoding, pixels.shape, window, bundle.input_size, spec.interpolation
        )
    with tf.device("/cpu:0"):
        image = centre_crop(tf.constant(data), stored, bundle.input_size, bundle.crop_fraction)
    return image.numpy()


def _labels_json(prediction: Prediction) -> dict[str, Any]:
    """A multi-label prediction's ``labels`` entry of the JSON; nothing for a single-label one."""
    if prediction.labels is None:
        return {}
    return {
        "labels": [{"label": text_key(name), "score": score} for name, score in prediction.labels]
    }


def _on_cpu() -> Any:
    """TensorFlow's CPU scope, where TensorFlow is installed: a bundle from a TPU or GPU
    run must classify images on a machine that has neither (without TensorFlow, Keras's
    backend places the model itself)."""
    return tf.device("/cpu:0") if installed("tensorflow") else contextlib.nullcontext()


def _entries(images: Any) -> list[str]:
    # One path is a list of one; a str is iterable and would otherwise read as characters.
    if isinstance(images, str | os.PathLike):
        images = [images]
    try:
        entries = [os.fspath(e) for e in images]
    except TypeError:
        raise ChuteError(
            "`images` must be a path or a list of files, folders and glob patterns. "
            f"Received: images={images!r}"
        ) from None
    if not entries:
        raise ChuteError(
            "`images` must name at least one file, folder or glob pattern. Received: images=[]"
        )
    return entries


def _expand(entries: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Files to classify (first occurrence kept) and entries that named none."""
    found: dict[str, None] = {}
    failures = []
    for entry in entries:
        if storage.isdir(entry):
            files = _walk(entry)
            if not files:
                failures.append((entry, _no_images(entry)))
        # A file named explicitly is tried whatever its extension: the user chose it.
        elif storage.exists(entry):
            files = [entry]
        # Only an entry that does not exist is read as a pattern: a name may contain [ or *.
        elif _PATTERN_CHARS & set(entry):
            files = []
            for match in storage.glob(entry):
                files.extend(_walk(match) if storage.isdir(match) else [match])
            if not files:
                failures.append((entry, "no image file matches this pattern"))
        else:
            files = []
            failures.append((entry, "no such file or folder"))
        # A dict, not a set: duplicates go, and the input order stays.
        found.update(dict.fromkeys(files))
    return list(found), failures


def _no_images(folder: str) -> str:
    return f"no image files ({', '.join(sorted(IMAGE_EXTENSIONS))}) in this folder"


def _walk(folder: str) -> list[str]:
    """Image files under ``folder``, recursively, sorted; hidden entries skipped
    and symlink loops broken, as ``chute convert`` lists a class folder."""
    return [storage.join(folder, rel) for rel in image_files(folder)]


def _in_order(
    failures: list[tuple[str, str]], entries: list[str], files: list[str]
) -> list[tuple[str, str]]:
    """Failures in input order: unmatched entries first as given, then files as found."""
    rank = {path: i for i, path in enumerate(entries)}
    rank.update({path: len(entries) + i for i, path in enumerate(files)})
    return sorted(failures, key=lambda f: rank.get(f[0], len(rank)))
