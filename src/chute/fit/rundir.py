"""The run directory: where a training run keeps its model, checkpoints, logs and reports.

Layout: ``bundle/`` (the model bundle, written last: its ``chute.json``
means the run finished), ``checkpoints/`` (``best.keras``, ``last.keras``),
``backup/`` (while a run is unfinished: what a resumed run continues from),
``logs/`` (TensorBoard), ``history.csv``/``.json``, ``curves.png``,
``config.json``, ``summary.json`` and the validation reports. In a
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
import os
from typing import Any

from chute.format import storage
from chute.format.bundle import META_NAME, RUN_SUBDIR

# what a run writes: replaced by --overwrite (nothing else in the folder is touched)
_ENTRIES = ("bundle", "checkpoints", "logs", "backup", "history.csv")


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


def prepare(run_dir: str | os.PathLike, *, overwrite: bool, worker_index: int = 0) -> RunDir:
    """Creates the run folder of this process; refuses a finished run unless ``overwrite``.

    Raises:
        ChuteError: ``run_dir`` holds a finished run and ``overwrite`` is False.
    """
    run_dir = os.fspath(run_dir)
    if storage.check_output(run_dir, "run_dir") and storage.exists(
        storage.join(run_dir, RUN_SUBDIR, META_NAME)
    ):
        storage.replace_or_refuse(
            run_dir, "run_dir", holds="a finished run", overwrite=overwrite, entries=_ENTRIES
        )
    path = storage.join(run_dir, f"worker-{worker_index}") if worker_index else run_dir
    storage.makedirs(path)
    return RunDir(path, resumed=storage.exists(storage.join(path, "backup")))
