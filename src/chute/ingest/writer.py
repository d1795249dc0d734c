"""The shard writer: one shard written under a temporary name, hashed, and renamed when complete.

Example:
    >>> with ShardWriter("ram://out/train-00000-of-00001.tfrecord") as w:  # doctest: +SKIP
    ...     w.write(framed, labels=[0, 1])
    >>> w.info["num_records"]  # doctest: +SKIP
    2
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from chute.format import manifest, storage


class ShardWriter:
    """Writes one shard under a temporary name and renames it when complete.

    Records arrive already framed (see :mod:`chute.format.records`). The
    writer keeps the sha256, size, record count and per-class counts the
    manifest needs. On an error inside the ``with`` block the partial file is
    deleted; on success its data reach the disk before the rename.

    The temporary file is ``tmp_dir/NAME.partial`` (beside the shard without
    ``tmp_dir``), or ``tmp_name`` there: a name of its own per attempt lets two
    writers of the same shard (a Beam bundle retried while the first attempt
    still runs) finish in either order, each renaming identical bytes into place.
    """

    def __init__(self, path: str, *, tmp_dir: str | None = None, tmp_name: str | None = None):
        self.path = path
        name = storage.basename(path)
        tmp_name = tmp_name or name + ".partial"
        self._tmp = storage.join(tmp_dir, tmp_name) if tmp_dir else path[: -len(name)] + tmp_name
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._class_counts: collections.Counter[int] = collections.Counter()
        self._handle: Any = None
        self.info: dict[str, Any] = {}

    def __enter__(self) -> ShardWriter:
        self._handle = storage.open_file(self._tmp, "wb")
        self._handle.write(b"")  # GFile creates the file on the first write, even an empty one
        return self

    def write(self, framed: bytes, labels: list[int]) -> None:
        """Appends framed records whose labels are ``labels``."""
        self._handle.write(framed)
        self._hash.update(framed)
        self._bytes += len(framed)
        self._class_counts.update(labels)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._handle.close()
            storage.remove_if_exists(self._tmp)
            return
        storage.sync(self._handle)
        self._handle.close()
        storage.rename(self._tmp, self.path)
        self.info = {
            "file": storage.basename(self.path),
            "num_records": self._class_counts.total(),
            "bytes": self._bytes,
            "sha256": self._hash.hexdigest(),
            "class_counts": manifest.sparse_counts(self._class_counts),
        }
