"""What a run optimises and reports, from its config: optimizer and schedule, loss, metrics.

Example:
    >>> config = TrainConfig(schedule="cosine")
    >>> optimizer = make_optimizer(config, steps_per_epoch=100)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from chute.fit.config import TrainConfig
from chute.lazy import keras
from chute.read.augment import MIXING


def categorical(config: TrainConfig) -> bool:
    """Whether labels are one-hot (label smoothing, MixUp and CutMix need them), else integers."""
    return config.label_smoothing > 0 or any(name in MIXING for name in config.augment)


def make_optimizer(
    config: TrainConfig,
    steps_per_epoch: int,
    *,
    learning_rate: float | None = None,
    epochs: int | None = None,
) -> Any:
    """The optimizer, with the learning-rate schedule over ``epochs`` (default: the run's)
    from ``learning_rate`` (default: the config's)."""
    start = config.learning_rate if learning_rate is None else learning_rate
    rate: Any = start
    total = max(1, steps_per_epoch * (config.epochs if epochs is None else epochs))
    if config.schedule == "cosine":
        rate = keras.optimizers.schedules.CosineDecay(start, decay_steps=total)
    elif config.schedule == "exponential":
        rate = keras.optimizers.schedules.ExponentialDecay(
            start, decay_steps=max(1, steps_per_epoch), decay_rate=0.9
        )
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(rate, momentum=0.9)
    return {
        "adam": keras.optimizers.Adam,
        "adamw": keras.optimizers.AdamW,
        "rmsprop": keras.optimizers.RMSprop,
    }[config.optimizer](rate)


def make_loss(config: TrainConfig, reduction: str = "sum_over_batch_size") -> Any:
    """Cross-entropy on one-hot labels (with label smoothing) or integer labels."""
    if categorical(config):
        return keras.losses.CategoricalCrossentropy(
            label_smoothing=config.label_smoothing, reduction=reduction
        )
    return keras.losses.SparseCategoricalCrossentropy(reduction=reduction)


def make_metrics(config: TrainConfig, num_classes: int) -> list:
    """Accuracy and top-5 accuracy (top-k with fewer classes)."""
    top = (
        keras.metrics.TopKCategoricalAccuracy
        if categorical(config)
        else (keras.metrics.SparseTopKCategoricalAccuracy)
    )
    return ["accuracy", top(k=min(5, num_classes), name="top5")]
