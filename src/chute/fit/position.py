"""Where a run's input is, saved with each backup: the exact mid-epoch resume of the Grain engine.

Keras's ``BackupAndRestore`` saves the weights and the optimizer (its step
counter included) every ``backup_every`` steps, but restores only the epoch:
the interrupted epoch starts again. With ``engine="grain"`` every batch is a
pure function of its number (:mod:`chute.read.grain_engine`), so the input's
state is the optimizer's step count that the backup holds: :func:`input_position`
tells the dataset, at the start of each epoch, which epoch it reads, and on
the first epoch after a restore, the batch the backup stopped before. The
resumed epoch then trains only its remaining batches, the same ones an
uninterrupted run trains, at the same learning rate (the schedule follows the
restored step count).

With ``engine="tf"``, tf.data cannot restore a shuffle buffer's position
(tensorflow#56372): an interrupted epoch trains again from its first batch,
and the log says so.

Example:
    >>> position = input_position(train, steps=100, first_epoch=0)  # doctest: +SKIP
    >>> model.fit(train, callbacks=[*backups(folder, 50), position])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from chute.format import storage
from chute.lazy import keras

log = logging.getLogger(__name__)


def backups(folder: str, every: int | None, steps: int) -> list[Any]:
    """Keras's ``BackupAndRestore`` into ``folder`` at each epoch's end and, with
    ``every``, every ``every`` steps too (both write the same files), except on an
    epoch's last batch, whose backup is the epoch's own: a backup that holds a whole
    epoch's steps is always that epoch's end. The backup outlives ``fit`` (chute
    removes it when the run is over): a resumed epoch's ``fit`` ends with it, and the
    next ``fit`` goes on from it."""
    epochs = keras.callbacks.BackupAndRestore(folder, delete_checkpoint=False)
    if every is None:
        return [epochs]

    class StepBackup(keras.callbacks.BackupAndRestore):
        def __init__(self):
            super().__init__(folder, save_freq=every, delete_checkpoint=False)
            self._since, self._last = 0, 0  # batches since a backup, counted as Keras does

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            self._last = 0

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 >= steps:
                return
            super().on_train_batch_end(batch, logs)
            self._since += batch + 1 if batch <= self._last else batch - self._last
            self._last = batch
            if self._since >= every:  # Keras's backup was just written: the seeds too
                self._since = 0
                save_seeds(self.model, folder)

    return [epochs, StepBackup()]


SEEDS = "seeds.json"  # beside Keras's backup: the random layers' states at that step


def input_position(
    dataset: Any,
    *,
    steps: int,
    first_epoch: int,
    engine: str = "grain",
    backup: str | None = None,
) -> Any:
    """A Keras callback keeping ``dataset`` at the run's position.

    At each epoch's start it tells a Grain-engine dataset which data epoch it reads
    (``first_epoch`` + the epoch) and, after a restore mid-epoch, the batch to go on
    from; that epoch then ends early, once its remaining batches are trained: ``fit``
    stops there with ``cut`` set, and the caller calls ``fit`` again (it resumes from
    that epoch's end). With ``engine="tf"`` it only logs that the epoch starts again.

    Args:
        dataset: what ``chute.load`` returned for training.
        steps: batches per epoch.
        first_epoch: the data epoch of this fit's epoch 0 (a fine-tuning phase goes
            on from the epochs of the head phase before it).
        engine: the engine ``dataset`` was read with.
        backup: the backup folder: the random layers' seed states (Dropout's, the
            augmentation's), which Keras's weights files leave out, are saved there
            with each backup (here at each epoch's end; :func:`backups` every N
            steps) and restored with it.
    """

    class Position(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.cut = False  # fit stopped at the end of a resumed epoch
            self._first, self._left = True, None

        def on_train_begin(self, logs=None):
            self._first, self._left, self.cut = True, None, False
            if backup is not None:
                _restore_seeds(self.model, backup)

        def on_epoch_end(self, epoch, logs=None):
            if backup is not None:
                save_seeds(self.model, backup)

        def on_epoch_begin(self, epoch, logs=None):
            start = 0
            if self._first:
                self._first = False
                done = step_of(self.model) - epoch * steps
                if 0 < done < steps:
                    start = self._log_resume(epoch, done)
            if engine == "grain":
                dataset.set_epoch(first_epoch + epoch, start)
                self._left = steps - start if start else None

        def on_train_batch_end(self, batch, logs=None):
            if self._left is not None and batch + 1 >= self._left:
                self._left, self.cut = None, True
                self.model.stop_training = True

        def _log_resume(self, epoch: int, done: int) -> int:
            if engine != "grain":
                log.info(
                    "resuming epoch %d, backed up after batch %d of %d: the tf.data engine "
                    "reads the epoch again from its first batch (engine='grain' goes on "
                    "from the next one)",
                    epoch + 1, done, steps,
                )  # fmt: skip
                return 0
            log.info(
                "resuming epoch %d at batch %d of %d: the input goes on from there",
                epoch + 1, done + 1, steps,
            )  # fmt: skip
            return done

    return Position()


def step_of(model) -> int:
    """The optimizer's step count (a mirrored variable under tf.distribute too)."""
    return int(_numpy(model.optimizer.iterations))


def _numpy(variable) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable))


def _seed_variables(model) -> list:
    return [v for v in model.variables if "seed_generator_state" in v.path]


def save_seeds(model, folder: str) -> None:
    """The random layers' seed states and the step they belong to, into ``folder``."""
    states = {v.path: _numpy(v).tolist() for v in _seed_variables(model)}
    body = {"step": step_of(model), "states": states}
    storage.makedirs(folder)
    storage.write_atomic(storage.join(folder, SEEDS), json.dumps(body).encode())


def _restore_seeds(model, folder: str) -> None:
    """The seed states saved with the backup just restored (its step must be the
    optimizer's: a backup written after them is not theirs)."""
    path = storage.join(folder, SEEDS)
    if not storage.exists(path):
        return
    saved = json.loads(storage.read_bytes(path))
    step = step_of(model)
    if step == 0:
        return
    if saved["step"] != step:
        log.warning(
            "the random layers' states were saved at step %d, the backup restored is of "
            "step %d: dropout and augmentation draw anew from here",
            saved["step"], step,
        )  # fmt: skip
        return
    for variable in _seed_variables(model):
        if variable.path in saved["states"]:
            variable.assign(np.asarray(saved["states"][variable.path], variable.dtype))
