"""Who is converting into ``OUT``: its lock file, and the scratch folders named after it.

While a conversion runs, ``OUT/.chute-lock`` names its process (pid, host, start):
a second conversion into the same ``OUT`` stops at once rather than interleave
shards with it. A conversion that is killed (SIGKILL, a machine that restarted)
leaves its lock and the temporary folders it unpacked a compressed tar or Parquet
files to; both carry its pid, so the next conversion into ``OUT`` recognises them
as a dead process's and takes them over or deletes them.
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
from collections.abc import Iterator

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.sources import source_identity

log = logging.getLogger(__name__)

LOCK_NAME = ".chute-lock"


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
    if not _take(path, me):
        holder = _holder(path)
        if holder is None or _alive(holder):
            who = (
                f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
                if holder
                else "unknown"
            )
            raise ChuteError(
                f"Another chute convert is writing into `output` ({who}). Received: "
                f"output={output!r}; wait for it to end, or, if it is no longer running, "
                f"delete {path}"
            )
        log.warning("taking over the lock of a conversion that is gone: %s", holder)
        storage.remove_if_exists(path)
        # two runs may find the same dead lock: the exclusive create below picks one
        if not _take(path, me):
            raise ChuteError(f"Another chute convert took the lock {path} just now")
    try:
        yield
    finally:
        storage.remove_if_exists(path)


def _take(path: str, me: dict) -> bool:
    """Creates the lock file; False if it exists (atomic for local paths; for other
    filesystems, which have no exclusive create, a check then a write)."""
    text = json.dumps(me).encode()
    if storage.is_local(path):
        try:
            # O_EXCL: the create itself fails if another process made the file first.
            handle = os.open(storage.local_path(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(handle, "wb") as file:
            file.write(text)
        return True
    if storage.exists(path):
        return False
    storage.write_atomic(path, text)
    return True


def _holder(path: str) -> dict | None:
    try:
        holder = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None  # half-written or garbled: its holder is "unknown", never taken over
    return holder if isinstance(holder, dict) and {"pid", "host"} <= set(holder) else None


def _alive(holder: dict) -> bool:
    """Whether the process holding a lock may still run (another machine: assume so)."""
    # Another machine's pid cannot be checked from here: its lock is taken as held.
    if holder["host"] != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)  # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True  # someone else's process, or a pid we cannot read: not ours to take
    return True


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
