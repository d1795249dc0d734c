"""What the Grain engine will read and how: ``chute.load``'s options resolved against the
manifest into a :class:`GrainPlan`, before anything is built. Making a plan has no side
effect.

Example:
    >>> plan = make_plan(manifest, "train", LoadOptions(batch_size=128))  # doctest: +SKIP
    >>> plan.steps, plan.share  # doctest: +SKIP
    (203, Share(pipelines=1, index=0, replicas=1))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute.errors import ChuteError
from chute.format.manifest import Manifest
from chute.read import share as share_lib
from chute.read.options import LoadOptions
from chute.read.target import target


@dataclasses.dataclass(frozen=True)
class GrainPlan:
    """Everything one input pipeline's Grain dataset is built from.

    Attributes:
        split: the split read.
        records: the records of the split (every pipeline's draw is over all of them).
        share: which input pipeline this is, of how many.
        batch_size: of this pipeline's batches (``batch_size`` times the replicas of a
            ``tf.distribute`` strategy of one host).
        steps: batches in an epoch (see :func:`chute.read.share.steps`).
        training: training draws (a new global shuffle each epoch, crops and flips,
            full batches), else evaluation (every example once, in record order).
        shape: ``(height, width, channels)`` of the images yielded.
        interpolation: the stored images' resize method, for evaluation's exact pixels.
        random_crop: ``(scale, ratio)`` ranges of training's random-resized crop, or None.
        crop_fraction: evaluation's centre crop.
        flip: flip left-right per image, half of the time (training).
        heavy: augmentations left to the train step (``augment_on="device"``).
        num_classes: the dataset's classes (for one-hot labels).
        dtype: of the images yielded: ``"uint8"``, or ``"float32"``/``"bfloat16"`` in [0, 1].
        label_mode: ``"int"``, ``"categorical"``, ``"binary"``, ``"multi_hot"`` (a
            multi-label dataset), or None (images alone).
        multi_label: the records hold ``labels`` lists, not one ``class``.
        weights: each batch carries the records' sample weights (third element).
        pad_final_batch: evaluation's last batch padded to full size, each batch with
            weights (0 for padding), every pipeline running the largest share's steps.
        repeat: each ``iter()`` runs on from epoch to epoch (training) or repeats the
            split (evaluation), rather than ending with the epoch.
        seed: of the draws, crops and flips; None: drawn when the dataset is made, or
            derived from the split's shards when several training pipelines share one order.
        sampling: training's class sampling as given (``LoadOptions.sampling``), or None.
        workers: Grain worker processes (None: the default, 0: threads).
        shard_window: training's shard-block shuffle, this many shards at a time (None:
            a global shuffle unless the split is larger than the shard cache).
    """

    split: str
    records: int
    share: share_lib.Share
    batch_size: int
    steps: int
    training: bool
    shape: tuple[int, int, int]
    interpolation: str
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None
    crop_fraction: float
    flip: bool
    heavy: tuple[Any, ...]
    num_classes: int
    dtype: str
    label_mode: str | None
    pad_final_batch: bool
    repeat: bool
    seed: int | None
    sampling: Any
    workers: int | None
    shard_window: int | None = None
    multi_label: bool = False
    weights: bool = False

    @property
    def num_examples(self) -> int:
        """Examples this pipeline reads in an epoch: its draws in training (``steps``
        full batches of one global order), its contiguous share in evaluation."""
        if self.training:
            # Training draws whole batches of one global order: the rest sit out the epoch.
            return self.steps * self.batch_size
        return self.sizes[self.share.index]

    @property
    def sizes(self) -> list[int]:
        """Records each pipeline's share holds (contiguous runs of the split or its draw)."""
        return share_lib.record_sizes(self.records, self.share.pipelines)


def make_plan(
    manifest: Manifest, split: str, options: LoadOptions, share: share_lib.Share, replicas: int = 1
) -> GrainPlan:
    """What ``chute.load(manifest, split, options, engine="grain")`` reads in input
    pipeline ``share``, whose batches feed ``replicas`` replicas of one host.

    Raises:
        ChuteError: what the options ask cannot be read from this dataset, or with Grain.
    """
    if options.skip_corrupt:
        raise ChuteError(
            "`skip_corrupt` is the tf.data engine's; the Grain engine checks every record's "
            "CRC and stops at a damaged one. Received: skip_corrupt=True with engine='grain'"
        )
    if options.sampling is not None and options.shard_window is not None:
        raise ChuteError(
            "`sampling` draws from the whole split, a `shard_window` reads a few shards at a "
            "time: pass one of them. Received: sampling="
            f"{options.sampling!r}, shard_window={options.shard_window}"
        )
    aim = target(manifest, split, options)
    spec = options.augment_spec
    heavy = spec.heavy if aim.training else ()
    if heavy and options.augment_on != "device":
        raise ChuteError(
            f"augmentations {list(heavy)} run in the train step on the Grain engine: pass "
            "augment_on='device' (crop and flip run in Grain's workers). "
            "Received: augment_on='host'"
        )
    records = sum(manifest.shard_counts(split))
    # One Grain batch feeds every replica of this host: the strategy splits it.
    batch_size = options.batch_size * replicas
    if records == 0:
        raise ChuteError(f"split {split!r} of {manifest.location} has no examples to read here")
    # An empty share is no error: a JAX process whose evaluation share is empty (fewer
    # examples than processes) still runs the others' steps, padded with weight 0.
    sizes = share_lib.record_sizes(records, share.pipelines)
    steps = share_lib.steps(
        sizes, share.index, batch_size, training=aim.training, pad=options.pad_final_batch
    )
    return GrainPlan(
        split=split,
        records=records,
        share=share,
        batch_size=batch_size,
        steps=steps,
        training=aim.training,
        shape=aim.shape,
        interpolation=manifest.image.interpolation,
        random_crop=aim.random_crop,
        # Training crops at random instead; the centre crop is evaluation's.
        crop_fraction=aim.crop_fraction if not aim.training else 1.0,
        flip=aim.training and spec.flip,
        heavy=tuple(heavy),
        num_classes=manifest.num_classes,
        dtype=options.dtype,
        label_mode=aim.label_mode,
        multi_label=aim.multi_label,
        weights=aim.weights,
        pad_final_batch=options.pad_final_batch,
        repeat=options.repeat,
        seed=None if options.seed is None else int(options.seed),
        # Evaluation reads every example once, whatever the sampling asks.
        sampling=options.sampling if aim.training else None,
        workers=options.workers,
        shard_window=options.shard_window,
    )
