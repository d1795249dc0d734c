"""What a run optimises and reports, from its config: optimizer and schedule, loss, metrics.

Example:
    >>> config = TrainConfig(schedule="cosine")
    >>> optimizer = make_optimizer(config, steps_per_epoch=100)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from chute.fit.config import TrainConfig
from chute.lazy import keras


def categorical(config: TrainConfig) -> bool:
    """Whether labels are one-hot (label smoothing needs them), else integers."""
    return config.label_smoothing > 0


def make_optimizer(config: TrainConfig, steps_per_epoch: int) -> Any:
    """The optimizer, with the learning-rate schedule over the whole run."""
    rate: Any = config.learning_rate
    total = max(1, steps_per_epoch * config.epochs)
    if config.schedule == "cosine":
        rate = keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=total)
    elif config.schedule == "exponential":
        rate = keras.optimizers.schedules.ExponentialDecay(
            config.learning_rate, decay_steps=max(1, steps_per_epoch), decay_rate=0.9
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
