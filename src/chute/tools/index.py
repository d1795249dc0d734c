"""``chute index``: add record indexes to a dataset converted before chute wrote them.

Each shard without a good index is read once, from start to end, in plain
Python: every record's CRCs are checked, the shard's sha256, size and record
count are compared with the manifest, and its index (see
:mod:`chute.format.index`) is written atomically into the dataset's ``index/``
folder. The manifest is then rewritten atomically with each shard's ``index``
entry; the shards stay as they are, byte for byte. Shards whose index is
already there, with the manifest's sha256, are left alone, so a dataset
indexed already is a no-op, and an index file that was deleted or damaged is
written again.

First, indexes that an older chute wrote beside the shards (where shard globs
such as ``train-*`` read them as TFRecords) are moved into ``index/``, so that
afterwards only shards match a shard glob; the manifest, which names each index
by its file name, stays as it is for them.

Example:
    >>> report = index("./kn-shards")  # doctest: +SKIP
    >>> report.written, report.moved, report.already_indexed  # doctest: +SKIP
    (['train-00000-of-00016.tfrecord', ...], [], False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.splits import IndexEntry, Shard

log = logging.getLogger(__name__)
_REMOTE_THREADS = 16  # shards on a bucket are read in parallel, each in one pass


@dataclasses.dataclass
class IndexReport:
    """The outcome of :func:`index`.

    Attributes:
        location: the dataset directory.
        num_shards: shards in the dataset.
        written: the shards whose index was written now, in manifest order.
        moved: the shards whose index was beside them (an older chute's layout) and was
            moved into the dataset's ``index/`` folder, in manifest order.
    """

    location: str
    num_shards: int = 0
    written: list[str] = dataclasses.field(default_factory=list)
    moved: list[str] = dataclasses.field(default_factory=list)

    @property
    def already_indexed(self) -> bool:
        """True when every shard had its index already, in its place: nothing was written
        or moved."""
        return not self.written and not self.moved


def index(
    path: str | os.PathLike | manifest_lib.Manifest,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> IndexReport:
    """Writes the record index of every shard of a converted dataset that lacks a good one,
    and adds them to its manifest (see the module docstring).

    Args:
        path: the converted directory (local, ``gs://``, ``ram://``), its
            ``manifest.json``, or the ``Manifest`` read from it.
        progress: called as ``progress("index", shards_done, shards_to_index)``.

    Returns:
        An :class:`IndexReport`; ``report.already_indexed`` when there was nothing to do,
        ``report.moved`` the shards whose index was moved out of the shards' globs.

    Raises:
        ChuteError: no dataset there, or a shard is missing, truncated, corrupt (a CRC)
            or differs from the manifest (nothing is added to the manifest then; run
            ``chute verify`` to see every problem).

    Example:
        >>> index("gs://my-bucket/flowers-shards").already_indexed  # doctest: +SKIP
        False
    """
    manifest = manifest_lib.load(path)
    shards = [shard for split in manifest.splits.values() for shard in split.shards]
    report = IndexReport(manifest.location, num_shards=len(shards))
    threads = 1 if storage.is_local(manifest.location) else _REMOTE_THREADS
    with ThreadPoolExecutor(max(1, min(threads, len(shards)))) as pool:
        # Moved first: the indexes found beside the shards are then checked where they now belong.
        moved = list(pool.map(lambda shard: _move_old_layout(manifest.location, shard), shards))
    report.moved = [shard.name for shard, done in zip(shards, moved, strict=True) if done]
    if report.moved:
        log.info(
            "%s: moved %d record index(es) from beside the shards into %s/",
            report.location,
            len(report.moved),
            record_index.FOLDER,
        )
    todo = [shard for shard in shards if not _has_index(manifest.location, shard)]
    if not todo:
        log.info("%s: all %d shards have their record index already", report.location, len(shards))
        return report
    log.info("%s: indexing %d of %d shards", report.location, len(todo), len(shards))
    entries = {}
    with ThreadPoolExecutor(min(threads, len(todo))) as pool:
        work = pool.map(lambda shard: _index_shard(manifest.location, shard), todo)
        for done, (shard, entry) in enumerate(zip(todo, work, strict=True), 1):
            entries[shard.name] = entry
            if progress:
                progress("index", done, len(todo))
    manifest.splits = {  # the manifest is written once, when every index is in place
        name: dataclasses.replace(
            split,
            shards=tuple(
                dataclasses.replace(s, index=entries.get(s.name, s.index)) for s in split.shards
            ),
        )
        for name, split in manifest.splits.items()
    }
    report.written += [shard.name for shard in todo]
    manifest.save(manifest.location)
    return report


def _move_old_layout(location: str, shard: Shard) -> bool:
    """Moves the shard's index from beside it (where an older chute wrote it) into the
    ``index/`` folder; True when one was moved. Where the folder holds the manifest's index
    already, the one beside the shard is a leftover and is deleted."""
    entry = shard.index
    # The manifest's name when it has one; else the name an older chute gave it.
    name = entry.file if entry else record_index.index_name(shard.name)
    old = record_index.old_path(location, name)
    if not storage.exists(old):
        return False
    new = record_index.index_path(location, name)
    if entry and storage.exists(new) and _good(new, entry):
        log.info("%s: deleting %s, a copy of %s", shard.name, old, new)
        storage.remove(old)
        return True
    storage.makedirs(record_index.folder(location))
    storage.rename(old, new)  # checked against the manifest next, like any index
    return True


def _good(path: str, entry: IndexEntry) -> bool:
    return record_index.sha256(storage.read_bytes(path)) == entry.sha256


def _has_index(location: str, shard: Shard) -> bool:
    """Whether the shard's index is named in the manifest and there with its sha256."""
    entry = shard.index
    if entry is None:
        return False
    path = record_index.index_path(location, entry.file)
    if not storage.exists(path):
        log.info("%s: its record index %s is missing: writing it again", shard.name, path)
        return False
    if not _good(path, entry):
        log.warning("%s differs from the manifest (sha256): writing it again", path)
        return False
    return True


def _index_shard(location: str, shard: Shard) -> IndexEntry:
    """Reads one shard (CRCs, sha256, size and count checked), writes its index atomically;
    returns the manifest's ``index`` entry."""
    name = shard.name
    path = storage.join(location, name)
    if not storage.exists(path):
        raise ChuteError(f"Shard {name} of {location!r} is missing: convert the dataset again")
    digest = hashlib.sha256()
    with storage.open_file(path, "rb") as handle:
        # One pass: the index and the shard's sha256 from the same reading.
        found = record_index.scan(handle, where=f"Shard {name} of {location!r}", digest=digest)
    differs = []
    if found.shard_bytes != shard.bytes:
        differs.append(f"{found.shard_bytes} bytes, the manifest says {shard.bytes}")
    # The digest only when the sizes agree: a size that differs already says the file changed.
    elif digest.hexdigest() != shard.sha256:
        differs.append("its sha256 is not the manifest's")
    if len(found) != shard.records:
        differs.append(f"{len(found)} records, the manifest says {shard.records}")
    if differs:
        raise ChuteError(
            f"Shard {name} of {location!r} differs from the manifest ({'; '.join(differs)}): "
            f"check it with `chute verify {location}` and convert the dataset again"
        )
    data = found.to_bytes()
    path = record_index.index_path(location, record_index.index_name(name))
    storage.makedirs(record_index.folder(location))
    # The index is written before the manifest names it, so a named index is always whole.
    storage.write_atomic(path, data)
    return IndexEntry(record_index.index_name(name), record_index.sha256(data))
