"""chute.load on shards of 650 records: several blocks per shard, block sizes that move each
epoch, and the block shuffle of a replayed cache, which the tiny datasets of test_load.py
(a block per shard) never reach.

The spy below sees each block as the reader hands it on: which shard, how many records.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from helpers import make_folder
from PIL import Image

import chute
from chute.lazy import tf
from chute.read.tf import pipeline
from chute.read.tf.plan import BLOCK

PER_CLASS = 650  # two classes, two shards of 650 records each: three blocks of at most 256
TOTAL = 2 * PER_CLASS
BATCH = 50  # divides 1,300: a training epoch holds every record


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("blocks")
    src = make_folder(root / "src", {"a": PER_CLASS, "b": PER_CLASS}, size=(6, 6))
    outs = {}
    for encoding in ("raw", "png"):
        outs[encoding] = root / encoding
        chute.convert(src, outs[encoding], workers=1, encoding=encoding, min_shards=2)
    outs["src"] = src
    return outs


def _source_keys(src: Path) -> collections.Counter:
    keys = collections.Counter()
    for label, name in enumerate(("a", "b")):
        for path in sorted((src / name).iterdir()):
            keys[(label, np.asarray(Image.open(path)).tobytes())] += 1
    return keys


def _epoch(ds) -> list[tuple[int, bytes]]:
    """(label, pixels) of every example, in the order yielded."""
    out = []
    for images, labels in ds:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            out.append((int(label), image.tobytes()))
    return out


@pytest.fixture
def blocks_read(monkeypatch) -> list[tuple[int, int]]:
    """``(shard index, records)`` of each block read from a shard (0 marks a shard's end)."""
    seen: list[tuple[int, int]] = []
    real = pipeline.shard_blocks

    def spied(plan, names, expected, corrupt):
        read = real(plan, names, expected, corrupt)

        def read_and_note(file_index, draw):
            def note(images, labels):
                def append(index, count):
                    seen.append((int(index), int(count)))
                    return count

                noted = tf.numpy_function(
                    append, [file_index, tf.shape(labels)[0]], tf.int32, stateful=True
                )
                with tf.control_dependencies([noted]):
                    return tf.identity(images), tf.identity(labels)

            return read(file_index, draw).map(note)

        return read_and_note

    monkeypatch.setattr(pipeline, "shard_blocks", spied)
    return seen


def _by_shard(seen) -> dict[int, list[int]]:
    shards = collections.defaultdict(list)
    for index, count in seen:
        shards[index].append(count)
    return dict(shards)


def test_training_reads_each_shard_in_blocks_whose_size_moves_each_epoch(big, blocks_read):
    ds = chute.load(big["raw"], batch_size=BATCH, training=True, cache=None, seed=7)
    sizes = []
    for _ in range(3):
        blocks_read.clear()
        assert len(_epoch(ds)) == TOTAL
        shards = _by_shard(blocks_read)
        assert sorted(shards) == [0, 1]
        for counts in shards.values():
            *full, last, end = counts
            assert end == 0 and sum(counts) == PER_CLASS
            assert len(full) >= 2  # three blocks or more: the multi-block path
            assert len(set(full)) == 1 and BLOCK // 2 <= full[0] <= BLOCK and last <= full[0]
            sizes.append(full[0])
    assert len(set(sizes)) > 1, sizes  # 2 shards x 3 epochs: the boundaries moved


def test_evaluation_reads_fixed_blocks(big, blocks_read):
    ds = chute.load(big["raw"], batch_size=BATCH, training=False, cache=None)
    assert len(_epoch(ds)) == TOTAL
    assert _by_shard(blocks_read) == {0: [BLOCK, BLOCK, 138, 0], 1: [BLOCK, BLOCK, 138, 0]}


@pytest.mark.parametrize(
    ("encoding", "cache"),
    [("raw", None), ("raw", "memory"), ("png", None), ("png", "memory")],
)
def test_every_record_once_per_epoch_in_a_new_order(big, encoding, cache):
    # png without a cache: decoded one by one after the shuffle; otherwise blocks of pixels.
    expected = _source_keys(big["src"])
    ds = chute.load(big[encoding], batch_size=BATCH, training=True, cache=cache, seed=3)
    epochs = [_epoch(ds) for _ in range(3)]
    for order in epochs:
        assert collections.Counter(order) == expected
    assert len({tuple(order) for order in epochs}) == 3


@pytest.mark.parametrize(("encoding", "cache"), [("raw", "memory"), ("png", None)])
def test_same_seed_same_order_other_seed_other_order(big, encoding, cache):
    def order(seed):
        ds = chute.load(big[encoding], batch_size=BATCH, training=True, cache=cache, seed=seed)
        return [_epoch(ds) for _ in range(2)]

    first = order(11)
    assert order(11) == first
    assert order(12)[0] != first[0]


def test_a_replayed_cache_goes_through_the_block_shuffle(big, blocks_read):
    # A cache replays the first epoch's blocks in one order: without the block shuffle,
    # the first window (256 records) would hold the same records every epoch.
    window = 256
    ds = chute.load(
        big["raw"], batch_size=32, training=True, cache="memory", shuffle_buffer=window, seed=5
    )
    firsts = []
    for epoch in range(4):
        blocks_read.clear()
        firsts.append(frozenset(_epoch(ds)[:window]))
        # the first epoch reads the shards; the others replay the cache
        assert (sum(count for _, count in blocks_read) == TOTAL) == (epoch == 0)
    assert len(set(firsts)) > 1
