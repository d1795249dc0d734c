"""A multi-label model's decision thresholds, tuned on the validation split.

A sigmoid score means something different for every label (a rare label's scores
run lower), so one cut at 0.5 serves few of them. Before a training run saves its
bundle, chute scores the whole validation split with the best model and keeps, for
each label, the threshold that maximises that label's F1 there
(:func:`chute.fit.multilabel.tune_thresholds` documents the rule); the bundle's
``chute.json`` holds them, and ``predict`` and ``evaluate`` use them.

Example:
    >>> tuned(model, manifest, LoadOptions(), input_size=(16, 16))  # doctest: +SKIP
    [0.41, 0.18, 0.63]
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from chute.fit import multilabel
from chute.format.manifest import Manifest
from chute.lazy import keras
from chute.read.load import load
from chute.read.options import LoadOptions

log = logging.getLogger(__name__)


def scores_and_truth(
    model: Any,
    manifest: Manifest,
    split: str,
    options: LoadOptions,
    *,
    input_size: tuple[int, int],
    crop_fraction: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, truth)``: the model's sigmoid scores and the multi-hot labels of every
    example of ``split``, once each, in reading order, the images prepared as evaluation
    prepares them (``input_size``, ``crop_fraction``)."""
    options = dataclasses.replace(
        options,
        training=False,
        label_mode="multi_hot",
        image_size=input_size,
        crop_fraction=crop_fraction,
        repeat=False,
        pad_final_batch=False,
        sampling=None,
        sample_weights=False,
    )
    scores, truth = [], []
    for images, labels in load(manifest, split, options):
        # NumPy in and out: the model may run on JAX or torch, not TensorFlow
        batch = model(np.asarray(images), training=False)
        scores.append(np.asarray(keras.ops.convert_to_numpy(batch), np.float32))
        truth.append(np.asarray(labels, np.float32))
    return np.concatenate(scores), np.concatenate(truth)


def tuned(
    model: Any,
    manifest: Manifest,
    options: LoadOptions,
    *,
    input_size: tuple[int, int],
    crop_fraction: float = 1.0,
) -> list[float]:
    """Each label's threshold tuned for F1 on ``manifest``'s val split; 0.5 each without
    a val split (logged)."""
    if manifest.num_examples("val") == 0:
        log.info("no val split to tune thresholds on: every label's threshold is 0.5")
        return [0.5] * manifest.num_classes
    scores, truth = scores_and_truth(
        model, manifest, "val", options, input_size=input_size, crop_fraction=crop_fraction
    )
    thresholds = [float(t) for t in multilabel.tune_thresholds(truth, scores)]
    shown = zip(manifest.class_names[:8], thresholds, strict=False)  # the first few
    log.info(
        "thresholds tuned on %d val images for F1: %s",
        len(truth),
        ", ".join(f"{name} {threshold:.3g}" for name, threshold in shown),
    )
    return thresholds
