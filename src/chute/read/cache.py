"""A verified local copy of a remote dataset's shards, shared by the processes of a host.

Reading a record from a bucket costs a request (10-50 ms to the first byte); the Grain
engine reads one record at a time. So, as MosaicML Streaming and WebDataset do, whole
shards and their record indexes are downloaded ahead of use into a folder on local disk,
and records are read from there (:class:`ShardCache`, made by :func:`for_load` from
``LoadOptions.cache_dir`` and ``cache_limit``).

The folder is content-addressed: an entry is named by the sha256 the manifest gives its
file, so datasets and runs that hold the same shard share one entry, and a dataset
converted again never reads an old copy::

    DIR/<sha256>                  a verified copy (a shard or a record index)
    DIR/<sha256>.<pid>-<n>.part   a download under way, sized to the whole file at once
                                  (so the room it takes is counted from the start)
    DIR/locks/<sha256>            the entry's lock file: one downloader at a time
                                  (deleted with the entry when it is evicted)
    DIR/locks/.space              the lock under which room is made and claimed

A download is hashed while it streams, fsynced, and only then renamed (``os.replace``)
to its sha256 name: **the name is the marker** that it was verified. A warm restart
checks each entry's size against the manifest, not its bytes again: hashing a 100 GB
cache at every start would read the whole disk, and a file that gets its name only
after its hash matched cannot be a partial one (a truncated one fails the size check).
A download whose bytes differ from the manifest is fetched once more, then a ChuteError
names the shard, the URL and both checksums. A copy damaged later at its size (a bad disk
block, a file altered in place) is found by its reader, a record whose length or CRC is
wrong: the reader evicts it (:meth:`ShardCache.evict`) and reads a fresh download once;
``chute verify --cache-dir`` hashes the copies a cache holds (:func:`check_copies`).

Locks are ``fcntl.flock``: the kernel drops them when a process dies, so none is ever
left held. A forked child would share the open files its parent locks through (and keep
the locks for its whole life): it closes its copies at the fork
(``os.register_at_fork``), as a :class:`~chute.read.grain.source.GrainSource` closes the
entries it holds open. The folder's accounting is done under ``locks/.space``: room
claimed, evictions, and the renames that make a download an entry. A downloader holds
its entry's lock file: another process waits, then finds the entry. A reader
(:meth:`ShardCache.open`) holds a shared lock on the entry itself while its file is
open; eviction takes an exclusive one without waiting and skips the entry when it
cannot, so **an entry being read is never deleted** (and a reader that finds its entry
gone just after it locked it fetches it again). Readers close what they no longer read
(:class:`~chute.read.grain.source.GrainSource` keeps at most half the limit open), or
eviction could never free the disk. Without ``fcntl`` (Windows) there are no locks
between processes: downloads stay atomic, two processes may fetch a shard twice, and
eviction skips the files the system refuses to delete (open ones).

Past the limit, entries are evicted least recently used first (the entry's mtime, set
on use at most every few seconds per process), except those the prefetch queue needs
before the one it is fetching. Prefetching never exceeds the limit (it waits for room);
a reader that needs a shard at once gets it even when every entry is in use, with a
warning.

Example:
    >>> cache = ShardCache("/tmp/chute-shards", parse_size("2GB"))  # doctest: +SKIP
    >>> shards = manifest.split("train").shards  # doctest: +SKIP
    >>> cache.prefetch(manifest.location, shards)  # doctest: +SKIP
    >>> cache.local(manifest.location, shards[0])  # doctest: +SKIP
    '/tmp/chute-shards/3f1c...'
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import hashlib
import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import remote, storage
from chute.format.splits import Shard
from chute.read.options import CACHE_OFF, LoadOptions

try:
    import fcntl
except ImportError:  # Windows: see the module docstring
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

THREADS = 8  # downloads at once: enough to hide a bucket's latency, few enough for a host
_BLOCK = 8 << 20  # bytes read from the store at a time
_TOUCH_EVERY = 5.0  # seconds between two mtime updates of one entry by one process
_WAIT = 0.5  # seconds between looks for room other processes may have freed
_SHARE_OF_FREE = 0.8  # the default limit: this share of the free disk (with the cache's own)
_MARGIN = 1 << 30  # ... less this, left free for everything else
_STALE_PART = 600.0  # without fcntl: a .part file untouched this long is a dead download
_IN_MEMORY = frozenset({"ram", "memory"})  # stores in this process's memory: no cache
_BINARY = getattr(os, "O_BINARY", 0)
_FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})  # disk or quota full
_told: set[tuple[str, int]] = set()
_numbers = itertools.count()
# Every fd through which this process may hold a flock. A forked child shares the open file
# description, so its copy would keep the lock for the child's whole life: it closes them
# at once (which leaves the parent's lock as it is). A set, not a lock: one a parent
# thread held at the fork would never be released in the child.
_lock_fds: set[int] = set()


def _close_lock_fds_in_child() -> None:
    for fd in list(_lock_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_close_lock_fds_in_child)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One file to hold: its sha256 (the entry's name), size, where it comes from, and
    how messages name it; ``index``: a record index, whose URL :meth:`source` finds."""

    sha256: str
    size: int
    url: str
    name: str
    location: str
    index: str | None = None

    def source(self) -> str:
        """Where to download it from: a record index may be in an older layout's place,
        looked up only when it is downloaded (a warm cache asks the store nothing)."""
        if self.index is None:
            return self.url
        return record_index.find(self.location, self.index) or self.url


def default_directory() -> str:
    """``$XDG_CACHE_HOME/chute/shards``, else ``~/.cache/chute/shards``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "chute", "shards")


def default_limit(directory: str) -> int:
    """80% of the free disk space where ``directory`` is, counting what the cache already
    holds as free (else a warm cache would shrink its own limit run after run), less
    1 GiB left for everything else."""
    os.makedirs(directory, exist_ok=True)
    held = sum(size for size, _ in _entries(directory).values())
    return max(0, int(_SHARE_OF_FREE * (shutil.disk_usage(directory).free + held)) - _MARGIN)


def applies(location: str, options: LoadOptions) -> bool:
    """Whether ``chute.load`` reads ``location`` through a shard cache: never for a local
    dataset or with ``cache_dir="none"``; the Grain engine on any other store (not on
    ``ram://`` or ``memory://``, already in memory, unless ``cache_dir`` is given); the
    tf.data engine only with ``cache_dir`` and without the tf.data service (whose
    workers, elsewhere, open the shards themselves)."""
    if storage.is_local(location) or options.cache_dir == CACHE_OFF:
        return False
    if options.engine == "tf":
        return options.cache_dir is not None and options.data_service is None
    return options.cache_dir is not None or remote.scheme(location) not in _IN_MEMORY


def for_load(location: str, options: LoadOptions) -> ShardCache | None:
    """The shard cache ``chute.load`` reads ``location`` through (see :func:`applies`),
    or None: ``cache_dir`` (default :func:`default_directory`) holding at most
    ``cache_limit`` bytes (default :func:`default_limit`), said once at INFO."""
    if not applies(location, options):
        return None
    directory = os.path.abspath(os.path.expanduser(options.cache_dir or default_directory()))
    limit = options.cache_limit or default_limit(directory)
    if (directory, limit) not in _told:
        _told.add((directory, limit))
        default_dir = " (the default; cache_dir= changes it, 'none' turns it off)"
        default_limit_rule = " (80% of the free disk, less 1 GiB; cache_limit= changes it)"
        log.info(
            "shard cache: %s%s, limit %s%s",
            directory,
            "" if options.cache_dir else default_dir,
            shown_size(limit),
            "" if options.cache_limit else default_limit_rule,
        )
    cache = ShardCache(directory, limit)
    if not options.cache_limit:
        cache.limit_rule = f", the default: 80% of the free disk in {directory}, less 1 GiB"
    return cache


def shown_size(size: int) -> str:
    """A byte count for people.

    Example:
        >>> shown_size(1536), shown_size(50 * 10**9)
        ('1.5 kB', '50.0 GB')
    """
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


class ShardCache:
    """Verified local copies of shards and record indexes, at most ``limit`` bytes in
    ``directory`` (see the module docstring). Picklable: a process that receives one
    (a Grain worker) starts its own threads and locks.

    Args:
        directory: the cache folder (made if missing).
        limit: the most bytes its entries and downloads under way may take.
    """

    def __init__(self, directory: str | os.PathLike, limit: int):
        self.directory = os.path.abspath(os.fspath(directory))
        self.limit = int(limit)
        self.limit_rule = ""  # how a default limit was derived, for messages
        os.makedirs(os.path.join(self.directory, "locks"), exist_ok=True)
        self._start()

    def _start(self) -> None:
        """Per-process state: no thread, an empty queue."""
        self._pid = os.getpid()
        self._changed = threading.Condition()
        self._touched: dict[str, float] = {}
        self._failed: dict[str, ChuteError] = {}
        self._queue: list[_Entry] = []
        self._rank: dict[str, int] = {}
        self._next = self._position = self._generation = self._threads = 0
        self._waiting: set[int] = set()  # queue ranks taken, no room claimed for yet
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "limit": self.limit, "limit_rule": self.limit_rule}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, limit={self.limit})"

    def check_fits(self, location: str, shards: Sequence[Shard]) -> None:
        """Raises a ChuteError naming ``cache_limit`` when the largest of ``shards`` with
        its record index does not fit in the limit."""
        if not shards:
            return
        need, shard = max((s.bytes + _index_size(s), s.name) for s in shards)
        if need > self.limit:
            raise ChuteError(
                f"`cache_limit` is smaller than one shard: {shard} of {location!r} takes "
                f"{need} bytes ({shown_size(need)}) with its record index. Pass a larger "
                f"cache_limit (--cache-limit), at least {shown_size(need)}. Received: "
                f"cache_limit={self.limit} ({shown_size(self.limit)}{self.limit_rule})"
            )

    def path(self, shard: Shard) -> str:
        """Where the verified copy of ``shard`` is (or will be)."""
        return os.path.join(self.directory, shard.sha256)

    def local(self, location: str, shard: Shard) -> str:
        """The path of a verified whole copy of ``shard`` of dataset ``location``,
        downloaded now if the cache does not hold it. Nothing holds it there: another
        process may evict it before it is opened (:meth:`open` holds it).

        Raises:
            ChuteError: the shard is missing, or differs from the manifest twice.
        """
        return self._ensure(_shard_entry(location, shard))

    def local_index(self, location: str, shard: Shard) -> str:
        """The path of a verified copy of ``shard``'s record index (see :meth:`local`)."""
        return self._ensure(_index_entry(location, shard))

    def open(self, location: str, shard: Shard) -> int:
        """A file descriptor (read-only) of the verified copy of ``shard``, holding it in
        the cache until it is closed (a shared lock that eviction respects). A forked
        child's copy of it holds the entry too: close it there (as GrainSource does)."""
        entry = _shard_entry(location, shard)
        for _ in range(3):
            path = self._ensure(entry)
            try:
                fd = os.open(path, os.O_RDONLY | _BINARY)
            except FileNotFoundError:  # evicted since: fetched again
                continue
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
                # Evicted between the open and the lock: this file is no entry any more.
                if not _same_file(fd, path):
                    os.close(fd)
                    continue
            return fd
        raise ChuteError(
            f"{entry.name} of {location!r} was evicted from the shard cache {self.directory} "
            f"three times before it could be read: other readers hold the rest of it. Pass a "
            f"larger cache_limit (--cache-limit). Received: cache_limit={self.limit}"
        )

    def open_all(self, location: str, shards: Sequence[Shard]) -> list[int]:
        """:meth:`open` of every shard, downloaded in parallel (all closed on an error)."""
        with ThreadPoolExecutor(max(1, min(2 * THREADS, len(shards)))) as pool:
            futures = [pool.submit(self.open, location, shard) for shard in shards]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            for future in futures:
                if future.exception() is None:
                    os.close(future.result())
            raise errors[0]
        return [future.result() for future in futures]

    def evict(self, location: str, shard: Shard, fd: int | None = None) -> bool:
        """Deletes the cached copy of ``shard``, found damaged by a reader (a record whose
        length or CRC is wrong in it: a copy altered at its size, which a warm cache's
        size check cannot see), even while other readers hold it (they read the same
        damage): the next :meth:`open` fetches it again. With ``fd``, the reader's
        descriptor of the copy, only while the entry is still that file (another reader
        may have fetched it again already). True when it was deleted.

        Example:
            >>> fd = cache.open(location, shard)  # doctest: +SKIP
            >>> cache.evict(location, shard, fd)  # a CRC failure read through fd  # doctest: +SKIP
            True
        """
        if os.getpid() != self._pid:  # forked: per-process state of its own
            self._start()
        path = self.path(shard)
        if not _delete_damaged(self.directory, shard.sha256, fd):
            return False
        self._touched.pop(shard.sha256, None)
        log.warning(
            "shard cache: the copy of %s of %r in %s is damaged: deleted, to be fetched again",
            shard.name,
            location,
            path,
        )
        return True

    def prefetch(self, location: str, shards: Sequence[Shard]) -> None:
        """Downloads ``shards`` ahead, in this order, on background threads, as far as
        the limit allows (a shard is fetched once room for it can be made without
        evicting one needed before it). Replaces the queue of an earlier call."""
        if os.getpid() != self._pid:  # forked: the parent's threads are not here
            self._start()
        entries = [_shard_entry(location, shard) for shard in shards]
        with self._changed:
            self._queue, self._rank = entries, {}
            for rank, entry in enumerate(entries):
                self._rank.setdefault(entry.sha256, rank)
            self._next = self._position = 0
            self._waiting = set()
            self._generation += 1
            start = min(THREADS, len(entries)) - self._threads
            self._threads += max(0, start)
            self._changed.notify_all()
        for _ in range(start):
            thread = threading.Thread(target=self._prefetching, name="chute-shard-cache")
            thread.daemon = True  # a process may end with downloads ahead still under way
            thread.start()

    def _prefetching(self) -> None:
        """One prefetch thread: takes the queue's next entry until it is empty, then ends."""
        while True:
            with self._changed:
                if self._next >= len(self._queue):
                    self._threads -= 1
                    return
                rank, entry, generation = self._next, self._queue[self._next], self._generation
                self._next += 1
                # Room is claimed in queue order: a later shard never takes an earlier one's.
                self._waiting.add(rank)
            try:
                while self._download(entry, rank=rank, ahead=generation) is None:
                    with self._changed:  # no room yet: until a reader moves on, or a while
                        if self._generation == generation:
                            self._changed.wait(_WAIT)
                        if self._generation != generation:
                            break
            except Exception as error:  # read on demand, which raises it to the reader
                log.debug("shard cache: prefetching %s failed: %s", entry.url, error)
            finally:
                self._claimed(rank, generation)

    def _claimed(self, rank: int, generation: int) -> None:
        """Prefetching ``rank`` has room (or ended): later ones may claim theirs."""
        with self._changed:
            if self._generation == generation and rank in self._waiting:
                self._waiting.discard(rank)
                self._changed.notify_all()

    def _ensure(self, entry: _Entry) -> str:
        """The verified copy of ``entry``, downloaded if needed, marked as used."""
        if os.getpid() != self._pid:  # forked: the parent's lock may have been held
            self._start()
        with self._changed:
            rank = self._rank.get(entry.sha256)
            if rank is not None and rank > self._position:
                self._position = rank
                self._changed.notify_all()  # room may be made for what comes next
        failed = self._failed.get(entry.sha256)
        if failed is not None:
            raise failed
        path = os.path.join(self.directory, entry.sha256)
        if _whole(path, entry.size):
            self._touch(entry.sha256, path)
            return path
        return self._download(entry, rank=rank)

    def _download(self, entry: _Entry, *, rank: int | None, ahead: int | None = None) -> str | None:
        """Fetches ``entry`` under its lock (once more if its bytes differ). None when
        fetching ``ahead`` (the prefetch queue's generation) and no room could be made
        within the limit."""
        path = os.path.join(self.directory, entry.sha256)
        with _locked(self._lock_path(entry.sha256)):
            if _whole(path, entry.size):  # another thread or process fetched it meanwhile
                self._touch(entry.sha256, path)
                return path
            if fcntl is not None:  # under its lock: any .part of this entry is a dead download's
                for dead in glob.glob(glob.escape(path) + ".*.part"):
                    _remove(dead)
            wrong = []
            for _ in range(2):
                with self._no_room_is_said(entry):
                    part = self._claim(entry, rank, ahead)
                if part is None:
                    return None
                try:
                    with self._no_room_is_said(entry):
                        digest, size = _stream(entry, part)
                    if (digest, size) == (entry.sha256, entry.size):
                        # Under the space lock: a claim that lists the folder meanwhile
                        # would count it as neither a .part nor an entry, and pass the limit.
                        with _locked(self._space_lock()):
                            os.replace(part, path)  # the name says it was verified
                        _sync_folder(self.directory)
                        log.debug("shard cache: fetched %s (%d bytes)", entry.url, size)
                        self._touch(entry.sha256, path)
                        return path
                finally:
                    _remove(part)
                wrong.append(f"sha256 {digest} ({size} bytes)")
                log.warning("shard cache: %s differs from the manifest; fetched again", entry.url)
        error = ChuteError(
            f"{entry.name} of {entry.location!r} differs from the manifest after two "
            f"downloads from {entry.url}: got {' then '.join(wrong)}, the manifest says sha256 "
            f"{entry.sha256} ({entry.size} bytes). Check the dataset with "
            f"`chute verify {entry.location}`"
        )
        self._failed[entry.sha256] = error
        raise error

    @contextlib.contextmanager
    def _no_room_is_said(self, entry: _Entry) -> Iterator[None]:
        """A full disk (or quota) while ``entry`` is written: a ChuteError that says how
        much room it needs and where, not a bare ``[Errno 28]`` (the caller deletes the
        ``.part`` file)."""
        try:
            yield
        except OSError as error:
            if error.errno not in _FULL:
                raise
            raise ChuteError(
                f"The disk of the shard cache {self.directory} is full ({error.strerror}): "
                f"{entry.name} of {entry.location!r} needs {entry.size} bytes "
                f"({shown_size(entry.size)}) there. Free some room, pass a smaller cache_limit "
                f"(--cache-limit) or another cache_dir (--cache-dir). Received: cache_limit="
                f"{self.limit} ({shown_size(self.limit)}{self.limit_rule})"
            ) from None

    def _claim(self, entry: _Entry, rank: int | None, ahead: int | None) -> str | None:
        """Under the space lock: room for ``entry`` made (evicting), and its ``.part``
        file made at its whole size. Fetching ``ahead``, never past the limit: None when
        there is no room (or an earlier shard of the queue has yet to claim its own)."""
        strict = ahead is not None
        if strict:
            with self._changed:
                if any(waiting < rank for waiting in self._waiting):
                    return None
        with _locked(self._space_lock()):
            held = _entries(self.directory, clean=True)
            used = sum(size for size, _ in held.values()) + _parts(self.directory)
            excess = used + entry.size - self.limit
            if excess > 0:
                excess -= self._evict(held, excess, rank)
            if excess > 0:
                if strict:
                    return None
                if not self._warned:  # a reader waits for this shard: it gets it
                    self._warned = True
                    log.warning(
                        "shard cache %s: %s over its limit (%s): the entries in it are in use",
                        self.directory,
                        shown_size(excess),
                        shown_size(self.limit),
                    )
            part = os.path.join(
                self.directory, f"{entry.sha256}.{os.getpid()}-{next(_numbers)}.part"
            )
            try:
                with open(part, "wb") as handle:
                    handle.truncate(entry.size)  # counted whole from now on
            except OSError:
                _remove(part)
                raise
        if strict:
            self._claimed(rank, ahead)
        return part

    def _evict(self, held: dict[str, tuple[int, float]], excess: int, rank: int | None) -> int:
        """Deletes entries not in use until ``excess`` bytes are freed: first those the
        queue does not need (least recently used first), then those it needs after
        ``rank`` (latest first); never one it needs up to ``rank``. Returns bytes freed."""
        with self._changed:
            ranks, position = dict(self._rank), self._position
        last = position if rank is None else rank

        def order(sha: str) -> tuple:
            r = ranks.get(sha)
            return (0, held[sha][1]) if r is None or r < position else (1, -r)

        freed = 0
        for sha in sorted((s for s in held if not position <= ranks.get(s, -1) <= last), key=order):
            if freed >= excess:
                break
            if _delete_unused(os.path.join(self.directory, sha)):
                freed += held[sha][0]
                self._touched.pop(sha, None)
                _delete_lock(self._lock_path(sha))  # else locks/ would grow without end
        return freed

    def _lock_path(self, sha256: str) -> str:
        return os.path.join(self.directory, "locks", sha256)

    def _space_lock(self) -> str:
        return os.path.join(self.directory, "locks", ".space")

    def _touch(self, sha256: str, path: str) -> None:
        """The entry's mtime set to now (its last use), at most every few seconds."""
        now = time.monotonic()
        if now - self._touched.get(sha256, -_TOUCH_EVERY) >= _TOUCH_EVERY:
            self._touched[sha256] = now
            with contextlib.suppress(OSError):  # evicted meanwhile by another process
                os.utime(path)


def check_copies(
    directory: str | os.PathLike, location: str, shards: Sequence[Shard]
) -> tuple[int, list[tuple[str, str]]]:
    """The copies of ``shards`` and their record indexes that the shard cache in
    ``directory`` holds, hashed: a warm cache is trusted by its sizes (see the module
    docstring), so this is where a copy damaged since its download is found. Each copy
    whose sha256 differs from the manifest's is deleted (a read fetches it again).

    Returns:
        ``(copies checked, [(what, its cache file), ...] of the damaged ones, deleted)``.

    Example:
        >>> check_copies("~/.cache/chute/shards", location, shards)  # doctest: +SKIP
        (8, [('train-00001-of-00004.tfrecord', '/home/me/.cache/chute/shards/3f1c...')])
    """
    directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
    entries = [_shard_entry(location, shard) for shard in shards]
    entries += [_index_entry(location, shard) for shard in shards if shard.index is not None]
    checked, damaged = 0, []
    for entry in {entry.sha256: entry for entry in entries}.values():  # content-addressed
        path = os.path.join(directory, entry.sha256)
        try:
            with open(path, "rb") as handle:
                digest, size = hashlib.sha256(), 0
                while block := handle.read(_BLOCK):
                    digest.update(block)
                    size += len(block)
                if (digest.hexdigest(), size) == (entry.sha256, entry.size):
                    checked += 1
                    continue
                deleted = _delete_damaged(directory, entry.sha256, handle.fileno())
        except FileNotFoundError:  # not cached (or evicted meanwhile): nothing to check
            continue
        checked += 1
        if deleted:
            log.info("shard cache: the copy of %s in %s is damaged: deleted", entry.name, path)
            damaged.append((entry.name, path))
    return checked, damaged


def _delete_damaged(directory: str, sha256: str, fd: int | None) -> bool:
    """Deletes the entry ``sha256`` (a damaged copy) under its lock, so that no download
    renames a fresh copy into its place meanwhile, whether readers hold it or not; with
    ``fd``, only while the entry is still the file ``fd`` reads. True if deleted."""
    path = os.path.join(directory, sha256)
    os.makedirs(os.path.join(directory, "locks"), exist_ok=True)
    with _locked(os.path.join(directory, "locks", sha256)):
        if fd is not None and not _same_file(fd, path):
            return False
        try:
            os.remove(path)
        except FileNotFoundError:
            return False
    return True


def _shard_entry(location: str, shard: Shard) -> _Entry:
    url = storage.join(location, shard.name)
    return _Entry(shard.sha256, shard.bytes, url, shard.name, location)


def _index_entry(location: str, shard: Shard) -> _Entry:
    if shard.index is None:  # record_index.load's error, naming `chute index`
        record_index.load(location, shard)
    name = shard.index.file
    url, shown = record_index.index_path(location, name), record_index.shown(location, name)
    return _Entry(shard.index.sha256, _index_size(shard), url, shown, location, name)


def _index_size(shard: Shard) -> int:
    return record_index.size_for(shard.records) if shard.index is not None else 0


def _stream(entry: _Entry, part: str) -> tuple[str, int]:
    """Copies ``entry``'s file into ``part``, hashing it: ``(hex sha256, bytes)``; the
    bytes reach the disk (fsync) before the caller names the file."""
    digest, size = hashlib.sha256(), 0
    url = entry.source()
    try:
        with (
            remote.errors(url),
            storage.open_file(url, "rb") as source,
            open(part, "r+b") as target,
        ):
            while block := source.read(_BLOCK):
                digest.update(block)
                size += len(block)
                if size > entry.size:  # longer than the manifest says: wrong already
                    break
                target.write(block)
            target.flush()
            os.fsync(target.fileno())
    except FileNotFoundError:
        raise ChuteError(
            f"{entry.name} of {entry.location!r} is missing: the manifest lists it, {entry.url} "
            f"is not there. Check the dataset with `chute verify {entry.location}`"
        ) from None
    return digest.hexdigest(), size


def _entries(directory: str, *, clean: bool = False) -> dict[str, tuple[int, float]]:
    """``{sha256: (size, mtime)}`` of the verified entries; with ``clean``, the
    ``.part`` files of dead downloads are deleted."""
    held = {}
    with os.scandir(directory) as found:
        for item in found:
            name = item.name
            try:
                if len(name) == 64 and item.is_file():
                    stat = item.stat()
                    held[name] = (stat.st_size, stat.st_mtime)
                elif clean and name.endswith(".part") and _dead(directory, item):
                    _remove(item.path)
            except FileNotFoundError:  # deleted by another process while listed
                continue
    return held


def _parts(directory: str) -> int:
    """Bytes claimed by downloads under way (their ``.part`` files, whole size)."""
    total = 0
    with os.scandir(directory) as found:
        for item in found:
            if item.name.endswith(".part"):
                with contextlib.suppress(FileNotFoundError):
                    total += item.stat().st_size
    return total


def _dead(directory: str, part: os.DirEntry) -> bool:
    """Whether ``part`` belongs to no download under way: nobody holds its entry's lock
    (its downloader died; the kernel released the lock), or, without fcntl, untouched
    for ten minutes."""
    if fcntl is None:
        return time.time() - part.stat().st_mtime > _STALE_PART
    lock = os.path.join(directory, "locks", part.name[:64])
    try:
        fd = _open_lock(lock, os.O_RDWR)
    except FileNotFoundError:  # a downloader makes it before its .part: none is under way
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Taken, but on a lock file deleted meanwhile: the new one may be a download's.
        return _same_file(fd, lock)
    except BlockingIOError:
        return False
    finally:
        _close_lock(fd)  # (releases the lock if it was taken)


def _delete_unused(path: str) -> bool:
    """Deletes entry ``path`` unless a reader holds it (its shared lock); True if gone."""
    if fcntl is None:
        try:
            os.remove(path)  # Windows refuses to delete an open file: that one is in use
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.remove(path)  # under the lock: a reader that opened it meanwhile sees it gone
    except BlockingIOError:
        return False
    except FileNotFoundError:
        pass
    finally:
        _close_lock(fd)
    return True


def _delete_lock(path: str) -> None:
    """Deletes lock file ``path`` of an evicted entry, only while holding it (a process
    that waits for it then holds a deleted file: :func:`_locked` notices and retries);
    left when in use (a later eviction deletes it)."""
    if fcntl is None:
        return  # (nothing to hold it by: the file is left, as small as a name)
    try:
        fd = _open_lock(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):
            os.remove(path)
    except BlockingIOError:
        pass
    finally:
        _close_lock(fd)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Holds lock file ``path`` exclusively (flock: released if this process dies)."""
    while True:
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
        if fcntl is None:
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            _close_lock(fd)
            raise
        # Deleted by an eviction while this process waited for it: no lock of the entry's.
        if _same_file(fd, path):
            break
        _close_lock(fd)
    try:
        yield
    finally:
        _close_lock(fd)


def _open_lock(path: str, flags: int) -> int:
    """An fd to flock ``path`` through, listed so that a forked child closes its copy."""
    fd = os.open(path, flags | _BINARY, 0o644)
    _lock_fds.add(fd)
    return fd


def _close_lock(fd: int) -> None:
    if fcntl is not None:  # released first: a fork before the close leaves the child none
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
    _lock_fds.discard(fd)  # before the close: the number may be reused at once
    os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _whole(path: str, size: int) -> bool:
    """Whether verified entry ``path`` is there at its size (see the module docstring)."""
    try:
        return os.stat(path).st_size == size
    except FileNotFoundError:
        return False


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _sync_folder(directory: str) -> None:
    """The rename reaches the disk too (where folders can be opened: not on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
