"""``chute.load([a, b], weights=[...])`` on the tf.data engine: several datasets' training
images put together into batches by the mixture's schedule
(:func:`chute.read.mixture.batch_counts`: each dataset's share of every batch, rounded
down or up, exactly when it is whole).

Each dataset is read by the tf.data engine's own pipeline (its shards, shuffle, crops and
flips at the mixture's size, repeated without end), with its labels put in the mixture's
label space and its images in its channels. Then, so that an image is copied no more
than it has to be:

- images decoded one by one (photos, crops): each dataset's images as decoded are
  chosen into batches by the schedule, each batch's slots dealt at random
  (``choose_from_datasets``); the batch is the image's one copy, as for one dataset;
- images decoded in blocks (raw pixels) and multi-label data: each dataset is read in
  batches, regrouped into its count of each mixed batch in turn (``Dataset.rebatch``:
  tensors sliced and joined, no step per image), and the parts of a batch placed in
  slots dealt at random (``tf.dynamic_stitch``, one copy).

Heavy augmentations and the label mode apply to the mixed batches. Under a
``tf.distribute`` strategy each input pipeline mixes its own batches.

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

from chute.image.channels import LUMA
from chute.lazy import tf
from chute.read import mixture as mixture_lib
from chute.read.augment import FUSED, DeviceAugmentation
from chute.read.options import LoadOptions
from chute.read.share import Share
from chute.read.target import target
from chute.read.tf.host_augment import NAMES as HOST
from chute.read.tf.host_augment import HostAugmentation
from chute.read.tf.plan import make_plan

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

    @property
    def steps(self) -> int:
        """Batches of an epoch."""
        return len(self.counts)


def make_mixed_dataset(
    mixture: mixture_lib.Mixture,
    split: str,
    options: LoadOptions,
    *,
    engine: Any,
    input_context: Any = None,
):
    """The tf.data dataset of ``mixture``'s ``split`` for one input pipeline, the
    augmentation left to the device (or None), its plan and its MixInfo.

    Args:
        engine: the tf.data engine (:class:`~chute.read.tf.engine.TfEngine`), which
            plans and builds each dataset's pipeline.

    Raises:
        ChuteError: the split is read for evaluation, or what the options ask cannot be
            read from one of the datasets, or with mixing.
    """
    options = mixture_lib.reading_options(options, split)
    aim = target(mixture.first, split, options)
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
    )
    spec = options.augment_spec
    seed = options.seed
    if seed is None:  # one order of slots for this dataset, drawn now
        seed = int(np.random.default_rng().integers(1 << 31))
    parts = _parts(engine, mixture, split, options, plan, input_context)
    if all(part.per_image and not part.multi_label for part, _ in parts):
        ds = _by_image(engine, mixture, parts, plan, seed)
    else:
        ds = _by_batch(engine, mixture, parts, plan, seed)
    heavy = spec.heavy
    device = None
    if heavy and options.augment_on == "device":
        device = DeviceAugmentation(heavy, seed)
    ds = _finished(ds, plan, () if device else heavy, options.dtype, options.seed)
    if not options.repeat:  # an epoch an iterator (each a new start of every dataset)
        ds = ds.take(steps).apply(tf.data.experimental.assert_cardinality(steps))
    # With repeat, the stream runs on: a repeat of epochs would start every dataset's
    # pipeline again at each (measured: half the raw glyphs a second).
    ds = ds.prefetch(tf.data.AUTOTUNE)
    # Not started when the iterator is made: warm-started, the pipelines of several
    # datasets together stopped for good after a few passes (TF 2.21, in bench_mix.py:
    # every thread waiting, the 7th pass of alternating photo and glyph mixtures).
    options = tf.data.Options()
    options.experimental_warm_start = False
    ds = ds.with_options(options)
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


def _parts(engine, mixture, split: str, options: LoadOptions, plan: MixedPlan, context) -> list:
    """Each dataset's tf.data engine plan and reading options: batches of its largest
    count (at most its split), at the mixture's size, with int (or multi-hot) labels,
    the crops and flips, repeated without end."""
    parts = []
    try:
        for index, manifest in enumerate(mixture.manifests):
            sizes = plan.counts[:, index]
            theirs = dataclasses.replace(
                mixture_lib.part_options(options, manifest, plan.shape[:2]),
                repeat=True,
                augment=tuple(item for item in options.augment if item in FUSED),
                augment_on="host",
                seed=None if options.seed is None else options.seed + 7919 * index,
            )
            # What this input pipeline holds of the dataset (a plan reserves nothing; one
            # that holds none is refused there, naming the dataset).
            held = make_plan(manifest, split, theirs, input_context=context).num_examples
            size = int(max(1, min(sizes.max(), held)))
            theirs = dataclasses.replace(theirs, batch_size=size)
            parts.append((engine.plan(manifest, split, theirs, input_context=context), theirs))
    except BaseException:
        for part_plan, _ in parts:  # what the plans made so far reserved goes back
            engine.release(part_plan)
        raise
    return parts


def _built(engine, mixture, parts: list, **changes) -> list:
    """Each part's dataset (its plan changed by ``changes``), built by the tf.data engine;
    what plans of parts not built reserved of the cache budget goes back on an error."""
    built = []
    try:
        for manifest, (part_plan, theirs) in zip(mixture.manifests, parts, strict=True):
            dataset, _ = engine.build(dataclasses.replace(part_plan, **changes), manifest, theirs)
            built.append(dataset)
    except BaseException:
        for part_plan, _ in parts[len(built) + 1 :]:  # build gives back its own plan's
            engine.release(part_plan)
        raise
    return built


def _by_image(engine, mixture, plans: list, plan: MixedPlan, seed: int):
    """Images decoded one by one (photos): each dataset's images as decoded, chosen into
    batches by the schedule, each batch's slots dealt at random; the batch is the one copy
    an image takes, as when one dataset is read."""
    parts = []
    for index, images in enumerate(_built(engine, mixture, plans, images_alone=True)):
        labels = mixture.labels_of(index)
        if (labels == np.arange(len(labels))).all():  # the first dataset's: as they are
            parts.append(images)
            continue
        lookup = tf.constant(labels, tf.int64)
        parts.append(
            images.map(
                lambda image, label, lookup=lookup: (image, tf.gather(lookup, label)),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
        )
    counts = tf.constant(plan.counts, tf.int64)
    steps = plan.steps

    def slots(number):
        batch = number % steps
        datasets = tf.repeat(tf.range(len(parts), dtype=tf.int64), counts[batch])
        dealt = tf.random.experimental.stateless_shuffle(
            datasets, seed=tf.stack([tf.constant(seed, tf.int64), number])
        )
        return tf.data.Dataset.from_tensor_slices(dealt)

    choices = tf.data.Dataset.counter().flat_map(slots)
    ds = tf.data.Dataset.choose_from_datasets(parts, choices)
    return ds.batch(plan.batch_size, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE)


def _by_batch(engine, mixture, plans: list, plan: MixedPlan, seed: int):
    """Images decoded in blocks (raw pixels), or multi-label: each dataset read in batches
    (``load``), brought into the mixture a batch at a time, regrouped into its count of
    each mixed batch in turn (``rebatch``: tensors sliced and joined), and the parts of a
    batch dealt into its slots."""
    parts = []
    for index, part in enumerate(_built(engine, mixture, plans)):
        manifest, (_, theirs) = mixture.manifests[index], plans[index]
        sizes = plan.counts[:, index]
        labels = mixture.labels_of(index)
        same = (labels == np.arange(len(labels))).all()
        if not same or manifest.image.channels != plan.shape[2] or plan.multi_label:
            into = _into_mixture(plan, manifest, labels)
            part = part.map(into, num_parallel_calls=tf.data.AUTOTUNE)
        # (Read in batches of its count when that never changes: nothing to regroup.)
        whole = sizes.min() == sizes.max() == theirs.batch_size
        parts.append(part if whole else part.rebatch(tf.constant(sizes, tf.int64)))
    numbers = tf.data.Dataset.counter()
    return tf.data.Dataset.zip(tuple(parts), numbers).map(
        _dealt(plan.batch_size, seed), num_parallel_calls=tf.data.AUTOTUNE
    )


def _dealt(batch_size: int, seed: int):
    """``((each dataset's images, labels), batch number) -> (images, labels)``: one
    mixed batch, each dataset's images placed in slots drawn at random, keyed by ``(seed,
    number)`` (so that each replica's part of a batch holds every dataset in about its
    share), in one copy (``tf.dynamic_stitch``)."""

    def deal(parts, number):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(batch_size), seed=tf.stack([tf.constant(seed, tf.int64), number])
        )
        sizes = [tf.shape(labels)[0] for _, labels in parts]
        slots = tf.split(order, tf.stack(sizes)) if len(parts) > 1 else [order]
        images = tf.dynamic_stitch(slots, [images for images, _ in parts])
        # one dtype: a first dataset's labels come as read (int32, or multi-hot floats)
        floating = any(labels.dtype.is_floating for _, labels in parts)
        kind = tf.float32 if floating else tf.int64
        labels = tf.dynamic_stitch(slots, [tf.cast(labels, kind) for _, labels in parts])
        return images, labels

    return deal


def _into_mixture(plan: MixedPlan, manifest, labels: np.ndarray):
    """``(images, labels) -> (images, labels)``, a batch in the mixture's channels and
    label space (multi-label rows widened to its columns; classes looked up)."""
    theirs = manifest.image.channels
    if plan.multi_label:
        # a dataset's label columns scattered into the mixture's
        spread = np.zeros((len(labels), plan.num_classes), np.float32)
        spread[np.arange(len(labels)), labels] = 1
        spread = tf.constant(spread)
    else:
        lookup = tf.constant(labels, tf.int64)

    def into(images, labels):
        if theirs == 1 and plan.shape[2] == 3:
            images = tf.repeat(images, 3, axis=-1)
        elif theirs == 3 and plan.shape[2] == 1:
            weighted = tf.tensordot(tf.cast(images, tf.int32), tf.constant(LUMA, tf.int32), 1)
            images = tf.cast(tf.bitwise.right_shift(weighted + 32768, 16), tf.uint8)[..., None]
        if plan.multi_label:
            return images, tf.matmul(tf.cast(labels, tf.float32), spread)
        return images, tf.gather(lookup, tf.cast(labels, tf.int64))

    return into


def _finished(ds, plan: MixedPlan, heavy: tuple, dtype: str, seed: int | None):
    """Mixed batches with heavy augmentations on the host, labels in the label mode asked
    for, and the dtype."""
    host = HostAugmentation([h for h in heavy if isinstance(h, str) and h in HOST])
    layers = DeviceAugmentation([h for h in heavy if not (isinstance(h, str) and h in HOST)], seed)

    def finish(images, labels, key):
        # Static shapes, the batch size included (TPU/XLA compile for them).
        images = tf.ensure_shape(images, (plan.batch_size, *plan.shape))
        labels = tf.ensure_shape(
            labels, (plan.batch_size, plan.num_classes) if plan.multi_label else (plan.batch_size,)
        )
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
