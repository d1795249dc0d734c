"""The seam between ``chute.load`` and its engines, and what a loaded dataset says of itself.

An engine (:class:`Engine`) turns checked options into a plan (what this input pipeline
reads, how, its steps; the tf.data engine's also reserves its in-memory cache from the
process's budget and makes a disk cache's folder, the Grain engine's has no side effect)
and a plan into a dataset with its :class:`LoadInfo` (``ds.chute``), built here by
:func:`make_info` and nowhere else. ``chute.load`` (:mod:`chute.read.load`) only picks the
engine: ``"tf"`` (:mod:`chute.read.tf`) or ``"grain"`` (:mod:`chute.read.grain`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from chute.errors import ChuteError
from chute.format.manifest import Manifest
from chute.read.augment import DeviceAugmentation
from chute.read.options import LoadOptions

# skipped = corrupt (unreadable shards) + sum(shards) + started - decoded; "shards": the records
# each shard lost in a reading of it (the most of any reading: with class sampling, several
# class streams read a shard, some of them several times an epoch)
COUNTED = {"corrupt": 1, "shards": 1, "started": 1, "decoded": -1}


class Engine(Protocol):
    """One way of reading a converted split: plan, then build.

    ``plan`` resolves the options against the manifest for one input pipeline and may
    refuse them (a ChuteError naming the option); ``build`` makes the dataset and its
    :class:`LoadInfo`.
    """

    def plan(
        self,
        manifest: Manifest,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> Any:
        """What this input pipeline reads and how (the engine's own plan)."""
        ...

    def build(self, plan: Any, manifest: Manifest, options: LoadOptions) -> tuple[Any, LoadInfo]:
        """The dataset of ``plan``, and its :class:`LoadInfo`."""
        ...

    def mixed(
        self,
        mixture: Any,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> tuple[Any, LoadInfo]:
        """A mixture of datasets (:class:`~chute.read.mixture.Mixture`) read as one, and
        its :class:`LoadInfo` (with ``mixture``)."""
        ...


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """What ``chute.load`` knows about a dataset it returned: ``ds.chute`` (or :func:`info_of`).

    Attributes:
        class_names: the class names, in label order.
        num_examples: examples this input pipeline reads in an epoch (a distributed
            dataset: the split's).
        steps: batches in an epoch, what ``len(ds)`` says (unless ``skip_corrupt``
            or ``repeat``); the same for every input pipeline in training and in
            padded evaluation (see :func:`chute.read.share.steps`). A distributed
            dataset counts global batches.
        per_replica_batch_size: ``batch_size``.
        global_batch_size: ``batch_size`` times the replicas in sync.
        training: read for training (shuffled, augmented, full batches).
        device_augmentation: with ``augment_on="device"``, the heavy
            augmentations left to the train step
            (:class:`~chute.read.augment.DeviceAugmentation`, called on a batch), else None.
        cached_in: ``"memory"``, the cache files' name, or None.
        options: the options read with.
        counters: ``skip_corrupt``'s counters of each input pipeline (see :meth:`corrupt_count`).
        mixture: a mixture of datasets' :class:`~chute.read.mixture.MixInfo` (each
            one's share and images an epoch), else None.
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
    mixture: Any = None

    def corrupt_count(self) -> int:
        """What ``skip_corrupt`` skipped in the latest epoch (exact once it is over; it
        starts again at each new iterator): records of damaged or missing shards (once
        each, however often class sampling's streams read the shard), and images that
        do not decode (each time one is drawn). 0 without ``skip_corrupt``."""
        return int(
            sum(
                counters[name].numpy().sum() * sign
                for counters in self.counters
                for name, sign in COUNTED.items()
                if name in counters
            )
        )


def make_info(
    manifest: Manifest,
    options: LoadOptions,
    *,
    num_examples: int,
    steps: int,
    global_batch_size: int,
    training: bool,
    device_augmentation: DeviceAugmentation | None = None,
    cached_in: str | None = None,
    counters: tuple[Mapping[str, Any], ...] = (),
    mixture: Any = None,
) -> LoadInfo:
    """The :class:`LoadInfo` of a dataset read from ``manifest`` with ``options``."""
    return LoadInfo(
        class_names=tuple(manifest.class_names),
        num_examples=num_examples,
        steps=steps,
        per_replica_batch_size=options.batch_size,
        global_batch_size=global_batch_size,
        training=training,
        device_augmentation=device_augmentation,
        cached_in=cached_in,
        options=options,
        counters=counters,
        mixture=mixture,
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
