"""``chute.load``: a converted split as a ``tf.data.Dataset`` that outruns the accelerator.

``load`` resolves its :class:`~chute.read.options.LoadOptions` against the
manifest into a :class:`~chute.read.plan.ReadPlan` (no side effect), reserves
the in-memory cache of ``cache="auto"`` from the process's :data:`CACHE_BUDGET`,
builds the pipeline of :mod:`chute.read.pipeline`, and attaches what it knows
as one :class:`LoadInfo` (``ds.chute``). The reservation is given back when the
dataset is gone. The README's *chute.load* tells the whole story.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.lazy import tf
from chute.machine import memory_limit
from chute.read import service
from chute.read.augment import DeviceAugmentation
from chute.read.host_augment import NAMES as HOST
from chute.read.host_augment import HostAugmentation
from chute.read.options import LoadOptions, resolve
from chute.read.pipeline import build, dataset_options
from chute.read.plan import ReadPlan, make_plan

log = logging.getLogger(__name__)

# skipped = corrupt (unreadable shards) + sum(shards) + started - decoded; "shards": the records
# each shard lost in a reading of it (the most of any reading: with class sampling, several
# class streams read a shard, some of them several times an epoch)
_COUNTED = {"corrupt": 1, "shards": 1, "started": 1, "decoded": -1}


class CacheBudget:
    """What ``cache="auto"`` may keep in memory, shared by every dataset of the process:
    a quarter of the memory the process may use (the container's limit, if lower than
    physical memory). A dataset reserves its split's size when it is built and gives it
    back when it is deleted.

    Example:
        >>> budget = CacheBudget(100)
        >>> budget.reserve(60), budget.reserve(60), budget.left
        (True, False, 40)
    """

    def __init__(self, total: int | None = None):
        if total is None:
            memory = memory_limit()
            total = memory // 4 if memory else 2 << 30
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    @property
    def left(self) -> int:
        """Bytes not reserved."""
        with self._lock:
            return max(0, self.total - self.used)

    def reserve(self, size: int) -> bool:
        """Takes ``size`` bytes if they fit in what is left."""
        with self._lock:
            if self.used + size > self.total:
                return False
            self.used += size
            return True

    def release(self, size: int) -> None:
        """Gives ``size`` bytes back."""
        with self._lock:
            self.used = max(0, self.used - size)


CACHE_BUDGET = CacheBudget()


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """What ``chute.load`` knows about a dataset it returned: ``ds.chute`` (or :func:`info_of`).

    Attributes:
        class_names: the class names, in label order.
        num_examples: examples this input pipeline reads in an epoch (a distributed
            dataset: the split's).
        steps: batches in an epoch, what ``len(ds)`` says (unless ``skip_corrupt``
            or ``repeat``); the same for every input pipeline in training and in
            padded evaluation (see :attr:`chute.read.plan.ReadPlan.steps`). A
            distributed dataset counts global batches.
        per_replica_batch_size: ``batch_size``.
        global_batch_size: ``batch_size`` times the replicas in sync.
        training: read for training (shuffled, augmented, full batches).
        device_augmentation: with ``augment_on="device"``, the heavy
            augmentations left to the train step
            (:class:`~chute.read.augment.DeviceAugmentation`, called on a batch), else None.
        cached_in: ``"memory"``, the cache files' name, or None.
        options: the options read with.
        counters: ``skip_corrupt``'s counters of each input pipeline (see :meth:`corrupt_count`).
    """

    class_names: tuple[str, ...]
    num_examples: int
    steps: int
    per_replica_batch_size: int
    global_batch_size: int
    training: bool
    device_augmentation: DeviceAugmentation | None
    cached_in: str | None
    options: LoadOptions
    counters: tuple[Mapping[str, Any], ...] = dataclasses.field(
        default=(), repr=False, compare=False
    )

    def corrupt_count(self) -> int:
        """What ``skip_corrupt`` skipped in the latest epoch (exact once it is over; it
        starts again at each new iterator): records of damaged or missing shards (once
        each, however often class sampling's streams read the shard), and images that
        do not decode (each time one is drawn). 0 without ``skip_corrupt``."""
        return int(
            sum(
                counters[name].numpy().sum() * sign
                for counters in self.counters
                for name, sign in _COUNTED.items()
                if name in counters
            )
        )


def info_of(dataset: Any) -> LoadInfo:
    """The :class:`LoadInfo` of a dataset ``chute.load`` returned (``dataset.chute``).

    Raises:
        ChuteError: ``dataset`` did not come from ``chute.load`` (``ds.map(...)`` of
            one is a new dataset, without it).
    """
    info = getattr(dataset, "chute", None)
    if not isinstance(info, LoadInfo):
        raise ChuteError(
            f"{type(dataset).__name__} was not returned by chute.load (a transformation "
            "such as ds.map() returns a new dataset): take its info before transforming it"
        )
    return info


def load(
    path: str | os.PathLike | manifest_lib.Manifest,
    split: str = "train",
    options: LoadOptions | Mapping[str, Any] | None = None,
    *,
    input_context: Any = None,
    strategy: Any = None,
    **overrides: Any,
):
    """Reads a converted split as batches of ``(images, labels)`` with static shapes.

    Args:
        path: a directory written by ``chute convert`` (local, ``gs://``,
            ``ram://``), its ``manifest.json``, or the ``Manifest`` read from it.
        split: ``"train"``, ``"val"`` or ``"test"``.
        options: a :class:`~chute.read.options.LoadOptions` (or a mapping of its
            fields); default: every default.
        input_context: a ``tf.distribute.InputContext``: read this input
            pipeline's part (by shard when there are enough shards, else by record).
        strategy: a ``tf.distribute.Strategy``: return
            ``strategy.distribute_datasets_from_function`` over this function.
        **overrides: ``LoadOptions`` fields replacing those of ``options``
            (``batch_size=256``, ``augment="crop,flip"``, ``cache=None``, ...).

    Returns:
        A ``tf.data.Dataset`` (or distributed dataset) of ``(images, labels)``
        (``(images, labels, weights)`` with ``pad_final_batch``; images alone
        with ``label_mode=None``), with its :class:`LoadInfo` as ``ds.chute``.
        ``len(ds)`` is the exact number of batches of an epoch (unless
        ``skip_corrupt`` or ``repeat``).

    Raises:
        ChuteError: a bad option (named), an unknown one, a path that is not a
            chute dataset, or a shard that exists but cannot be read (unless
            ``skip_corrupt``).
        tf.errors.InvalidArgumentError: while iterating, naming the shard, when
            a shard is corrupt, truncated or missing, or an image does not
            match the manifest (unless ``skip_corrupt``).

    Example:
        >>> train = chute.load("./kn-shards", "train", batch_size=256)  # doctest: +SKIP
        >>> model.fit(train, validation_data=chute.load("./kn-shards", "val"))  # doctest: +SKIP
        >>> train.chute.steps, train.chute.global_batch_size  # doctest: +SKIP
        (101, 256)
    """
    options = resolve(options, overrides)  # every value checked before any work
    manifest = manifest_lib.load(path)
    if options.engine == "grain":
        return _grain(manifest, split, options, input_context, strategy)
    if strategy is not None:
        return _distributed(manifest, split, options, strategy)
    plan = _reserved_plan(manifest, split, options, input_context)
    try:
        dataset, device, counters = _dataset(plan, options, input_context)
    except BaseException:
        CACHE_BUDGET.release(plan.cache_bytes)
        raise
    if plan.cache_bytes:  # the budget it took comes back with the dataset
        weakref.finalize(dataset, CACHE_BUDGET.release, plan.cache_bytes)
    dataset.chute = LoadInfo(
        class_names=tuple(manifest.class_names),
        num_examples=plan.num_examples,
        steps=plan.steps,
        per_replica_batch_size=plan.batch_size,
        global_batch_size=plan.batch_size * plan.replicas,
        training=plan.training,
        device_augmentation=device,
        cached_in="memory" if plan.cache == "" else plan.cache,
        options=options,
        counters=(counters,) if counters else (),
    )
    return dataset


def _grain(manifest, split: str, options: LoadOptions, input_context, strategy):
    """The split as a Grain dataset (:mod:`chute.read.grain_engine`), with its LoadInfo."""
    from chute.read import grain_engine
    from chute.read.grain_source import GrainSource

    if options.skip_corrupt:
        raise ChuteError(
            "`skip_corrupt` is the tf.data engine's; the Grain engine checks every record's "
            "CRC and stops at a damaged one. Received: skip_corrupt=True with engine='grain'"
        )
    replicas, share = 1, grain_engine.Share()
    if strategy is not None:
        if _strategy_hosts(strategy) > 1:
            raise ChuteError(
                "engine='grain' under a tf.distribute strategy on several hosts is not "
                "supported: use engine='tf', or JAX processes (each reads its share)"
            )
        replicas = strategy.num_replicas_in_sync
    if input_context is not None:
        share = grain_engine.Share(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
    read = dataclasses.replace(options, cache=None, batch_size=options.batch_size * replicas)
    plan = make_plan(manifest, split, read, cache_room=0)
    spec = options.augment_spec
    heavy = spec.heavy if plan.training else ()
    if heavy and options.augment_on != "device":
        raise ChuteError(
            f"augmentations {list(heavy)} run in the train step on the Grain engine: pass "
            "augment_on='device' (crop and flip run in Grain's workers). "
            "Received: augment_on='host'"
        )
    source = GrainSource(manifest, split)
    dataset = grain_engine.make_dataset(
        plan, source, share, split=split, manifest=manifest, sampling=options.sampling,
        workers=options.workers, flip=plan.training and spec.flip,
    )  # fmt: skip
    dataset.chute = LoadInfo(
        class_names=tuple(manifest.class_names),
        num_examples=len(dataset.batches.records)
        if dataset.batches.records is not None
        else dataset.batches.per_epoch,
        steps=len(dataset),
        per_replica_batch_size=options.batch_size,
        global_batch_size=plan.batch_size * share.pipelines,
        training=plan.training,
        device_augmentation=DeviceAugmentation(heavy, plan.seed) if heavy else None,
        cached_in=None,
        options=options,
    )
    return dataset


def _strategy_hosts(strategy) -> int:
    """Hosts a tf.distribute strategy spans (1 for the strategies of one machine)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(tasks) for name, tasks in spec.items() if name in ("worker", "chief")))


def _reserved_plan(manifest, split: str, options: LoadOptions, input_context) -> ReadPlan:
    """The plan, its in-memory cache (``cache="auto"``) reserved from the process's budget
    (the caller gives it back), and a disk cache's folder made."""
    plan = make_plan(
        manifest, split, options, input_context=input_context, cache_room=CACHE_BUDGET.left
    )
    if plan.cache_bytes and not CACHE_BUDGET.reserve(plan.cache_bytes):
        # another thread's dataset took the room meanwhile: read from the shards instead
        plan = make_plan(manifest, split, options, input_context=input_context, cache_room=0)
    if plan.cache:  # on disk: each split, dataset version and way of reading has its files
        storage.makedirs(options.cache.removeprefix("disk:"))
    return plan


def _dataset(plan: ReadPlan, options: LoadOptions, input_context):
    """The pipeline of ``plan``: ``(dataset, augmentation left to the device, counters)``."""
    device, keras_on_host, host = _augmentations(options.augment_spec, plan, options.augment_on)
    plan, lost = _without_unreadable(plan)
    counters = _counters(lost, len(plan.files)) if plan.skip_corrupt else {}
    if plan.data_service:  # TensorFlow would wait for a dispatcher that is not there forever
        service.wait_for_dispatcher(plan.data_service, options.data_service_timeout)
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
    keep = [i for i, path in enumerate(plan.files) if path not in bad]
    lost = sum(plan.counts) - sum(plan.counts[i] for i in keep)
    log.warning("skipping %d unreadable shard(s) (%d records): %s", len(bad), lost, sorted(bad))
    return dataclasses.replace(
        plan,
        files=tuple(plan.files[i] for i in keep),
        counts=tuple(plan.counts[i] for i in keep),
        # class sampling: the classes each shard holds
        shard_classes=tuple(plan.shard_classes[i] for i in keep) if plan.shard_classes else (),
    ), lost


def _counted_per_epoch(dataset, counters: dict, lost: int):
    """``dataset`` whose counters start again at each epoch (each new iterator): after a
    full pass, ``corrupt_count()`` is what that pass skipped (shards that cannot be
    read count in every pass)."""

    def restart(_):
        for name, counter in counters.items():
            counter.assign(tf.zeros_like(counter) + (lost if name == "corrupt" else 0))
        return dataset

    return tf.data.Dataset.range(1).flat_map(restart).with_options(dataset_options())


def _counters(lost: int, shards: int) -> dict:
    """Variables counting what ``skip_corrupt`` skips (see :data:`_COUNTED`)."""
    start = {"corrupt": lost, "shards": [0] * shards}
    return {
        name: tf.Variable(start.get(name, 0), dtype=tf.int64, trainable=False, name=f"chute_{name}")
        for name in _COUNTED
    }


def _log_share(plan: ReadPlan, context) -> None:
    """What this input pipeline (host) reads of the split, for a multi-host run's logs."""
    named = ", ".join(storage.basename(f) for f in plan.files[:8])
    named += "..." if len(plan.files) > 8 else ""
    how = (
        f"every {plan.every_nth[0]}th record from record {plan.every_nth[1]} of {named}"
        if plan.every_nth
        else f"{len(plan.files)} shard(s) ({named})"
    )
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


def _distributed(manifest, split: str, options: LoadOptions, strategy):
    """``strategy.distribute_datasets_from_function`` over ``load``, one input pipeline per
    worker, with the :class:`LoadInfo` of the whole: its steps are global batches."""
    built: list[tuple[Any, LoadInfo]] = []

    def dataset_fn(input_context):
        dataset = load(manifest, split, options, input_context=input_context)
        built.append((input_context, info_of(dataset)))
        return dataset

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    # The strategies chute runs under build the local pipelines at once. A global batch
    # takes a batch from each replica an input pipeline feeds.
    context, first = built[0]
    feeds = max(1, context.num_replicas_in_sync // context.num_input_pipelines)
    steps = first.steps // feeds if first.training else -(-first.steps // feeds)
    distributed.chute = dataclasses.replace(
        first,
        num_examples=manifest.num_examples(split),
        steps=steps,
        counters=tuple(counters for _, info in built for counters in info.counters),
    )
    return distributed
