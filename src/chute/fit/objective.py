"""What a run optimises and reports, from its config: optimizer and schedule, loss, metrics.

Example:
    >>> config = TrainConfig(schedule="cosine")
    >>> optimizer = make_optimizer(config, steps_per_epoch=100)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
from typing import Any

from chute.errors import ChuteError
from chute.fit import multilabel
from chute.fit.config import TrainConfig
from chute.fit.reading import DEFAULT_BATCH, categorical
from chute.lazy import keras

log = logging.getLogger(__name__)

MIN_STEPS = 100
"""The fewest optimizer steps a run should take: a CNN trained from scratch for fewer
is still far from what its data allow (benchmarks/bench_quality.py), whatever its
BatchNorm statistics do."""

SMALLEST_CHOSEN_BATCH = 16
"""The smallest per-replica batch chute chooses itself: smaller ones make BatchNorm's
batch statistics noisy and leave an accelerator mostly idle."""


def make_optimizer(
    config: TrainConfig,
    steps_per_epoch: int,
    *,
    learning_rate: float | None = None,
    epochs: int | None = None,
) -> Any:
    """The optimizer, with the learning-rate schedule of :func:`learning_rate_schedule`."""
    rate = learning_rate_schedule(
        config, steps_per_epoch, learning_rate=learning_rate, epochs=epochs
    )
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(rate, momentum=0.9)
    return {
        "adam": keras.optimizers.Adam,
        "adamw": keras.optimizers.AdamW,
        "rmsprop": keras.optimizers.RMSprop,
    }[config.optimizer](rate)


def learning_rate_schedule(
    config: TrainConfig,
    steps_per_epoch: int,
    *,
    learning_rate: float | None = None,
    epochs: int | None = None,
) -> Any:
    """The learning rate (a number or a Keras schedule of the step) over ``epochs``
    (default: the run's) from ``learning_rate`` (default: the config's). A run with a
    ``time_limit`` gets a plain rate, which :mod:`chute.fit.budget` moves along the
    schedule fitted to the time.

    Example:
        >>> config = TrainConfig(schedule="onecycle", learning_rate=0.01, epochs=5)
        >>> schedule = learning_rate_schedule(config, steps_per_epoch=10)
        >>> [round(float(schedule(step)), 4) for step in (0, 5, 10, 30, 50)]
        [0.0, 0.005, 0.01, 0.005, 0.0]
    """
    start = config.learning_rate if learning_rate is None else learning_rate
    if start is None:
        raise ChuteError("learning_rate is chosen by chute.fit.recipe.choose before a run")
    # The phase's own epochs: a fine-tuning phase decays over its epochs, not the run's.
    total = max(1, steps_per_epoch * (config.epochs if epochs is None else epochs))
    if config.time_limit is not None and config.schedule in ("onecycle", "cosine"):
        return float(start)  # the budget's callback sets the rate, fitted to the time
    if config.schedule == "onecycle":
        from chute.fit.recipe import WARMUP

        warmup = round(total * WARMUP)
        # Keras's own schedule (a checkpoint reloads without chute): linear from 0 to the
        # peak over the warm-up, then a cosine to 0 at the run's last step.
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=max(1, total - warmup), warmup_target=float(start),
            warmup_steps=warmup,
        )  # fmt: skip
    if config.schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(start, decay_steps=total)
    if config.schedule == "exponential":
        return keras.optimizers.schedules.ExponentialDecay(
            start, decay_steps=max(1, steps_per_epoch), decay_rate=0.9
        )
    return float(start)


def make_loss(
    config: TrainConfig,
    reduction: str = "sum_over_batch_size",
    *,
    positives: Any = None,
) -> Any:
    """Cross-entropy on one-hot labels (with label smoothing) or integer labels; for a
    multi-label dataset (``positives``: its per-label positive weights, see
    :func:`multi_label_positives`) binary cross-entropy, each label's positives weighed."""
    if positives is not None:
        weights = None if config.positive_weights is None else positives
        return multilabel.make_loss(
            weights, reduction=reduction, label_smoothing=config.label_smoothing
        )
    if categorical(config):
        return keras.losses.CategoricalCrossentropy(
            label_smoothing=config.label_smoothing, reduction=reduction
        )
    return keras.losses.SparseCategoricalCrossentropy(reduction=reduction)


def multi_label_positives(config: TrainConfig, manifest: Any, counts: Any = None) -> Any:
    """A multi-label dataset's per-label positive weights (all 1 unless the config asks
    ``positive_weights="balanced"``: negatives / positives in the train split, or in
    ``counts``, ``(each label's positives, examples)`` of what training reads: a
    mixture's); None for a single-label dataset.

    Raises:
        ChuteError: ``positive_weights`` for a single-label dataset, or
            ``class_weights`` for a multi-label one (each names the other).
    """
    if not manifest.multi_label:
        if config.positive_weights is not None:
            raise ChuteError(
                f"`positive_weights` weighs the labels of a multi-label dataset; "
                f"{manifest.location} has one class per image: pass class_weights="
                f"'balanced'. Received: positive_weights={config.positive_weights!r}"
            )
        return None
    if config.class_weights is not None:
        raise ChuteError(
            f"{manifest.location} is multi-label: an image's labels cannot each weigh the "
            "whole image; pass positive_weights='balanced' (each label's positives "
            f"weighed). Received: class_weights={config.class_weights!r}"
        )
    if counts is None:
        train = manifest.split("train")
        counts = (train.class_counts, train.examples)
    weights = multilabel.positive_weights(*counts)
    if config.positive_weights is not None:
        log.info(
            "positive weights from %.3g to %.3g (negatives / positives per label)",
            min(weights),
            max(weights),
        )
    return weights


def make_metrics(
    config: TrainConfig, num_classes: int, *, multi_label: bool = False, present: Any = None
) -> list:
    """Accuracy and top-5 accuracy (top-k with fewer classes); for multi-label data the
    mAP estimate (``map``, over the labels ``present`` marks), AUC and micro/macro F1 at
    0.5 (see :func:`chute.fit.multilabel.training_metrics`)."""
    if multi_label:
        return multilabel.training_metrics(num_classes, present)
    top = (
        keras.metrics.TopKCategoricalAccuracy
        if categorical(config)
        else (keras.metrics.SparseTopKCategoricalAccuracy)
    )
    return ["accuracy", top(k=min(5, num_classes), name="top5")]


def choose_batch_size(config: TrainConfig, *, train_examples: int, replicas: int) -> int:
    """The per-replica batch of a run: ``config.batch_size`` when given; else
    :data:`DEFAULT_BATCH`, halved (down to :data:`SMALLEST_CHOSEN_BATCH`) while a model
    trained from scratch would take fewer than :data:`MIN_STEPS` optimizer steps (the
    :func:`warn_if_short` threshold), the choice and its reason logged.

    Example:
        >>> choose_batch_size(TrainConfig(epochs=10), train_examples=480, replicas=1)
        32
        >>> choose_batch_size(TrainConfig(epochs=10, batch_size=128), train_examples=480,
        ...                   replicas=1)
        128
    """
    if config.batch_size is not None:  # given by hand: it wins (warn_if_short may warn)
        return config.batch_size

    def steps(batch: int) -> int:  # the last batch of an epoch is dropped
        return train_examples // (batch * replicas) * config.epochs

    batch = DEFAULT_BATCH
    # A pretrained backbone's new head learns in far fewer steps: its batch stays.
    while not config.pretrained and steps(batch) < MIN_STEPS and batch > SMALLEST_CHOSEN_BATCH:
        batch = max(SMALLEST_CHOSEN_BATCH, batch // 2)
    if batch != DEFAULT_BATCH:
        per = "" if replicas == 1 else f" per replica x {replicas} replicas"
        log.info(
            "batch size %d, not %d: %d training images give %d optimizer steps in %d "
            "epoch(s) of batches of %d%s, fewer than the %d %s needs to learn from scratch; "
            "with %d, %d steps (--batch-size sets it)",
            batch, DEFAULT_BATCH, train_examples, steps(DEFAULT_BATCH), config.epochs,
            DEFAULT_BATCH, per, MIN_STEPS, config.model, batch, steps(batch),
        )  # fmt: skip
    return batch


def warn_if_short(
    config: TrainConfig, steps_per_epoch: int, *, global_batch: int, train_examples: int
) -> bool:
    """Logs a warning when a model trained from scratch takes fewer than
    :data:`MIN_STEPS` optimizer steps, naming its steps and the ``batch_size`` or
    ``epochs`` that would give enough; returns whether it warned. (A pretrained
    backbone's new head may need far fewer.)

    Example:
        >>> warn_if_short(TrainConfig(epochs=5, batch_size=256), 2, global_batch=256,
        ...               train_examples=594)
        True
    """
    steps = steps_per_epoch * config.epochs
    # A pretrained backbone's new head learns in far fewer steps: no warning then.
    if steps >= MIN_STEPS or config.pretrained:
        return False
    epochs = math.ceil(MIN_STEPS / steps_per_epoch)
    replicas = max(1, global_batch // (config.batch_size or global_batch))
    # the batch with which config.epochs epochs make MIN_STEPS steps (the last batch of
    # an epoch is dropped: a whole number of batches per epoch)
    batch = train_examples // math.ceil(MIN_STEPS / config.epochs) // replicas
    ways = [f"more epochs (--epochs {epochs})"]
    if batch >= 1:
        ways.insert(0, f"a smaller batch (--batch-size {batch} or less)")
    log.warning(
        "This run takes %d optimizer steps (%d per epoch: %d training images in global "
        "batches of %d, x %d epochs): too few for %s to learn what the data allow. Give "
        "it %d or more with %s",
        steps,
        steps_per_epoch,
        train_examples,
        global_batch,
        config.epochs,
        config.model,
        MIN_STEPS,
        " or ".join(ways),
    )
    return True
