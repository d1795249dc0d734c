"""Who is converting into ``OUT``: its lock file, and the scratch folders named after it.

While a conversion runs, ``OUT/.chute-lock`` names its process (pid, host, start):
a second conversion into the same ``OUT`` stops at once rather than interleave
shards with it. A conversion that is killed (SIGKILL, a machine that restarted)
leaves its lock and the temporary folders it unpacked a compressed tar or Parquet
files to; both carry its pid, so the next conversion into ``OUT`` recognises them
as a dead process's and takes them over or deletes them.

In a bucket nothing can be flock'ed and another host's pid cannot be asked: the lock
is an object made with a conditional put (only one of two conversions creates it:
:func:`chute.format.storage.create`), and its holder renews it every
``HEARTBEAT_S`` seconds. A lock of another host not renewed for ``EXPIRY_S`` seconds
is a dead conversion's and is taken over (by the holder's clock: hosts whose clocks
differ by minutes still agree). Two conversions that find the same expired lock at
the same moment may both take it; the holder's next renewal then sees the other's
lock and says so, and a conversion deletes only its own lock. The temporary folders
are on the converting machine, never in the bucket; the shards' work folder
(``OUT/.chute-work``) is in ``OUT`` wherever it is.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.sources import source_identity

log = logging.getLogger(__name__)

LOCK_NAME = ".chute-lock"
HEARTBEAT_S = 30.0  # how often a lock in a bucket is renewed while its conversion runs
EXPIRY_S = 600.0  # another host's lock in a bucket not renewed for this long is a dead one's


@contextlib.contextmanager
def locked(output: str) -> Iterator[None]:
    """Holds ``OUT/.chute-lock`` while a conversion writes into ``output`` (created if
    needed, and removed again if it is left empty). A lock left by a process that is
    gone (same machine) is taken over.

    Raises:
        ChuteError: another conversion is writing into ``output``.
    """
    storage.check_output(output, "output")
    made = not storage.exists(output)
    storage.makedirs(output)
    try:
        with _lock_file(output):
            yield
    finally:
        # a refused or failed first run leaves no empty OUT behind for the user to wonder at
        if made and storage.exists(output) and not storage.listdir(output):
            storage.remove_if_exists(output)


@contextlib.contextmanager
def _lock_file(output: str) -> Iterator[None]:
    path = storage.join(output, LOCK_NAME)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    if not storage.is_local(path):  # renewed while held; whose it is, by the token
        me |= {"token": uuid.uuid4().hex, "renewed": me["since"]}
    if not _take(path, me):
        holder = _holder(path)
        if holder is None or _alive(holder):
            raise ChuteError(
                f"Another chute convert is writing into `output` ({_who(holder)}). Received: "
                f"output={output!r}; wait for it to end, or, if it is no longer running, "
                f"delete {path}"
            )
        log.warning("taking over the lock of a conversion that is gone: %s", holder)
        storage.remove_if_exists(path)
        # two runs may find the same dead lock: the exclusive create below picks one
        if not _take(path, me):
            raise ChuteError(f"Another chute convert took the lock {path} just now")
    heartbeat = None if storage.is_local(path) else _Heartbeat(path, me)
    try:
        yield
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        # in a bucket, only its own: a lock taken over after a long pause is the other's now
        if heartbeat is None or heartbeat.ours():
            storage.remove_if_exists(path)


def _take(path: str, me: dict) -> bool:
    """Creates the lock file; False if it exists (atomic locally and on object stores
    with conditional puts; see :func:`chute.format.storage.create`)."""
    return storage.create(path, json.dumps(me).encode())


def _holder(path: str) -> dict | None:
    try:
        holder = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None  # half-written or garbled: its holder is "unknown", never taken over
    return holder if isinstance(holder, dict) and {"pid", "host"} <= set(holder) else None


def _who(holder: dict | None) -> str:
    if holder is None:
        return "unknown"
    who = f"pid {holder['pid']} on {holder['host']}, since {holder.get('since')}"
    if "renewed" in holder:
        who += f"; renewed {holder['renewed']}, taken over once {EXPIRY_S:.0f} s pass without"
    return who


def _alive(holder: dict) -> bool:
    """Whether the process holding a lock may still run: on this machine, whether its pid
    does; on another, whether it renewed its lock within ``EXPIRY_S`` (a lock that is
    never renewed, on a shared filesystem, is taken as held)."""
    if holder["host"] != socket.gethostname():
        return _age_s(holder.get("renewed")) < EXPIRY_S
    try:
        os.kill(int(holder["pid"]), 0)  # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True  # someone else's process, or a pid we cannot read: not ours to take
    return True


def _age_s(stamp: object) -> float:
    """Seconds since ISO time ``stamp``; 0 when there is none or it does not parse."""
    try:
        then = datetime.datetime.fromisoformat(str(stamp))
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        return 0.0
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()


class _Heartbeat:
    """Renews a lock in a bucket every ``HEARTBEAT_S`` seconds, from a daemon thread,
    while it is still this conversion's (its token)."""

    def __init__(self, path: str, me: dict):
        self._path, self._me = path, dict(me)
        self._stopped = threading.Event()
        self._lost = False
        self._thread = threading.Thread(target=self._run, name="chute-lock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                if not self.ours():
                    return
                self._me["renewed"] = _now()
                storage.write_atomic(self._path, json.dumps(self._me).encode())
            except Exception as error:  # a refused request: the next beat tries again
                log.warning("could not renew the lock %s: %s", self._path, error)

    def ours(self) -> bool:
        """Whether the lock is still this conversion's (said once when it is not)."""
        if self._lost:
            return False
        holder = _holder(self._path)
        if holder is not None and holder.get("token") == self._me["token"]:
            return True
        self._lost = True
        log.error(
            "the lock %s is no longer this conversion's (%s): another conversion writes "
            "into the same output; check its result with `chute verify`",
            self._path, _who(holder),
        )  # fmt: skip
        return False

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def scratch_prefix(output: str) -> str:
    """The name prefix of the temporary folders a conversion into ``output`` unpacks a
    compressed tar or Parquet files to: ``chute-unpack-<output's tag>-<pid>-``, so that
    a later conversion into the same ``output`` recognises (and removes) what a killed
    one left behind."""
    # The pid in the name: a later run tells a live conversion's scratch from a dead one's.
    return f"{_scratch_tag(output)}{os.getpid()}-"


def _scratch_tag(output: str) -> str:
    # the output normalised as sources are: OUT, OUT/ and its absolute path share a tag
    digest = hashlib.sha256(source_identity(output).encode()).hexdigest()[:12]
    return f"chute-unpack-{digest}-"


def remove_stale_scratch(output: str) -> None:
    """Deletes the temporary folders left by conversions into ``output`` whose process
    is gone (killed with SIGKILL, or a machine that restarted). Call it holding the lock."""
    tag = _scratch_tag(output)
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(root)):
            if not name.startswith(tag):
                continue
            pid = name[len(tag) :].split("-", 1)[0]
            # the temp folder is this machine's: its pids are this host's processes
            host = {"pid": pid, "host": socket.gethostname()}
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(host):
                log.info("removing %s, left by an interrupted conversion", name)
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
