"""``chute.load(..., engine="grain")``: the same batches as the tf.data engine, as a Grain
dataset over the record indexes: a global shuffle, and a position that is saved and restored.

Every batch is a pure function of its number. Training batch ``j`` of epoch
``e`` holds positions ``j * batch .. (j + 1) * batch`` of that epoch's draw: a
permutation of every record of the split seeded by ``(seed, e)`` (or, with
``sampling``, a weighted draw with replacement of the same length), of which
each input pipeline (a host, a JAX process) takes its own contiguous share of
``steps * batch`` positions. A batch's crops and flips are drawn from a
generator keyed by ``(seed, e, pipeline, j)``. So an iterator's state is where
it is (Grain's ``get_state()``: a few bytes), an epoch's order is a new global
permutation, and a run resumed at batch ``j`` reads exactly the batches it
would have read.

A batch is one Grain element, made whole in Grain's worker processes
(``workers``; threads with ``workers=0``): for each record a positioned read
(:class:`~chute.read.grain.source.GrainSource`), in training a JPEG decoded at
the smallest DCT scale that covers the crop and OpenCV's resize, in evaluation
the tf.data engine's pixels (:mod:`chute.image.crop`). Heavy augmentations
(rotation, MixUp, ...) run in the train step (``augment_on="device"``).

A plain dataset's ``iter()`` is an epoch (the next one once an epoch was read to its
end) of one stream kept across epochs (:mod:`chute.read.grain.epochs`): its worker
processes start once, not at every epoch and every validation.

Evaluation reads every example once, in record order, each input pipeline a
contiguous share, the last batch short or (``pad_final_batch``) padded with
weight-0 examples and every pipeline given the largest share's batches.

Worker processes (:mod:`chute.read.grain.workers`): Grain spawns them, and a spawned
process first runs the main script again, all but what ``if __name__ ==
"__main__":`` guards. So ``workers=None`` is one process per core where that is
safe (a guarded script, ``chute train``, a notebook, ``python -c``) and threads
where it is not (``chute.load`` called at a script's unguarded top level, as in
most tutorials). Workers end when their parent does, however it ends (a watch
thread in each), and iterators still open at exit are closed before the
interpreter tears down the modules Grain's finalizers use.

Example:
    >>> train = chute.load("./kn-shards", engine="grain", seed=0)  # doctest: +SKIP
    >>> iterator = iter(train)  # doctest: +SKIP
    >>> images, labels = next(iterator)  # doctest: +SKIP
    >>> state = iterator.get_state()  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.format import records
from chute.format.spec import ImageSpec
from chute.image import crop
from chute.lazy import extra
from chute.machine import available_cores
from chute.read import sampling as sampling_lib
from chute.read.grain import epochs
from chute.read.grain import order as order_lib
from chute.read.grain import workers as grain_workers
from chute.read.grain.plan import GrainPlan
from chute.read.grain.source import GrainSource
from chute.read.stream import StreamPosition

log = logging.getLogger(__name__)

MAX_EPOCHS = 1 << 20  # the training stream's length, in epochs ("forever")
_CROP_KEY, _FLIP_KEY = 1, 2


def _grain():
    try:
        import grain
    except ImportError:
        raise ChuteError(f"engine='grain' needs Grain: {extra('grain', instead='grain')}") from None
    from absl import flags  # Grain reads its absl flags, which a program without absl never parses

    # Marked as parsed, or Grain's first flag read would raise in a program without absl.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return grain


class Batches:
    """A pipeline's batches by number, each made whole here: ``chute.load``'s batch.

    Training batch ``j`` is batch ``j % steps`` of epoch ``j // steps``; evaluation
    has one epoch. A batch is the unit of work (one Grain element): its records are
    read and prepared in one call, their random choices drawn from one generator
    keyed by ``(seed, epoch, pipeline, batch)``. Picklable (Grain sends it to its
    worker processes); an epoch's draw is made once per process and epoch.
    """

    def __init__(
        self,
        source: GrainSource,
        plan: GrainPlan,
        *,
        seed: int,
        probabilities: np.ndarray | None,
        window: int | None = None,
        shard_records: Sequence[int] = (),
        stored: ImageSpec | None = None,
    ):
        self.source, self.plan, self.seed, self.share = source, plan, seed, plan.share
        self.probabilities, self.steps, self.flip = probabilities, plan.steps, plan.flip
        self.window = window
        # Records per shard, in manifest order (records are numbered shard after shard).
        self.shard_records = list(shard_records) or [len(source)]
        self.shard_starts = np.concatenate([[0], np.cumsum(self.shard_records)]).tolist()
        # Every pipeline's batch j together: one global batch, read from one global order.
        self.global_batch = plan.batch_size * plan.share.pipelines
        self.per_epoch = plan.steps * self.global_batch  # of the order, read by all pipelines
        # A stream resumed after a run of another global batch size starts its first epoch
        # at this example (see StreamPosition.offset): (epoch, offset).
        self.offset: tuple[int, int] = (0, 0)
        self._block: tuple[int, int] | None = None  # (epoch, block) last prefetched for
        self._block_plans: dict[int, Any] = {}  # epoch -> its shard blocks
        self.records = None
        if not plan.training:  # this pipeline's contiguous run of the split
            start = sum(plan.sizes[: plan.share.index])
            self.records = np.arange(start, start + plan.sizes[plan.share.index])
        self.finish = Finish(plan)
        self._drawn: tuple[int, np.ndarray] | None = None
        # Raw images stored at the size yielded, one class each, no weights, no crop: the
        # records' image bytes are found without parsing each Example (the layout chute
        # writes; any other record takes the general parse).
        self._raw = None
        if (
            stored is not None
            and stored.encoding == "raw"
            and stored.shape == plan.shape
            and plan.random_crop is None
            and not plan.multi_label
            and not plan.weights
        ):
            self._raw = records.raw_layout(stored.channels, stored.height, stored.width)

    def __len__(self) -> int:
        # Training is one long stream (epochs follow each other); a resume slices into it.
        return MAX_EPOCHS * self.steps if self.plan.training else self.steps

    def __getstate__(self) -> dict[str, Any]:
        # The epoch's draw is not pickled: each worker makes it again, and it can be large.
        return {**self.__dict__, "_drawn": None}

    def draw(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s record numbers, for every pipeline (a permutation of the
        split or a shard-block shuffle, :mod:`chute.read.grain.order`; or weighted
        draws with replacement of the same length)."""
        if self._drawn is None or self._drawn[0] != epoch:
            # Keyed by (seed, epoch) alone: every pipeline draws the same order and takes its share.
            if self.probabilities is None:
                # Cut to every pipeline's whole batches: the rest is not read this epoch.
                drawn = order_lib.epoch_order(
                    self.shard_records, seed=self.seed, epoch=epoch, window=self.window
                )[: self.per_epoch]
            else:
                rng = np.random.default_rng([self.seed, epoch])
                drawn = rng.choice(len(self.source), size=self.per_epoch, p=self.probabilities)
            self._drawn = (epoch, drawn)
            # The whole split fits the cache: every shard is fetched ahead, in order of use.
            if self.window is None:
                self._upcoming(self._first_use(drawn))
        return self._drawn[1]

    def _upcoming(self, shards: list[int]) -> None:
        # The source fetches these shards ahead into its cache (it has none when local).
        if self.source.cache is not None:
            self.source.upcoming(shards)

    def _first_use(self, drawn: np.ndarray) -> list[int]:
        return order_lib.shards_by_first_use(drawn, self.shard_starts)

    def _prefetch_blocks(self, epoch: int, position: int) -> None:
        """Shard-block order: the block holding ``position`` and the next one (the next
        epoch's first at the last block) are fetched ahead, once per block and process."""
        blocks, ends = self._blocks(epoch)
        block = int(np.searchsorted(ends, position, side="right"))
        if self._block == (epoch, block) or block >= len(blocks):
            return
        self._block = (epoch, block)
        following = blocks[block + 1] if block + 1 < len(blocks) else self._blocks(epoch + 1)[0][0]
        self._upcoming(blocks[block] + [s for s in following if s not in blocks[block]])

    def _blocks(self, epoch: int) -> tuple[list[list[int]], np.ndarray]:
        blocks = self._block_plans.get(epoch)
        if blocks is None:
            blocks = order_lib.shard_blocks(
                self.shard_records, seed=self.seed, epoch=epoch, window=self.window
            )
            # This epoch's and the next one's (its first block is fetched during the last).
            self._block_plans = {e: b for e, b in self._block_plans.items() if e >= epoch - 1}
            self._block_plans[epoch] = blocks
        return blocks

    def fetch_ahead(self, start: StreamPosition) -> None:
        """Asks the shard cache for what a stream from ``start`` reads first (training;
        evaluation: its shards in order), from this process: the downloads then overlap
        the start of Grain's worker processes, which would ask only once running."""
        if self.source.cache is None:
            return
        if not self.plan.training:
            self._upcoming(self._first_use(self.records))
        elif self.window is None:
            self.draw(start.epoch)  # asks for every shard, in the order of first use
        else:
            first = start.batch * self.global_batch + self.share.index * self.plan.batch_size
            self._prefetch_blocks(start.epoch, first + start.offset)

    def records_of(self, number: int) -> np.ndarray:
        """The record numbers of batch ``number`` (evaluation: -1 for padding)."""
        size = self.plan.batch_size
        if self.plan.training:
            epoch, batch = divmod(int(number), self.steps)
            # Batch j of every pipeline is global batch j: this pipeline's places in it. The
            # order and a global batch do not depend on how many pipelines share them, so a
            # run resumes on another number of hosts or devices (same global batch size).
            first = batch * self.global_batch + self.share.index * size
            if epoch == self.offset[0]:
                first += self.offset[1]
            if self.window is not None:
                self._prefetch_blocks(epoch, first)
            drawn = self.draw(epoch)
            # A resumed stream's epoch holds fewer whole batches; its fit stops before the
            # end, but Grain may prefetch a batch past it: any records will do there.
            return drawn[np.arange(first, first + size) % len(drawn)]
        mine = self.records[number * size : (number + 1) * size]
        if self.plan.pad_final_batch and len(mine) < size:
            mine = np.concatenate([mine, np.full(size - len(mine), -1, mine.dtype)])
        return mine

    def __getitem__(self, number: int):
        records = self.records_of(number)
        rng = None
        if self.plan.training:
            epoch, batch = divmod(int(number), self.steps)
            # One generator per batch: a batch's crops do not depend on which worker made it.
            key = [self.seed, epoch, self.share.index, batch]
            # A stream that starts mid-batch (another global batch size) draws other crops.
            if epoch == self.offset[0] and self.offset[1]:
                key.append(self.offset[1])
            rng = np.random.default_rng(key)
        return self.finish(*self.fill(records, rng))

    def fill(
        self,
        records: np.ndarray,
        rng: np.random.Generator | None,
        into: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        slots: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(images, labels, weights)`` of ``records`` (record numbers; -1: padding) as
        stored in this split's classes, before :class:`Finish`: uint8 images of the plan's
        shape, int64 labels (multi-label: 0/1 float rows), float32 weights. Training's
        crops and flips are drawn from ``rng``, in slot order (None: evaluation's pixels).
        ``into``: arrays of that kind to write into, at rows ``slots`` (a mixture's batch),
        rather than new ones."""
        plan = self.plan
        if into is None:
            images = np.zeros((len(records), *plan.shape), np.uint8)
            if plan.multi_label:  # a 0/1 row per image (padding: all 0)
                labels = np.zeros((len(records), plan.num_classes), np.float32)
            else:
                labels = np.zeros(len(records), np.int64)
            weights = (records >= 0).astype(np.float32)
            slots = np.arange(len(records))
        else:
            images, labels, weights = into
        for slot, record in zip(slots.tolist(), records.tolist(), strict=True):
            if record < 0:  # padding: zeros, weight 0
                continue
            if self._raw is not None and self._fast(images, labels, slot, record, rng):
                continue
            values = self.source[record]
            self._pixels(values, rng, images[slot])
            if plan.multi_label:
                labels[slot, values["labels"]] = 1
            else:
                labels[slot] = values["class"]
            if plan.weights:  # the record's own weight (padding never comes with weights)
                weights[slot] = values["weight"][0]
        return images, labels, weights

    def _fast(self, images, labels, slot: int, record: int, rng) -> bool:
        """Batch slot ``slot`` filled from a record in chute's raw layout, with the flip
        :meth:`_pixels` would draw (the same draws, in the same order); False for a record
        in any other layout."""
        found = self.source.raw_image(record, self._raw)
        if found is None:
            return False
        data, at, label = found
        image = np.frombuffer(data, np.uint8, images[slot].size, at).reshape(images.shape[1:])
        crop.place(image, images[slot], flip=rng is not None and self.flip and rng.random() < 0.5)
        labels[slot] = label
        return True

    def _pixels(self, values: dict, rng: np.random.Generator | None, out: np.ndarray) -> None:
        """Writes a record's image into batch slot ``out``. Evaluation (no ``rng``): the
        centre crop, exactly the tf.data engine's pixels; training: the random-resized crop
        (or the whole image) and the flip."""
        plan = self.plan
        height, width = (int(n) for n in values["size"])
        shape, size = (height, width, int(values["channels"])), plan.shape[:2]
        if values["encoding"] == "raw" and shape == plan.shape and plan.random_crop is None:
            image = np.frombuffer(values["image"], np.uint8).reshape(shape)  # as stored
        else:
            if rng is not None and plan.random_crop is not None:
                window = crop.random_window(height, width, rng, *plan.random_crop)
            else:
                # Training without a random crop: the whole image; the centre crop is evaluation's.
                fraction = plan.crop_fraction if rng is None else 1.0
                window = crop.centre_window(height, width, size, fraction)
            image = crop.window_pixels(
                values["image"], values["encoding"], shape, window, size,
                plan.interpolation, exact=rng is None,
            )  # fmt: skip
        # Drawn after the crop, from the same generator: the draws stay in one fixed order.
        crop.place(image, out, flip=rng is not None and self.flip and rng.random() < 0.5)


class Finish:
    """A batch of ``(images, labels, weights)`` as ``chute.load`` yields it: labels in the
    label mode, images in the dtype, weights only with ``pad_final_batch`` (0 on the
    padding) or sample weights (each record's)."""

    def __init__(self, plan: GrainPlan):
        self.plan = plan

    def __call__(self, images: np.ndarray, labels: np.ndarray, weights: np.ndarray):
        plan = self.plan
        if plan.dtype != "uint8":
            images = images.astype(np.float32) / np.float32(255)
            if plan.dtype == "bfloat16":
                # ml_dtypes comes with JAX and TensorFlow; imported only for bfloat16.
                import ml_dtypes

                images = images.astype(ml_dtypes.bfloat16)
        if plan.label_mode is None:
            return images
        if plan.multi_label:
            pass  # already 0/1 float rows
        elif plan.label_mode == "int":
            labels = labels.astype(np.int32)
        elif plan.label_mode == "binary":
            labels = labels.astype(np.float32).reshape(-1, 1)
        else:
            labels = np.eye(plan.num_classes, dtype=np.float32)[labels]
        if plan.pad_final_batch or plan.weights:
            return images, labels, weights
        return images, labels


def make_dataset(plan: GrainPlan, source: GrainSource, manifest):
    """The Grain dataset of ``plan`` over ``source`` (see the module docstring): a
    ``grain.IterDataset`` whose every ``iter()`` is the next epoch (or the one
    stream :meth:`stream` starts), and whose ``len()`` is the batches of an epoch."""
    share, split = plan.share, plan.split
    seed = resolve_seed(plan, lambda: shared_seed(manifest, split))
    probabilities = record_probabilities(plan, manifest, source)
    shards = manifest.split(split).shards
    window = _window(plan, source, shards)
    batches = Batches(
        source, plan, seed=seed, probabilities=probabilities, window=window,
        shard_records=[shard.records for shard in shards], stored=manifest.image,
    )  # fmt: skip
    workers = grain_workers.default_workers() if plan.workers is None else plan.workers
    grain_workers.check_processes(workers)
    if not plan.training:
        reads = "every example once, in order"
    elif window is None:
        reads = "a new global shuffle each epoch"
    else:
        reads = f"a shard-block shuffle each epoch ({window} of {len(shards)} shards at a time)"
    log.info(
        "grain engine: input pipeline %d of %d, %s, %d batches of %d per epoch, %d worker(s)",
        share.index,
        share.pipelines,
        reads,
        plan.steps,
        plan.batch_size,
        workers,
    )
    return _dataset_class()(batches, workers)


def resolve_seed(plan: GrainPlan, shared) -> int:
    """The seed of ``plan``'s draws: its own; else, for several training pipelines, one
    every pipeline derives alike (``shared()``); else a new one, logged."""
    seed, share = plan.seed, plan.share
    if seed is None and plan.training and share.pipelines > 1:
        # Each pipeline takes its share of one global order: a seed drawn by each would
        # give each its own order, and shares that overlap.
        seed = shared()
        log.info(
            "grain engine: no seed given; the %d input pipelines share seed %d, derived from "
            "the %s split's shards (the same order every run: pass seed= for another)",
            share.pipelines,
            seed,
            plan.split,
        )
    # One pipeline: any seed will do, and it is logged so that a run can be repeated.
    elif seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
        if plan.training:
            log.info("grain engine: no seed given; this dataset's seed is %d", seed)
    return seed


def record_probabilities(
    plan: GrainPlan, manifest, source: GrainSource, draws: int | None = None
) -> np.ndarray | None:
    """Each record's chance of a draw under ``plan.sampling`` (None without), logged with
    what it does over an epoch of ``draws`` (default: every pipeline's batches; given:
    one dataset of a mixture, named in the line)."""
    if plan.sampling is None:
        return None
    classes = sampling_lib.class_probabilities(manifest, plan.split, plan.sampling)
    named = f"{manifest.location}: " if draws is not None else ""
    if draws is None:
        draws = plan.steps * plan.batch_size * plan.share.pipelines
    counts = manifest.split(plan.split).class_counts
    log.info(
        "sampling=%r: %s%s",
        plan.sampling,
        named,
        sampling_lib.describe(manifest.class_names, classes, counts, draws),
    )
    return _record_probabilities(classes, source)


def _window(plan: GrainPlan, source: GrainSource, shards) -> int | None:
    """Training's shard-block window: asked for (``shard_window``), else sized by the
    shard cache when the split is larger than it; None: a global shuffle."""
    if not plan.training:
        return None
    if plan.shard_window is not None:  # make_plan refuses it with sampling
        return min(plan.shard_window, len(shards))
    cache = source.cache
    if cache is None:
        return None
    # An index holds 16 bytes a record (offset and length); it is cached beside its shard.
    entries = [shard.bytes + 16 * shard.records for shard in shards]
    window = order_lib.window_for(cache.limit, entries)
    if window is not None and plan.sampling is not None:
        raise ChuteError(
            f"`sampling` draws from the whole {plan.split} split ({sum(entries) / 1e9:.1f} GB), "
            f"which is larger than the shard cache: raise cache_limit above it. Received: "
            f"cache_limit={cache.limit} bytes"
        )
    if window is not None and cache.limit_rule:
        # A default limit follows this machine's free disk: another host, or this one after
        # a restart, would draw other blocks, and pipelines must all read one order.
        raise ChuteError(
            f"The {plan.split} split ({sum(entries) / 1e9:.1f} GB) is larger than the shard "
            f"cache's default limit ({cache.limit / 1e9:.1f} GB{cache.limit_rule}), so it is "
            "read in shard blocks, whose order must not depend on a machine's free disk: pass "
            "cache_limit (--cache-limit) a size every host has, or shard_window "
            "(--shard-window N). Received: cache_limit=None"
        )
    if window is not None:
        log.warning(
            "the %s split (%.1f GB) is larger than the shard cache (cache_limit %.1f GB): "
            "a shard-block shuffle of %d shards at a time, not a global shuffle (a larger "
            "cache_limit, or shard_window=, changes it)",
            plan.split, sum(entries) / 1e9, cache.limit / 1e9, window,
        )  # fmt: skip
    return window


def shared_seed(manifest, split: str) -> int:
    """A seed every input pipeline derives alike from the split's shards (names, record
    counts, checksums), without talking to the others."""
    shards = [[shard.name, shard.records, shard.sha256] for shard in manifest.split(split).shards]
    digest = hashlib.sha256(json.dumps([split, shards]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _record_probabilities(classes: Sequence[float], source: GrainSource) -> np.ndarray:
    """Each record's chance of a draw: its class's probability ``classes[label]``, spread
    over the class's records (the labels are read once from the records; no image is
    decoded)."""
    labels = np.fromiter((source[i]["class"] for i in range(len(source))), np.int64, len(source))
    classes = np.asarray(classes, np.float64)
    counts = np.bincount(labels, minlength=len(classes))
    # A class's probability spread evenly over its records; at least 1 avoids dividing by zero.
    per_record = classes[labels] / np.maximum(counts[labels], 1)
    return per_record / per_record.sum()


@functools.cache
def _dataset_class():
    grain = _grain()

    class ChuteGrainDataset(grain.IterDataset):
        """Batches of a split read through Grain: each ``iter()`` an epoch (the next
        one; a :meth:`stream` always the same, from the position it names); ``len()``
        its batches. Its iterators have Grain's ``get_state()``/``set_state()``."""

        def __init__(self, batches: Batches, workers: int):
            # No parents: the batches are made here, not from another Grain dataset.
            super().__init__([])
            self.batches, self.plan, self.workers = batches, batches.plan, workers
            # The epoch the next iter() reads: one an iterator read to its end moves it on;
            # one left part-way (Keras reads two batches to learn the shapes) does not.
            self.epoch = 0
            self.start: StreamPosition | None = None  # a stream's (see stream())
            self._reader: epochs.Reader | None = None  # the plain dataset's, kept across epochs

        def __len__(self) -> int:
            return self.batches.steps

        def stream(self, position: StreamPosition) -> ChuteGrainDataset:
            """The training batches from ``position`` on (with ``repeat``, from epoch to
            epoch; else to that epoch's end), each ``iter()`` from there: Keras iterates
            a dataset a few times before it trains (to learn its shapes), so a resumed
            run's input must not move on when iterated. Evaluation ignores it."""
            streamed = copy.copy(self)  # the same batches, source and LoadInfo
            streamed.start, streamed._reader = position, None
            return streamed

        def __iter__(self):
            if self.start is None:
                # A plain dataset: an epoch at a time from one stream whose workers live on
                # (Keras iterates training and validation anew each epoch).
                return epochs.epoch_iterator(grain)(self, self.epoch, 0)
            return self._iterator()

        def close(self) -> None:
            """Ends the worker processes (or threads) kept across epochs; a later
            ``iter()`` starts them again."""
            if self._reader is not None:
                self._reader.close()
                self._reader = None

        def _read_at(self, number: int):
            """Batch ``number`` of the plain dataset's stream (training: of epoch ``number
            // steps``; evaluation: the split again every ``steps``), from the reader kept
            across epochs."""
            if self._reader is None:
                self._reader = epochs.Reader(self)
            return self._reader.read(number)

        def _stream_from(self, number: int):
            """An iterator of the plain dataset's stream from batch ``number`` on, without
            end (training: the epochs one after another; evaluation: the split repeated)."""
            steps = self.batches.steps
            # a bucket's shards download while workers start
            self.batches.fetch_ahead(StreamPosition(number // steps, number % steps))
            batches = grain.MapDataset.source(self.batches)
            if not self.plan.training:
                batches = batches.repeat()
            return self._read(batches.slice(slice(number, None)))

        def _iterator(self):
            source, steps = self.batches, self.batches.steps
            start = self.start
            if self.plan.training and start.offset:
                source = copy.copy(source)  # this stream's own: its first epoch starts later
                source.offset = (start.epoch, start.offset)
            source.fetch_ahead(start)  # a bucket's shards download while workers start
            batches = grain.MapDataset.source(source)
            if self.plan.training:
                # every batch is a pure function of its number: the stream is a slice
                first = start.epoch * steps + start.batch
                # An epoch started `offset` examples in (0 < offset < a global batch) has
                # one whole batch less.
                last = None if self.plan.repeat else (start.epoch + 1) * steps - bool(start.offset)
                batches = batches.slice(slice(first, last))
            elif self.plan.repeat:
                batches = batches.repeat()
            return self._read(batches)

        def _read(self, batches):
            """An iterator of ``batches`` (a Grain MapDataset of whole batches) made in
            worker processes, or with ``workers=0`` in up to 4 threads of this process."""
            threads = 0 if self.workers else min(4, available_cores())
            dataset = batches.to_iter_dataset(
                grain.ReadOptions(num_threads=threads, prefetch_buffer_size=max(2, threads))
            )
            if not self.workers:
                return iter(dataset)
            options = grain.MultiprocessingOptions(num_workers=self.workers)
            # Each worker watches this process and ends with it, however it ends.
            hook = functools.partial(grain_workers.end_with_parent, os.getpid())
            return grain_workers.delivered(iter(dataset.mp_prefetch(options, worker_init_fn=hook)))

    return ChuteGrainDataset
