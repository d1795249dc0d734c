"""Several chute datasets read as one, in given proportions: the engine-free part.

What both reading engines share for ``chute.load([a, b, c], weights=[...])``
(:mod:`chute.read.grain.mixed`, :mod:`chute.read.tf.mixed`):

- :func:`mixture_of`: the datasets checked against each other (:class:`Mixture`);

- :func:`label_space`: one label space over the datasets by class name (a class in
  several datasets is one class), the first dataset's classes first, and for each
  dataset the array that maps its labels into it;
- :func:`batch_counts`: how many images of each dataset every batch holds, exact per
  batch where the batch allows (every ``weight * batch_size`` whole), else spread so that
  each dataset's running total stays within about one image of its share;
- :func:`epoch_steps`: the batches of an epoch, defined by the first dataset (its
  images seen once) or given;
- :func:`draws`: where batch ``j``'s images come from, a pure function of ``j`` (each
  dataset's own draws in turn), so a reader can resume at any batch and an elastic
  resume keeps the mixture's global position.

Example:
    >>> batch_counts([0.5, 0.25, 0.25], 8, 2).tolist()
    [[4, 2, 2], [4, 2, 2]]
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.manifest import Manifest

_MIX_KEY = 3  # a batch's slots are dealt from a generator keyed (seed, epoch, batch, _MIX_KEY)


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Several datasets read as one (made by :func:`mixture_of`).

    Attributes:
        manifests: the datasets, the first one widened to the mixture's classes
            (:meth:`~chute.format.manifest.Manifest.with_classes`).
        shares: each dataset's share of every batch (summing to 1).
        class_names: the mixture's classes: the first dataset's, then each later
            dataset's new ones.
        maps: per dataset, its labels' labels in the mixture.
        channels: of the images yielded (the first dataset's); another dataset's
            are converted (grayscale repeated, colour to luma).
        steps: batches of an epoch when given; None: as many as show the first
            dataset's train images once.
    """

    manifests: tuple[Manifest, ...]
    shares: tuple[float, ...]
    class_names: tuple[str, ...]
    maps: tuple[np.ndarray, ...]
    channels: int
    steps: int | None = None

    @property
    def first(self) -> Manifest:
        """The first dataset, in the mixture's classes: its val and test splits are
        the mixture's, its image spec the one the others are brought to."""
        return self.manifests[0]

    def labels_of(self, index: int) -> np.ndarray:
        """The mixture's label of each label dataset ``index`` is read with (the first
        dataset, widened to the mixture's classes, keeps every label)."""
        if index == 0:
            return np.arange(self.manifests[0].num_classes, dtype=np.int64)
        return self.maps[index]

    def class_counts(self, split: str) -> tuple[np.ndarray, int]:
        """``(each class's examples, examples)`` expected in as many draws of the mixture
        as the first dataset's ``split`` holds: what class weights are computed from
        (a multi-label mixture: each label's positives).

        Example:
            >>> mixture_of(["pets", "wild"], [0.5, 0.5]).class_counts("train")  # doctest: +SKIP
            (array([50., 25., 25.]), 100)
        """
        examples = self.first.num_examples(split)
        counts = np.zeros(len(self.class_names))
        for index, (manifest, share) in enumerate(zip(self.manifests, self.shares, strict=True)):
            theirs = np.asarray(manifest.split(split).class_counts, np.float64)
            held = max(1, manifest.num_examples(split))
            np.add.at(counts, self.labels_of(index), share * examples * theirs / held)
        return counts, examples

    def epoch_steps(self, split: str, global_batch: int) -> int:
        """Batches of a mixed epoch of ``global_batch`` images (see :func:`epoch_steps`)."""
        return epoch_steps([self.first.num_examples(split)], self.shares, global_batch, self.steps)

    def schedule(self, split: str, global_batch: int) -> Schedule:
        """Every batch's images of each dataset in an epoch of ``global_batch`` images."""
        steps = self.epoch_steps(split, global_batch)
        return Schedule(batch_counts(self.shares, global_batch, steps))

    def describe(self, split: str, global_batch: int, schedule: Schedule | None = None) -> MixInfo:
        """What an epoch of this mixture reads: :class:`MixInfo` (``schedule``: its
        schedule for ``global_batch``, when already made)."""
        schedule = schedule or self.schedule(split, global_batch)
        return MixInfo(
            datasets=tuple(m.location for m in self.manifests),
            weights=self.shares,
            images=tuple(int(n) for n in schedule.per_epoch),
            examples=tuple(m.num_examples(split) for m in self.manifests),
            label_maps=tuple(tuple(int(x) for x in m) for m in self.maps),
        )


@dataclasses.dataclass(frozen=True)
class MixInfo:
    """What a mixed dataset reads, in ``ds.chute.mixture`` (and a run's ``started.json``).

    Attributes:
        datasets: where each dataset is, in the order given.
        weights: each one's share of every batch (summing to 1).
        images: each one's images in an epoch (all input pipelines together).
        examples: each one's examples in the split read.
        label_maps: per dataset, the mixture's label of each of its labels.
    """

    datasets: tuple[str, ...]
    weights: tuple[float, ...]
    images: tuple[int, ...]
    examples: tuple[int, ...]
    label_maps: tuple[tuple[int, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        """Stored form: one entry per dataset."""
        return {
            "datasets": [
                {"location": where, "weight": weight, "images_per_epoch": images,
                 "examples": examples, "label_map": list(labels)}
                for where, weight, images, examples, labels in zip(
                    self.datasets, self.weights, self.images, self.examples,
                    self.label_maps, strict=True,
                )
            ]
        }  # fmt: skip


def shown(info: MixInfo) -> str:
    """A mixture in a log line: each dataset's share and images an epoch.

    Example:
        >>> shown(MixInfo(("a", "b/c"), (0.75, 0.25), (30, 10), (40, 9), ((0,), (0,))))
        'a 75% (30 images an epoch), c 25% (10)'
    """
    parts = [
        f"{folder_name(where)} {weight:.0%}"
        + (f" ({images} images an epoch)" if i == 0 else f" ({images})")
        for i, (where, weight, images) in enumerate(
            zip(info.datasets, info.weights, info.images, strict=True)
        )
    ]
    return ", ".join(parts)


def folder_name(location: str) -> str:
    """A dataset's folder name, for logs."""
    return location.rstrip("/").rsplit("/", 1)[-1] or location


@dataclasses.dataclass(frozen=True)
class Schedule:
    """An epoch's batches: ``counts[j, d]`` images of dataset ``d`` in batch ``j``. Every
    epoch repeats it, so where batch ``j`` of epoch ``e`` starts in each dataset's own
    sequence of draws is a pure function of ``(e, j)``: a reader resumes at any batch."""

    counts: np.ndarray

    def __post_init__(self) -> None:
        before = np.zeros((len(self.counts) + 1, self.counts.shape[1]), np.int64)
        np.cumsum(self.counts, axis=0, out=before[1:])
        object.__setattr__(self, "_before", before)

    @property
    def steps(self) -> int:
        """Batches of an epoch."""
        return len(self.counts)

    @property
    def per_epoch(self) -> np.ndarray:
        """Each dataset's images in an epoch."""
        return self._before[-1]

    def starts(self, epoch: int, batch: int) -> np.ndarray:
        """Where batch ``batch`` of epoch ``epoch`` starts in each dataset's draws."""
        return epoch * self._before[-1] + self._before[batch]

    def slots(self, seed: int, epoch: int, batch: int) -> np.ndarray:
        """The dataset of each slot of the global batch: its images dealt at random (so
        each replica's part holds every dataset in about its share), the same for any
        number of input pipelines."""
        datasets = np.repeat(np.arange(self.counts.shape[1]), self.counts[batch])
        rng = np.random.default_rng([seed, epoch, batch, _MIX_KEY])
        return datasets[rng.permutation(len(datasets))]


def part_options(options: Any, manifest: Manifest, size: tuple[int, int]) -> Any:
    """The ``LoadOptions`` one dataset of a mixture is read with: at the mixture's image
    ``size``, labels as stored (class numbers, or multi-hot rows) for the mixture to map,
    uint8 pixels, no sample weights."""
    return dataclasses.replace(
        options,
        image_size=size,
        label_mode="multi_hot" if manifest.multi_label else "int",
        dtype="uint8",
        sample_weights=False,
    )


def reading_options(options: Any, split: str = "train") -> Any:
    """``LoadOptions`` for reading a mixture: no sample weights, as its batches are
    ``(images, labels)`` (a weighted dataset's weights are left out unless asked for,
    which is refused); class sampling ``"balanced"`` only (within each dataset: weights
    by class would have to say which dataset's class they weigh); ``split`` read for
    training (evaluation reads each dataset's split once, on its own).
    """
    training = (split == "train") if options.training is None else options.training
    if not training:
        raise ChuteError(
            f"`weights` mix training draws; split {split!r} is read for evaluation (every "
            "example once): load each dataset's split on its own. Received: "
            f"split={split!r}, training={options.training!r}"
        )
    for name in ("data_service", "skip_corrupt"):
        if getattr(options, name):
            raise ChuteError(
                "A mixture of datasets is read in this process by its schedule: not through "
                "the tf.data service, nor skipping damaged records. Received: "
                f"{name}={getattr(options, name)!r}"
            )
    if options.sampling not in (None, "balanced"):
        raise ChuteError(
            "A mixture of datasets samples classes 'balanced' (within each dataset) or "
            f"not at all. Received: sampling={options.sampling!r}"
        )
    if options.sample_weights:
        raise ChuteError(
            "Sample weights are not read from a mixture of datasets: its batches are "
            "(images, labels). Received: sample_weights=True"
        )
    return dataclasses.replace(options, sample_weights=False)


def mixture_of(
    datasets: Sequence[str | os.PathLike | Manifest],
    weights: Sequence[float] | None = None,
    *,
    versions: Sequence[int | None] | None = None,
    steps: int | None = None,
) -> Mixture:
    """The datasets ``chute.load([a, b, c], weights=[...])`` reads as one, checked.

    Args:
        datasets: chute datasets (folders, buckets, manifests), the first one first:
            its classes keep their labels, its image spec and val split are the
            mixture's, and by default its train images define an epoch.
        weights: each one's share of every batch (any positive numbers: they are
            made to sum to 1); default: equal shares.
        versions: each one's version to read (None: the latest).
        steps: batches of an epoch (default: the first dataset's images once).

    Raises:
        ChuteError: fewer than one dataset, the same one twice, weights (or versions)
            not one per dataset, labels of different kinds, or images whose channels
            cannot be converted (anything but grayscale and colour).

    Example:
        >>> mixed = mixture_of(["pets", "wild"], [0.75, 0.25])  # doctest: +SKIP
        >>> mixed.class_names, mixed.shares  # doctest: +SKIP
        (('cat', 'dog', 'fox'), (0.75, 0.25))
    """
    if isinstance(datasets, (str, os.PathLike, Manifest)) or not datasets:
        raise ChuteError(f"Mixing needs a list of datasets. Received: {datasets!r}")
    if weights is None:
        weights = [1.0] * len(datasets)
    elif isinstance(weights, (str, bytes)) or len(weights) != len(datasets):
        raise ChuteError(
            f"`weights` must give one positive number per dataset ({len(datasets)}). "
            f"Received: weights={weights!r}"
        )
    shares = _weights(weights)
    if versions is None:
        versions = [None] * len(datasets)
    elif isinstance(versions, int) or len(versions) != len(datasets):
        raise ChuteError(
            f"`version` of a mixture must give one version (or None) per dataset "
            f"({len(datasets)}). Received: version={versions!r}"
        )
    manifests = []
    for dataset, version in zip(datasets, versions, strict=True):
        manifest = manifest_lib.load(dataset)
        manifests.append(manifest if version is None else manifest.at_version(version))
    seen: dict[str, int] = {}
    for index, manifest in enumerate(manifests):
        where = _place(manifest.location)
        if where and where in seen:
            raise ChuteError(
                f"Dataset {manifest.location!r} is mixed in twice (datasets {seen[where]} and "
                f"{index}): give it once, with the sum of its weights. Received: datasets "
                f"{[m.location for m in manifests]!r}"
            )
        seen[where] = index
    names, maps = label_space(manifests)
    channels = manifests[0].image.channels
    for manifest in manifests[1:]:
        theirs = manifest.image.channels
        if theirs != channels and {theirs, channels} != {1, 3}:
            raise ChuteError(
                f"{manifest.location} stores {theirs}-channel images and "
                f"{manifests[0].location} {channels}-channel ones: mixing converts between "
                "grayscale (1) and colour (3) only. Received: channels "
                f"{[m.image.channels for m in manifests]}"
            )
    if steps is not None:
        epoch_steps([1], [1.0], 1, steps)  # checked: a positive integer
    manifests[0] = manifests[0].with_classes(names)
    return Mixture(
        tuple(manifests), tuple(float(x) for x in shares), tuple(names), tuple(maps),
        channels, steps,
    )  # fmt: skip


def _place(location: str) -> str:
    """Where a dataset is, one way however it was written (``./a``, ``a/``)."""
    if storage.is_local(location):
        return os.path.realpath(storage.local_path(location)) if location else ""
    return location.rstrip("/")


def label_space(manifests: Sequence[Manifest]) -> tuple[list[str], list[np.ndarray]]:
    """The class names of the datasets together, and each dataset's label map.

    The first dataset's classes keep their labels; each later dataset's classes that
    are new come after, in its own order (as ``chute convert --append`` numbers them).

    Raises:
        ChuteError: the datasets hold labels of different kinds (one class an image and
            a set of labels), or there are fewer than one.

    Example:
        >>> class M:  # a manifest's class names and label kind
        ...     def __init__(self, names): self.class_names, self.multi_label = names, False
        >>> names, maps = label_space([M(["cat", "dog"]), M(["dog", "eel"])])
        >>> names, [m.tolist() for m in maps]
        (['cat', 'dog', 'eel'], [[0, 1], [1, 2]])
    """
    if not manifests:
        raise ChuteError("Mixing needs at least one dataset. Received: none")
    kinds = {manifest.multi_label for manifest in manifests}
    if len(kinds) > 1:
        shown = ", ".join(
            f"{getattr(m, 'location', '') or i}: {'multi' if m.multi_label else 'single'}-label"
            for i, m in enumerate(manifests)
        )
        raise ChuteError(
            "Datasets mixed together must hold labels of one kind (one class an image, or "
            f"a set of labels). Received: {shown}"
        )
    names: list[str] = []
    number: dict[str, int] = {}
    maps = []
    for manifest in manifests:
        for name in manifest.class_names:
            if name not in number:
                number[name] = len(names)
                names.append(name)
        maps.append(np.array([number[name] for name in manifest.class_names], np.int64))
    return names, maps


def _weights(weights: Sequence[float]) -> np.ndarray:
    """``weights`` checked and made to sum to 1."""
    try:
        values = np.asarray([float(w) for w in weights], np.float64)
    except (TypeError, ValueError):
        values = np.asarray([math.nan])
    if len(values) == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ChuteError(
            "`weights` must be positive numbers, one per dataset. Received: "
            f"weights={list(weights)!r}"
        )
    return values / values.sum()


def batch_counts(weights: Sequence[float], batch_size: int, steps: int) -> np.ndarray:
    """Images of each dataset in each of ``steps`` batches (``steps x datasets``).

    Every batch gives each dataset its share of the batch rounded down; the images left
    over (fewer than the datasets) go, batch after batch, to the datasets owed the
    largest fractions so far (ties: the earlier dataset). So every batch holds exactly
    ``batch_size`` images and each dataset's share rounded down or up (exactly its share
    when that is whole), and after any number of batches each dataset stays within one
    image of its share. Each dataset's count in a batch takes at most two values, which
    lets a reader batch each dataset on its own (:mod:`chute.read.tf.mixed`).

    Raises:
        ChuteError: a weight is not a positive number, or ``batch_size`` is not a
            positive integer.

    Example:
        >>> batch_counts([0.9, 0.1], 4, 5).tolist()  # 0.4 images a batch: every 2.5 batches
        [[4, 0], [3, 1], [4, 0], [3, 1], [4, 0]]
    """
    shares = _weights(weights)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ChuteError(
            f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
        )
    exact = shares * batch_size
    # 1e-9 of an image: a whole share summed in floats still counts as whole.
    base = np.floor(exact + 1e-9).astype(np.int64)
    left = batch_size - int(base.sum())  # 0 when every share is whole, else < datasets
    counts = np.tile(base, (steps, 1))
    if left > 0:
        fractions = np.maximum(exact - base, 0.0)
        owed = np.zeros(len(shares))  # each dataset's fractions so far minus its extras
        for step in range(steps):
            target = owed + fractions
            extra = np.argsort(-target, kind="stable")[:left]  # stable: the earlier first
            counts[step, extra] += 1
            owed = target
            owed[extra] -= 1
    return counts


def epoch_steps(
    sizes: Sequence[int], weights: Sequence[float], batch_size: int, steps: int | None = None
) -> int:
    """The batches of a mixed epoch: ``steps`` when given, else as many as show the
    first dataset's ``sizes[0]`` images once (the last batch's share may fall short).

    Example:
        >>> epoch_steps([1000, 50], [0.75, 0.25], 100)  # 75 of the first a batch
        14
    """
    if steps is not None:
        if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 1:
            raise ChuteError(f"`steps` must be a positive integer. Received: steps={steps!r}")
        return int(steps)
    share = _weights(weights)[0] * batch_size
    return max(1, math.ceil(sizes[0] / share))


def draws(counts: np.ndarray, step: int) -> list[range]:
    """For batch ``step``: the positions, in each dataset's own sequence of draws (its
    shuffled epochs one after another), of the images it gives that batch.

    Example:
        >>> counts = batch_counts([0.5, 0.5], 4, 3)
        >>> [list(r) for r in draws(counts, 2)]
        [[4, 5], [4, 5]]
    """
    before = counts[:step].sum(axis=0)
    return [range(int(b), int(b + n)) for b, n in zip(before, counts[step], strict=True)]
