"""The run directory: where a training run keeps its model, checkpoints, logs and reports.

Layout: ``bundle/`` (the model bundle, written last: its ``chute.json``
means the run finished), ``checkpoints/`` (``best.keras``, ``last.keras``),
``backup/`` (while a run is unfinished: what a resumed run continues from),
``logs/`` (TensorBoard), ``history.csv``/``.json``, ``curves.png``,
``config.json``, ``summary.json``, the validation reports, and ``started.json``
(what the backup depends on: a run resumes only with the same). In a
multi-worker run the chief writes it; each other worker keeps its files in
``worker-N/`` inside it.

Example:
    >>> run = prepare("runs/kn", overwrite=False)  # doctest: +SKIP
    >>> run.checkpoint("best")  # doctest: +SKIP
    'runs/kn/checkpoints/best.keras'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from chute.format import storage
from chute.format.bundle import META_NAME, RUN_SUBDIR

log = logging.getLogger(__name__)

# what a run writes: replaced by --overwrite (nothing else in the folder is touched)
STARTED = "started.json"  # what the backup depends on (see prepare)
PROGRESS = "progress-{}.json"  # a phase's history while it runs (see trainable.progress)
OPTIONAL = ("mix",)  # keys of started.json recorded only when present (absent: none)
_PHASES = ("all", "head", "fine-tune")
_ENTRIES = (
    "bundle", "checkpoints", "logs", "backup", "history.csv", STARTED, "budget.json",
    *(PROGRESS.format(phase) for phase in _PHASES),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunDir:
    """This process's run folder (a worker's own subfolder for non-chief workers).

    Attributes:
        path: the folder this process writes.
        resumed: an interrupted run left a backup here to continue from.
    """

    path: str
    resumed: bool

    def join(self, *parts: str) -> str:
        """A path inside the run folder."""
        return storage.join(self.path, *parts)

    @property
    def bundle(self) -> str:
        """Where the model bundle goes."""
        return self.join(RUN_SUBDIR)

    @property
    def backup(self) -> str:
        """The ``BackupAndRestore`` (or checkpoint manager) folder of an unfinished run."""
        return self.join("backup")

    @property
    def logs(self) -> str:
        """TensorBoard logs."""
        return self.join("logs")

    def checkpoint(self, which: str) -> str:
        """``checkpoints/best.keras`` or ``checkpoints/last.keras``."""
        return self.join("checkpoints", f"{which}.keras")

    def write_json(self, name: str, value: Any) -> None:
        """Writes ``value`` as JSON into the run folder, atomically."""
        text = json.dumps(value, indent=1, default=float)
        storage.write_atomic(self.join(name), text.encode())


def prepare(
    run_dir: str | os.PathLike,
    *,
    overwrite: bool,
    worker_index: int = 0,
    started: dict[str, Any] | None = None,
) -> RunDir:
    """Creates the run folder of this process; refuses a finished run unless ``overwrite``.

    An interrupted run (its backup) is resumed when ``started`` (what the backup depends
    on: model, input, classes, backend, the dataset's fingerprints...) is what it was
    started with; other options or data are refused unless ``overwrite``, which starts
    afresh. ``started`` is recorded.

    Raises:
        ChuteError: ``run_dir`` holds a finished run, or an interrupted one started with
            other options, and ``overwrite`` is False.
    """
    run_dir = os.fspath(run_dir)
    if storage.check_output(run_dir, "run_dir") and storage.exists(
        storage.join(run_dir, RUN_SUBDIR, META_NAME)
    ):
        storage.replace_or_refuse(
            run_dir, "run_dir", holds="a finished run", overwrite=overwrite, entries=_ENTRIES
        )
    # Each MultiWorkerMirroredStrategy worker keeps a backup of its own; the chief's is the folder.
    path = storage.join(run_dir, f"worker-{worker_index}") if worker_index else run_dir
    storage.makedirs(path)
    run = RunDir(path, resumed=storage.exists(storage.join(path, "backup")))
    if started is None:
        return run
    if run.resumed and (differences := _differences(run, started)):
        # A changed dataset: the backup's position is in an order that no longer exists.
        on_data = ", on the dataset it was started with" if "data" in differences else ""
        holds = (
            f"an interrupted run started with other options ({'; '.join(differences.values())}"
            f"; the command it was started with resumes it{on_data})"
        )
        storage.replace_or_refuse(
            path, "run_dir", holds=holds, overwrite=overwrite, entries=_ENTRIES
        )
        run = RunDir(path, resumed=False)
    # Recorded only for a fresh start: a resumed run keeps what it was started with.
    if not run.resumed:
        run.write_json(STARTED, started)
    return run


def _differences(run: RunDir, started: dict[str, Any]) -> dict[str, str]:
    """What differs between the options a run was started with and ``started``, each
    said (``{}``: nothing, or a run from before chute recorded them; what an older chute
    did not record is not checked, and said in the log)."""
    path = run.join(STARTED)
    if not storage.exists(path):
        return {}
    before = json.loads(storage.read_bytes(path))
    unrecorded = [key for key in started if key not in before and key not in OPTIONAL]
    if unrecorded:
        log.info(
            "resuming %s without checking %s: an older chute started it and did not record it",
            run.path,
            ", ".join(unrecorded),
        )
    # Backups that count examples resume on another per-replica batch (chute.fit.position).
    elastic = before.get("position") == started.get("position") == "examples"
    changed = [
        key
        for key in started
        if key in before and before[key] != started[key] and not (elastic and key == "batch_size")
    ]
    # Recorded only when there is one: absent is none (a run that mixed nothing in).
    changed += [
        key for key in OPTIONAL if key not in changed and before.get(key) != started.get(key)
    ]
    return {key: _said(key, before.get(key), started.get(key)) for key in changed}


def _mixed(mix: Any) -> str:
    """A run's mixed datasets in words: each one's location and share (and its data)."""
    if not mix:
        return "nothing"
    return ", ".join(
        f"{entry.get('location')} {entry.get('weight', 0):.0%} "
        f"({entry.get('examples')} examples, {entry.get('fingerprint')})"
        for entry in mix
    )


def _said(key: str, then: Any, now: Any) -> str:
    """One difference in words; the dataset's (``data``: per split, its examples, shards
    and fingerprint, see :meth:`chute.format.splits.Split.fingerprint`) split by split."""
    if key == "dataset_version":
        return (
            f"the run reads version {now} of the dataset and started on version {then} "
            f"(--dataset-version {then} resumes it there; to train on version {now}, start "
            "another run, or pass --overwrite)"
        )
    if key == "mix":
        return f"mixed in: {_mixed(then)} then, {_mixed(now)} now"
    if key != "data" or not (isinstance(then, dict) and isinstance(now, dict)):
        return f"{key}: {then!r} then, {now!r} now"
    said = []
    for split in sorted(set(then) | set(now)):
        old, new = then.get(split), now.get(split)
        if old == new:
            continue
        if old is None or new is None:
            said.append(f"a {split} split {'then, none now' if new is None else 'now, none then'}")
            continue
        counts = f"{old.get('examples')} examples in {old.get('shards')} shard(s) then, "
        counts += f"{new.get('examples')} in {new.get('shards')} now"
        if (old.get("examples"), old.get("shards")) == (new.get("examples"), new.get("shards")):
            counts = f"as many examples ({new.get('examples')}), other records"
        said.append(
            f"the {split} split: {counts} (fingerprint {old.get('fingerprint')} then, "
            f"{new.get('fingerprint')} now)"
        )
    return "the dataset changed: " + "; ".join(said)
