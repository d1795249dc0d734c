"""The state of an output folder: finished, resumable, someone else's, busy.

A conversion writes into ``OUT``: shards, ``rejects.csv``, ``source-files.csv``
(each source file's size and modification time) and, last, ``manifest.json``.
While it runs, ``OUT/.chute-lock`` says who is writing (a second conversion into
the same ``OUT`` stops at once) and ``OUT/.chute-work`` holds the plan's stamp
(source, options, layout) and one note per finished shard (see
:mod:`chute.ingest.writer`); a re-run with the same stamp keeps those shards
(after checking their sha256) and redoes the rest.
A re-run on a finished ``OUT`` compares the source's files with
``source-files.csv``: unchanged, it is a no-op; changed, it names what changed.
A resumed run compares them with the listing its interrupted run started from
(``.chute-work/source-files.csv``): a shard holding a changed file is written again.

Sources are compared as the user named them, normalised (:func:`source_identity`):
``src``, ``src/`` and its absolute path are one source, ``hf:OWNER/NAME`` is itself,
not the folder it was downloaded to.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.ingest import sources
from chute.ingest.layout import SHARD_NAME
from chute.ingest.options import ConvertOptions

log = logging.getLogger(__name__)

WORK_DIR = manifest_lib.WORK_DIR
REJECTS_NAME = "rejects.csv"
SOURCE_FILES = "source-files.csv"
LOCK_NAME = ".chute-lock"
_PLAN = "plan.json"


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
        return None
    return holder if isinstance(holder, dict) and {"pid", "host"} <= set(holder) else None


def _alive(holder: dict) -> bool:
    """Whether the process holding a lock may still run (another machine: assume so)."""
    if holder["host"] != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def listing(found: sources.Source) -> list[tuple[str, int, int]]:
    """Each source file's ``(key, size, modification time in ns)``, sorted by key: what
    tells a changed source on a re-run (-1 where the filesystem does not say cheaply).
    An archive source lists its archive files (one, or every WebDataset shard)."""
    if found.containers:
        return sorted(_stat_row(container) for container in found.containers)
    if found.kind in ("npz", "keras") or not found.items or found.items[0].path is None:
        if found.kind == "npz":
            return [_stat_row(found.location)]
        return [(sources.text_key(found.location), -1, -1)]
    return sorted((item.key, *_stat_row(item.path)[1:]) for item in found.items)


def write_listing(output: str, rows: list[tuple[str, int, int]], folder: str = "") -> None:
    """``source-files.csv`` (in ``folder`` of ``output``): the listing a re-run compares
    with."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["key", "size", "mtime_ns"])
    writer.writerows(rows)
    where = storage.join(output, folder) if folder else output
    storage.write_atomic(storage.join(where, SOURCE_FILES), buffer.getvalue().encode())


def _read_listing(path: str) -> dict[str, tuple[int, int]] | None:
    if not storage.exists(path):
        return None
    return {
        row[0]: (int(row[1]), int(row[2]))
        for row in list(csv.reader(io.StringIO(storage.read_bytes(path).decode())))[1:]
    }


def _changes(output: str, rows: list[tuple[str, int, int]], folder: str = "") -> list[str]:
    """What differs between the source's files now and when ``output`` was converted
    (or, with ``folder`` the work folder, when the interrupted run started); nothing
    known, for conversions made before the listing was kept."""
    where = storage.join(output, folder) if folder else output
    before = _read_listing(storage.join(where, SOURCE_FILES))
    if before is None:
        return []
    return [f"{what} {key}" for what, key in _diff(before, rows)]


def _diff(before: dict[str, tuple[int, int]], rows: list[tuple[str, int, int]]) -> list:
    """``(what, key)`` for each file added, removed or changed (size or time) since
    ``before``, in that order, each sorted by key."""
    now = {key: (size, mtime) for key, size, mtime in rows}
    added = sorted(set(now) - set(before))
    removed = sorted(set(before) - set(now))
    changed = sorted(k for k in set(now) & set(before) if now[k] != before[k])
    return (
        [("added", k) for k in added]
        + [("removed", k) for k in removed]
        + [("changed", k) for k in changed]
    )


def changed_since_start(output: str, rows: list[tuple[str, int, int]]) -> set[str]:
    """Keys of the source files added, removed or changed since the interrupted run of
    this plan started (its listing in the work folder); then this run's listing is
    what a later resume compares with."""
    before = _read_listing(storage.join(output, WORK_DIR, SOURCE_FILES))
    changed = set() if before is None else {key for _, key in _diff(before, rows)}
    write_listing(output, rows, WORK_DIR)
    return changed


def source_identity(source: str | os.PathLike) -> str:
    """A source as the user named it, normalised, so that a re-run or resume recognises
    it however it is spelled: a local path made absolute (``src``, ``src/``,
    ``./src`` and ``/abs/src`` are one), a remote one without a trailing ``/``;
    ``hf:`` and ``keras:`` names as they are (never the folder a download went to);
    a name that is not UTF-8 escaped as keys are (``sources.text_key``).

    Example:
        >>> source_identity("hf:AI-Lab-Makerere/beans"), source_identity("gs://b/imgs/")
        ('hf:AI-Lab-Makerere/beans', 'gs://b/imgs')
        >>> source_identity("data/../src/") == os.path.abspath("src")
        True
    """
    source = os.fspath(source).strip()
    if source.startswith(("hf:", "keras:")):
        return source
    if storage.is_local(source):
        return sources.text_key(os.path.abspath(storage.local_path(source)))
    return sources.text_key(source.rstrip("/") or source)


def finished_before_scan(
    source: str, output: str, options: ConvertOptions, files: list[str] | None
) -> manifest_lib.Manifest | None:
    """The manifest of an identical finished conversion, found without scanning the
    source: only for sources read from files whose size and time tell a change
    (``files``: archives, Parquet, ``.npz``, WebDataset shards; None otherwise).
    None means: scan, then :func:`existing_state` decides."""
    if files is None or not storage.exists(storage.join(output, manifest_lib.MANIFEST_NAME)):
        return None
    existing = manifest_lib.load(output)
    defaults = type(options)().to_dict()
    same = (
        source_identity(existing.source.get("location") or "") == source_identity(source)
        and {**defaults, **(existing.options or {})} == options.to_dict()
    )
    if not same or _changes(output, [_stat_row(path) for path in files]):
        return None
    return existing


def _stat_row(path: str) -> tuple[str, int, int]:
    """``(path, size, modification time in ns)`` of a file (-1 where not known cheaply);
    the path as a key (a name that is not UTF-8 escaped, see ``sources.text_key``)."""
    size, mtime = -1, -1
    if storage.is_local(path):
        with contextlib.suppress(OSError):
            stat = os.stat(storage.local_path(path))
            size, mtime = stat.st_size, stat.st_mtime_ns
    return sources.text_key(path), size, mtime


# -- temporary folders --------------------------------------------------------------------


def scratch_prefix(output: str) -> str:
    """The name prefix of the temporary folders a conversion into ``output`` unpacks a
    compressed tar or Parquet files to: ``chute-unpack-<output's tag>-<pid>-``, so that
    a later conversion into the same ``output`` recognises (and removes) what a killed
    one left behind."""
    return f"{_scratch_tag(output)}{os.getpid()}-"


def _scratch_tag(output: str) -> str:
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
            host = {"pid": pid, "host": socket.gethostname()}
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(host):
                log.info("removing %s, left by an interrupted conversion", name)
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def existing_state(
    source: str,
    output: str,
    options: ConvertOptions,
    overwrite: bool,
    files: list[tuple[str, int, int]] | None = None,
) -> manifest_lib.Manifest | None:
    """Returns the manifest of an identical finished run, or None to (re)start.

    Raises when the output holds a different conversion or other files, or when
    the source's ``files`` (see :func:`listing`) changed since an identical
    finished run, unless ``overwrite`` (then chute's own files there are removed).
    """
    if not storage.check_output(output, "output"):
        return None
    wanted = {"source": source_identity(source), "options": options.to_dict()}
    defaults = type(options)().to_dict()  # options added since: their defaults were in force
    manifest_file = storage.join(output, manifest_lib.MANIFEST_NAME)
    plan_file = storage.join(output, WORK_DIR, _PLAN)
    if storage.exists(manifest_file):
        existing = manifest_lib.load(output)
        previous = {
            "source": source_identity(existing.source.get("location") or ""),
            "options": {**defaults, **(existing.options or {})},
        }
        if previous == wanted and not overwrite:
            changes = _changes(output, files or [])
            if not changes:
                return existing
            shown = "; ".join(changes[:10]) + (
                f"; ... {len(changes)} in all" if len(changes) > 10 else ""
            )
            raise ChuteError(
                f"`source` changed since {output!r} was converted from it ({shown}). Pass "
                "overwrite=True (--overwrite) to convert it again, or choose another folder"
            )
    elif storage.exists(plan_file):
        stored = json.loads(storage.read_bytes(plan_file))
        previous = {
            "source": source_identity(stored.get("source") or ""),
            "options": {**defaults, **(stored.get("options") or {})},
        }
        if previous == wanted and not overwrite:
            return None  # resume
    else:
        # a lone rejects.csv: what a conversion refused before writing any shard
        ours = (LOCK_NAME, REJECTS_NAME)
        if [n for n in storage.listdir(output) if n not in ours] and not overwrite:
            raise ChuteError(
                "`output` is a non-empty folder that chute did not write. "
                f"Received: output={output!r}; choose an empty or new folder"
            )
        previous = None
    if previous is None:  # an empty folder, or chute's files to be replaced
        remove_outputs(output)
        return None
    holds = "a conversion"
    if previous != wanted:
        changed = [
            f"{key}: {previous['options'].get(key)!r} -> {value!r}"
            for key, value in wanted["options"].items()
            if (previous.get("options") or {}).get(key) != value
        ]
        if previous.get("source") != wanted["source"]:
            changed.insert(0, f"source: {previous.get('source')!r} -> {wanted['source']!r}")
        holds = f"a conversion with other options ({'; '.join(changed)})"
    storage.replace_or_refuse(
        output, "output", holds=holds, overwrite=overwrite, entries=_outputs(output)
    )
    return None


def _outputs(output: str) -> list[str]:
    """The names in ``output`` that a conversion writes."""
    return [
        name
        for name in storage.listdir(output)
        if _is_shard(name)
        or name
        in (manifest_lib.MANIFEST_NAME, REJECTS_NAME, SOURCE_FILES, WORK_DIR, record_index.FOLDER)
    ]


def remove_orphans(output: str, planned: set[str]) -> None:
    """Deletes shard files in ``output`` that the current plan does not name (left by
    an interrupted run under another plan): a finished folder holds only its own. Record
    indexes beside the shards (where chute wrote them before their ``index/`` folder) go
    too: this run writes its shards' indexes into the folder."""
    for name in storage.listdir(output):
        if _is_shard(name) and name not in planned:
            log.info("removing %s, a shard of an earlier plan", name)
            storage.remove(storage.join(output, name))
    folder = record_index.folder(output)
    if storage.isdir(folder):
        indexes = {record_index.index_name(name) for name in planned}
        for name in storage.listdir(folder):
            if name not in indexes:
                log.info("removing %s/%s, an index of an earlier plan", record_index.FOLDER, name)
                storage.remove_if_exists(storage.join(folder, name))


def _is_shard(name: str) -> bool:
    """Whether ``name`` is a shard file or a shard's record index."""
    if name.endswith(record_index.SUFFIX):
        name = name.removesuffix(record_index.SUFFIX) + record_index.SHARD_SUFFIX
    return bool(SHARD_NAME.match(name))


def remove_outputs(output: str) -> None:
    """Deletes what a conversion wrote into ``output`` (and nothing else)."""
    for name in _outputs(output):
        storage.remove_if_exists(storage.join(output, name))


def remove_work_dir(output: str) -> None:
    """Deletes the work folder of a conversion."""
    storage.remove_if_exists(storage.join(output, WORK_DIR))


def start_work(output: str, stamp: dict) -> None:
    """Creates the work folder for a plan; forgets notes made under another plan."""
    work = storage.join(output, WORK_DIR)
    storage.makedirs(work)
    plan_file = storage.join(work, _PLAN)
    if storage.exists(plan_file) and json.loads(storage.read_bytes(plan_file)) != stamp:
        log.warning("the source changed since the interrupted run; starting over")
        storage.rmtree(work)
        storage.makedirs(work)
    storage.write_atomic(plan_file, json.dumps(stamp, sort_keys=True).encode())


def write_rejects(output: str, rejects: list[dict]) -> None:
    """``rejects.csv``: every skipped input with its reason."""
    lines = ["key,reason"] + [_csv_row(r["key"], r["reason"]) for r in rejects]
    storage.write_atomic(storage.join(output, REJECTS_NAME), ("\n".join(lines) + "\n").encode())


def _csv_row(*cells: str) -> str:
    return ",".join(
        '"' + c.replace('"', '""') + '"' if any(x in c for x in ',"\n') else c for c in cells
    )
