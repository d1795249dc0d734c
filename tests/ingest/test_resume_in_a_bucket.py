"""Converting into a bucket (moto's S3 server on 127.0.0.1): a conversion killed twice
resumes and ends byte for byte as an uninterrupted one; the lock in the bucket is made by
a conditional put, renewed while held, taken over once another host's stops being
renewed, and deleted only by its own conversion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_folder
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


def _kill_after(src: Path, out: str, notes: int, deadline_s: float = 120) -> int:
    """Starts the CLI and kill -9s it once more than ``notes`` shards are done; returns
    how many were (0: it finished first)."""
    proc = subprocess.Popen(_convert_cmd(src, out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            done = _notes(out)
            if done > notes:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return 0 if storage.exists(storage.join(out, "manifest.json")) else done
            if proc.poll() is not None:
                return 0
            time.sleep(0.01)
        pytest.fail(f"no shard was finished within {deadline_s} s: {_convert_cmd(src, out)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return 0  # unreachable


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


def _ago(seconds: float) -> str:
    import datetime

    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds)
    return then.isoformat(timespec="seconds")


def test_only_one_writer_creates_an_object(bucket):
    assert storage.create(bucket + "/x", b"first")
    assert not storage.create(bucket + "/x", b"second")
    assert storage.read_bytes(bucket + "/x") == b"first"


def test_another_hosts_lock_in_a_bucket_is_held_while_renewed(bucket, tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    _lock(bucket + "/out", token="t", renewed=_ago(60))
    with pytest.raises(ChuteError, match=r"Another chute convert is writing.*another-host"):
        chute.convert(src, bucket + "/out", workers=1)
    _lock(bucket + "/never", since=_ago(10_000))  # no renewals (an older chute): held
    with pytest.raises(ChuteError, match="Another chute convert is writing"):
        chute.convert(src, bucket + "/never", workers=1)


def test_another_hosts_lock_in_a_bucket_no_longer_renewed_is_taken_over(bucket, tmp_path,
                                                                         caplog):  # fmt: skip
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    _lock(bucket + "/out", token="t", renewed=_ago(lock_lib.EXPIRY_S + 60))
    with caplog.at_level("WARNING"):
        chute.convert(src, bucket + "/out", workers=1)
    assert "taking over the lock" in caplog.text
    assert chute.verify(bucket + "/out").ok
    assert not storage.exists(f"{bucket}/out/{lock_lib.LOCK_NAME}")


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
