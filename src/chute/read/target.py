"""What both engines make of ``LoadOptions`` against the manifest before their own plans:
training or evaluation, the shape images are yielded at, the crops, and what this dataset
cannot give (refused before any work). Pure: nothing is read but the manifest.

Example:
    >>> default_crop_fraction(ImageSpec(None, None, 3, "jpeg", shorter_side=256))
    0.875
"""

from __future__ import annotations

import dataclasses
import logging

from chute.errors import ChuteError
from chute.format.manifest import Manifest
from chute.format.spec import ImageSpec
from chute.read.options import LoadOptions

log = logging.getLogger(__name__)

DEFAULT_CROP_FRACTION = 0.875  # evaluation: centre crop of 224 from 256, the usual


@dataclasses.dataclass(frozen=True)
class Target:
    """What a split is read as, whichever the engine.

    Attributes:
        training: shuffled, augmented, full batches (else evaluation: every example once).
        shape: ``(height, width, channels)`` of the images yielded.
        crop_fraction: evaluation's centre crop (1.0 in training).
        random_crop: ``(scale, ratio)`` ranges of training's random-resized crop, or None.
        label_mode: the options' label mode with ``"auto"`` resolved against the dataset.
        multi_label: the records hold ``labels`` lists (a multi-label dataset).
        weights: each batch carries the records' sample weights.
    """

    training: bool
    shape: tuple[int, int, int]
    crop_fraction: float
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None
    label_mode: str | None = "int"
    multi_label: bool = False
    weights: bool = False


def target(manifest: Manifest, split: str, options: LoadOptions) -> Target:
    """The :class:`Target` of reading ``split`` with ``options``, or a ChuteError naming
    what the options ask that this dataset or split cannot give."""
    manifest.check_split(split)
    # By default only the train split trains; val and test are read once, in order.
    training = (split == "train") if options.training is None else options.training
    _check_against(manifest, split, options, training)
    label_mode = options.label_mode
    if label_mode == "auto":
        label_mode = "multi_hot" if manifest.multi_label else "int"
    _check_labels(manifest, options, label_mode)
    weights = _weights(manifest, options, training, label_mode)
    stored = manifest.image
    size = options.image_size or stored.size
    if size is None:
        raise ChuteError(
            f"{manifest.location} stores images at their own sizes; pass image_size=(H, W). "
            "Received: image_size=None"
        )
    crop_fraction = options.crop_fraction
    if crop_fraction is None:
        crop_fraction = default_crop_fraction(stored)
    random = training and options.augment_spec.crop
    return Target(
        training=training,
        shape=(*size, stored.channels),
        crop_fraction=crop_fraction,
        random_crop=(options.crop_scale, options.crop_ratio) if random else None,
        label_mode=label_mode,
        multi_label=manifest.multi_label,
        weights=weights,
    )


def _check_labels(manifest: Manifest, options: LoadOptions, label_mode: str | None) -> None:
    """What a label mode asks that this dataset's labels cannot give."""
    if manifest.multi_label and label_mode not in ("multi_hot", None):
        raise ChuteError(
            f"{manifest.location} is multi-label (several labels per image): `label_mode` "
            f"must be 'multi_hot' (or 'auto', or None for images alone). Received: "
            f"label_mode={options.label_mode!r}"
        )
    if not manifest.multi_label and label_mode == "multi_hot":
        raise ChuteError(
            f"`label_mode='multi_hot'` needs a multi-label dataset; {manifest.location} has "
            "one class per image: pass 'categorical' for one-hot labels. Received: "
            "label_mode='multi_hot'"
        )
    if options.augment_spec.mixing and label_mode not in ("categorical", "multi_hot"):
        raise ChuteError(
            "`augment` with 'mixup' or 'cutmix' mixes labels: it needs label_mode="
            f"'categorical' (or 'multi_hot'). Received: label_mode={options.label_mode!r}"
        )
    if manifest.multi_label and options.sampling is not None:
        raise ChuteError(
            f"`sampling` draws by class, and {manifest.location} gives an image several "
            "labels; for rare labels weigh them in the loss instead (chute train "
            f"--positive-weights balanced). Received: sampling={options.sampling!r}"
        )


def _weights(manifest: Manifest, options: LoadOptions, training: bool, label_mode) -> bool:
    """Whether batches carry the records' sample weights."""
    if options.sample_weights is None:
        wanted = manifest.weighted and training and label_mode is not None
        if wanted and options.augment_spec.mixing:
            log.info(
                "sample weights left out: MixUp and CutMix blend two images' labels, not "
                "their weights (pass sample_weights=True to be told why not)"
            )
        # not where a batch's third element is already something else
        return wanted and not options.pad_final_batch and not options.augment_spec.mixing
    if not options.sample_weights:
        return False
    if not manifest.weighted:
        raise ChuteError(
            f"`sample_weights=True` needs a dataset converted with a weight column; "
            f"{manifest.location} has none. Received: sample_weights=True"
        )
    clash = {
        "label_mode=None": label_mode is None,
        "pad_final_batch=True": options.pad_final_batch,
        "augment with mixup/cutmix": options.augment_spec.mixing,
    }
    for what, present in clash.items():
        if present:
            raise ChuteError(
                f"`sample_weights=True` cannot be combined with {what}. Received: "
                f"sample_weights=True, label_mode={options.label_mode!r}, "
                f"pad_final_batch={options.pad_final_batch!r}, augment={options.augment!r}"
            )
    return True


def _check_against(manifest: Manifest, split: str, options: LoadOptions, training: bool) -> None:
    """What the options ask that this dataset, or this split, cannot give."""
    if options.label_mode == "binary" and manifest.num_classes != 2:
        raise ChuteError(
            "`label_mode='binary'` needs exactly 2 classes. Received: "
            f"{manifest.num_classes} classes in {manifest.location}"
        )
    if options.pad_final_batch and training:
        raise ChuteError(
            "`pad_final_batch` applies to evaluation (training=False) only; split "
            f"{split!r} is read for training unless training=False"
        )
    if options.sampling is not None and not training:
        raise ChuteError(
            f"`sampling` chooses training draws; split {split!r} is read for evaluation "
            f"unless training=True. Received: sampling={options.sampling!r}"
        )
    if options.sampling is not None and options.data_service is not None:
        raise ChuteError(
            "`sampling` draws from a stream per class, which the tf.data service cannot deal "
            f"out by shard; pass one of them. Received: sampling={options.sampling!r}, "
            f"data_service={options.data_service!r}"
        )


def default_crop_fraction(stored: ImageSpec) -> float:
    """Evaluation's centre crop by default: the usual 0.875 for photos kept at their
    aspect ratio (larger than they are read), the whole image for a fixed stored size.

    Example:
        >>> default_crop_fraction(ImageSpec(8, 8, 3))
        1.0
    """
    # Images kept at their aspect ratio are stored larger than read: the usual crop.
    return 1.0 if stored.fixed_size else DEFAULT_CROP_FRACTION
