"""Keras's epoch logs of a run (``history.csv``, TensorBoard's ``logs/``), wherever its
run folder is.

Keras's ``CSVLogger`` appends to a local file (or, with TensorFlow, one of TensorFlow's
filesystems, where a bucket often cannot append), and TensorBoard's event files are
written by TensorFlow, which opens local paths, ``gs://`` and ``ram://`` but not
``s3://`` or ``az://``. Where the run folder is elsewhere, they write into a local
temporary folder, copied into the run folder after each epoch and at the end of each
``fit`` (said in one line for TensorBoard).

Example:
    >>> model.fit(data, callbacks=callbacks(run, tensorboard=True))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from chute.format import storage
from chute.lazy import keras

log = logging.getLogger(__name__)

HISTORY = "history.csv"


def callbacks(run: Any, *, tensorboard: bool) -> list:
    """``CSVLogger`` into ``history.csv`` (appending: a resumed run continues it) and,
    when ``tensorboard``, ``TensorBoard`` into ``logs/`` of ``run`` (a
    :class:`chute.fit.rundir.RunDir`); through a local copy where they cannot write
    the run folder themselves."""
    history = run.join(HISTORY)
    staged_csv = not storage.is_local(run.path)
    staged_logs = tensorboard and not storage.tensorflow_opens(run.logs)
    if not (staged_csv or staged_logs):
        return [
            keras.callbacks.CSVLogger(history, append=True),
            *([keras.callbacks.TensorBoard(run.logs)] if tensorboard else []),
        ]
    # Kept as long as the callbacks (a run's phases fit with new ones): deleted with them.
    staging = tempfile.TemporaryDirectory(prefix="chute-run-logs-")
    copies: list[tuple[str, str]] = []  # (local, in the run folder)
    if staged_csv:
        local = os.path.join(staging.name, HISTORY)
        if storage.exists(history):  # an interrupted run's epochs: appended to
            storage.copy(history, local)
        copies.append((local, history))
        history = local
    logs = run.logs
    if staged_logs:
        logs = os.path.join(staging.name, "logs")
        copies.append((logs, run.logs))
        log.info(
            "TensorFlow cannot write TensorBoard logs to %s: they are written in %s and "
            "copied there after each epoch",
            run.logs, logs,
        )  # fmt: skip
    return [
        keras.callbacks.CSVLogger(history, append=True),
        *([keras.callbacks.TensorBoard(logs)] if tensorboard else []),
        _copier(copies, staging),  # last: after the loggers wrote the epoch
    ]


def _copier(copies: list[tuple[str, str]], staging: Any) -> Any:
    """A callback copying each local file or folder of ``copies`` to its place in the
    run folder (files new or changed since the last copy) after each epoch and at the
    end of ``fit`` (when TensorBoard has closed its event files)."""

    # Defined inside: Keras is imported lazily, so no Keras class exists at import time.
    class Copier(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.staging = staging  # the folder lives as long as this callback
            self.copied: dict[str, tuple[int, int]] = {}

        def on_epoch_end(self, epoch, logs=None):
            self.copy()

        def on_train_end(self, logs=None):
            self.copy()

        def copy(self) -> None:
            for local, target in copies:
                for path, relative in _files(local):
                    stat = os.stat(path)
                    seen = (stat.st_size, stat.st_mtime_ns)
                    if self.copied.get(path) == seen:
                        continue
                    destination = storage.join(target, *relative) if relative else target
                    storage.makedirs(storage.dirname(destination))
                    storage.copy(path, destination)
                    self.copied[path] = seen

    return Copier()


def _files(local: str) -> list[tuple[str, tuple[str, ...]]]:
    """The files of ``local`` (a file: itself; a folder: those under it, each with its
    path relative to ``local`` as parts)."""
    if os.path.isfile(local):
        return [(local, ())]
    found = []
    for folder, _, names in os.walk(local):
        parts = [part for part in os.path.relpath(folder, local).split(os.sep) if part != "."]
        found += [(os.path.join(folder, name), (*parts, name)) for name in sorted(names)]
    return found
