"""``chute.load([a, b], weights=[...], engine="grain")``: several datasets as one stream of
batches, each batch a pure function of its number, so a mixed run resumes exactly, and on
another number of input pipelines with the same global batch (the same records; crops and
flips are keyed by pipeline, as for one dataset).

Global batch ``j`` of epoch ``e`` takes ``counts[j, d]`` images from dataset ``d``
(:class:`~chute.read.mixture.Schedule`): the next ones of that dataset's own sequence of
draws, its epochs one after another, each a new global permutation seeded by ``(seed of
d, its epoch)`` (or, with ``sampling``, weighted draws within the dataset). The global
batch's slots are dealt at random among the datasets, keyed by ``(seed, e, j)``, and each
input pipeline makes its own contiguous part of them. The state of an iterator is the
batch number, as for one dataset (:mod:`chute.read.grain.dataset`).

Each dataset's records are read and prepared by its own :class:`Batches` (its source,
crops and flips at the mixture's size), then brought to the mixture's channels
(:mod:`chute.image.channels`) and labels (:func:`chute.read.mixture.label_space`).

Example:
    >>> train = chute.load(["pets", "wild"], weights=[0.75, 0.25], engine="grain")  # doctest: +SKIP
    >>> train.chute.mixture.images  # doctest: +SKIP
    (3072, 1024)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging

import numpy as np

from chute.errors import ChuteError
from chute.image.channels import to_channels
from chute.read import cache as shard_cache
from chute.read import mixture as mixture_lib
from chute.read.grain import dataset as dataset_lib
from chute.read.grain import workers as grain_workers
from chute.read.grain.plan import GrainPlan, make_plan
from chute.read.grain.source import GrainSource
from chute.read.options import LoadOptions
from chute.read.share import Share
from chute.read.stream import StreamPosition

log = logging.getLogger(__name__)


class MixedBatches:
    """A mixture's batches by number (what :class:`~chute.read.grain.dataset.Batches` is
    for one dataset): picklable, each batch made whole in one call."""

    def __init__(
        self,
        parts: list[dataset_lib.Batches],
        mixture: mixture_lib.Mixture,
        plan: GrainPlan,
        seed: int,
        schedule: mixture_lib.Schedule,
    ):
        self.parts, self.plan, self.seed, self.share = parts, plan, seed, plan.share
        self.maps = [mixture.labels_of(index) for index in range(len(parts))]
        self.steps = plan.steps
        self.schedule = schedule  # for the global batch: every pipeline's batch j together
        self.finish = dataset_lib.Finish(plan)
        # An epoch defined by the first dataset (not a number of steps) reads it once.
        self.aligned = mixture.steps is None
        for part in parts:
            # A dataset's own epoch is every record once (its draws run on across epochs).
            part.per_epoch = len(part.source)

    @property
    def offset(self) -> tuple[int, int]:
        """Always ``(0, 0)``: a mixture resumes at a batch of the same global batch size."""
        return (0, 0)

    @offset.setter
    def offset(self, value: tuple[int, int]) -> None:
        if value[1]:
            raise ChuteError(
                "A mixture of datasets resumes at a batch of the same global batch size, "
                f"not {value[1]} examples into one: its batches' composition depends on it. "
                f"Received: a position {value[1]} examples into epoch {value[0]}"
            )

    def __len__(self) -> int:
        return dataset_lib.MAX_EPOCHS * self.steps

    def slots(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """This pipeline's slots of batch ``number``: the dataset and the record of each."""
        epoch, batch = divmod(int(number), self.steps)
        datasets = self.schedule.slots(self.seed, epoch, batch)
        starts = self.schedule.starts(epoch, batch)
        records = np.zeros(len(datasets), np.int64)
        for index, part in enumerate(self.parts):
            taken = datasets == index
            positions = np.arange(starts[index], starts[index] + taken.sum())
            if index == 0 and self.aligned:
                # The first dataset's epoch is the mixture's: its draws start anew with each
                # (the last batch's few beyond its images come from the start of its order).
                total = len(part.source)
                within = positions - epoch * int(self.schedule.per_epoch[0])
                positions = epoch * total + within % total
            records[taken] = self._draws(part, positions)
        size = self.plan.batch_size
        mine = slice(self.share.index * size, (self.share.index + 1) * size)
        return datasets[mine], records[mine]

    @staticmethod
    def _draws(part: dataset_lib.Batches, positions: np.ndarray) -> np.ndarray:
        """The records at ``positions`` of a dataset's draws: its epochs' orders one after
        another."""
        total = len(part.source)
        found = np.zeros(len(positions), np.int64)
        for epoch in np.unique(positions // total):
            here = positions // total == epoch
            found[here] = part.draw(int(epoch))[positions[here] % total]
        return found

    def __getitem__(self, number: int):
        plan = self.plan
        epoch, batch = divmod(int(number), self.steps)
        datasets, records = self.slots(number)
        rng = np.random.default_rng([self.seed, epoch, self.share.index, batch])
        images = np.zeros((len(records), *plan.shape), np.uint8)
        if plan.multi_label:
            labels = np.zeros((len(records), plan.num_classes), np.float32)
        else:
            labels = np.zeros(len(records), np.int64)
        weights = np.ones(len(records), np.float32)
        for index, part in enumerate(self.parts):
            taken = np.flatnonzero(datasets == index)
            if not len(taken):
                continue
            if part.plan.shape == plan.shape and not plan.multi_label:
                # straight into the batch (no copy), then its labels into the mixture's
                part.fill(records[taken], rng, (images, labels, weights), taken)
                labels[taken] = self.maps[index][labels[taken]]
                continue
            theirs, their_labels, _ = part.fill(records[taken], rng)
            images[taken] = to_channels(theirs, plan.shape[2])
            if plan.multi_label:  # their label columns into the mixture's
                labels[np.ix_(taken, self.maps[index])] = their_labels
            else:
                labels[taken] = self.maps[index][their_labels]
        return self.finish(images, labels, weights)

    def fetch_ahead(self, start: StreamPosition) -> None:
        """Asks each dataset's shard cache (a bucket's) for what it reads first."""
        starts = self.schedule.starts(start.epoch, start.batch)
        for index, (part, first) in enumerate(zip(self.parts, starts, strict=True)):
            if part.source.cache is not None:  # asks in order of first use
                aligned = index == 0 and self.aligned  # its epochs are the mixture's
                part.draw(start.epoch if aligned else int(first) // len(part.source))


def make_mixed_dataset(
    mixture: mixture_lib.Mixture, split: str, options: LoadOptions, share: Share, replicas: int = 1
):
    """The Grain dataset of ``mixture``'s ``split`` for input pipeline ``share`` (see the
    module docstring), and its :class:`~chute.read.mixture.MixInfo`.

    Raises:
        ChuteError: the split is read for evaluation, or what the options ask cannot be
            read from one of the datasets.
    """
    first = mixture.first
    options = mixture_lib.reading_options(options, split)
    plan = make_plan(first, split, options, share, replicas)
    global_batch = plan.batch_size * share.pipelines
    plan = dataclasses.replace(
        plan,
        steps=mixture.epoch_steps(split, global_batch),
        shape=(*plan.shape[:2], mixture.channels),
        num_classes=len(mixture.class_names),
    )
    seed = dataset_lib.resolve_seed(plan, lambda: _shared_seed(mixture, split))
    schedule = mixture.schedule(split, global_batch)
    parts = []
    for index, manifest in enumerate(mixture.manifests):
        theirs = mixture_lib.part_options(options, manifest, plan.shape[:2])
        part_plan = make_plan(manifest, split, theirs, Share(), 1)
        cache = shard_cache.for_load(manifest.location, theirs)
        source = GrainSource(manifest, split, cache)
        shards = manifest.split(split).shards
        if dataset_lib._window(part_plan, source, shards) is not None:
            raise ChuteError(
                f"Mixing reads every dataset in a global shuffle; {manifest.location}'s "
                f"{split} split does not fit the shard cache, or a shard_window was given. "
                f"Received: cache_limit={options.cache_limit}, "
                f"shard_window={options.shard_window}"
            )
        part_seed = int(np.random.default_rng([seed, index]).integers(1 << 31))
        probabilities = dataset_lib.record_probabilities(
            part_plan, manifest, source, draws=int(schedule.per_epoch[index])
        )
        parts.append(
            dataset_lib.Batches(
                source,
                part_plan,
                seed=part_seed,
                probabilities=probabilities,
                shard_records=[shard.records for shard in shards],
                stored=manifest.image,
            )
        )
    batches = MixedBatches(parts, mixture, plan, seed, schedule)
    workers = grain_workers.default_workers() if plan.workers is None else plan.workers
    grain_workers.check_processes(workers)
    info = mixture.describe(split, global_batch, schedule)
    log.info(
        "grain engine: input pipeline %d of %d, a mixture of %d datasets (%s), %d batches "
        "of %d per epoch, %d worker(s)",
        share.index,
        share.pipelines,
        len(parts),
        mixture_lib.shown(info),
        plan.steps,
        plan.batch_size,
        workers,
    )
    return dataset_lib._dataset_class()(batches, workers), plan, info


def _shared_seed(mixture: mixture_lib.Mixture, split: str) -> int:
    """A seed every input pipeline derives alike from the mixed datasets' shards."""
    seeds = [dataset_lib.shared_seed(manifest, split) for manifest in mixture.manifests]
    digest = hashlib.sha256(json.dumps([seeds, mixture.shares]).encode()).digest()
    return int.from_bytes(digest[:4], "little")
