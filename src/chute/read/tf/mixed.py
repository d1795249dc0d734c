"""``chute.load([a, b], weights=[...])`` on the tf.data engine: several datasets' training
examples chosen into batches by the mixture's schedule.

Each dataset is read by the tf.data engine's own pipeline (its shards, shuffle, crops and
flips at the mixture's size, repeated without end), its examples unbatched, their labels
put in the mixture's label space and their images in its channels. A choice stream made
from :func:`chute.read.mixture.batch_counts` (every batch's images of each dataset, dealt
in a random order) picks from them (``tf.data.Dataset.choose_from_datasets``), so every
batch holds each dataset's share exactly where the batch allows. Heavy augmentations and
the label mode apply to the mixed batches. Under a ``tf.distribute`` strategy each input
pipeline mixes its own batches (each replica's batch is composed by the schedule).

Example:
    >>> train = chute.load(["pets", "wild"], weights=[0.75, 0.25])  # doctest: +SKIP
    >>> [int(n) for n in train.chute.mixture.images]  # doctest: +SKIP
    [3072, 1024]
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.image.channels import LUMA
from chute.lazy import tf
from chute.read import mixture as mixture_lib
from chute.read.augment import FUSED, DeviceAugmentation
from chute.read.options import LoadOptions
from chute.read.share import Share
from chute.read.target import target
from chute.read.tf.host_augment import NAMES as HOST
from chute.read.tf.host_augment import HostAugmentation

log = logging.getLogger(__name__)

_HOST_KEY = 11  # the host augmentations' keys: Dataset.random(seed + _HOST_KEY)


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """What one input pipeline's mixture reads: its batches and the schedule of each."""

    counts: np.ndarray  # steps x datasets: images of each dataset in each batch
    batch_size: int
    shape: tuple[int, int, int]
    label_mode: str | None
    multi_label: bool
    num_classes: int
    training: bool

    @property
    def steps(self) -> int:
        """Batches of an epoch."""
        return len(self.counts)


def make_mixed_dataset(
    mixture: mixture_lib.Mixture,
    split: str,
    options: LoadOptions,
    *,
    load: Any,
    input_context: Any = None,
):
    """The tf.data dataset of ``mixture``'s ``split`` for one input pipeline, the
    augmentation left to the device (or None), its plan and its MixInfo.

    Args:
        load: ``chute.load`` (each dataset is read by it).

    Raises:
        ChuteError: the split is read for evaluation, or what the options ask cannot be
            read from one of the datasets, or with mixing.
    """
    aim = target(mixture.first, split, options)
    if not aim.training:
        raise ChuteError(
            f"`weights` mix training draws; split {split!r} is read for evaluation (every "
            "example once): load each dataset's split on its own. Received: "
            f"split={split!r}, training={options.training!r}"
        )
    if options.data_service:
        raise ChuteError(
            "A mixture of datasets is read in this process, not through the tf.data "
            f"service. Received: data_service={options.data_service!r}"
        )
    if options.skip_corrupt:
        raise ChuteError(
            "`skip_corrupt` is not supported for a mixture of datasets: its batches are "
            "composed by a schedule. Received: skip_corrupt=True"
        )
    if aim.weights:
        raise ChuteError(
            "Sample weights are not read from a mixture of datasets: its batches are "
            "(images, labels). Received: sample_weights=True"
        )
    share = Share.of(input_context)
    batch_size = options.batch_size
    global_steps = mixture.epoch_steps(split, batch_size * max(share.replicas, 1))
    steps = global_steps * share.feeds  # each replica's batch is one of this pipeline's
    plan = MixedPlan(
        counts=mixture_lib.batch_counts(mixture.shares, batch_size, steps),
        batch_size=batch_size,
        shape=(*aim.shape[:2], mixture.channels),
        label_mode=aim.label_mode,
        multi_label=aim.multi_label,
        num_classes=len(mixture.class_names),
        training=True,
    )
    spec = options.augment_spec
    parts = []
    for index, manifest in enumerate(mixture.manifests):
        theirs = dataclasses.replace(
            options,
            image_size=plan.shape[:2],
            label_mode="multi_hot" if manifest.multi_label else "int",
            dtype="uint8",
            sample_weights=False,
            repeat=True,
            augment=tuple(item for item in options.augment if item in FUSED),
            augment_on="host",
            seed=None if options.seed is None else options.seed + 7919 * index,
        )
        part = load(manifest, split, theirs, input_context=input_context).unbatch()
        parts.append(part.map(_into_mixture(plan, manifest, mixture.maps[index])))
    seed = options.seed
    choices = tf.data.Dataset.from_tensor_slices(_choices(plan.counts, seed)).repeat()
    ds = tf.data.Dataset.choose_from_datasets(parts, choices)
    ds = ds.batch(batch_size, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE)
    heavy = spec.heavy
    device = None
    if heavy and options.augment_on == "device":
        device = DeviceAugmentation(heavy, seed)
    ds = _finished(ds, plan, () if device else heavy, options.dtype, seed)
    ds = ds.take(steps)
    ds = ds.apply(tf.data.experimental.assert_cardinality(steps))
    ds = ds.repeat() if options.repeat else ds
    ds = ds.prefetch(tf.data.AUTOTUNE)
    info = mixture.describe(split, batch_size * max(share.replicas, 1))
    log.info(
        "input pipeline %d of %d: a mixture of %d datasets (%s), %d batches of %d per epoch",
        share.index,
        share.pipelines,
        len(parts),
        mixture_lib.shown(info),
        steps,
        batch_size,
    )
    return ds, device, plan, info


def _choices(counts: np.ndarray, seed: int | None) -> np.ndarray:
    """The dataset of each example of an epoch, batch after batch: each batch's images
    of each dataset (``counts``), dealt in a random order."""
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.repeat(np.arange(counts.shape[1]), row)) for row in counts]
    return np.concatenate(rows).astype(np.int64)


def _into_mixture(plan: MixedPlan, manifest, labels: np.ndarray):
    """``(image, label) -> (image, label)`` in the mixture's channels and label space (a
    multi-label row widened to its columns; a class looked up)."""
    theirs = manifest.image.channels
    if plan.multi_label:
        # a dataset's label columns scattered into the mixture's
        spread = np.zeros((len(labels), plan.num_classes), np.float32)
        spread[np.arange(len(labels)), labels] = 1
        spread = tf.constant(spread)
    else:
        lookup = tf.constant(labels, tf.int64)

    def into(image, label):
        if theirs == 1 and plan.shape[2] == 3:
            image = tf.repeat(image, 3, axis=-1)
        elif theirs == 3 and plan.shape[2] == 1:
            weighted = tf.tensordot(tf.cast(image, tf.int32), tf.constant(LUMA, tf.int32), 1)
            image = tf.cast(tf.bitwise.right_shift(weighted + 32768, 16), tf.uint8)[..., None]
        if plan.multi_label:
            return image, tf.linalg.matvec(spread, tf.cast(label, tf.float32), transpose_a=True)
        return image, tf.gather(lookup, tf.cast(label, tf.int64))

    return into


def _finished(ds, plan: MixedPlan, heavy: tuple, dtype: str, seed: int | None):
    """Mixed batches with heavy augmentations on the host, labels in the label mode asked
    for, and the dtype."""
    host = HostAugmentation([h for h in heavy if isinstance(h, str) and h in HOST])
    layers = DeviceAugmentation([h for h in heavy if not (isinstance(h, str) and h in HOST)], seed)

    def finish(images, labels, key):
        images = tf.ensure_shape(images, (None, *plan.shape))
        if host:
            images = host(images, key)
        if plan.label_mode == "int":
            labels = tf.cast(labels, tf.int32)
        elif plan.label_mode == "binary":
            labels = tf.cast(tf.reshape(labels, (-1, 1)), tf.float32)
        elif plan.label_mode == "categorical":
            labels = tf.one_hot(labels, plan.num_classes, dtype=tf.float32)
        if layers:
            if layers.mixing:
                images, labels = layers(images, labels)
            else:
                images = layers(images)
        if dtype != "uint8":
            images = tf.cast(images, tf.float32) / 255.0
            if dtype == "bfloat16":
                images = tf.cast(images, tf.bfloat16)
        return images if plan.label_mode is None else (images, labels)

    keys = tf.data.Dataset.random(
        seed=None if seed is None else seed + _HOST_KEY, rerandomize_each_iteration=True
    )
    both = tf.data.Dataset.zip(ds, keys)
    return both.map(lambda batch, key: finish(*batch, key), num_parallel_calls=tf.data.AUTOTUNE)
