"""``chute.load``: a converted split as a ``tf.data.Dataset`` that outruns the accelerator.

``load`` checks its arguments into a :class:`~chute.read.plan.ReadPlan`, builds
the pipeline of :mod:`chute.read.graph` from it, and tells the dataset its
real size. In order (the reasons are in :func:`chute.read.graph.build`): shard
order reshuffled every epoch, parallel interleave of shards read and checked
in blocks, PNG/JPEG decoded per image on every core, cache, shuffle windows
cut into full batches (training) or every example once (evaluation),
augmentation and labels, prefetch.

Training batches drop the remainder (static shapes for TPU/XLA); evaluation
(``training=False``) sees every example exactly once: in order, no shuffle,
with a final smaller batch, or, with ``pad_final_batch=True``, a full batch
padded with zeros and a third element of per-example weights (1 real, 0 pad)
that Keras's ``evaluate`` uses as ``sample_weight``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.lazy import tf
from chute.read import service
from chute.read.augment import PLACES, DeviceAugmentation, parse_augment
from chute.read.graph import build, options
from chute.read.host_augment import NAMES as HOST
from chute.read.host_augment import HostAugmentation
from chute.read.plan import (
    DEFAULT_CROP_RATIO,
    DEFAULT_CROP_SCALE,
    ReadPlan,
    make_plan,
    release_cache,
)

log = logging.getLogger(__name__)

# skipped = corrupt + started - decoded
_COUNTED = {"corrupt": 1, "started": 1, "decoded": -1}


def load(
    path: str | os.PathLike | manifest_lib.Manifest,
    split: str = "train",
    *,
    batch_size: int = 128,
    training: bool | None = None,
    image_size: Any = None,
    dtype: str = "uint8",
    label_mode: str | None = "int",
    augment: list | tuple | None = None,
    augment_on: str = "host",
    crop_scale: tuple[float, float] = DEFAULT_CROP_SCALE,
    crop_ratio: tuple[float, float] = DEFAULT_CROP_RATIO,
    crop_fraction: float | None = None,
    cache: str | None = "auto",
    seed: int | None = None,
    shuffle_buffer: int = 8192,
    pad_final_batch: bool = False,
    repeat: bool = False,
    skip_corrupt: bool = False,
    input_context: Any = None,
    strategy: Any = None,
    data_service: str | None = None,
):
    """Reads a converted split as batches of ``(images, labels)`` with static shapes.

    Args:
        path: a directory written by ``chute convert`` (local, ``gs://``,
            ``ram://``), its ``manifest.json``, or the ``Manifest`` read from it.
        split: ``"train"``, ``"val"`` or ``"test"``.
        batch_size: examples per batch **per replica**; the global batch is
            ``batch_size * replicas`` (see ``input_context`` and ``strategy``).
        training: shuffle, drop the remainder and augment; default: ``split == "train"``.
        image_size: ``(height, width)`` of the images yielded; default: as
            stored (needed for images stored at their own sizes).
        dtype: ``"uint8"`` (0-255, the default: models rescale inside), or
            ``"float32"``/``"bfloat16"`` scaled to [0, 1].
        label_mode: ``"int"``, ``"categorical"`` (one-hot), ``"binary"`` (two
            classes, float 0/1) or ``None`` (images only), as in Keras.
        augment: training only: ``"crop"`` (an Inception-style random-resized
            crop, fused with decoding) and ``"flip"`` (left-right, per image), and
            the heavier ``"rotation"``, ``"zoom"``, ``"translation"``,
            ``"contrast"``, ``"brightness"``, ``"randaugment"``, ``"mixup"``,
            ``"cutmix"`` (needs ``label_mode="categorical"``) or Keras layers
            (see :mod:`chute.read.augment`).
        augment_on: where the heavy augmentations run: ``"host"`` (per batch in
            this pipeline) or ``"device"`` (left to the model's train step: the
            dataset's ``device_augmentation`` applies them to a batch, as
            ``chute train`` does on an accelerator).
        crop_scale: ``(min, max)`` share of an image's area that a random crop covers.
        crop_ratio: ``(min, max)`` aspect ratio (width / height) of a random crop.
        crop_fraction: evaluation: the centred window of ``image_size``'s
            aspect ratio over this share of the shorter side, resized to
            ``image_size`` (``chute.predict`` does the same). Default: 0.875 for
            images stored at their aspect ratio (``convert --shorter-side`` or
            ``--keep-size``), 1 (the whole image) for a fixed stored size.
        cache: ``"auto"`` (keep decoded images, or for cropped images their
            records, in RAM when the split fits what is left of the process's
            cache budget: a quarter of the memory it may use, the container's
            limit if lower, shared by every dataset alive), ``"memory"``,
            ``"disk:FOLDER"`` (files named by split, dataset version and input
            pipeline, so they never mix) or ``None``.
        seed: makes shuffling, interleave order and augmentation reproducible
            for any number of cores (crops and flips are keyed per image; with a
            seed, heavy augmentation on the host runs one batch at a time).
        shuffle_buffer: records mixed together (training): batches are drawn
            from windows of this many records read from several shards, at
            most 128 MB of pixels each (about four windows are held at once).
        pad_final_batch: evaluation only: pad the last batch to full size and
            yield ``(images, labels, weights)`` with weight 0 on the padding.
        repeat: repeat forever, each pass one epoch as without it (a new
            order each pass in training); ``len()`` is then infinite.
        skip_corrupt: instead of raising, skip what is damaged and count it in
            ``ds.corrupt_count()`` (what the latest epoch skipped, exact once it
            is over: it starts again at each new iterator): a missing shard,
            the rest of a shard after a record that fails its CRC or is
            truncated, images of the wrong length or that do not decode. A
            record with a valid CRC that is not a ``tf.train.Example`` still
            raises. ``len(ds)`` is then unknown. Input pipelines that share
            records (fewer shards than pipelines) each count every shard's.
        input_context: a ``tf.distribute.InputContext``: read this input
            pipeline's part (by shard when there are enough shards, else by record).
        strategy: a ``tf.distribute.Strategy``: return
            ``strategy.distribute_datasets_from_function`` over this function.
        data_service: a ``tf.data`` service dispatcher, ``grpc://HOST:PORT``
            (see :mod:`chute.read.service`): in training, its workers run this
            pipeline with dynamic sharding and this process receives the
            batches. Each example at most once per epoch (a worker that dies
            loses the rest of its shard for that epoch), and all but the last
            partial batch when none dies; a new order every epoch (``seed``
            cannot fix it), no ``cache``, no ``skip_corrupt``, heavy
            augmentations on the device. Input pipelines of several hosts share
            one job. Evaluation reads here, exactly once.

    Returns:
        A ``tf.data.Dataset`` with ``class_names``, ``num_examples``,
        ``per_replica_batch_size``, ``global_batch_size``, ``corrupt_count()``,
        ``cached_in`` (``"memory"``, the cache files' name, or None) and
        ``device_augmentation`` (None unless ``augment_on="device"``);
        ``len(ds)`` is the exact number of batches of an epoch (unless
        ``skip_corrupt`` or ``repeat``).

    Raises:
        ChuteError: for a bad argument, a path that is not a chute dataset, or
            a shard that exists but cannot be read (unless ``skip_corrupt``).
        tf.errors.InvalidArgumentError: while iterating, naming the shard, when
            a shard is corrupt, truncated or missing, or an image does not
            match the manifest (unless ``skip_corrupt``).

    Example:
        >>> train = chute.load("./kn-shards", "train", batch_size=256)  # doctest: +SKIP
        >>> model.fit(train, validation_data=chute.load("./kn-shards", "val"))  # doctest: +SKIP
    """
    if strategy is not None:
        return _distributed(path, split, strategy, locals())
    manifest = manifest_lib.load(path)
    spec = parse_augment(augment)  # checked in evaluation too
    checks.one_of("augment_on", augment_on, PLACES)
    if spec.mixing and label_mode != "categorical":
        raise ChuteError(
            "`augment` with 'mixup' or 'cutmix' mixes labels: it needs "
            f"label_mode='categorical'. Received: label_mode={label_mode!r}"
        )
    plan = make_plan(
        manifest,
        split,
        batch_size=batch_size,
        training=training,
        image_size=image_size,
        dtype=dtype,
        label_mode=label_mode,
        cache=cache,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        pad_final_batch=pad_final_batch,
        repeat=repeat,
        skip_corrupt=skip_corrupt,
        input_context=input_context,
        augment=spec,
        crop_scale=crop_scale,
        crop_ratio=crop_ratio,
        crop_fraction=crop_fraction,
        data_service=data_service,
    )
    try:
        dataset, device, counters = _dataset(plan, spec, augment_on, input_context)
    except BaseException:
        release_cache(plan.cache_bytes)
        raise
    if plan.cache_bytes:  # the budget it took comes back with the dataset
        weakref.finalize(dataset, release_cache, plan.cache_bytes)
    dataset.class_names = list(manifest.class_names)
    dataset.num_examples = plan.num_examples
    dataset.per_replica_batch_size = plan.batch_size
    dataset.global_batch_size = plan.batch_size * plan.replicas
    dataset.device_augmentation = device
    dataset.cached_in = "memory" if plan.cache == "" else plan.cache
    dataset.corrupt_count = lambda: int(
        sum(counters[name].numpy() * sign for name, sign in _COUNTED.items() if name in counters)
    )
    return dataset


def _dataset(plan: ReadPlan, spec, augment_on: str, input_context):
    """The pipeline of ``plan``: ``(dataset, augmentation left to the device, counters)``."""
    device, keras_on_host, host = _augmentations(spec, plan, augment_on)
    plan, lost = _without_unreadable(plan)
    counters = _counters(lost) if plan.skip_corrupt else {}
    dataset = build(plan, counters=counters, augmentation=keras_on_host, host=host)
    if counters:
        dataset = _counted_per_epoch(dataset, counters, lost)
    if plan.data_service:
        dataset = _through_service(dataset, plan)
    elif input_context is not None:
        _log_share(plan, input_context)
    return dataset, device, counters


def _augmentations(spec, plan: ReadPlan, augment_on: str):
    """``(for the device, Keras layers on the host, OpenCV on the host)``, each or None.

    Crops and flips fused with decoding are in ``plan``; a flip that is not (images
    read in blocks) is one of the heavy ones.
    """
    heavy = spec.heavy if plan.per_image or not spec.flip else ("flip", *spec.heavy)
    heavy = heavy if plan.training else ()
    if not heavy:
        return None, None, None
    if augment_on == "device":
        return DeviceAugmentation(heavy, plan.seed), None, None
    if plan.data_service:
        raise ChuteError(
            f"augmentations {list(heavy)} run in Python or Keras layers, which the tf.data "
            "service's workers cannot run; pass augment_on='device' (they then run in the "
            "train step). Received: augment_on='host'"
        )
    host = HostAugmentation([h for h in heavy if isinstance(h, str) and h in HOST])
    layers = [h for h in heavy if not (isinstance(h, str) and h in HOST)]
    return None, DeviceAugmentation(layers, plan.seed) or None, host or None


def _without_unreadable(plan: ReadPlan) -> tuple[ReadPlan, int]:
    """``plan`` without the shards that exist but cannot be read, and the records those hold.

    Such a shard is an error naming it, or, with ``skip_corrupt``, skipped and
    counted: read under ``ignore_errors``, TensorFlow would retry opening it
    forever. (Missing shards are handled while reading, where they read as empty.)
    """
    bad = storage.unreadable(plan.files)
    if not bad:
        return plan, 0
    if not plan.skip_corrupt:
        path, error = next(iter(bad.items()))
        raise ChuteError(
            f"shard {path} cannot be read ({error}). Check its permissions, "
            "run `chute verify`, or pass skip_corrupt=True"
        )
    kept = [(path, n) for path, n in zip(plan.files, plan.counts, strict=True) if path not in bad]
    lost = sum(plan.counts) - sum(n for _, n in kept)
    log.warning("skipping %d unreadable shard(s) (%d records): %s", len(bad), lost, sorted(bad))
    files, counts = (tuple(p for p, _ in kept), tuple(n for _, n in kept))
    return dataclasses.replace(plan, files=files, counts=counts), lost


def _counted_per_epoch(dataset, counters: dict, lost: int):
    """``dataset`` whose counters start again at each epoch (each new iterator): after a
    full pass, ``corrupt_count()`` is what that pass skipped (shards that cannot be
    read count in every pass)."""

    def restart(_):
        for name, counter in counters.items():
            counter.assign(lost if name == "corrupt" else 0)
        return dataset

    return tf.data.Dataset.range(1).flat_map(restart).with_options(options())


def _counters(lost: int) -> dict:
    """Variables counting what ``skip_corrupt`` skips (see :data:`_COUNTED`)."""
    return {
        name: tf.Variable(
            lost if name == "corrupt" else 0, dtype=tf.int64, trainable=False, name=f"chute_{name}"
        )
        for name in _COUNTED
    }


def _log_share(plan: ReadPlan, context) -> None:
    """What this input pipeline (host) reads of the split, for a multi-host run's logs."""
    how = f"every {plan.every_nth[0]}th record" if plan.every_nth else f"{len(plan.files)} shard(s)"
    log.info(
        "input pipeline %d of %d reads %s, %d examples: %d batches of %d per epoch",
        context.input_pipeline_id,
        context.num_input_pipelines,
        how,
        plan.num_examples,
        plan.steps,
        plan.batch_size,
    )


def _through_service(dataset, plan: ReadPlan):
    """The pipeline run by the ``tf.data`` service's workers; this process receives the
    batches (a new job each epoch; with ``repeat``, each repetition is the next one)."""
    log.info(
        "input pipeline: %s split read through the tf.data service at %s%s",
        "training" if plan.training else "evaluation",
        plan.data_service,
        f" (job {plan.job_name}, shared by the hosts)" if plan.job_name else "",
    )
    dataset = service.read_through(dataset, plan.data_service, name=plan.job_name)
    # Each worker's last batch is short: regrouped here into full batches (static shapes).
    # The filter keeps them full where tf.distribute rewrites the batching (Keras's fit
    # under a strategy: experimental_distribute_dataset yielded the short rest in TF 2.21).
    size = plan.batch_size
    dataset = dataset.rebatch(size, drop_remainder=True)
    dataset = dataset.filter(lambda *batch: tf.shape(tf.nest.flatten(batch)[0])[0] == size)
    if plan.repeat:
        dataset = dataset.repeat()
    return dataset.prefetch(tf.data.AUTOTUNE)


def _distributed(path, split, strategy, arguments):
    """``strategy.distribute_datasets_from_function`` over ``load``, one pipeline per worker."""
    kwargs = {k: v for k, v in arguments.items() if k not in ("path", "split", "strategy")}
    manifest = manifest_lib.load(path)  # read once, not once per input pipeline

    def dataset_fn(input_context):
        return load(manifest, split, **dict(kwargs, input_context=input_context))

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    distributed.class_names = list(manifest.class_names)
    distributed.per_replica_batch_size = kwargs["batch_size"]
    distributed.global_batch_size = kwargs["batch_size"] * strategy.num_replicas_in_sync
    return distributed
