"""The Grain engine's order (chute.read.grain.order) and its elastic positions: one
global order that any number of input pipelines and any global batch size read, a
shard-block shuffle for a split larger than the shard cache."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import types

import numpy as np
import pytest
from resume_plans import resume_shards

import chute
from chute import ChuteError
from chute.fit.backup import Record
from chute.fit.position import ResumePoint
from chute.read.grain import order
from chute.read.stream import StreamPosition

COUNTS = [5, 3, 4, 6, 2, 5]  # records per shard: 25, numbered shard after shard
STARTS = np.concatenate([[0], np.cumsum(COUNTS)])


def _shard_of(records) -> np.ndarray:
    return np.searchsorted(STARTS, records, side="right") - 1


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """90 train records in 12 JPEG shards (tests/resume_plans.py)."""
    return resume_shards(tmp_path_factory)


@pytest.mark.parametrize("window", [None, 1, 2, 4, 6, 100])
def test_every_order_is_a_permutation_fixed_by_seed_and_epoch(window):
    drawn = order.epoch_order(COUNTS, seed=7, epoch=3, window=window)
    assert sorted(drawn.tolist()) == list(range(sum(COUNTS)))
    again = order.epoch_order(COUNTS, seed=7, epoch=3, window=window)
    np.testing.assert_array_equal(drawn, again)
    other = order.epoch_order(COUNTS, seed=7, epoch=4, window=window)
    assert not np.array_equal(drawn, other)


def test_the_global_order_is_the_engine_s_permutation_as_before():
    """Window None keeps the order chute drew before the shard cache (a resumed run of an
    older chute reads the same batches)."""
    expected = np.random.default_rng([7, 3]).permutation(sum(COUNTS))
    np.testing.assert_array_equal(order.epoch_order(COUNTS, seed=7, epoch=3, window=None), expected)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_shard_block_holds_the_records_of_window_shards(window):
    drawn = order.epoch_order(COUNTS, seed=1, epoch=0, window=window)
    sequence = order.shards_by_first_use(drawn, STARTS)
    assert sorted(sequence) == list(range(len(COUNTS)))
    position = 0
    for first in range(0, len(sequence), window):
        block = sequence[first : first + window]
        size = sum(COUNTS[s] for s in block)
        # every record of the block's shards, and nothing else, before the next block
        assert set(_shard_of(drawn[position : position + size]).tolist()) == set(block)
        position += size
    assert position == len(drawn)
    # records are mixed inside a block: not each shard's records in a run
    if window > 1:
        runs = np.count_nonzero(np.diff(_shard_of(drawn)))
        assert runs > len(COUNTS)


@pytest.mark.parametrize(
    ("limit", "sizes", "window"),
    [
        (1000, [100] * 10, None),  # the split fits: a global shuffle
        (999, [100] * 10, 4),  # 9 shards fit: two blocks of 4
        (250, [100] * 10, 1),  # 2 fit: one read, one fetched
        (150, [100] * 10, 1),  # 1 fits: one at a time
        (300, [50, 200, 100], 1),  # sized by the largest shard
    ],
)
def test_the_window_is_sized_by_the_cache_limit(limit, sizes, window):
    assert order.window_for(limit, sizes) == window


def _contexts(count: int):
    return [
        types.SimpleNamespace(num_input_pipelines=count, input_pipeline_id=i) for i in range(count)
    ]


def _load(shards, batch_size, context=None, **options):
    return chute.load(shards, engine="grain", batch_size=batch_size, seed=3, workers=0,
                      input_context=context, **options)  # fmt: skip


def test_global_batch_j_is_the_same_on_any_number_of_pipelines(shards):
    """Two pipelines of 4 read, in batch j, what one pipeline of 8 reads in its batch j:
    the order and each global batch do not depend on how many pipelines share them."""
    alone = list(iter(_load(shards, 8)))
    pair = [list(iter(_load(shards, 4, context))) for context in _contexts(2)]
    assert len(alone) == len(pair[0]) == len(pair[1]) == 11
    for j, batch in enumerate(alone):
        together = np.concatenate([pair[0][j][0], pair[1][j][0]])
        np.testing.assert_array_equal(together, batch[0])
        np.testing.assert_array_equal(np.concatenate([pair[0][j][1], pair[1][j][1]]), batch[1])


def _records(train, position: StreamPosition, steps: int) -> list[int]:
    batches = train.stream(position).batches
    if position.offset:  # what the stream's iter() does
        batches = copy.copy(batches)
        batches.offset = (position.epoch, position.offset)
    first = position.epoch * batches.steps + position.batch
    return [int(r) for n in range(first, first + steps) for r in batches.records_of(n)]


def test_two_pipelines_then_one_then_two_again_see_each_example_once(shards):
    """An epoch trained 3 global batches on 2 pipelines (4 each), then resumed on one
    pipeline of 8 for 2, then on 2 pipelines of 5 (another global batch): every example
    of the epoch's order is read once, none twice, and each global batch of 10 is the two
    pipelines' batches together."""
    pair = [_load(shards, 4, context) for context in _contexts(2)]
    seen = []
    for j in range(3):
        for train in pair:
            seen += _records(train, StreamPosition(0, j), 1)
    eight = _load(shards, 8)
    seen += _records(eight, StreamPosition(0, 3), 2)  # 5 global batches: 40 examples
    point = ResumePoint.of(Record(0, 5, "w", samples=40, global_batch=8), steps=9, global_batch=10)
    assert (point.batch, point.offset, point.samples) == (4, 0, 40)
    call = point.fit_call(0, epochs=2, steps=9)
    assert call.steps == 5 and call.start == StreamPosition(0, 4)
    fives = [_load(shards, 5, context) for context in _contexts(2)]
    for j in range(call.steps):
        for train in fives:
            seen += _records(train, StreamPosition(0, call.start.batch + j), 1)
    assert len(seen) == 90 and sorted(seen) == list(range(90))  # 9 x 10: the whole split


def test_a_new_global_batch_that_does_not_divide_the_examples_read_resumes_mid_batch(shards):
    point = ResumePoint.of(Record(1, 16, "w", samples=24, global_batch=8), steps=18, global_batch=5)
    assert (point.epoch, point.batch, point.offset, point.samples) == (1, 4, 4, 24)
    call = point.fit_call(1, epochs=3, steps=18, first_epoch=2)
    assert call.start == StreamPosition(3, 4, 4) and call.cut and call.steps == 18 - 1 - 4
    eight, five = _load(shards, 8), _load(shards, 5)
    seen = _records(eight, StreamPosition(3), 3) + _records(five, call.start, call.steps)
    assert len(seen) == len(set(seen)) == 24 + 13 * 5  # each once; the epoch's last 1 cut
    # the stream a fit iterates: those batches, then it ends (not repeated)
    stream = list(iter(five.stream(call.start)))
    assert len(stream) == call.steps
    labels = np.concatenate([batch[1] for batch in stream])
    assert labels.tolist() == [five.batches.source[r]["class"] for r in seen[24:]]


@pytest.mark.parametrize(
    ("record", "steps", "batch", "expected"),
    [
        (Record(2, 0, "w", samples=0, global_batch=8), 11, 8, (2, 0, 0, 0)),  # an epoch's start
        (Record(0, 4, "w", samples=32, global_batch=8), 11, 8, (0, 4, 0, 32)),  # same size
        (Record(0, 3, "w", samples=48, global_batch=16), 11, 8, (0, 6, 0, 48)),  # halved
        (Record(0, 6, "w", samples=48, global_batch=8), 5, 16, (0, 3, 0, 48)),  # doubled
        # 80 or 72 of 80 read: no whole batch of 16 is left; the last one is trained again
        (Record(0, 10, "w", samples=80, global_batch=8), 5, 16, (0, 4, 0, 64)),
        (Record(0, 9, "w", samples=72, global_batch=8), 5, 16, (0, 4, 0, 64)),
        (Record(0, 1, "w", samples=8, global_batch=8), 5, 16, (0, 0, 8, 8)),  # in batch 0
        (Record(0, 7, "w", samples=56, global_batch=8), 5, 16, (0, 3, 8, 56)),  # mid-batch
    ],
)
def test_resume_points_of_backups_that_record_examples(record, steps, batch, expected):
    point = ResumePoint.of(record, steps=steps, global_batch=batch)
    assert (point.epoch, point.batch, point.offset, point.samples) == expected


def test_a_resume_inside_the_first_batch_of_the_new_size_is_cut_at_its_example():
    """8 examples trained at 8 a step, resumed at 16: the epoch goes on at example 9
    (4 whole batches of 16 left of its 80), not from its start."""
    point = ResumePoint.of(Record(0, 1, "w", samples=8, global_batch=8), steps=5, global_batch=16)
    call = point.fit_call(0, epochs=2, steps=5)
    assert call.cut and call.steps == 4 and call.start == StreamPosition(0, 0, 8)


def test_a_backup_records_examples_and_layout_and_reads_back(tmp_path):
    record = Record(1, 9, "w.h5", {}, samples=24, global_batch=8, layout=(2, 4))
    assert Record.from_dict(record.to_dict()) == record
    older = {"epoch": 1, "step": 9, "weights": "w.h5", "seeds": {}}  # an older chute's
    assert Record.from_dict(older) == Record(1, 9, "w.h5")


def test_a_shard_window_reads_a_few_shards_at_a_time(shards, caplog):
    with caplog.at_level(logging.INFO, logger="chute"):
        train = _load(shards, 8, shard_window=3)
    assert "shard-block shuffle each epoch (3 of 12 shards at a time)" in caplog.text
    starts = train.batches.shard_starts
    drawn = train.batches.draw(0)
    first = np.searchsorted(starts, drawn[:20], side="right") - 1
    assert len(set(first.tolist())) <= 3  # the first block: 3 shards of 7 or 8 records
    batches = list(iter(train))
    assert len(batches) == 11
    labels = np.concatenate([batch[1] for batch in batches])
    assert labels.tolist() == [train.batches.source[int(r)]["class"] for r in drawn]


def test_a_shard_window_with_sampling_is_refused(shards):
    with pytest.raises(ChuteError, match=r"sampling.*shard_window") as refused:
        _load(shards, 8, shard_window=2, sampling="balanced")
    assert "Received: sampling='balanced', shard_window=2" in str(refused.value)
    with pytest.raises(ChuteError, match="shard_window"):
        _load(shards, 8, shard_window=0)


def test_a_split_larger_than_the_shard_cache_reads_in_shard_blocks(shards, tmp_path, caplog):
    """From a store (memory://, through the shard cache) whose cache holds 5 of the 12
    shards: a shard-block shuffle of 2 (two blocks fit), said in the log, and the batches
    of the same dataset read locally with shard_window=2."""
    import fsspec

    fsspec.filesystem("memory").put(str(shards), "/blocks/shards", recursive=True)
    split = chute.load_manifest(shards).split("train")
    largest = max(shard.bytes + 16 * shard.records for shard in split.shards)
    with caplog.at_level(logging.INFO, logger="chute"):
        remote = _load("memory://blocks/shards", 8, cache_dir=str(tmp_path / "cache"),
                       cache_limit=5 * largest + 10)  # fmt: skip
    assert "larger than the shard cache" in caplog.text
    assert "a shard-block shuffle each epoch (2 of 12 shards at a time)" in caplog.text
    local = _load(shards, 8, shard_window=2)
    sizes, done = [], threading.Event()
    watch = threading.Thread(target=_watch_size, args=(tmp_path / "cache", sizes, done))
    watch.start()  # the cache's size all along, not only at the end
    try:
        for theirs, ours in zip(iter(remote), iter(local), strict=True):
            np.testing.assert_array_equal(theirs[0], ours[0])
            np.testing.assert_array_equal(theirs[1], ours[1])
    finally:
        done.set()
        watch.join()
    held = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert held <= 5 * largest + 10
    assert len(sizes) > 1 and max(sizes) <= 5 * largest + 10


def _watch_size(folder, sizes: list, done: threading.Event) -> None:
    """Appends the bytes in ``folder`` (entries and downloads under way) until ``done``."""
    while True:
        total = 0
        for item in folder.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # evicted while listed
                total += item.stat().st_size if item.is_file() else 0
        sizes.append(total)
        if done.wait(0.001):
            return


def test_every_shard_a_batch_reads_was_asked_for_ahead_in_uneven_blocks(shards):
    """Shard blocks of very different sizes (7 shards of 40 records and one of 5, two at
    a time): each batch's shards are among those last asked of the cache (its block and
    the next), including across the epoch's end."""
    from chute.read.grain.dataset import Batches

    counts = [40] * 7 + [5]
    asked: list[list[int]] = []

    class Source:  # what Batches asks of a source with a shard cache
        cache = "a cache"

        def __len__(self):
            return sum(counts)

        def upcoming(self, shard_numbers):
            asked.append(list(shard_numbers))

    plan = dataclasses.replace(_load(shards, 5).batches.plan, steps=57, batch_size=5)
    batches = Batches(Source(), plan, seed=4, probabilities=None, window=2, shard_records=counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for number in range(2 * 57):  # two epochs
        needed = np.searchsorted(starts, batches.records_of(number), side="right") - 1
        assert set(needed.tolist()) <= set(asked[-1]), (number, needed, asked[-1])
    assert 2 * 4 <= len(asked) <= 2 * 4 + 1  # once per block, not per batch


def test_shard_blocks_sized_by_a_default_limit_are_refused(shards, tmp_path, monkeypatch):
    """A default cache limit follows the machine's free disk: blocks sized by it would
    differ between hosts and restarts, so a split larger than it asks for a limit."""
    import fsspec

    from chute.read import cache

    fsspec.filesystem("memory").put(str(shards), "/default/shards", recursive=True)
    monkeypatch.setattr(cache, "default_limit", lambda directory: 20_000)
    with pytest.raises(ChuteError, match="--cache-limit") as refused:
        _load("memory://default/shards", 8, cache_dir=str(tmp_path / "cache"))
    assert "default limit" in str(refused.value) and "--shard-window" in str(refused.value)
    window = _load("memory://default/shards", 8, cache_dir=str(tmp_path / "cache"), shard_window=2)
    assert window.batches.window == 2


@pytest.mark.parametrize(
    ("before", "now", "refused"),
    [
        ({"position": "examples", "batch_size": 8}, {"position": "examples", "batch_size": 4}, 0),
        ({"batch_size": 8}, {"position": "examples", "batch_size": 4}, 1),  # an older run's
        ({"batch_size": 8, "engine": "tf"}, {"batch_size": 4, "engine": "tf"}, 1),
        ({"engine": "tf"}, {"engine": "grain", "position": "examples"}, 1),
    ],
)
def test_only_backups_that_count_examples_resume_on_another_batch_size(
    tmp_path, before, now, refused
):
    from chute.fit import rundir

    rundir.prepare(tmp_path / "run", overwrite=False, started=before)
    (tmp_path / "run" / "backup").mkdir()  # interrupted
    if refused:
        with pytest.raises(ChuteError, match="interrupted run started with other options"):
            rundir.prepare(tmp_path / "run", overwrite=False, started=now)
    else:
        assert rundir.prepare(tmp_path / "run", overwrite=False, started=now).resumed


def test_a_stream_asks_the_cache_for_its_shards_before_reading_a_batch(shards, tmp_path):
    """The shards are asked for from the calling process when a stream starts, so a
    bucket's downloads overlap the start of Grain's workers: they arrive with no batch read."""
    import time

    import fsspec

    fsspec.filesystem("memory").put(str(shards), "/ahead/shards", recursive=True)
    train = _load("memory://ahead/shards", 8, cache_dir=str(tmp_path / "cache"))
    wanted = {shard.sha256 for shard in chute.load_manifest(shards).split("train").shards}
    train.batches.fetch_ahead(StreamPosition(0))
    deadline = time.monotonic() + 20
    while not wanted <= {p.name for p in (tmp_path / "cache").iterdir()}:
        assert time.monotonic() < deadline, "the shards were not fetched ahead"
        time.sleep(0.02)
