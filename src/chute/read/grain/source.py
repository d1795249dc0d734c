"""``chute.grain_source``: a split's records by number, for Grain (random access).

The record indexes (:mod:`chute.format.index`) say where each record starts,
so record ``i`` is one positioned read: ``os.pread`` on a local shard (no
shared file position, so threads need no lock), a seek and a read through
``tf.io.gfile`` on ``gs://`` and other filesystems (a handle per thread).
Each read checks the record's length and both CRCs, and the
``tf.train.Example`` is parsed in plain Python
(:mod:`chute.format.parse`): neither TensorFlow nor Grain
is imported here, so Grain's worker processes stay small.

Records are numbered in the manifest's shard order, then in each shard's
record order: the order ``tf.data.TFRecordDataset`` reads the split's shards
in. The source pickles without its open files (each process, and each
process made by ``fork``, opens its own on first use), so Grain can send it
to worker processes.

With a shard cache (:class:`~chute.read.cache.ShardCache`, on by default for a
dataset in a bucket) the record indexes and the shards are read from verified
local copies instead, still one ``os.pread`` a record: the cache downloads whole
shards ahead, in the order :meth:`GrainSource.upcoming` gives (the Grain dataset
says it at each epoch; a source nobody tells fetches them in manifest order once
first read). Each process keeps the copies it reads open (which keeps them in
the cache), at most half the cache's limit of them when the split does not fit.

Open files are bounded whatever the shard count: each process keeps at most
:func:`~chute.read.grain.limits.max_open_files` shards open (a share of its
``RLIMIT_NOFILE``, raised first where the hard limit allows), and closes the one read
longest ago, with no read under way, to open another. ImageNet's 1,024 shards read at
``ulimit -n 256`` as they do at any limit.

Example:
    >>> import grain  # doctest: +SKIP
    >>> source = grain_source("./kn-shards", "train")  # doctest: +SKIP
    >>> len(source), source[0]["class"], source[0]["key"]  # doctest: +SKIP
    (25844, 17, 'ka/0001.png')
    >>> dataset = grain.MapDataset.source(source).shuffle(seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import itertools
import logging
import operator
import os
import threading
import weakref
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, SupportsIndex

import numpy as np

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.format import parse, records, storage
from chute.format.splits import Shard
from chute.read.cache import ShardCache
from chute.read.grain.limits import max_open_files

log = logging.getLogger(__name__)
_PREAD = hasattr(os, "pread")  # not on Windows
_REMOTE_THREADS = 16  # record indexes on a bucket are read in parallel
_OPEN_TRIES = 3  # a cached copy evicted between its download and its open: fetched again
# Every source of this process: a forked child closes their files at once, not at its first
# read (it may never read: a copy of a shard cache entry held open keeps it from eviction).
_sources: weakref.WeakSet[GrainSource] = weakref.WeakSet()


def _forked() -> None:
    for source in list(_sources):
        source._reopen()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forked)


def grain_source(
    path: str | os.PathLike | manifest_lib.Manifest, split: str = "train"
) -> GrainSource:
    """A Grain random-access data source over one split of a converted dataset.

    Args:
        path: the converted directory (local, ``gs://``, ``ram://``), its
            ``manifest.json``, or the ``Manifest`` read from it.
        split: ``"train"``, ``"val"`` or ``"test"`` (one the dataset has).

    Returns:
        A :class:`GrainSource`: ``len(source)`` records; ``source[i]`` is record ``i``'s
        features (see :func:`chute.format.parse.record_values`).

    Raises:
        ChuteError: no dataset there, no such split, or a shard without a good record
            index (a dataset converted before chute wrote them: the message says to
            run ``chute index``).

    Example:
        >>> source = grain_source("gs://my-bucket/flowers-shards", "val")  # doctest: +SKIP
        >>> sorted(source[0])  # doctest: +SKIP
        ['channels', 'class', 'encoding', 'image', 'key', 'size']
    """
    return GrainSource(manifest_lib.load(path), split)


class GrainSource:
    """A split's records by number: Grain's ``RandomAccessDataSource`` protocol
    (``__len__``, thread-safe ``__getitem__``, a ``__repr__`` for checkpoints), picklable.

    Made by :func:`grain_source`. Each record costs one positioned read of its frame
    (length, CRCs, data) and a plain-Python parse; open files are per process.

    Example:
        >>> source = GrainSource(chute.load_manifest("./kn-shards"), "val")  # doctest: +SKIP
        >>> source[-1]["key"]  # doctest: +SKIP
        'zha/0261.png'
    """

    def __init__(
        self, manifest: manifest_lib.Manifest, split: str, cache: ShardCache | None = None
    ):
        manifest.check_split(split)
        self.location, self.split, self.cache = manifest.location, split, cache
        shards = self._shards = manifest.split(split).shards
        self._paths = [storage.join(manifest.location, shard.name) for shard in shards]
        # pread where it exists (not on Windows): no shared file position, so no lock per read.
        self._local = [storage.is_local(path) and _PREAD for path in self._paths]
        for path, local in zip(self._paths, self._local, strict=True):
            if local and not os.path.exists(storage.local_path(path)):  # before any read
                raise _missing(self.location, self.split, path)
        self._planned = False  # upcoming() was called: no prefetch in manifest order
        # Copies kept open, at most this many bytes of them: all when the split fits.
        self._room = sum(s.bytes for s in shards)
        if cache is not None:
            cache.check_fits(self.location, shards)
            self._room = min(self._room, max(cache.limit // 2, max(s.bytes for s in shards)))
        indexes = _indexes(manifest.location, shards, cache)
        # record number of each shard's first record, then the total
        self._starts = [0, *itertools.accumulate(len(index) for index in indexes)]
        # Plain arrays, not lists: eight bytes a record, copied over from the indexes' arrays
        # without a Python object a record (1.28M records: 0.15 s less), and they pickle
        # compactly to each worker.
        self._offsets, self._lengths = array("Q"), array("Q")
        for kept, field in ((self._offsets, "offsets"), (self._lengths, "lengths")):
            parts = [getattr(index, field) for index in indexes]
            if parts:
                kept.frombytes(np.concatenate(parts).astype(np.uint64, copy=False).tobytes())
        self._open()

    def _open(self) -> None:
        """Per-process state: no file open yet (opened on first use, in this process)."""
        self._pid = os.getpid()
        # this process's limit, read (and raised, where allowed) in this process
        self._max_open = max_open_files(len(self._shards))
        # shard -> [fd, reads under way], least recently used first (local shards)
        self._fds: collections.OrderedDict[int, list[int]] = collections.OrderedDict()
        self._fds_lock = threading.Lock()
        self._threads = threading.local()  # remote handles, one per thread and shard
        # shard -> [fd of its cached copy, reads under way], least recently opened first
        self._held: collections.OrderedDict[int, list[int]] = collections.OrderedDict()
        self._prefetching = False
        _sources.add(self)

    def _reopen(self) -> None:
        """In a forked child: the parent's files closed (this process's copies only; the
        parent's stay open), per-process state made anew."""
        if getattr(self, "_pid", None) in (None, os.getpid()):
            return
        for fd, _ in [*self._fds.values(), *self._held.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._open()

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def shard_starts(self) -> tuple[int, ...]:
        """The record number of each shard's first record, in manifest order."""
        return tuple(self._starts[:-1])

    def upcoming(self, shards: Sequence[int]) -> None:
        """Tells the shard cache which shards (numbers, in manifest order) will be read
        next, in this order, to download ahead (replacing what it was told before);
        nothing without a cache."""
        self._planned = True
        if self.cache is not None:
            self.cache.prefetch(self.location, [self._shards[shard] for shard in shards])

    def __getitem__(self, record: SupportsIndex) -> dict[str, Any]:
        """Record ``record``'s features (a negative number counts from the end).

        Raises:
            IndexError: out of range.
            ChuteError: the record is damaged (length or CRC) or cut short.
        """
        number = operator.index(record)
        if number < 0:
            number += len(self)
        if not 0 <= number < len(self):
            raise IndexError(
                f"record {operator.index(record)} is out of range: the {self.split} split "
                f"of {self.location!r} holds {len(self)} records"
            )
        return self._parsed(number, parse.record_values)

    def raw_image(self, number: int, layout: records.RawLayout) -> tuple[bytes, int, int] | None:
        """``(record, offset of its image, class)`` of record ``number`` (in range) when it
        is in the layout chute writes for a single-label raw image (``layout``:
        :func:`chute.format.records.raw_layout`), its frame checked; None otherwise (read
        it with ``source[number]``). A reader of fixed-size raw images takes this path:
        about a fifth of the general parse's time per record."""

        record = self._parsed(number, _itself)
        at = parse.raw_image_at(record, layout)
        return None if at is None else (record, *at)

    def _parsed(self, number: int, parse_record: Any) -> Any:
        """``parse_record`` of record ``number``'s bytes, once its frame is checked."""
        shard = bisect.bisect_right(self._starts, number) - 1
        offset, size = self._offsets[number], self._lengths[number] + records.FRAME_OVERHEAD
        framed = self._read(shard, offset, size)
        try:
            return parse_record(parse.unframe(framed))
        except ChuteError as error:
            if self.cache is not None and _PREAD:  # a damaged cached copy: fetched again once
                return self._refetched(number, shard, offset, size, parse_record, error)
            raise ChuteError(
                f"Record {number} of the {self.split} split of {self.location!r} (in "
                f"{storage.basename(self._paths[shard])} at byte {offset}) is damaged: {error}. "
                f"Check the dataset with `chute verify {self.location}`"
            ) from None

    def _refetched(
        self, number: int, shard: int, offset: int, size: int, parse_record: Any, damage: Exception
    ) -> Any:
        """Record ``number`` read from a fresh download of its shard: its cached copy is
        damaged (``damage``: a length or CRC wrong, which a warm cache's size check cannot
        see). The copy is evicted (see :meth:`ShardCache.evict`), this process's descriptor
        of it closed (left to a read under way through it, which meets the same fate), and
        the record read once from a new download. A fresh copy that fails too, or a
        download that does, is one error naming the object and the cache file."""
        entry, url = self._shards[shard], self._paths[shard]
        cached = self.cache.path(entry)
        where = f"Record {number} of the {self.split} split of {self.location!r}"
        where += f" (in {entry.name} at byte {offset})"
        with self._fds_lock:
            held = self._held.get(shard)
            if held is not None:
                held[1] += 1  # not closed before the cache has compared it with its entry
        try:
            self.cache.evict(self.location, entry, None if held is None else held[0])
        finally:
            if held is not None:
                with self._fds_lock:
                    held[1] -= 1
                    if not held[1] and self._held.get(shard) is held:
                        del self._held[shard]
                        os.close(held[0])
        try:
            fd = self.cache.open(self.location, entry)
        except ChuteError as error:
            raise ChuteError(
                f"{where} is damaged in the shard cache's copy {cached} ({damage}); fetching "
                f"it again from {url} failed: {error}"
            ) from None
        try:
            return parse_record(parse.unframe(os.pread(fd, size, offset)))
        except ChuteError as error:
            raise ChuteError(
                f"{where} is damaged: {error}, in the shard cache's copy {cached} and again in "
                f"a fresh download of {url}. Check the dataset with `chute verify "
                f"{self.location}`"
            ) from None
        finally:
            os.close(fd)

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        if os.getpid() != self._pid:  # a forked process: files of its own, not its parent's
            self._reopen()  # (done at the fork already where os.register_at_fork exists)
        try:
            if self.cache is not None and _PREAD:
                data = self._read_cached(shard, offset, size)
            elif self._local[shard]:
                data = self._read_local(shard, offset, size)
            else:
                handle = self._handle(shard)
                handle.seek(offset)
                data = handle.read(size)
        except FileNotFoundError:  # gone since the source was made, or on a bucket
            raise _missing(self.location, self.split, self._paths[shard]) from None
        if len(data) != size:
            raise ChuteError(
                f"{storage.basename(self._paths[shard])} of {self.location!r} ends before "
                f"byte {offset + size} where its record index puts a record: the shard is cut "
                f"short. Check the dataset with `chute verify {self.location}`"
            )
        return data

    def _read_cached(self, shard: int, offset: int, size: int) -> bytes:
        return self._pread(self._held, shard, offset, size, self._hold)

    def _read_local(self, shard: int, offset: int, size: int) -> bytes:
        return self._pread(self._fds, shard, offset, size, self._open_local)

    def _pread(self, files, shard: int, offset: int, size: int, opener) -> bytes:
        """One positioned read of ``shard`` through ``files`` (shard -> ``[fd, reads under
        way]``, least recently read first), its file opened by ``opener`` if needed; the
        file is not closed while the read is under way (another thread may want its slot)."""
        with self._fds_lock:
            held = files.get(shard)
            if held is not None:
                held[1] += 1
                files.move_to_end(shard)
        if held is None:
            held = opener(shard)
        try:
            return os.pread(held[0], size, offset)
        finally:
            with self._fds_lock:  # an fd with no read under way may be closed
                held[1] -= 1

    def _hold(self, shard: int) -> list[int]:
        """Opens the cached copy of ``shard`` (downloading it if needed) for one read."""
        if not (self._planned or self._prefetching):  # nobody said the order: manifest order
            self._prefetching = True
            self.cache.prefetch(self.location, self._shards)
        # Outside the lock: a download takes a while, and reads of other shards go on.
        fd = self.cache.open(self.location, self._shards[shard])

        # Closed, so that the cache may evict them: copies read longest ago, not in use;
        # and so that this process's descriptors stay bounded whatever the shard count.
        def fits(files) -> bool:
            room = sum(self._shards[number].bytes for number in files)
            return room <= self._room and len(files) <= self._max_open

        return self._adopt(self._held, shard, fd, fits)

    def _open_local(self, shard: int) -> list[int]:
        """Opens a local shard for one read, closing the files read longest ago (with no
        read under way) beyond this process's limit."""
        path = storage.local_path(self._paths[shard])
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        return self._adopt(self._fds, shard, fd, lambda files: len(files) <= self._max_open)

    def _adopt(self, files, shard: int, fd: int, fits) -> list[int]:
        """``fd`` kept in ``files`` as ``shard``'s for one read (closed where another thread
        opened it meanwhile); then the files read longest ago, with no read under way,
        closed until ``fits(files)``."""
        with self._fds_lock:
            held = files.get(shard)
            if held is not None:
                os.close(fd)
            else:
                held = files[shard] = [fd, 0]
            held[1] += 1
            files.move_to_end(shard)
            for number, (old, users) in list(files.items()):
                if fits(files):
                    break
                if users == 0 and number != shard:
                    os.close(old)
                    del files[number]
        return held

    def _handle(self, shard: int) -> IO[bytes]:
        handles = getattr(self._threads, "handles", None)
        if handles is None:
            handles = self._threads.handles = {}
        if shard not in handles:
            # One handle per thread: a seek then a read on a shared handle would race.
            if self.cache is None:
                handles[shard] = storage.open_file(self._paths[shard], "rb")
            else:  # (no pread here: Windows)
                handles[shard] = _open_cached(self.cache, self.location, self._shards[shard])
        return handles[shard]

    def close(self) -> None:
        """Closes this process's local files (reads open them again when needed)."""
        with self._fds_lock:
            for files in (self._fds, self._held):
                for shard, (fd, users) in list(files.items()):
                    if not users:  # a read under way keeps its file until it is done
                        os.close(fd)
                        del files[shard]

    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:
        # (os's functions bound now: at interpreter exit the module may be gone)
        # Only the process that opened them closes them; a forked child's copies are its own.
        if getattr(self, "_pid", None) == _getpid():
            for fd, _ in [*self._fds.values(), *self._held.values()]:
                _close(fd)
            self._fds.clear()
            self._held.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # Open files, a lock and thread-locals do not pickle; the receiving process opens its own.
        for name in ("_pid", "_max_open", "_fds", "_fds_lock", "_threads", "_held", "_prefetching"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __repr__(self) -> str:
        return f"GrainSource(location={self.location!r}, split={self.split!r}, records={len(self)})"


def _missing(location: str, split: str, path: str) -> ChuteError:
    return ChuteError(
        f"Shard {storage.basename(path)} of the {split} split of {location!r} is missing "
        f"(the manifest lists it; no file is there). Check the dataset with "
        f"`chute verify {location}`"
    )


def _indexes(
    location: str, shards: Sequence[Shard], cache: ShardCache | None
) -> list[record_index.RecordIndex]:
    """Each shard's record index, checked against the manifest (in parallel on a bucket;
    through the shard cache when there is one)."""
    unindexed = next((shard for shard in shards if shard.index is None), None)
    if unindexed is not None:  # one clear error, naming `chute index`, before any read
        record_index.load(location, unindexed)
    # An older chute's layout is read (record_index.load finds it there); said once.
    if shards and record_index.in_old_layout(location, shards[0].index.file):
        log.warning(
            "%s: the record indexes are beside the shards, where shard globs (train-*) "
            "read them as TFRecords: `chute index %s` moves them into %s/",
            location,
            location,
            record_index.FOLDER,
        )
    # Local reads are fast already; a bucket's latency is what threads hide.
    threads = 1 if storage.is_local(location) else _REMOTE_THREADS
    with ThreadPoolExecutor(max(1, min(threads, len(shards)))) as pool:
        if cache is not None:
            return list(pool.map(lambda shard: _cached_index(cache, location, shard), shards))
        return list(pool.map(lambda shard: record_index.load(location, shard), shards))


def _open_cached(
    cache: ShardCache, location: str, shard: Shard, *, index: bool = False
) -> IO[bytes]:
    """The cached copy of ``shard`` (or of its record index) open for reading, fetched
    again when another process evicts it between its download and this open (an open
    file stays readable when it is evicted: only the open can miss it)."""
    for _ in range(_OPEN_TRIES):
        path = cache.local_index(location, shard) if index else cache.local(location, shard)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            continue
    what = f"The record index of {shard.name}" if index else shard.name
    raise ChuteError(
        f"{what} of {location!r} was evicted from the shard cache {cache.directory} "
        f"{_OPEN_TRIES} times before it could be read: other readers hold the rest of it. "
        f"Pass a larger cache_limit (--cache-limit). Received: cache_limit={cache.limit}"
    )


def _cached_index(cache: ShardCache, location: str, shard: Shard) -> record_index.RecordIndex:
    """A shard's record index read from the cache (which checked its sha256), checked
    against the manifest's record count and shard size."""
    with _open_cached(cache, location, shard, index=True) as handle:
        data = handle.read()
    where = f"the record index of {shard.name} in {location!r}"
    index = record_index.RecordIndex.from_bytes(data, where)
    if len(index) != shard.records or index.shard_bytes != shard.bytes:
        raise ChuteError(
            f"{where} describes {len(index)} records in {index.shard_bytes} bytes, the "
            f"manifest {shard.records} in {shard.bytes}"
        )
    return index


def _itself(record: bytes) -> bytes:
    return record
