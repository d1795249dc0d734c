"""A multi-label model's decision thresholds, tuned on the validation split.

A sigmoid score means something different for every label (a rare label's scores
run lower), so one cut at 0.5 serves few of them. After training, chute scores the
whole validation split with the saved model and keeps, for each label, the threshold
that maximises that label's F1 there (:func:`chute.fit.multilabel.tune_thresholds`
documents the rule); ``predict`` and ``evaluate`` then use them from the bundle.

Example:
    >>> bundle = tune(bundle, manifest, options)  # doctest: +SKIP
    >>> bundle.thresholds[:2]  # doctest: +SKIP
    [0.41, 0.18]
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from chute.fit import multilabel
from chute.format.bundle import Bundle, save_thresholds
from chute.format.manifest import Manifest
from chute.lazy import keras
from chute.read.load import load
from chute.read.options import LoadOptions

log = logging.getLogger(__name__)


def scores_and_truth(bundle: Bundle, manifest: Manifest, split: str, options: LoadOptions):
    """``(scores, truth)``: the model's sigmoid scores and the multi-hot labels of every
    example of ``split``, once each, in reading order."""
    options = dataclasses.replace(
        options,
        training=False,
        label_mode="multi_hot",
        image_size=bundle.input_size,
        crop_fraction=bundle.crop_fraction,
        repeat=False,
        pad_final_batch=False,
        sampling=None,
        sample_weights=False,
    )
    model = bundle.model
    scores, truth = [], []
    for images, labels in load(manifest, split, options):
        # NumPy in and out: the model may run on JAX or torch, not TensorFlow
        batch = model(np.asarray(images), training=False)
        scores.append(np.asarray(keras.ops.convert_to_numpy(batch), np.float32))
        truth.append(np.asarray(labels, np.float32))
    return np.concatenate(scores), np.concatenate(truth)


def tune(bundle: Bundle, manifest: Manifest, options: LoadOptions) -> Bundle:
    """The bundle with each label's threshold tuned on ``manifest``'s val split (written
    into its ``chute.json``); without a val split every threshold stays 0.5 (logged)."""
    if manifest.num_examples("val") == 0:
        log.info("no val split to tune thresholds on: every label's threshold is 0.5")
        return bundle
    scores, truth = scores_and_truth(bundle, manifest, "val", options)
    thresholds = multilabel.tune_thresholds(truth, scores)
    names = manifest.class_names[:8]  # the log shows the first few
    log.info(
        "thresholds tuned on %d val images for F1: %s",
        len(truth),
        ", ".join(f"{n} {t:.3g}" for n, t in zip(names, thresholds, strict=False)),
    )
    return save_thresholds(bundle, [float(t) for t in thresholds])
