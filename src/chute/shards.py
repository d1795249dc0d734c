"""Shard files: naming, sizing, and an atomic, hashing writer.

Shards are planned before any image is encoded: a split's records are cut
into contiguous, near-equal runs, so the content of shard ``i`` depends only
on the source and the options. That is what makes a resumed conversion
byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from typing import Any

from chute import storage
from chute.options import DEFAULT_MIN_SHARDS

MIN_RECORDS_PER_SHARD = 64  # below this, more files only add open/seek overhead
SHARD_NAME = re.compile(r"^(train|val|test)-(\d{5})-of-(\d{5})\.tfrecord$")


def shard_name(split: str, index: int, count: int) -> str:
    """``train-00003-of-00016.tfrecord``: split, index and count in the name.

    Example:
        >>> shard_name("val", 0, 4)
        'val-00000-of-00004.tfrecord'
    """
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def plan(
    num_items: int,
    bytes_per_item: float,
    *,
    shard_size_mb: float,
    min_shards: int | None,
    default_min_shards: int = DEFAULT_MIN_SHARDS,
) -> list[tuple[int, int]]:
    """Cuts ``num_items`` records into ``[start, stop)`` runs, one per shard.

    The count is the larger of what the size bound needs and the minimum: an
    explicit ``min_shards``, else ``default_min_shards`` when every shard can
    still hold ``MIN_RECORDS_PER_SHARD`` records. Never more shards than records.
    """
    by_size = math.ceil(num_items * bytes_per_item / (shard_size_mb * 1e6))
    if min_shards is None:
        min_shards = min(default_min_shards, num_items // MIN_RECORDS_PER_SHARD)
    count = max(1, min(num_items, max(by_size, min_shards)))
    bounds = [num_items * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


class ShardWriter:
    """Writes one shard under a temporary name and renames it when complete.

    Records arrive already framed (see :mod:`chute.records`). The writer keeps
    the sha256, size, record count and per-class counts the manifest needs.

    Example:
        >>> with ShardWriter("ram://out/train-00000-of-00001.tfrecord", 2) as w:  # doctest: +SKIP
        ...     w.write(framed, labels=[0, 1])
        >>> w.info["num_records"]  # doctest: +SKIP
        2
    """

    def __init__(self, path: str, num_classes: int, *, tmp_dir: str | None = None):
        self.path = path
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        self._tmp = storage.join(tmp_dir, name + ".partial") if tmp_dir else path + ".partial"
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._class_counts = [0] * num_classes
        self._handle: Any = None
        self.info: dict[str, Any] = {}

    def __enter__(self) -> ShardWriter:
        self._handle = storage.gfile().GFile(self._tmp, "wb")
        self._handle.write(b"")  # GFile creates the file on the first write, even an empty one
        return self

    def write(self, framed: bytes, labels: list[int]) -> None:
        """Appends framed records whose labels are ``labels``."""
        self._handle.write(framed)
        self._hash.update(framed)
        self._bytes += len(framed)
        for label in labels:
            self._class_counts[label] += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        self._handle.close()
        fs = storage.gfile()
        if exc_type is not None:
            if fs.exists(self._tmp):
                fs.remove(self._tmp)
            return
        fs.rename(self._tmp, self.path, overwrite=True)
        self.info = {
            "file": self.path.replace("\\", "/").rsplit("/", 1)[-1],
            "num_records": sum(self._class_counts),
            "bytes": self._bytes,
            "sha256": self._hash.hexdigest(),
            "class_counts": self._class_counts,
        }
