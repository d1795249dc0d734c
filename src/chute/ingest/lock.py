"""Who is converting into ``OUT``: its lock file, and the scratch folders named after it.

While a conversion runs, ``OUT/.chute-lock`` names its process (pid, host, start):
a second conversion into the same ``OUT`` stops at once rather than interleave
shards with it. A conversion that is killed (SIGKILL, a machine that restarted)
leaves its lock and the temporary folders it unpacked a compressed tar or Parquet
files to; both carry its pid, so the next conversion into ``OUT`` recognises them
as a dead process's and takes them over or deletes them.

In a bucket nothing can be flock'ed and another machine's pid cannot be asked: the lock
is an object made with a conditional put (only one of two conversions creates it:
:func:`chute.format.storage.create`), carrying a token, and its holder renews it every
``HEARTBEAT_S`` seconds. No clock is compared with another: a conversion that finds
the lock watches it, and takes it over only once it stayed unchanged for ``EXPIRY_S``
seconds timed on its own monotonic clock (a renewal seen meanwhile: the holder runs,
and this conversion stops). Only the pid namespace of one boot of one machine (not a
hostname, which containers share) trusts a pid check instead. The takeover replaces
only the version it watched (on S3 atomically, ``If-Match``): of two takers one wins,
and reads its token back. The holder checks its token at every renewal and renews
only its own version; once another conversion holds the lock, it stops before its
next shard or manifest (:func:`check_held`). The temporary folders are on the
converting machine, never in the bucket; the shards' work folder
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
import time
import uuid
from collections.abc import Iterator

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.sources import source_identity

log = logging.getLogger(__name__)

LOCK_NAME = ".chute-lock"
HEARTBEAT_S = 30.0  # how often a lock in a bucket is renewed while its conversion runs
EXPIRY_S = 600.0  # a lock in a bucket watched this long without a change is a dead one's
POLL_S = 5.0  # how often a conversion waiting on another's lock in a bucket looks again
SETTLE_S = 2.0  # after a takeover, a pause before reading the lock back (see _confirm)

# This machine's clocks, the only ones that time a watch (the tests drive them).
_monotonic = time.monotonic
_sleep = time.sleep

# output -> the renewal of the lock this process holds on it (bucket locks only)
_held: dict[str, _Heartbeat] = {}


@contextlib.contextmanager
def locked(output: str) -> Iterator[None]:
    """Holds ``OUT/.chute-lock`` while a conversion writes into ``output`` (created if
    needed, and removed again if it is left empty). A lock left by a process that is
    gone (same machine) is taken over; in a bucket, also one not renewed for
    ``EXPIRY_S`` seconds (waited for here).

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


def check_held(output: str) -> None:
    """Raises if another conversion took over the lock this process holds on ``output``
    (in a bucket); a conversion calls it before each shard and before its manifest.

    Raises:
        ChuteError: the lock is another conversion's now.
    """
    heartbeat = _held.get(output)
    if heartbeat is not None and heartbeat.lost:
        raise ChuteError(
            f"Another chute convert took over `output` while this one was writing; this one "
            f"stopped before writing more. Received: output={output!r}; check the other's "
            "result with `chute verify`, or run this one again once it ends (it resumes)"
        )


@contextlib.contextmanager
def _lock_file(output: str) -> Iterator[None]:
    path = storage.join(output, LOCK_NAME)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    if storage.is_local(path):
        _take_local(path, me, output)
        try:
            yield
        finally:
            storage.remove_if_exists(path)
        return
    # renewed while held; whose it is, by the token; "renewals" changes it at every renewal
    me |= {"machine": _machine(), "token": uuid.uuid4().hex, "renewed": me["since"], "renewals": 0}
    heartbeat = _held[output] = _Heartbeat(path, me, _take_in_bucket(path, me, output))
    try:
        yield
    finally:
        heartbeat.stop()
        _held.pop(output, None)
        # only its own: a lock taken over after a long pause is the other's now
        if heartbeat.ours():
            storage.remove_if_exists(path)


def _take_local(path: str, me: dict, output: str) -> None:
    """Creates a local lock file, or takes over one whose process is gone."""
    if _take(path, me):
        return
    holder = _holder(path)
    if holder is None or _alive(holder):
        raise _busy(output, path, holder)
    log.warning("taking over the lock of a conversion that is gone: %s", holder)
    storage.remove_if_exists(path)
    # two runs may find the same dead lock: the exclusive create below picks one
    if not _take(path, me):
        raise ChuteError(f"Another chute convert took the lock {path} just now")


def _take_in_bucket(path: str, me: dict, output: str) -> str:
    """Creates the lock in a bucket, or takes over one whose conversion is gone; returns
    the version this conversion wrote (:func:`chute.format.storage.version`)."""
    for _ in range(3):  # a lock that ends between the create and the look: create again
        if _take(path, me):
            return _confirm(path, me, output)
        seen, holder = storage.version(path), _holder(path)
        if seen is None:
            continue
        if not _gone(path, seen, holder):
            if storage.version(path) is None:  # it ended while watched
                continue
            raise _busy(output, path, holder)
        log.warning("taking over the lock of a conversion that is gone: %s", holder)
        # Only the version watched: of two takers that watched it, one replaces it.
        if not storage.replace(path, _dump(me), seen):
            raise _taken(output, path)
        # where the replace is a check, then a write, the other taker's write shows by then
        _sleep(SETTLE_S)
        return _confirm(path, me, output)
    raise _busy(output, path, _holder(path))


def _confirm(path: str, me: dict, output: str) -> str:
    """The version of the lock just written, read back: still this conversion's token."""
    # The version first: read before the token, it cannot be a later writer's.
    seen, holder = storage.version(path), _holder(path)
    if seen is None or holder is None or holder.get("token") != me["token"]:
        raise _taken(output, path, holder)
    return seen


def _gone(path: str, seen: str, holder: dict | None) -> bool:
    """Whether the conversion holding a lock in a bucket is gone: on this machine (the
    same boot and pid namespace), whether its pid is; elsewhere, whether its lock stays
    ``seen`` for ``EXPIRY_S`` seconds, watched here."""
    if holder is None or "renewed" not in holder:
        return False  # garbled, or never renewed (a chute before renewals): held
    if holder.get("machine") and holder.get("machine") == _machine():
        return not _pid_alive(holder["pid"])
    log.warning(
        "%s is held by %s; taken over if it is not renewed within %.0f s (timed here)",
        path, _who(holder), EXPIRY_S,
    )  # fmt: skip
    start = _monotonic()
    while _monotonic() - start < EXPIRY_S:
        _sleep(POLL_S)
        if storage.version(path) != seen:
            return False  # renewed (or ended): its conversion runs
    return True


def _take(path: str, me: dict) -> bool:
    """Creates the lock file; False if it exists (atomic locally and on object stores
    with conditional puts; see :func:`chute.format.storage.create`)."""
    return storage.create(path, _dump(me))


def _dump(me: dict) -> bytes:
    return json.dumps(me).encode()


def _holder(path: str) -> dict | None:
    try:
        holder = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None  # half-written or garbled: its holder is "unknown", never taken over
    return holder if isinstance(holder, dict) and {"pid", "host"} <= set(holder) else None


def _busy(output: str, path: str, holder: dict | None) -> ChuteError:
    return ChuteError(
        f"Another chute convert is writing into `output` ({_who(holder)}). Received: "
        f"output={output!r}; wait for it to end, or, if it is no longer running, "
        f"delete {path}"
    )


def _taken(output: str, path: str, holder: dict | None = None) -> ChuteError:
    return ChuteError(
        f"Another chute convert took over `output` just now ({_who(holder)}). Received: "
        f"output={output!r}; wait for it to end, or, if it is no longer running, "
        f"delete {path}"
    )


def _who(holder: dict | None) -> str:
    if holder is None:
        return "unknown"
    who = f"pid {holder['pid']} on {holder['host']}, since {holder.get('since')}"
    if "renewed" in holder:
        who += f"; renewed {holder['renewed']} by its clock"
    return who


def _alive(holder: dict) -> bool:
    """Whether the process holding a local lock may still run: on this machine, whether
    its pid does; a lock of another host (on a shared filesystem) is taken as held."""
    if holder["host"] != socket.gethostname():
        return True
    return _pid_alive(holder["pid"])


def _pid_alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # someone else's process, or a pid we cannot read: not ours to take
    return True


def _machine() -> str | None:
    """This boot of this machine and this process's pid namespace (Linux): pids mean one
    process only where both match (a hostname does not tell: containers on two machines
    may share one); None where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


class _Heartbeat:
    """Renews a lock in a bucket every ``HEARTBEAT_S`` seconds, from a daemon thread,
    while it is still this conversion's (its token); ``lost`` once it is not."""

    def __init__(self, path: str, me: dict, seen: str):
        self._path, self._me, self._seen = path, dict(me), seen
        self.lost = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chute-lock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                if not self.ours():
                    return
                self._me["renewed"] = _now()  # shown to others; they time by their own clock
                self._me["renewals"] += 1
                # Over the version just read only: never over a lock another took over since.
                if not storage.replace(self._path, _dump(self._me), self._seen):
                    self._lose(_holder(self._path))
                    return
            except Exception as error:  # a refused request: the next beat tries again
                log.warning("could not renew the lock %s: %s", self._path, error)

    def ours(self) -> bool:
        """Whether the lock is still this conversion's (said once when it is not)."""
        if self.lost:
            return False
        # The version first: read before the token, it cannot be a later writer's.
        seen, holder = storage.version(self._path), _holder(self._path)
        if seen is not None and holder is not None and holder.get("token") == self._me["token"]:
            self._seen = seen
            return True
        self._lose(holder)
        return False

    def _lose(self, holder: dict | None) -> None:
        self.lost = True
        log.error(
            "the lock %s is no longer this conversion's (%s): another conversion writes "
            "into the same output; this one stops before its next shard",
            self._path, _who(holder),
        )  # fmt: skip

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
