"""What the tf.data engine will read and how: ``chute.load``'s options resolved against
the manifest into a :class:`ReadPlan`, before anything is built. Making a plan has no
side effect.

Example:
    >>> plan = make_plan(manifest, "train", LoadOptions(batch_size=128))  # doctest: +SKIP
    >>> plan.steps, plan.deterministic  # doctest: +SKIP
    (201, False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

from chute.errors import ChuteError
from chute.format import storage
from chute.format.manifest import Manifest
from chute.format.spec import ImageSpec
from chute.machine import available_cores
from chute.read import share as share_lib
from chute.read.options import LoadOptions
from chute.read.sampling import class_probabilities, describe, share_counts
from chute.read.target import target
from chute.read.tf import service

log = logging.getLogger(__name__)

BLOCK = 256  # records read, checked and decoded together from one shard
WINDOW_BYTES = 128 << 20  # the most one shuffle window holds (decoded pixels, or records)


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Everything the pipeline of one input pipeline is built from.

    Attributes:
        files: this input pipeline's shards, and ``counts`` the records of each.
        stored: how the shards store images.
        shape: ``(height, width, channels)`` of the images yielded.
        deterministic: the order of elements is fixed (evaluation, a seed, or
            input pipelines sharing records); otherwise a slow file never
            holds the others up.
        reshuffle_each_epoch: a new shard order and new block boundaries each epoch.
        every_nth: ``(pipelines, index)``: keep every n-th record, when there
            are fewer shards than input pipelines.
        per_image: each image is decoded (cropped, resized) on its own after the
            shuffle (:mod:`chute.image.tf_ops`): images stored at other sizes,
            random-resized crops, a centre crop, or PNG/JPEG images not cached
            decoded. Otherwise blocks of decoded pixels are cached and shuffled.
        cache: ``tf.data`` cache file name (``""`` in memory), or None; with
            ``per_image``, the encoded records are cached.
        window: records per shuffle window (training).
        random_crop: ``(scale, ratio)`` ranges of training's random-resized
            crop, or None.
        flip: flip left-right per image while decoding (with ``per_image``).
        crop_fraction: evaluation's centre crop (with ``per_image``).
        steps: batches in an epoch, the same for every input pipeline (see
            :func:`chute.read.share.steps`). Through the ``tf.data`` service: the
            epoch's batches if nothing is lost.
        data_service: a ``tf.data`` service dispatcher (``grpc://HOST:PORT``)
            whose workers run this pipeline (training), or None.
        job_name: the service job that several input pipelines share, or None.
        sampling: training's class sampling: the probability of drawing each class
            (by label, summing to 1), or None (every record once an epoch). Records
            are then decoded one by one (``per_image``), after the draw.
        class_counts: with ``sampling``, each class's examples in this pipeline's share.
        shard_classes: with ``sampling``, the classes each of ``files`` holds.
        images_alone: a ``per_image`` training plan yields its ``(image, label)``
            elements as decoded, unbatched and without end (a mixture of datasets
            batches them, :mod:`chute.read.tf.mixed`).
    """

    files: tuple[str, ...]
    counts: tuple[int, ...]
    stored: ImageSpec
    shape: tuple[int, int, int]
    num_classes: int
    num_examples: int
    training: bool
    deterministic: bool
    reshuffle_each_epoch: bool
    every_nth: tuple[int, int] | None
    cores: int
    cache: str | None
    cache_bytes: int  # for cache="auto": what the caller reserves from the process's budget
    batch_size: int
    # which input pipeline this is, of how many, feeding how many replicas (None: no
    # input context, the only pipeline)
    share: share_lib.Share | None
    seed: int | None
    dtype: str
    label_mode: str | None
    per_image: bool
    multi_label: bool
    weights: bool
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None
    flip: bool
    crop_fraction: float
    window: int | None
    shuffle_buffer: int
    repeat: bool
    pad_final_batch: bool
    skip_corrupt: bool
    steps: int
    data_service: str | None = None
    job_name: str | None = None
    sampling: tuple[float, ...] | None = None
    class_counts: tuple[int, ...] = ()
    shard_classes: tuple[tuple[int, ...], ...] = ()
    images_alone: bool = False

    @property
    def shuffled_blocks(self) -> int:
        """Blocks the block shuffle holds: about a window's worth, so that it too
        holds at most ``WINDOW_BYTES`` (the window is capped by bytes, and whole
        blocks of ``BLOCK`` records are shuffled), two at the least."""
        # Two at the least: with one block the shuffle would not mix blocks at all.
        return max(2, (self.window or self.shuffle_buffer) // BLOCK)

    @property
    def own_steps(self) -> int:
        """Batches this pipeline's examples make: full ones in training, every example
        in evaluation (see ``steps`` for what it yields)."""
        if self.training:
            return self.num_examples // self.batch_size
        # Ceiling division: evaluation keeps the last, partial batch.
        return -(-self.num_examples // self.batch_size)

    @property
    def class_streams(self) -> tuple[tuple[int, bool], ...]:
        """Class sampling: ``(label, kept)`` for each class drawn; ``kept``: its records are
        cached after their first pass, when there is a cache and an epoch draws the class
        at least twice over (its first pass then ends within the first epoch, and what is
        drawn more than once is read once)."""
        if self.sampling is None:
            return ()
        draws = self.steps * self.batch_size
        return tuple(
            (label, self.cache is not None and p * draws >= 2 * self.class_counts[label])
            for label, p in enumerate(self.sampling)
            if p > 0
        )


def make_plan(
    manifest: Manifest,
    split: str,
    options: LoadOptions,
    *,
    input_context: Any = None,
    cache_room: int = 0,
) -> ReadPlan:
    """What ``chute.load(manifest, split, options)`` reads, and how, in one input pipeline.

    Reserves and creates nothing: the caller reserves ``cache_bytes`` from the
    process's cache budget and makes a disk cache's folder.

    Args:
        manifest: the dataset.
        split: ``"train"``, ``"val"`` or ``"test"``.
        options: checked :class:`~chute.read.options.LoadOptions`.
        input_context: a ``tf.distribute.InputContext``, or None for the only pipeline.
        cache_room: bytes that ``cache="auto"`` may still keep in memory.

    Raises:
        ChuteError: what the options ask cannot be read from this dataset.
    """
    aim = target(manifest, split, options)
    training, shape = aim.training, aim.shape
    seed, cache, data_service = options.seed, options.cache, options.data_service
    if data_service is not None:
        if training:
            seed, cache = _through_service(seed, cache, options.skip_corrupt)
        else:
            data_service = None  # evaluation reads here: every example exactly once
    stored = manifest.image
    part = share_lib.Share.of(input_context)  # a share of the only pipeline without one
    pipelines, index = part.pipelines, part.index
    cropped = aim.random_crop is not None or stored.size != shape[:2] or aim.crop_fraction < 1
    namespace = _namespace(manifest, split, (pipelines, index), cropped, shape, aim.weights)
    sampled = options.sampling is not None
    cache, cache_bytes = _cache_target(
        cache,
        manifest,
        split,
        # Decoded pixels are cached only when every epoch decodes them alike and they fit one shape.
        encoded=cropped or sampled or not stored.fixed_size,
        namespace=namespace,
        room=cache_room,
    )
    # PNG/JPEG not kept decoded: decoded one by one after the shuffle, streaming
    per_image = cropped or (stored.encoding != "raw" and cache is None)
    # Through the service: records shuffled, then decoded one by one; each worker's last
    # batch is kept short, and the trainer regroups them (no example dropped there).
    per_image = per_image or data_service is not None
    # Class sampling: records drawn by their label, then decoded one by one.
    per_image = per_image or sampled

    files, counts, sizes, every_nth = _share(manifest, split, pipelines, index, data_service)
    num_examples = sizes[index]
    if num_examples == 0:
        raise ChuteError(f"split {split!r} of {manifest.location} has no examples to read here")
    batch_size = options.batch_size
    steps = share_lib.steps(
        sizes, index, batch_size, training=training, pad=options.pad_final_batch
    )
    sampling, class_counts, shard_classes = _sampling(
        manifest, split, options.sampling, (pipelines, index), every_nth, steps * batch_size
    )
    return ReadPlan(
        files=tuple(files),
        counts=tuple(counts),
        stored=stored,
        shape=shape,
        num_classes=manifest.num_classes,
        num_examples=num_examples,
        training=training,
        # every pipeline sharing records must see one order
        deterministic=not training or seed is not None or every_nth is not None,
        # Pipelines that share records by every_nth must keep one shard order, epoch after epoch.
        reshuffle_each_epoch=training and every_nth is None,
        every_nth=every_nth,
        cores=available_cores(),
        cache=cache,
        cache_bytes=cache_bytes,
        batch_size=batch_size,
        share=part if input_context is not None else None,
        seed=None if seed is None else int(seed),
        dtype=options.dtype,
        label_mode=aim.label_mode,
        per_image=per_image,
        multi_label=aim.multi_label,
        weights=aim.weights,
        random_crop=aim.random_crop,
        flip=per_image and training and options.augment_spec.flip,
        # Training crops at random instead; the centre crop is evaluation's.
        crop_fraction=aim.crop_fraction if not training else 1.0,
        window=_window(options.shuffle_buffer, batch_size, manifest, split, shape, per_image)
        if training
        else None,
        shuffle_buffer=options.shuffle_buffer,
        repeat=options.repeat,
        pad_final_batch=options.pad_final_batch,
        skip_corrupt=options.skip_corrupt,
        steps=steps,
        data_service=data_service,
        job_name=service.job_name(namespace, pipelines) if data_service else None,
        sampling=sampling,
        class_counts=class_counts,
        shard_classes=shard_classes,
    )


def _sampling(
    manifest: Manifest,
    split: str,
    sampling: Any,
    pipeline: tuple[int, int],
    every_nth: tuple[int, int] | None,
    draws: int,
) -> tuple[tuple[float, ...] | None, tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(draw probabilities, class counts, classes of each shard)`` of this input
    pipeline's share (see :class:`ReadPlan`), logged; without sampling ``(None, (), ())``."""
    if sampling is None:
        return None, (), ()
    # Class counts of this pipeline's share, not the split's: the draw probabilities follow them.
    counts, shard_classes = share_counts(manifest, split, *pipeline, by_record=bool(every_nth))
    probabilities = class_probabilities(manifest, split, sampling, counts=counts)
    log.info(
        "sampling=%r: %s",
        sampling,
        describe(manifest.class_names, probabilities, counts, draws),
    )
    return probabilities, counts, shard_classes


def _share(manifest: Manifest, split: str, pipelines: int, index: int, data_service) -> tuple:
    """What input pipeline ``index`` of ``pipelines`` reads: ``(files, counts, the examples
    of every pipeline, every_nth)``: its own shards when there are enough, else every
    n-th record of all; through the service, all of them (dealt out by the dispatcher)."""
    files, counts = manifest.shard_paths(split), manifest.shard_counts(split)
    if data_service:
        # The dispatcher deals shards out as workers ask: each share is an even part of the split.
        return files, counts, [manifest.num_examples(split) // pipelines] * pipelines, None
    sizes = pipeline_sizes(manifest, split, pipelines)
    if share_lib.by_shard(len(files), pipelines):
        return files[index::pipelines], counts[index::pipelines], sizes, None
    return files, counts, sizes, (pipelines, index) if pipelines > 1 else None


def _through_service(seed, cache, skip_corrupt: bool) -> tuple[None, None]:
    """What reading through the ``tf.data`` service rules out: ``(seed, cache)`` for the
    pipeline the service runs."""
    if skip_corrupt:
        raise ChuteError(
            "`skip_corrupt` counts what it skips in this process; the tf.data service's "
            "workers cannot report it. Run `chute verify` instead. Received: skip_corrupt=True"
        )
    # Told, not refused: the run still trains, only its order is not reproducible.
    if seed is not None:
        log.info(
            "data_service: the dispatcher hands shards to whichever worker asks first, "
            "so seed=%s cannot fix the order; each epoch has a new one",
            seed,
        )
    if cache not in ("auto", None):
        log.info("data_service: cache=%r left out (each epoch is a new job)", cache)
    return None, None


def _namespace(
    manifest: Manifest,
    split: str,
    pipeline: tuple[int, int],
    cropped: bool,
    shape: tuple,
    weights: bool = False,
) -> str:
    """A disk cache's file name: the split, and a digest of the dataset's version (its
    source fingerprint and shards' sha256), of this input pipeline's part, and of
    what is cached (decoded pixels at ``shape``, or encoded records)."""
    # The shards' digests in the key: a dataset converted again never reads another's cache.
    shards = [s.sha256 for s in manifest.split(split).shards]
    parts = [manifest.source.get("fingerprint"), shards, pipeline, cropped, shape]
    # labels with weights are rows of another shape: never the cache of a read without them
    key = json.dumps([*parts, "weights"] if weights else parts)
    # 16 hex digits: short enough for a file name, and collisions are not a practical worry.
    return f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def pipeline_sizes(manifest: Manifest, split: str, pipelines: int) -> list[int]:
    """Examples each of ``pipelines`` input pipelines reads of ``split``.

    With at least as many shards as pipelines each reads its own shards;
    otherwise every pipeline keeps every ``pipelines``-th record.

    Example:
        >>> pipeline_sizes(manifest, "train", 2)  # doctest: +SKIP
        [13008, 13009]
    """
    return share_lib.shard_sizes(manifest.shard_counts(split), pipelines)


def _cache_target(
    cache: str | None,
    manifest: Manifest,
    split: str,
    *,
    encoded: bool,
    namespace: str,
    room: int,
) -> tuple[str | None, int]:
    """``(tf.data cache file name or "" for memory or None, bytes to reserve)``."""
    if cache is None:
        return None, 0
    if cache == "memory":
        return "", 0
    if cache.startswith("disk:"):
        # a folder; each split, dataset version and way of reading has its own files
        return storage.join(cache[5:], namespace), 0
    spec = manifest.image
    if encoded:  # images decoded anew each epoch (crops): the records are what is kept
        size, what = sum(s.bytes for s in manifest.split(split).shards), "is"
    else:
        size = manifest.num_examples(split) * spec.height * spec.width * spec.channels
        what = "decodes to"
    # Memory only while it fits what is left of the process's cache budget; else no cache.
    fits = size <= room
    log.info(
        "cache=auto: %s split %s %.0f MB: %s (%.0f MB of the budget left)",
        split,
        what,
        size / 1e6,
        "kept in memory" if fits else "read from the shards each epoch",
        room / 1e6,
    )
    return ("", size) if fits else (None, 0)


def _window(
    shuffle_buffer: int,
    batch_size: int,
    manifest: Manifest,
    split: str,
    shape: tuple,
    encoded: bool,
) -> int:
    """Records per shuffle window: ``shuffle_buffer``, at most ``WINDOW_BYTES`` of what
    the window holds (encoded records with ``encoded``, else decoded pixels), whole batches."""
    if encoded:
        shards = manifest.split(split).shards
        # The mean record size: shard bytes are known without reading a record.
        per_record = sum(s.bytes for s in shards) / max(1, manifest.num_examples(split))
    else:
        per_record = shape[0] * shape[1] * shape[2]
    window = min(shuffle_buffer, max(batch_size, int(WINDOW_BYTES // max(1, per_record))))
    if window < shuffle_buffer:
        log.info("shuffle window: %d records (%d MB)", window, WINDOW_BYTES >> 20)
    # Whole batches, so that a window never ends mid-batch.
    return batch_size * max(1, window // batch_size)
