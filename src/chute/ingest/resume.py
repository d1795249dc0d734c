"""The state of an output folder: finished, resumable, someone else's, empty.

A conversion writes into ``OUT``: shards, ``rejects.csv``, ``source-files.csv``
(each source file's size and modification time) and, last, ``manifest.json``.
While it runs, ``OUT/.chute-lock`` says who is writing (see :mod:`chute.ingest.lock`)
and ``OUT/.chute-work`` holds the plan's stamp (source, options, layout) and one
note per finished shard (see :mod:`chute.ingest.writer`); a re-run with the same
stamp keeps those shards (after checking their sha256) and redoes the rest.
A re-run on a finished ``OUT`` compares the source's files with
``source-files.csv``: unchanged, it is a no-op; changed, it names what changed.
A resumed run compares them with the listing its interrupted run started from
(``.chute-work/source-files.csv``): a shard holding a changed file is written again.

What a re-run does is one decision (:func:`decide`) over three things, each
computed once: the folder's state (:func:`read_folder`), whether it holds the same
conversion (:class:`Conversion`, compared with ``==``), and ``overwrite``.
Sources are compared as the user named them, normalised
(:func:`~chute.ingest.sources.source_identity`): ``src``, ``src/`` and its absolute
path are one source, ``hf:OWNER/NAME`` is itself, not the folder it was downloaded to.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import json
import logging
from typing import Any

from chute.errors import ChuteError
from chute.format import contents, storage
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.ingest.layout import SHARD_NAME
from chute.ingest.lock import LOCK_NAME
from chute.ingest.options import ConvertOptions
from chute.ingest.sources import source_identity
from chute.ingest.sources.base import ListingRow, stat_row

log = logging.getLogger(__name__)

WORK_DIR = manifest_lib.WORK_DIR
REJECTS_NAME = "rejects.csv"
SOURCE_FILES = "source-files.csv"
_PLAN = "plan.json"


# -- what the folder holds ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What a conversion converted: the source as named (normalised) and every option.

    Two conversions are the same when they compare equal; a stamp written by an
    older chute lacks the options added since, which had their defaults then.
    """

    source: str
    options: dict[str, Any]

    @classmethod
    def of(cls, source: str, options: dict[str, Any] | None) -> Conversion:
        """From a source as named and options as stored (a manifest's, a plan's, or now)."""
        # Today's defaults under the stored options: an older chute's stamp still compares.
        return cls(source_identity(source), {**ConvertOptions().to_dict(), **(options or {})})

    def changes_from(self, previous: Conversion) -> list[str]:
        """What differs from ``previous``, as ``name: before -> now``, source first."""
        changed = [
            f"{key}: {previous.options.get(key)!r} -> {value!r}"
            for key, value in self.options.items()
            if previous.options.get(key) != value
        ]
        if previous.source != self.source:
            changed.insert(0, f"source: {previous.source!r} -> {self.source!r}")
        return changed


class FolderState(enum.Enum):
    """What an output folder holds, before a conversion writes into it."""

    NEW = "new"  # not there: nothing to decide
    EMPTY = "empty"  # nothing, or only the lock and a rejects.csv of a refused run
    FINISHED = "finished"  # a manifest: a conversion that ended
    INTERRUPTED = "interrupted"  # a work folder's plan and no manifest: a conversion killed
    FOREIGN = "foreign"  # files chute did not write (or shards without their plan)


@dataclasses.dataclass(frozen=True)
class Folder:
    """An output folder read once: its state and, when it holds one, the conversion
    (and a finished one's manifest)."""

    state: FolderState
    holds: Conversion | None = None
    manifest: manifest_lib.Manifest | None = None


def read_folder(output: str) -> Folder:
    """Classifies ``output``: the manifest first (a finished run wins over a work folder
    left beside it), then the interrupted run's plan, then whatever else is there.

    Raises:
        ChuteError: ``output`` is a file.
    """
    if not storage.check_output(output, "output"):
        return Folder(FolderState.NEW)
    # The manifest first: it is written last, so it alone says the conversion ended.
    if storage.exists(storage.join(output, manifest_lib.MANIFEST_NAME)):
        manifest = manifest_lib.load(output)
        holds = Conversion.of(manifest.source.get("location") or "", manifest.options)
        return Folder(FolderState.FINISHED, holds, manifest)
    plan_file = storage.join(output, WORK_DIR, _PLAN)
    if storage.exists(plan_file):
        stored = json.loads(storage.read_bytes(plan_file))
        holds = Conversion.of(stored.get("source") or "", stored.get("options"))
        return Folder(FolderState.INTERRUPTED, holds)
    # a lone rejects.csv: what a conversion refused before writing any shard
    ours = (LOCK_NAME, REJECTS_NAME)
    if [name for name in storage.listdir(output) if name not in ours]:
        return Folder(FolderState.FOREIGN)
    return Folder(FolderState.EMPTY)


class Action(enum.Enum):
    """What a conversion does with its output folder."""

    START = "start"  # write into it as it is (new)
    REPLACE = "replace"  # delete chute's files there, then start
    RESUME = "resume"  # keep the shards the interrupted run finished
    KEEP = "keep"  # the same conversion is there: nothing to do, unless the source changed
    REFUSE = "refuse"  # it holds a conversion: replaced only with overwrite
    REFUSE_FOREIGN = "refuse-foreign"  # it holds files chute did not write


def decide(state: FolderState, same: bool, overwrite: bool) -> Action:
    """The one rule over folder state x same conversion x ``overwrite``.

    Example:
        >>> decide(FolderState.INTERRUPTED, same=True, overwrite=False)
        <Action.RESUME: 'resume'>
        >>> decide(FolderState.FINISHED, same=False, overwrite=False)
        <Action.REFUSE: 'refuse'>
    """
    if state is FolderState.NEW:
        return Action.START
    if state is FolderState.EMPTY or overwrite:
        # overwrite deletes only chute's own files: others (FOREIGN) stay where they are
        return Action.REPLACE
    if state is FolderState.FOREIGN:
        return Action.REFUSE_FOREIGN
    if not same:
        return Action.REFUSE
    return Action.KEEP if state is FolderState.FINISHED else Action.RESUME


def existing_state(
    source: str,
    output: str,
    options: ConvertOptions,
    overwrite: bool,
    files: list[ListingRow] | None = None,
) -> manifest_lib.Manifest | None:
    """Returns the manifest of an identical finished run, or None to (re)start; what
    the folder held is removed first when the conversion starts over.

    Raises:
        ChuteError: the output holds a different conversion or other files, or the
            source's ``files`` (see :meth:`~chute.ingest.sources.Source.listing`)
            changed since an identical finished run, unless ``overwrite`` (then
            chute's own files there are removed).
    """
    folder = read_folder(output)
    wanted = Conversion.of(source, options.to_dict())
    action = decide(folder.state, folder.holds == wanted, overwrite)
    if action is Action.KEEP:
        changes = _changes(output, files or [])
        if not changes:
            return folder.manifest
        shown = "; ".join(changes[:10]) + (
            f"; ... {len(changes)} in all" if len(changes) > 10 else ""
        )
        raise ChuteError(
            f"`source` changed since {output!r} was converted from it ({shown}). Pass "
            "overwrite=True (--overwrite) to convert it again, or choose another folder"
        )
    if action is Action.REFUSE_FOREIGN:
        raise ChuteError(
            "`output` is a non-empty folder that chute did not write. "
            f"Received: output={output!r}; choose an empty or new folder"
        )
    if action is Action.REFUSE:
        # a same conversion is kept or resumed, so this one differs; the refusal is worded
        # as for chute's other output folders (train's run folder)
        changed = wanted.changes_from(folder.holds) if folder.holds is not None else []
        holds = f"a conversion with other options ({'; '.join(changed)})"
        storage.replace_or_refuse(
            output, "output", holds=holds, overwrite=False, entries=_outputs(output)
        )
    if action is Action.REPLACE:
        remove_outputs(output)
    return None  # START, RESUME, REPLACE: the conversion runs


def finished_before_scan(
    source: str, output: str, options: ConvertOptions, files: list[str] | None
) -> manifest_lib.Manifest | None:
    """The manifest of an identical finished conversion, found without scanning the
    source: only for sources read from files whose size and time tell a change
    (``files``: archives, Parquet, ``.npz``, WebDataset shards; None otherwise).
    None means: scan, then :func:`existing_state` decides."""
    # Without container files, only a scan can tell whether the source changed.
    if files is None or not storage.exists(storage.join(output, manifest_lib.MANIFEST_NAME)):
        return None
    folder = read_folder(output)
    if options.val_fraction is None and folder.manifest is not None:
        # Unset, it is decided by the source's splits: those the finished run did not carve.
        carved = {
            name for name in ("val", "test") if folder.manifest.options.get(f"{name}_fraction")
        }
        options = options.for_source_splits(set(folder.manifest.splits) - carved)
    if folder.holds != Conversion.of(source, options.to_dict()):
        return None
    if _changes(output, [stat_row(path) for path in files]):
        return None
    return folder.manifest


# -- source listings ----------------------------------------------------------------------


def write_listing(output: str, rows: list[ListingRow], folder: str = "") -> None:
    """``source-files.csv`` (in ``folder`` of ``output``): the listing a re-run compares
    with."""
    where = storage.join(output, folder) if folder else output
    _write_csv(storage.join(where, SOURCE_FILES), ["key", "size", "mtime_ns"], rows)


def _read_listing(path: str) -> dict[str, tuple[int, int]] | None:
    if not storage.exists(path):
        return None
    return {
        row[0]: (int(row[1]), int(row[2]))
        for row in list(csv.reader(io.StringIO(storage.read_bytes(path).decode())))[1:]
    }


def changes_since(output: str, rows: list[ListingRow]) -> list[str] | None:
    """What differs between the source's files now (``rows``) and when ``output`` was
    converted; None when the conversion kept no listing (made by an older chute)."""
    if not storage.exists(storage.join(output, SOURCE_FILES)):
        return None
    return _changes(output, rows)


def _changes(output: str, rows: list[ListingRow]) -> list[str]:
    """What differs between the source's files now and when ``output`` was converted;
    nothing known, for conversions made before the listing was kept."""
    before = _read_listing(storage.join(output, SOURCE_FILES))
    if before is None:
        return []
    return [f"{what} {key}" for what, key in _diff(before, rows)]


def _diff(before: dict[str, tuple[int, int]], rows: list[ListingRow]) -> list:
    """``(what, key)`` for each file added, removed or changed (size or time) since
    ``before``, in that order, each sorted by key."""
    now = {key: (size, mtime) for key, size, mtime in rows}
    added = sorted(set(now) - set(before))
    removed = sorted(set(before) - set(now))
    # Size or modification time: a file rewritten in place changes one or the other.
    changed = sorted(k for k in set(now) & set(before) if now[k] != before[k])
    return (
        [("added", k) for k in added]
        + [("removed", k) for k in removed]
        + [("changed", k) for k in changed]
    )


def changed_since_start(output: str, rows: list[ListingRow]) -> set[str]:
    """Keys of the source files added, removed or changed since the interrupted run of
    this plan started (its listing in the work folder); then this run's listing is
    what a later resume compares with."""
    before = _read_listing(storage.join(output, WORK_DIR, SOURCE_FILES))
    changed = set() if before is None else {key for _, key in _diff(before, rows)}
    write_listing(output, rows, WORK_DIR)
    return changed


# -- chute's files in the folder ----------------------------------------------------------


def _outputs(output: str) -> list[str]:
    """The names in ``output`` that a conversion writes."""
    return [
        name
        for name in storage.listdir(output)
        if _is_shard(name)
        or name
        in (
            manifest_lib.MANIFEST_NAME,
            REJECTS_NAME,
            SOURCE_FILES,
            WORK_DIR,
            record_index.FOLDER,
            contents.FOLDER,
        )
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
    # An index beside the shards is judged by the shard name it belongs to.
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
    # Another plan's finished shards must not be kept: its notes are dropped with the folder.
    if storage.exists(plan_file) and json.loads(storage.read_bytes(plan_file)) != stamp:
        log.warning("the source changed since the interrupted run; starting over")
        storage.rmtree(work)
        storage.makedirs(work)
    storage.write_atomic(plan_file, json.dumps(stamp, sort_keys=True).encode())


def write_rejects(output: str, rejects: list[dict]) -> None:
    """``rejects.csv``: every skipped input with its reason."""
    rows = [(reject["key"], reject["reason"]) for reject in rejects]
    _write_csv(storage.join(output, REJECTS_NAME), ["key", "reason"], rows)


def _write_csv(path: str, header: list[str], rows: list) -> None:
    # "\n", not csv's "\r\n": the files stay as earlier chute versions wrote them
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    storage.write_atomic(path, buffer.getvalue().encode())
