"""Converting into a bucket (moto's S3 server on 127.0.0.1): a conversion killed twice
resumes and ends byte for byte as an uninterrupted one; the lock in the bucket is made by
a conditional put, renewed while held, taken over once it stays unchanged for the expiry
timed by the waiter's clock (the holder's clock never counts), by one of two takers only,
and deleted only by its own conversion; a conversion whose lock was taken over stops."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import kill_after, make_folder
from object_stores import new_s3_bucket

import chute
from chute.errors import ChuteError
from chute.format import storage
from chute.ingest import lock as lock_lib
from chute.ingest import resume


@pytest.fixture
def bucket(s3_endpoint) -> str:
    return new_s3_bucket(s3_endpoint)


def _objects(prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` (key below it -> bytes)."""
    found = {}
    for top, _, files in storage.walk(prefix):
        for name in files:
            path = f"{top}/{name}"
            found[path[len(prefix) + 1 :]] = storage.read_bytes(path)
    return found


def _notes(out: str) -> int:
    work = storage.join(out, resume.WORK_DIR)
    try:
        return sum(name.endswith(".tfrecord.json") for name in storage.listdir(work))
    except FileNotFoundError:
        return 0


def _convert_cmd(src: Path, out: str) -> list[str]:
    return [sys.executable, "-m", "chute", "convert", str(src), out,
            "--workers", "1", "--min-shards", "12", "--no-progress"]  # fmt: skip


def _kill_after(src: Path, out: str, notes: int) -> int:
    """Kills the CLI once more than ``notes`` shards are done (see helpers.kill_after)."""
    finished = lambda: storage.exists(storage.join(out, "manifest.json"))  # noqa: E731
    return kill_after(_convert_cmd(src, out), lambda: _notes(out), finished, notes, poll_s=0.01)


@pytest.mark.slow  # three conversions in processes, two of them killed
def test_a_conversion_into_a_bucket_killed_twice_resumes_byte_for_byte(bucket, tmp_path):
    src = make_folder(tmp_path / "src", {"a": 200, "b": 200, "c": 200}, size=(8, 8))
    out = bucket + "/out"
    first = _kill_after(src, out, 0)
    second = _kill_after(src, out, first) if first else 0
    if not (first and second and second < 12):
        pytest.skip("the conversion finished before it could be killed twice")
    assert not storage.exists(out + "/manifest.json")
    rerun = subprocess.run(_convert_cmd(src, out), capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    assert "resumed:" in rerun.stdout, rerun.stdout
    chute.convert(str(src), bucket + "/reference", workers=1, min_shards=12)
    assert _objects(out) == _objects(bucket + "/reference")  # manifest, shards, indexes
    assert chute.verify(out).ok


def _lock(out: str, **fields) -> None:
    holder = {"pid": 1, "host": "another-host", "since": "2026-01-01T00:00:00+00:00", **fields}
    storage.write_atomic(f"{out}/{lock_lib.LOCK_NAME}", json.dumps(holder).encode())


def _holder(out: str) -> dict:
    return json.loads(storage.read_bytes(f"{out}/{lock_lib.LOCK_NAME}"))


def _ago(seconds: float) -> str:
    import datetime

    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds)
    return then.isoformat(timespec="seconds")


class _Clock:
    """The waiter's monotonic clock, moved on only by its sleeps (none real); at each one
    ``on_sleep`` runs: another host renewing its lock meanwhile, or not."""

    def __init__(self):
        self.now = 0.0
        self.on_sleep = lambda: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep()


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(lock_lib, "_monotonic", clock.monotonic)
    monkeypatch.setattr(lock_lib, "_sleep", clock.sleep)
    return clock


def _renewing(out: str, clock: _Clock, *, skew_s: float) -> None:
    """Makes the lock's holder renew it every HEARTBEAT_S of the waiter's time, stamping
    its renewals by a clock ``skew_s`` ahead of this machine's."""
    state = {"renewals": 0, "last": 0.0}

    def renew() -> None:
        if clock.now - state["last"] >= lock_lib.HEARTBEAT_S:
            state["renewals"] += 1
            state["last"] = clock.now
            _lock(out, token="t", renewed=_ago(-skew_s), renewals=state["renewals"],
                  machine="another-boot/pid:[1]")  # fmt: skip

    clock.on_sleep = renew


def test_only_one_writer_creates_an_object(bucket):
    assert storage.create(bucket + "/x", b"first")
    assert not storage.create(bucket + "/x", b"second")
    assert storage.read_bytes(bucket + "/x") == b"first"


def test_only_the_version_seen_is_replaced(bucket):
    path = bucket + "/x"
    assert storage.version(path) is None
    assert not storage.replace(path, b"over nothing", "any")
    storage.write_atomic(path, b"first")
    seen = storage.version(path)
    storage.write_atomic(path, b"second")
    assert storage.version(path) != seen
    assert not storage.replace(path, b"third", seen)  # If-Match: another version is there
    assert storage.read_bytes(path) == b"second"
    assert storage.replace(path, b"third", storage.version(path))
    assert storage.read_bytes(path) == b"third"


def test_a_lock_in_a_bucket_never_renewed_or_garbled_is_held(bucket, tmp_path, clock):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    _lock(bucket + "/never", since=_ago(10_000))  # no renewals (an older chute): held
    with pytest.raises(ChuteError, match=r"Another chute convert is writing.*another-host"):
        chute.convert(src, bucket + "/never", workers=1)
    storage.write_atomic(f"{bucket}/garbled/{lock_lib.LOCK_NAME}", b"{")
    with pytest.raises(ChuteError, match=r"Another chute convert is writing.*\(unknown\)"):
        chute.convert(src, bucket + "/garbled", workers=1)
    assert clock.now == 0  # neither was watched


@pytest.mark.parametrize("skew_s", [-86_400, 0, 86_400])  # its clock a day behind, right, ahead
def test_another_hosts_lock_is_held_while_it_renews_whatever_its_clock(bucket, clock, skew_s):
    out = bucket + "/out"
    _lock(out, token="t", renewed=_ago(-skew_s), renewals=0, machine="another-boot/pid:[1]")
    _renewing(out, clock, skew_s=skew_s)
    refused = pytest.raises(ChuteError, match=r"^Another chute convert is writing.*another-host")
    with refused, lock_lib.locked(out):
        pytest.fail("took over a lock that is renewed")
    assert clock.now <= lock_lib.HEARTBEAT_S + lock_lib.POLL_S  # refused at the first renewal
    assert _holder(out)["token"] == "t"


def test_same_hostname_on_another_machine_is_watched_not_asked_by_pid(bucket, clock):
    import socket

    out = bucket + "/out"
    dead_pid = 2**22 + 12345  # above Linux's pid_max: no such process here
    _lock(out, token="t", host=socket.gethostname(), pid=dead_pid, renewed=_ago(0),
          renewals=0, machine="another-boot/pid:[1]")  # fmt: skip
    _renewing(out, clock, skew_s=0)
    with pytest.raises(ChuteError, match="Another chute convert is writing"), lock_lib.locked(out):
        pytest.fail("took over a renewed lock because its pid is not one of this machine's")
    # The same boot and pid namespace: the pid tells at once.
    _lock(out, token="t", host=socket.gethostname(), pid=dead_pid, renewed=_ago(0),
          renewals=0, machine=lock_lib._machine())  # fmt: skip
    clock.on_sleep, clock.now = (lambda: None), 0.0
    with lock_lib.locked(out):
        assert _holder(out)["token"] != "t"
    assert clock.now == lock_lib.SETTLE_S


@pytest.mark.parametrize("skew_s", [-86_400, 86_400])
def test_a_lock_whose_renewals_stop_is_taken_over_after_the_expiry_timed_here(
    bucket, tmp_path, clock, caplog, monkeypatch, skew_s
):
    monkeypatch.setattr(lock_lib, "POLL_S", 50.0)  # fewer looks at the lock: a faster test
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    out = bucket + "/out"
    # By its stamp, renewed a day ahead or behind of this machine's clock: it does not count.
    _lock(out, token="t", renewed=_ago(-skew_s), renewals=7, machine="another-boot/pid:[1]")
    with caplog.at_level("WARNING"):
        chute.convert(src, out, workers=1)
    assert "taking over the lock" in caplog.text
    assert lock_lib.EXPIRY_S <= clock.now <= lock_lib.EXPIRY_S + lock_lib.POLL_S + lock_lib.SETTLE_S
    assert chute.verify(out).ok
    assert not storage.exists(f"{out}/{lock_lib.LOCK_NAME}")


def _race(out: str, monkeypatch, replace) -> dict[str, object]:
    """Two conversions that watched the same dead lock take it over at once, each through
    ``replace``; returns what each ended with: "wrote", or the error that stopped it."""
    import threading

    monkeypatch.setattr(lock_lib, "EXPIRY_S", 0.3)
    monkeypatch.setattr(lock_lib, "POLL_S", 0.05)
    monkeypatch.setattr(lock_lib, "SETTLE_S", 0.3)
    monkeypatch.setattr(storage, "replace", replace)
    _lock(out, token="dead", renewed=_ago(0), renewals=0, machine="another-boot/pid:[1]")
    ended: dict[str, object] = {}

    def convert(name: str) -> None:
        try:
            with lock_lib.locked(out):
                lock_lib.check_held(out)  # before its first shard
                storage.write_atomic(f"{out}/{name}.tfrecord", b"shard")
                ended[name] = "wrote"
        except ChuteError as error:
            ended[name] = error

    threads = [threading.Thread(target=convert, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return ended


def _one_wrote(out: str, ended: dict[str, object]) -> None:
    assert sorted(map(str, ended.values()))[-1] == "wrote", ended
    [error] = [e for e in ended.values() if e != "wrote"]
    assert str(error).startswith("Another chute convert took over `output` just now")
    assert "\n" not in str(error) and repr(out) in str(error)
    [writer] = [name for name, e in ended.items() if e == "wrote"]
    assert storage.listdir(out) == [f"{writer}.tfrecord"]  # its lock gone with it


def test_two_takers_of_one_dead_lock_one_writes_the_other_stops(bucket, monkeypatch):
    import threading

    both_watched = threading.Barrier(2, timeout=10)
    real = storage.replace

    def replace(path: str, data: bytes, seen: str) -> bool:
        both_watched.wait()  # both saw the dead lock unchanged: S3's If-Match picks one
        return real(path, data, seen)

    _one_wrote(bucket + "/out", _race(bucket + "/out", monkeypatch, replace))


def test_two_takers_where_a_replace_is_not_atomic_the_one_read_back_writes(bucket, monkeypatch):
    # A store without conditional puts: both check, both write, the later write stays; the
    # earlier writer reads the other's token back and stops (A deletes, A creates, B deletes
    # A's, B creates).
    import threading

    both_checked = threading.Barrier(2, timeout=10)
    one_at_a_time = threading.Lock()

    def replace(path: str, data: bytes, seen: str) -> bool:
        unchanged = storage.version(path) == seen
        both_checked.wait()
        with one_at_a_time:
            storage.write_atomic(path, data)
        return unchanged

    _one_wrote(bucket + "/out", _race(bucket + "/out", monkeypatch, replace))


def test_a_conversion_whose_lock_is_taken_over_stops_before_its_next_shard(
    bucket, tmp_path, monkeypatch, caplog
):
    from chute.ingest import writer

    monkeypatch.setattr(lock_lib, "HEARTBEAT_S", 0.05)
    src = make_folder(tmp_path / "src", {"a": 4, "b": 4})
    out = bucket + "/out"
    real = writer.write_shard
    shards = []

    def write_shard(output, name, chunks, **kw):
        if not shards:  # another conversion takes the lock over (a put without a condition)
            _lock(out, token="another's", renewed=_ago(0), renewals=0)
            deadline = time.monotonic() + 10
            while not lock_lib._held[out].lost:
                assert time.monotonic() < deadline, "the heartbeat did not see the takeover"
                time.sleep(0.02)
        shards.append(name)
        return real(output, name, chunks, **kw)

    monkeypatch.setattr(writer, "write_shard", write_shard)
    with caplog.at_level("ERROR"), pytest.raises(ChuteError) as raised:
        chute.convert(src, out, workers=1, min_shards=3)
    message = str(raised.value)
    assert message.startswith("Another chute convert took over `output` while this one")
    assert "\n" not in message and repr(out) in message
    assert len(shards) == 1  # the shard under way was finished; none after it
    assert "no longer this conversion's" in caplog.text
    assert not storage.exists(f"{out}/manifest.json")
    assert _holder(out)["token"] == "another's"  # the other's lock stays


def test_a_held_lock_is_renewed_and_only_its_own_is_deleted(bucket, monkeypatch, caplog):
    monkeypatch.setattr(lock_lib, "HEARTBEAT_S", 0.05)
    out, path = bucket + "/out", f"{bucket}/out/{lock_lib.LOCK_NAME}"
    with lock_lib.locked(out):
        first = json.loads(storage.read_bytes(path))
        assert first["host"] and first["token"] and first["renewed"]
        deadline = time.monotonic() + 10
        while json.loads(storage.read_bytes(path))["renewed"] == first["renewed"]:
            assert time.monotonic() < deadline, "the lock was not renewed"
            time.sleep(0.1)
    assert not storage.exists(path)
    with caplog.at_level("ERROR"), lock_lib.locked(out):
        _lock(out, token="someone else's", renewed=_ago(0))  # taken over in a long pause
        time.sleep(0.3)
    assert "no longer this conversion's" in caplog.text
    assert json.loads(storage.read_bytes(path))["token"] == "someone else's"
