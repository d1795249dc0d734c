"""The shard cache (chute.read.cache): verified local copies of a remote dataset's shards,
against moto's S3 server on 127.0.0.1 (tests/object_stores.py) and memory:// where a
server is not the point: fetched and checked, refetched once then refused when corrupt,
a killed download, a limit below one shard, two processes, a warm restart, LRU
eviction, both engines reading through it, and the options and flags that set it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings

import numpy as np
import pytest
from helpers import make_folder
from object_stores import new_s3_bucket

import chute
from chute import cli
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.read import cache as cache_lib
from chute.read.cache import ShardCache
from chute.read.grain.source import GrainSource
from chute.read.options import LoadOptions, parse_size

try:
    import fcntl
except ImportError:  # Windows: the tests of locks are skipped (they need fork or /proc/locks)
    fcntl = None


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A tiny dataset converted locally: 3 train shards, one val shard."""
    root = tmp_path_factory.mktemp("cache-src")
    src = make_folder(root / "src", {"a": 10, "b": 8, "c": 6})
    chute.convert(src, root / "out", val_fraction=0.25, min_shards=3, workers=1)
    return str(root / "out")


def _copy(local: str, target: str) -> str:
    """The dataset folder ``local`` copied file by file to URL ``target``."""
    for top, _, files in os.walk(local):
        for name in files:
            relative = os.path.relpath(os.path.join(top, name), local).replace(os.sep, "/")
            storage.copy(os.path.join(top, name), f"{target}/{relative}")
    return target


@pytest.fixture(scope="module")
def remote(s3_endpoint, local) -> str:
    """The same dataset, byte for byte, in a bucket (read only by the tests)."""
    return _copy(local, new_s3_bucket(s3_endpoint) + "/shards")


@pytest.fixture
def memory(local) -> str:
    """The same dataset in memory:// (fsspec), a copy of its own per test."""
    return _copy(local, f"memory://cache-{uuid.uuid4().hex[:8]}")


def _shards(location: str, split: str = "train"):
    return manifest_lib.load(location).split(split).shards


def _entries(directory) -> dict[str, int]:
    return {
        name: os.path.getsize(os.path.join(directory, name))
        for name in os.listdir(directory)
        if len(name) == 64
    }


@pytest.fixture
def no_downloads(monkeypatch):
    def refuse(entry, part):
        raise AssertionError(f"downloaded {entry.url}")

    monkeypatch.setattr(cache_lib, "_stream", refuse)


@pytest.mark.parametrize(
    ("value", "size"),
    [(123, 123), ("123", 123), ("50GB", 50 * 10**9), ("500MB", 500 * 10**6),
     ("1.5TiB", int(1.5 * 2**40)), ("2 gib", 2 * 2**30), ("10kB", 10_000), ("7b", 7),
     (None, None)],
)  # fmt: skip
def test_cache_limit_sizes(value, size):
    assert parse_size("cache_limit", value) == size
    assert LoadOptions(cache_limit=value).cache_limit == size


@pytest.mark.parametrize("value", ["", "GB", "-5GB", "0", 0, -1, 1.5, True, "5 XB", "5G"])
def test_a_bad_cache_limit_names_the_option(value):
    with pytest.raises(ChuteError, match=r"`cache_limit` must be .*'50GB'.*Received: cache_limit="):
        LoadOptions(cache_limit=value)


@pytest.mark.parametrize(
    ("location", "options", "cached"),
    [("/data/x", {"engine": "grain", "cache_dir": "/c"}, False),
     ("s3://b/x", {"engine": "grain"}, True),
     ("s3://b/x", {"engine": "grain", "cache_dir": "none"}, False),
     ("memory://x", {"engine": "grain"}, False),
     ("memory://x", {"engine": "grain", "cache_dir": "/c"}, True),
     ("s3://b/x", {"engine": "tf"}, False),
     ("s3://b/x", {"engine": "tf", "cache_dir": "/c"}, True),
     ("s3://b/x", {"engine": "tf", "cache_dir": "/c", "data_service": "h:1"}, False)],
)  # fmt: skip
def test_which_loads_use_the_cache(location, options, cached):
    assert cache_lib.applies(location, LoadOptions(**options)) is cached


def test_a_cold_fetch_is_verified_and_named_by_its_sha256(remote, tmp_path):
    cache = ShardCache(tmp_path / "c", 10**7)
    shard = _shards(remote)[0]
    path = cache.local(remote, shard)
    assert os.path.basename(path) == shard.sha256
    with open(path, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == shard.sha256
    index = cache.local_index(remote, shard)
    with open(index, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == shard.index.sha256
    assert not [name for name in os.listdir(tmp_path / "c") if name.endswith(".part")]


@pytest.mark.parametrize("damage", ["corrupt", "short"])
def test_a_damaged_object_is_fetched_again_then_refused(
    local, s3_endpoint, tmp_path, damage, caplog
):
    location = _copy(local, new_s3_bucket(s3_endpoint) + "/shards")
    shard = _shards(location)[1]
    data = bytearray(storage.read_bytes(f"{location}/{shard.name}"))
    if damage == "corrupt":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[-10:]
    storage.write_atomic(f"{location}/{shard.name}", bytes(data))
    cache = ShardCache(tmp_path / "c", 10**7)
    with caplog.at_level(logging.WARNING), pytest.raises(ChuteError) as caught:
        cache.local(location, shard)
    message = str(caught.value)
    assert shard.name in message and f"{location}/{shard.name}" in message
    assert hashlib.sha256(data).hexdigest() in message and shard.sha256 in message
    assert "chute verify" in message
    assert sum("fetched again" in r.getMessage() for r in caplog.records) == 2
    assert _entries(tmp_path / "c") == {}  # nothing bad kept, no temporary file left
    assert not [name for name in os.listdir(tmp_path / "c") if name.endswith(".part")]


def test_a_download_killed_part_way_leaves_no_entry(remote, tmp_path):
    directory = tmp_path / "c"
    # A child that downloads a shard 64 bytes at a time, slowly, and is killed part-way.
    code = f"""
import sys, time
from chute.format import manifest, storage
from chute.read import cache
real = storage.open_file
class Slow:
    def __init__(self, handle): self.handle = handle
    def __enter__(self): return self
    def __exit__(self, *exc): self.handle.close()
    def read(self, n):
        print("reading", flush=True)
        time.sleep(0.05)
        return self.handle.read(n)
cache._BLOCK = 64
storage.open_file = lambda path, mode="rb": Slow(real(path, mode))
shard = manifest.load({remote!r}).split("train").shards[0]
cache.ShardCache({str(directory)!r}, 10**7).local({remote!r}, shard)
print("finished", flush=True)
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # a few blocks written
            assert child.stdout.readline().strip() == "reading"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    shard = _shards(remote)[0]
    assert _entries(directory) == {}
    assert [name for name in os.listdir(directory) if name.endswith(".part")]
    path = ShardCache(directory, 10**7).local(remote, shard)  # the next run completes
    assert os.path.getsize(path) == shard.bytes
    assert not [name for name in os.listdir(directory) if name.endswith(".part")]


def test_a_limit_smaller_than_one_shard_is_refused_by_name(remote, tmp_path):
    with pytest.raises(ChuteError, match=r"`cache_limit` is smaller than one shard: train-.*"
                       r"--cache-limit.*Received: cache_limit=100 "):  # fmt: skip
        chute.load(remote, engine="grain", cache_dir=str(tmp_path), cache_limit=100)


def _waiters(pids) -> set[int]:
    """The inodes that processes ``pids`` wait to flock (Linux's /proc/locks)."""
    waiting = set()
    with open("/proc/locks") as table:
        for line in table:
            fields = line.split()
            if "->" in fields and int(fields[-4]) in pids:
                waiting.add(int(fields[-3].rsplit(":", 1)[1]))
    return waiting


def _inodes(folder) -> set[int]:
    found = set()
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        with contextlib.suppress(FileNotFoundError):
            found.add(os.stat(os.path.join(folder, name)).st_ino)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux's lock table")
def test_two_processes_download_each_shard_once(remote, tmp_path):
    directory, go, release = tmp_path / "c", tmp_path / "go", tmp_path / "release"
    # Both start together; the first download's first read is held until the test has seen
    # the other process wait for that shard's lock.
    code = f"""
import logging, os, sys, time
from chute.format import manifest, storage
from chute.read.cache import ShardCache
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s", stream=sys.stdout)
logging.getLogger("chute.read.cache").setLevel(logging.DEBUG)
for name in ("s3fs", "botocore", "aiobotocore", "fsspec", "urllib3", "asyncio"):
    logging.getLogger(name).setLevel(logging.WARNING)
shards = manifest.load({remote!r}).split("train").shards
real = storage.open_file
def held(path, mode="rb"):
    while not os.path.exists({str(release)!r}):
        time.sleep(0.005)
    return real(path, mode)
storage.open_file = held
cache = ShardCache({str(directory)!r}, 10**7)
while not os.path.exists({str(go)!r}):
    time.sleep(0.005)
for shard in shards:
    cache.local({remote!r}, shard)
    cache.local_index({remote!r}, shard)
"""
    children = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        go.touch()
        pids = {child.pid for child in children}
        _until(
            lambda: _waiters(pids) & _inodes(directory / "locks"),
            "one process waits for the other's download (its entry's lock)",
            timeout=30,
        )
    finally:
        release.touch()
    logs = [child.communicate(timeout=60)[0] for child in children]
    assert all(child.returncode == 0 for child in children), logs
    fetched = [line for out in logs for line in out.splitlines() if "fetched" in line]
    # Each file once, in all (equal record indexes are one entry: content-addressed).
    files = {digest for s in _shards(remote) for digest in (s.sha256, s.index.sha256)}
    assert len(fetched) == len(files), fetched
    assert set(_entries(directory)) == files


def test_a_warm_restart_downloads_nothing(remote, tmp_path, monkeypatch):
    directory = tmp_path / "c"
    first = GrainSource(manifest_lib.load(remote), "train", ShardCache(directory, 10**7))
    records = [first[i]["key"] for i in range(len(first))]
    monkeypatch.setattr(cache_lib, "_stream", lambda entry, part: pytest.fail(entry.url))
    again = GrainSource(manifest_lib.load(remote), "train", ShardCache(directory, 10**7))
    assert [again[i]["key"] for i in range(len(again))] == records


def test_lru_eviction_keeps_the_total_under_the_limit(memory, tmp_path, monkeypatch):
    monkeypatch.setattr(cache_lib, "_TOUCH_EVERY", 0.0)
    shards = _shards(memory)
    limit = max(s.bytes for s in shards) * 2 + 50  # two shards fit, three do not
    cache = ShardCache(tmp_path / "c", limit)
    first, second, third = (cache.path(s) for s in shards)
    cache.local(memory, shards[0])
    cache.local(memory, shards[1])
    os.utime(first, (1, 1))  # used long ago ...
    os.utime(second, (2, 2))
    cache.local(memory, shards[0])  # ... and now again: the second is the least recent
    cache.local(memory, shards[2])
    assert os.path.exists(first) and os.path.exists(third) and not os.path.exists(second)
    assert sum(_entries(tmp_path / "c").values()) <= limit


def test_an_entry_being_read_is_not_evicted(memory, tmp_path):
    shards = _shards(memory)
    cache = ShardCache(tmp_path / "c", max(s.bytes for s in shards) * 2 + 50)
    fd = cache.open(memory, shards[0])  # a reader holds it
    try:
        cache.local(memory, shards[1])
        os.utime(cache.path(shards[1]), (5, 5))
        os.utime(cache.path(shards[0]), (1, 1))  # the least recent, but in use
        cache.local(memory, shards[2])
        assert os.path.exists(cache.path(shards[0])) and not os.path.exists(cache.path(shards[1]))
    finally:
        os.close(fd)


def _prefetch_waits_for_room() -> bool:
    """Whether a prefetch thread is waiting for room (where it goes only when
    fetching its shard would pass the limit)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return any(
        names.get(ident) == "chute-shard-cache"
        and frame.f_code.co_name == "wait"
        and frame.f_back is not None
        and frame.f_back.f_code.co_name == "_prefetching"
        for ident, frame in sys._current_frames().items()
    )


def _until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.005)


def test_prefetch_stays_within_the_limit(memory, tmp_path):
    shards = _shards(memory)
    limit = max(s.bytes for s in shards) * 2 + 50
    cache = ShardCache(tmp_path / "c", limit)
    cache.prefetch(memory, shards)
    # the third waits for room that only a reader moving on makes
    _until(
        lambda: (
            len(_entries(tmp_path / "c")) == 2
            and _prefetch_waits_for_room()
            and sum(t.name == "chute-shard-cache" for t in threading.enumerate()) == 1
        ),
        "the first two fetched, and the third's prefetch waits for room",
    )
    held = _entries(tmp_path / "c")
    assert set(held) == {shards[0].sha256, shards[1].sha256} and sum(held.values()) <= limit
    cache.prefetch(memory, [])  # (the waiting thread ends)


def test_prefetch_fetches_a_whole_split_ahead(memory, tmp_path, monkeypatch):
    shards = _shards(memory)
    cache = ShardCache(tmp_path / "c", 10**7)
    cache.prefetch(memory, shards[::-1])
    deadline = time.monotonic() + 10
    while len(_entries(tmp_path / "c")) < len(shards) and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setattr(cache_lib, "_stream", lambda entry, part: pytest.fail(entry.url))
    assert [cache.local(memory, s) for s in shards] == [cache.path(s) for s in shards]


def _wait_for(directory, digests) -> set[str]:
    deadline = time.monotonic() + 10
    while not set(digests) <= set(_entries(directory)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return set(_entries(directory))


def test_the_source_fetches_what_it_is_told_comes_next_else_all_in_order(memory, tmp_path):
    shards = _shards(memory)
    told = GrainSource(manifest_lib.load(memory), "train", ShardCache(tmp_path / "a", 10**7))
    told.upcoming([2])
    assert shards[2].sha256 in _wait_for(tmp_path / "a", [shards[2].sha256])
    assert shards[0].sha256 not in _entries(tmp_path / "a")
    alone = GrainSource(manifest_lib.load(memory), "train", ShardCache(tmp_path / "b", 10**7))
    alone[0]  # nobody said the order: all of them, in manifest order
    assert {s.sha256 for s in shards} <= _wait_for(tmp_path / "b", [s.sha256 for s in shards])


def test_the_source_pickles_with_its_cache_and_reads_in_another_process(remote, tmp_path):
    source = GrainSource(manifest_lib.load(remote), "train", ShardCache(tmp_path / "c", 10**7))
    assert source.shard_starts == (0, *np.cumsum([s.records for s in _shards(remote)])[:-1])
    key = source[3]["key"]
    copy = pickle.loads(pickle.dumps(source))
    assert copy.cache.limit == 10**7 and copy[3]["key"] == key


def test_the_grain_engine_reads_a_bucket_through_the_cache_as_locally(remote, local, tmp_path):
    options = {"engine": "grain", "batch_size": 4, "seed": 3, "workers": 0}
    here = [b[1].tolist() for b in chute.load(local, **options)]
    cached = chute.load(remote, cache_dir=str(tmp_path / "c"), cache_limit="1MB", **options)
    assert [b[1].tolist() for b in cached] == here
    shards = _shards(remote)
    assert set(_entries(tmp_path / "c")) == {
        digest for s in shards for digest in (s.sha256, s.index.sha256)
    }


@pytest.mark.slow  # imports TensorFlow
def test_the_tf_engine_reads_a_bucket_through_the_cache_as_locally(remote, local, tmp_path):
    options = {"training": False, "batch_size": 4}
    here = [(b[0].numpy(), b[1].numpy()) for b in chute.load(local, "val", **options)]
    cached = chute.load(remote, "val", cache_dir=str(tmp_path / "c"), **options)
    batches = [(b[0].numpy(), b[1].numpy()) for b in cached]
    assert len(batches) == len(here) and all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        for a, b in zip(batches, here, strict=True)
    )
    with pytest.raises(ChuteError, match=r"do not fit in cache_limit.*engine='grain'"):
        shard = max(s.bytes for s in _shards(remote))
        chute.load(remote, "train", cache_dir=str(tmp_path / "d"), cache_limit=shard + 600)


class _Called(Exception):
    pass


def test_the_cache_flags_reach_the_load_options(shared_dataset, monkeypatch):
    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise _Called

    monkeypatch.setattr("chute.fit.train.train", record)
    monkeypatch.setattr("chute.fit.evaluate.evaluate", record)
    flags = ["--cache-dir", "/tmp/shards", "--cache-limit", "2GB"]
    with pytest.raises(_Called):
        cli.main(["train", str(shared_dataset), *flags])
    assert seen["config"].load.cache_dir == "/tmp/shards"
    assert seen["config"].load.cache_limit == 2 * 10**9
    with pytest.raises(_Called):
        cli.main(["evaluate", "run", str(shared_dataset), *flags])
    assert seen["cache_dir"] == "/tmp/shards" and seen["cache_limit"] == "2GB"


def _lockable(path) -> bool:
    """Whether this process can lock ``path`` exclusively now (nobody holds it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _forked_child():
    """A forked child that lives, doing nothing, until the block ends."""
    ready_r, ready_w = os.pipe()
    end_r, end_w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (fork with threads running)
        pid = os.fork()
    if pid == 0:  # the child: says it is there (its at-fork hooks have run), then waits
        os.write(ready_w, b"x")
        os.read(end_r, 1)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        yield
    finally:
        os.write(end_w, b"x")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, end_r, end_w):
            os.close(fd)


def _held_stream(monkeypatch):
    """Downloads wait to start until ``release`` is set; ``started`` says one waits."""
    started, release = threading.Event(), threading.Event()
    real = storage.open_file

    def held(path, mode="rb"):
        started.set()
        assert release.wait(10)
        return real(path, mode)

    monkeypatch.setattr(storage, "open_file", held)
    return started, release


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_keeps_no_lock_of_a_download_under_way(memory, tmp_path, monkeypatch):
    shard = _shards(memory)[0]
    cache = ShardCache(tmp_path / "c", 10**7)
    started, release = _held_stream(monkeypatch)
    download = threading.Thread(target=cache.local, args=(memory, shard))
    download.start()
    try:
        assert started.wait(10)  # it holds the entry's lock now
        with _forked_child():
            release.set()
            download.join(10)
            assert os.path.exists(cache.path(shard))
            # the parent's lock is gone; the child's copy of it must not hold it
            assert _lockable(tmp_path / "c" / "locks" / shard.sha256)
    finally:
        release.set()
        download.join(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_that_never_reads_does_not_pin_the_sources_entries(memory, tmp_path):
    shards = _shards(memory)
    cache = ShardCache(tmp_path / "c", 10**7)
    source = GrainSource(manifest_lib.load(memory), "train", cache)
    source.upcoming([])  # (no prefetch threads)
    source[0]  # its shard is held open (a shared lock) by the source
    assert not _lockable(cache.path(shards[0]))
    with _forked_child():
        source.close()  # the parent moves on: eviction may delete the entry now
        assert _lockable(cache.path(shards[0]))


class _EvictedOnce(ShardCache):
    """A cache whose record indexes another process evicts once, just after each is
    fetched and before it is opened (``always``: every time)."""

    always = False

    def local_index(self, location, shard):
        path = super().local_index(location, shard)
        with self._evicting:
            if self.always or path not in self.evicted:
                self.evicted.add(path)
                with contextlib.suppress(FileNotFoundError):  # (two threads, one index)
                    os.remove(path)
        return path

    def __init__(self, *args):
        super().__init__(*args)
        self._evicting, self.evicted = threading.Lock(), set()


def test_a_record_index_evicted_before_it_is_opened_is_fetched_again(memory, tmp_path):
    cache = _EvictedOnce(tmp_path / "c", 10**7)
    source = GrainSource(manifest_lib.load(memory), "train", cache)
    assert cache.evicted == {os.path.join(cache.directory, s.index.sha256) for s in _shards(memory)}
    assert source[0]["key"]
    cache.always = True
    with pytest.raises(ChuteError, match=r"record index of train-.* was evicted from the shard "
                       r"cache .* 3 times.*--cache-limit"):  # fmt: skip
        GrainSource(manifest_lib.load(memory), "train", cache)


def test_an_evicted_entry_takes_its_lock_file_with_it(memory, tmp_path):
    shards = _shards(memory)
    cache = ShardCache(tmp_path / "c", max(s.bytes for s in shards) + 50)  # one at a time
    for shard in shards * 2:
        cache.local(memory, shard)
    assert set(os.listdir(tmp_path / "c" / "locks")) == {".space", shards[-1].sha256}


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux's lock table")
def test_a_lock_file_deleted_while_waited_for_is_made_again(memory, tmp_path, monkeypatch):
    shard = _shards(memory)[0]
    cache = ShardCache(tmp_path / "c", 10**7)
    lock = tmp_path / "c" / "locks" / shard.sha256
    evictor = os.open(lock, os.O_RDWR | os.O_CREAT)  # another process evicting the entry
    fcntl.flock(evictor, fcntl.LOCK_EX)
    started, release = _held_stream(monkeypatch)
    download = threading.Thread(target=cache.local, args=(memory, shard))
    download.start()
    try:
        _until(lambda: os.stat(lock).st_ino in _waiters({os.getpid()}), "the download waits")
        os.remove(lock)  # the evictor deletes the lock file, then lets go of it
        os.close(evictor)
        assert started.wait(10)  # downloading: under the lock of the file now at that name
        assert lock.exists() and not _lockable(lock)
    finally:
        release.set()
        download.join(10)
    assert os.path.getsize(cache.path(shard)) == shard.bytes


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_names_the_cache_the_shard_and_the_limit(memory, tmp_path, monkeypatch, code):
    shard = _shards(memory)[1]
    cache = ShardCache(tmp_path / "c", 10**7)

    def full(fd):  # where a full disk shows at the latest (NFS, delayed allocation)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ChuteError) as caught:
        cache.local(memory, shard)
    message = str(caught.value)
    assert str(tmp_path / "c") in message and shard.name in message and memory in message
    assert f"needs {shard.bytes} bytes" in message and os.strerror(code) in message
    assert "cache_limit=10000000" in message and "--cache-limit" in message
    assert not [name for name in os.listdir(tmp_path / "c") if name != "locks"]


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux's lock table")
def test_a_download_becomes_an_entry_under_the_space_lock(memory, tmp_path, monkeypatch):
    """Else a claim listing the folder meanwhile counts it neither as a .part nor as an
    entry, and passes the limit."""
    shard = _shards(memory)[0]
    cache = ShardCache(tmp_path / "c", 10**7)
    started, release = _held_stream(monkeypatch)
    download = threading.Thread(target=cache.local, args=(memory, shard))
    download.start()
    space = os.open(tmp_path / "c" / "locks" / ".space", os.O_RDWR | os.O_CREAT)
    try:
        assert started.wait(10)  # room claimed: a .part file is there
        fcntl.flock(space, fcntl.LOCK_EX)  # another process claims room now
        release.set()
        inode = os.fstat(space).st_ino
        _until(lambda: inode in _waiters({os.getpid()}), "the rename waits for the space lock")
        assert not os.path.exists(cache.path(shard))
        assert [name for name in os.listdir(tmp_path / "c") if name.endswith(".part")]
    finally:
        os.close(space)
        release.set()
        download.join(10)
    assert os.path.getsize(cache.path(shard)) == shard.bytes


def _damage_in_place(path) -> None:
    """One byte flipped in the middle of file ``path``, in place: the same size (and inode),
    as a bad disk block leaves it; a warm cache's size check does not see it."""
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size // 2)
        byte = handle.read(1)[0]
        handle.seek(size // 2)
        handle.write(bytes([byte ^ 0xFF]))


def _sha256_of(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def test_a_cached_copy_damaged_at_its_size_is_evicted_and_fetched_again(remote, tmp_path, caplog):
    directory = tmp_path / "c"
    warm = GrainSource(manifest_lib.load(remote), "train", ShardCache(directory, 10**7))
    keys = [warm[i]["key"] for i in range(len(warm))]  # every copy cached, and held open
    shard = _shards(remote)[1]
    copy = ShardCache(directory, 10**7).path(shard)
    _damage_in_place(copy)
    again = GrainSource(manifest_lib.load(remote), "train", ShardCache(directory, 10**7))
    with caplog.at_level(logging.WARNING, logger="chute.read.cache"):
        assert [again[i]["key"] for i in range(len(again))] == keys  # no error
    assert [warm[i]["key"] for i in range(len(warm))] == keys  # its damaged fd let go too
    assert sum("is damaged: deleted" in r.getMessage() for r in caplog.records) == 1
    assert _sha256_of(copy) == shard.sha256  # the entry is a verified copy again


def test_a_damaged_copy_of_a_damaged_object_is_one_error_naming_both(local, s3_endpoint, tmp_path):
    """The cached copy and the bucket's object both damaged: the download is refused (its
    sha256), and the one error names the object and the cache file."""
    location = _copy(local, new_s3_bucket(s3_endpoint) + "/shards")
    directory = tmp_path / "c"
    warm = GrainSource(manifest_lib.load(location), "train", ShardCache(directory, 10**7))
    [warm[i] for i in range(len(warm))]
    shard = _shards(location)[1]
    copy = ShardCache(directory, 10**7).path(shard)
    _damage_in_place(copy)
    data = bytearray(storage.read_bytes(f"{location}/{shard.name}"))
    data[len(data) // 2] ^= 0xFF
    storage.write_atomic(f"{location}/{shard.name}", bytes(data))
    again = GrainSource(manifest_lib.load(location), "train", ShardCache(directory, 10**7))
    with pytest.raises(ChuteError) as caught:
        [again[i] for i in range(len(again))]
    message = str(caught.value)
    assert f"{location}/{shard.name}" in message and copy in message
    assert "is damaged in the shard cache's copy" in message and "chute verify" in message


def test_a_fresh_copy_that_is_damaged_too_is_one_error_naming_both(local, s3_endpoint, tmp_path):
    """A dataset written damaged (its manifest's sha256 is the damaged file's): the copy
    is fetched again once, then one error names the object and the cache file."""
    location = _copy(local, new_s3_bucket(s3_endpoint) + "/shards")
    shard = _shards(location)[1]
    data = bytearray(storage.read_bytes(f"{location}/{shard.name}"))
    data[len(data) // 2] ^= 0xFF
    storage.write_atomic(f"{location}/{shard.name}", bytes(data))
    body = json.loads(storage.read_bytes(f"{location}/manifest.json"))
    body["splits"]["train"]["shards"][1]["sha256"] = hashlib.sha256(data).hexdigest()
    storage.write_atomic(f"{location}/manifest.json", json.dumps(body).encode())
    source = GrainSource(manifest_lib.load(location), "train", ShardCache(tmp_path / "c", 10**7))
    with pytest.raises(ChuteError) as caught:
        [source[i] for i in range(len(source))]
    message = str(caught.value)
    copy = os.path.join(tmp_path / "c", hashlib.sha256(data).hexdigest())
    assert f"{location}/{shard.name}" in message and copy in message
    assert "again in a fresh download" in message and f"chute verify {location}" in message


def test_verify_with_cache_dir_hashes_the_cached_copies_and_deletes_the_damaged(remote, tmp_path):
    from helpers import run_here

    directory = tmp_path / "c"
    warm = GrainSource(manifest_lib.load(remote), "train", ShardCache(directory, 10**7))
    [warm[i] for i in range(len(warm))]
    del warm
    shard = _shards(remote)[2]
    copy = ShardCache(directory, 10**7).path(shard)
    _damage_in_place(copy)
    report = chute.verify(remote, cache_dir=directory)
    assert report.ok and report.evicted == [(shard.name, copy)]
    assert report.cached_copies == len(_entries(directory)) + 1  # the damaged one is gone
    assert not os.path.exists(copy)
    cache_lib.ShardCache(directory, 10**7).local(remote, shard)
    _damage_in_place(copy)
    done = run_here("verify", remote, "--cache-dir", directory)
    assert done.returncode == 0, done.stderr
    assert "1 damaged" in done.stdout and f"DAMAGED copy of {shard.name}: {copy}" in done.stdout
    assert not os.path.exists(copy)
    again = run_here("verify", remote, "--cache-dir", directory)
    assert "0 damaged" in again.stdout and "ok:" in again.stdout
