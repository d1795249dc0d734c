"""The tf.data engine behind ``chute.load(..., engine="tf")``: the plan (:mod:`.plan`), the
in-memory cache of ``cache="auto"`` reserved from the process's :data:`CACHE_BUDGET` (given
back when the dataset is gone), the pipeline (:mod:`.pipeline`), ``skip_corrupt``'s
counters, and the tf.data service. The README's *chute.load* tells the whole story.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from typing import Any

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.lazy import tf
from chute.machine import memory_limit
from chute.read import cache as shard_cache
from chute.read.augment import DeviceAugmentation
from chute.read.cache import shown_size
from chute.read.engine import COUNTED, LoadInfo, make_info
from chute.read.options import LoadOptions
from chute.read.share import Share
from chute.read.tf import service
from chute.read.tf.host_augment import NAMES as HOST
from chute.read.tf.host_augment import HostAugmentation
from chute.read.tf.pipeline import build, dataset_options
from chute.read.tf.plan import ReadPlan, make_plan

log = logging.getLogger(__name__)


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
            # 2 GiB when the process's memory limit cannot be read.
            total = memory // 4 if memory else 2 << 30
        self.total = total
        self.used = 0
        # A lock: datasets may be built and garbage-collected on several threads at once.
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


class TfEngine:
    """The tf.data engine (see :class:`chute.read.engine.Engine`)."""

    def plan(
        self,
        manifest: manifest_lib.Manifest,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> ReadPlan:
        """The plan of this input pipeline, its in-memory cache (``cache="auto"``) reserved
        from the process's budget (:meth:`build` gives it back), a disk cache's folder made.
        A ``strategy`` is ``chute.load``'s to deal out (one pipeline per worker)."""
        plan = make_plan(
            manifest, split, options, input_context=input_context, cache_room=CACHE_BUDGET.left
        )
        if plan.cache_bytes and not CACHE_BUDGET.reserve(plan.cache_bytes):
            # another thread's dataset took the room meanwhile: read from the shards instead
            plan = make_plan(manifest, split, options, input_context=input_context, cache_room=0)
        if plan.cache:  # on disk: each split, dataset version and way of reading has its files
            storage.makedirs(options.cache.removeprefix("disk:"))
        return plan

    def build(
        self, plan: ReadPlan, manifest: manifest_lib.Manifest, options: LoadOptions
    ) -> tuple[Any, LoadInfo]:
        """The pipeline of ``plan`` and its LoadInfo; the cache reservation goes back with
        the dataset (or at once, when building fails)."""
        try:
            plan, held = _through_shard_cache(plan, manifest, options)
            dataset, device, counters = _dataset(plan, options)
        except BaseException:
            CACHE_BUDGET.release(plan.cache_bytes)
            raise
        if held:  # the local copies stay in the shard cache while the dataset lives
            weakref.finalize(dataset, _close_all, held)
        if plan.cache_bytes:  # the budget it took comes back with the dataset
            weakref.finalize(dataset, CACHE_BUDGET.release, plan.cache_bytes)
        info = make_info(
            manifest,
            options,
            num_examples=plan.num_examples,
            steps=plan.steps,
            global_batch_size=plan.batch_size * (plan.share.replicas if plan.share else 1),
            training=plan.training,
            device_augmentation=device,
            cached_in="memory" if plan.cache == "" else plan.cache,
            counters=(counters,) if counters else (),
        )
        return dataset, info

    def mixed(
        self,
        mixture: Any,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> tuple[Any, LoadInfo]:
        """A mixture's tf.data dataset for this input pipeline, and its LoadInfo; a
        ``strategy`` is ``chute.load``'s to deal out."""
        from chute.read.tf.mixed import make_mixed_dataset

        dataset, device, plan, mix = make_mixed_dataset(
            mixture, split, options, engine=self, input_context=input_context
        )
        share = Share.of(input_context)
        info = make_info(
            mixture.first,
            options,
            num_examples=plan.steps * plan.batch_size,
            steps=plan.steps,
            global_batch_size=plan.batch_size * max(share.replicas, 1),
            training=True,
            device_augmentation=device,
            mixture=mix,
        )
        return dataset, info

    @staticmethod
    def release(plan: ReadPlan) -> None:
        """Gives back what ``plan`` reserved of the cache budget, for a plan never built."""
        CACHE_BUDGET.release(plan.cache_bytes)


def _through_shard_cache(
    plan: ReadPlan, manifest: manifest_lib.Manifest, options: LoadOptions
) -> tuple[ReadPlan, list[int]]:
    """``plan`` reading verified local copies of its shards, downloaded now (in parallel)
    into the shard cache, and the descriptors that hold them there; ``plan`` itself
    when no shard cache applies (see :func:`chute.read.cache.applies`)."""
    cache = shard_cache.for_load(manifest.location, options)
    if cache is None:
        return plan, []
    by_path = {
        storage.join(manifest.location, shard.name): shard
        for split in manifest.splits.values()
        for shard in split.shards
    }
    shards = [by_path[path] for path in plan.files]
    total = sum(shard.bytes for shard in shards)
    # tf.data reads each shard from its start every epoch: all of them stay in the cache.
    if total > cache.limit:
        raise ChuteError(
            f"The tf.data engine reads every shard it needs from the shard cache: "
            f"{len(shards)} shards of {manifest.location!r}, {shown_size(total)}, do not fit "
            f"in cache_limit={cache.limit} ({shown_size(cache.limit)}). Pass engine='grain' "
            "(--engine grain), which holds a window of shards at a time, or a larger "
            "cache_limit (--cache-limit)"
        )
    log.info(
        "shard cache: %d shard(s) of %s (%s) into %s",
        len(shards),
        manifest.location,
        shown_size(total),
        cache.directory,
    )
    held = cache.open_all(manifest.location, shards)
    return dataclasses.replace(plan, files=tuple(cache.path(shard) for shard in shards)), held


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _dataset(plan: ReadPlan, options: LoadOptions):
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
    elif plan.share is not None:
        _log_share(plan, plan.share)
    return dataset, device, counters


def _augmentations(spec, plan: ReadPlan, augment_on: str):
    """``(for the device, Keras layers on the host, OpenCV on the host)``, each or None.

    Crops and flips fused with decoding are in ``plan``; a flip that is not (images
    read in blocks) is one of the heavy ones.
    """
    heavy = spec.heavy if plan.per_image or not spec.flip else ("flip", *spec.heavy)
    # Evaluation never augments: its pixels must be the same every epoch.
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
            # Unreadable shards are skipped in every pass: each pass starts its count with them.
            counter.assign(tf.zeros_like(counter) + (lost if name == "corrupt" else 0))
        return dataset

    # flat_map over one element: restart runs each time an iterator is made, at epoch start.
    return tf.data.Dataset.range(1).flat_map(restart).with_options(dataset_options())


def _counters(lost: int, shards: int) -> dict:
    """Variables counting what ``skip_corrupt`` skips (see :data:`chute.read.engine.COUNTED`)."""
    start = {"corrupt": lost, "shards": [0] * shards}
    return {
        name: tf.Variable(start.get(name, 0), dtype=tf.int64, trainable=False, name=f"chute_{name}")
        for name in COUNTED
    }


def _log_share(plan: ReadPlan, share: Share) -> None:
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
        share.index,
        share.pipelines,
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
    # Repeated after the service: each repetition is a new job, so a new order.
    if plan.repeat:
        dataset = dataset.repeat()
    return dataset.prefetch(tf.data.AUTOTUNE)
