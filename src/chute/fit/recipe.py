"""The default training recipe: what ``chute train`` chooses from the data for the
options a user leaves unset.

A model trained from scratch gets what ``benchmarks/bench_accuracy.py`` showed
to pay on more than one dataset (glyphs, digits, photos; 5 epochs at batch 128
on a 2-core CPU):

* **model**: ``chute-cnn``, as deep as the input size asks (stages until about 4
  pixels are left) and 16 filters at its stem (32 from 100,000 training images);
* **schedule**: ``onecycle``: a linear warm-up over the first fifth of the run's
  steps to a peak learning rate (Adam 3e-3), then a cosine decay to 0 over the
  rest, so the number of epochs asked for is what the schedule is fitted to;
* **label smoothing** 0.1 (single-label data): it paid on glyphs, digits and photos;
* **no augmentation**: small translations (and flips for the colour photos) cost
  accuracy on three datasets of the benchmark's four at 5 epochs, few images a
  class included, so none is chosen; ``augment="translation"`` (and ``"flip"`` for photos
  and objects, never for glyphs and text, which read differently mirrored) are the
  ones to add for long runs. A run with ``flip`` gets **flip test-time
  augmentation** in ``evaluate`` and ``predict`` (the mean of the image's and its
  mirror's probabilities), said in the bundle's ``chute.json`` (single-label data:
  a multi-label model's thresholds are tuned on the image alone).

A pretrained backbone (``weights``) keeps the plain recipe it always had (Adam at
1e-3, constant, no smoothing), which the benchmark does not cover. Whatever a user
sets wins, option by option; the choice is logged in one line and kept with the run
(its ``started.json``), so a resumed run chooses the same.

Example:
    >>> from chute.fit.config import TrainConfig
    >>> config, recipe = choose(TrainConfig(), examples=54_000, num_classes=10,
    ...                         image_size=(28, 28), channels=1, multi_label=False)
    >>> config.model, config.schedule, config.augment, recipe.tta
    ('chute-cnn', 'onecycle', (), None)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from chute.fit import cnns
from chute.fit.config import AUTO, TrainConfig

log = logging.getLogger(__name__)

WIDE_FROM = 100_000
"""Training images from which chute-cnn's stem gets 32 filters, not 16."""

PEAK_RATE = {"adam": 3e-3, "adamw": 3e-3, "rmsprop": 1e-3, "sgd": 0.05}
"""The one-cycle schedule's peak learning rate per optimizer."""

PLAIN_RATE = 1e-3
"""The learning rate of a pretrained backbone's run (and of any constant schedule)."""

WARMUP = 0.2
"""The share of a one-cycle run's steps spent warming up."""

LABEL_SMOOTHING = 0.1

PRETRAINED_MODEL = "MobileNetV2"
"""What ``model="auto"`` builds with ``weights="imagenet"``."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What was chosen for a run, and why, in words.

    Attributes:
        kind: the kind of images as the recipe reads it: ``"grayscale"`` (glyphs,
            digits, text: no flips) or ``"colour"`` (photos, objects: flips).
        width: chute-cnn's stem filters (None for another model).
        tta: ``"flip"`` where evaluation and prediction average the image's and
            its mirror's probabilities (flips were used in training), else None.
        summary: the one line logged.
    """

    kind: str
    width: int | None
    tta: str | None
    summary: str

    def as_dict(self) -> dict[str, Any]:
        """The recipe as the run folder and the bundle keep it."""
        return {"kind": self.kind, "width": self.width, "tta": self.tta, "summary": self.summary}


def default_model(config: TrainConfig) -> str:
    """The model ``model="auto"`` means: chute-cnn, or with ImageNet weights
    :data:`PRETRAINED_MODEL`; a model named by the config is itself.

    Example:
        >>> default_model(TrainConfig()), default_model(TrainConfig(weights="imagenet"))
        ('chute-cnn', 'MobileNetV2')
    """
    if config.model != AUTO:
        return config.model
    if config.weights is not None and str(config.weights).lower() == "imagenet":
        return PRETRAINED_MODEL
    return "chute-cnn"


def choose(
    config: TrainConfig,
    *,
    examples: int,
    num_classes: int,
    image_size: tuple[int, int],
    channels: int,
    multi_label: bool,
) -> tuple[TrainConfig, Recipe]:
    """Fills the options ``config`` leaves unset from the data; returns the config every
    option of which is set, and the :class:`Recipe` (logged in one line).

    Args:
        config: the run's options; ``model="auto"``, ``learning_rate=None``,
            ``schedule="auto"``, ``label_smoothing=None`` and ``augment=None`` are
            chosen here, anything else is kept.
        examples: training images.
        num_classes: classes (labels, for multi-label data).
        image_size: the model's input ``(height, width)``.
        channels: 1 (grayscale) or 3.
        multi_label: whether images carry several labels (no label smoothing then).

    Example:
        >>> config, recipe = choose(TrainConfig(augment="flip"), examples=500,
        ...                         num_classes=3, image_size=(32, 32), channels=3,
        ...                         multi_label=False)
        >>> config.augment, recipe.tta
        (('flip',), 'flip')
    """
    scratch = config.weights is None
    kind = "grayscale" if channels == 1 else "colour"
    model = default_model(config)
    schedule = config.schedule
    if schedule == AUTO:
        schedule = "onecycle" if scratch else "constant"
    rate = config.learning_rate
    if rate is None:
        rate = PEAK_RATE[config.optimizer] if schedule == "onecycle" else PLAIN_RATE
    smoothing = config.label_smoothing
    if smoothing is None:
        smoothing = LABEL_SMOOTHING if scratch and not multi_label else 0.0
    augment = () if config.augment is None else config.augment
    width = None
    if model.lower().replace("_", "-") == "chute-cnn":  # as models.resolve_model folds it
        width = 32 if examples >= WIDE_FROM else cnns.DEFAULT_WIDTH
    chosen = dataclasses.replace(
        config,
        model=model,
        schedule=schedule,
        learning_rate=rate,
        label_smoothing=smoothing,
        augment=augment,
    )
    # single-label only: a multi-label model's thresholds are tuned on unflipped scores
    tta = "flip" if "flip" in augment and not multi_label else None
    recipe = Recipe(
        kind,
        width,
        tta,
        _summary(
            chosen,
            kind + (" multi-label" if multi_label else ""),
            width,
            tta,
            examples,
            num_classes,
            image_size,
            channels,
        ),
    )
    log.info("recipe: %s", recipe.summary)
    return chosen, recipe


def _summary(
    config: TrainConfig,
    kind: str,
    width: int | None,
    tta: str | None,
    examples: int,
    num_classes: int,
    size: tuple[int, int],
    channels: int,
) -> str:
    small = "small " if max(size) <= 64 else ""
    data = f"{small}{kind} {size[0]}x{size[1]}, {num_classes:,} classes, {examples:,} images"
    model = config.model
    if width is not None:
        model += f" width {width} ({cnns.stages(size)} stages)"
    over = f"over {config.epochs} epochs"
    if config.time_limit is not None:
        over = f"fitted to the time limit ({config.time_limit:g} s, at most {config.epochs} epochs)"
    if config.schedule == "onecycle":
        schedule = (
            f"{config.optimizer} {config.learning_rate:g} one-cycle ({WARMUP:.0%} warm-up, "
            f"cosine to 0) {over}"
        )
    else:
        schedule = f"{config.optimizer} {config.learning_rate:g} {config.schedule}"
    augment = ", ".join(config.augment) or "none"
    return (
        f"{data} -> {model}, {schedule}, label smoothing {config.label_smoothing:g}, "
        f"augment {augment}, test-time flips {'yes' if tta else 'no'}"
    )
