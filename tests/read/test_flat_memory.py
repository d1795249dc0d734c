"""Memory flat across epochs on both engines (what benchmarks/bench_scale.py measures at
ImageNet's shape, kept here on a few thousand records): an epoch must not leave anything
behind that the next one adds to."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import pytest
from helpers import convert_arrays, once_per_run

import chute


@pytest.fixture(scope="module")
def thousands(tmp_path_factory) -> Path:
    """3,000 raw 8x8 grayscale records over 30 classes in 24 shards."""

    def build(root: Path) -> None:
        convert_arrays(root, 3000, 30, min_shards=24, workers=1)

    return once_per_run(tmp_path_factory, "thousands", build) / "shards"


def test_the_grain_engine_allocates_nothing_that_stays_from_epoch_to_epoch(thousands):
    """Python's allocations, traced (exact, whatever the machine's load): after two warm-up
    epochs, three more leave less than 256 KB more held (a leak of a record's worth of bytes
    an epoch would leave 3 x 3,000 objects)."""
    train = chute.load(thousands, engine="grain", batch_size=50, seed=0, workers=0)
    for _ in range(2):
        for _ in train:
            pass
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(3):
            for _ in train:
                pass
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert train.epoch == 5 and grown < 256 * 1024, grown
    train.close()


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow  # TensorFlow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_the_tf_engine_holds_no_more_memory_after_five_epochs_than_after_two(thousands):
    """The process's resident memory (TensorFlow's allocations are not Python's): after two
    warm-up epochs, three more add less than 32 MB (the split's decoded cache is 0.2 MB;
    a buffer kept an epoch would add its own size each time)."""
    train = chute.load(thousands, batch_size=50, seed=0)
    for _ in range(2):
        for _ in train:
            pass
    before = _rss()
    for _ in range(3):
        for _ in train:
            pass
    assert _rss() - before < 32 * 2**20
