"""Where a run's input is, and its backups: the exact mid-epoch resume of the Grain engine.

One Keras callback keeps the input and the backup in step. At each epoch's start
it tells a Grain-engine dataset which data epoch it reads and, on the first epoch
after a restore mid-epoch, the batch the backup stopped before; every
``backup_every`` steps and at each epoch's end it writes a backup
(:class:`chute.fit.backup.Backup`) recording the epoch in progress, so a run killed
any number of times resumes where the last kill stopped it. With ``engine="grain"``
every batch is a pure function of its number (:mod:`chute.read.grain_engine`), so
the input's state is the optimizer's step count that the backup holds; the resumed
epoch then trains only its remaining batches, the same ones an uninterrupted run
trains, at the same learning rate (the schedule follows the restored step count),
ends early (``cut``), and the caller calls ``fit`` again from the next epoch.

With ``engine="tf"``, tf.data cannot restore a shuffle buffer's position
(tensorflow#56372): an interrupted epoch trains again from its first batch, and
the log says so.

Example:
    >>> point = backup.restore(model)  # doctest: +SKIP
    >>> where = input_position(train, steps=100, first_epoch=0, save=backup.save, every=50)
    >>> start = point.epoch if point else 0  # doctest: +SKIP
    >>> model.fit(train, initial_epoch=start, callbacks=[where])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from chute.fit.backup import step_of
from chute.lazy import keras

log = logging.getLogger(__name__)


def input_position(
    dataset: Any,
    *,
    steps: int,
    first_epoch: int,
    engine: str = "grain",
    save: Callable[[Any, int], Any] | None = None,
    every: int | None = None,
    restore: Callable[[Any], Any] | None = None,
) -> Any:
    """A Keras callback keeping ``dataset`` at the run's position and backing the run up.

    Args:
        dataset: what ``chute.load`` returned for training.
        steps: batches per epoch.
        first_epoch: the data epoch of this fit's epoch 0 (a fine-tuning phase goes
            on from the epochs of the head phase before it).
        engine: the engine ``dataset`` was read with.
        save: ``save(model, epoch)`` writes a backup of ``model`` in ``epoch`` (None:
            this process writes none, e.g. a JAX process other than the chief).
        every: back up every ``every`` steps too, not only at each epoch's end (never
            on an epoch's last batch, whose backup is the epoch's own: a backup holding
            a whole epoch's steps is always that epoch's end).
        restore: ``restore(model)`` loads the backup the run resumes from, once, when the
            first ``fit`` begins (its model is built then); every process runs it (on
            several JAX processes a collective: the same values, the chief's).

    Returns:
        The callback. After ``fit`` returns, ``cut`` says a resumed epoch ended early
        (call ``fit`` again with ``initial_epoch=next_epoch``).
    """

    class Position(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.cut = False  # fit stopped at the end of a resumed epoch
            self.next_epoch = 0  # the epoch the next fit starts with after a cut
            self._first, self._epoch, self._batches, self._since = True, 0, steps, 0
            self._restore = restore

        def on_train_begin(self, logs=None):
            self._first, self.cut = True, False
            if self._restore is not None:
                self._restore(self.model)
                self._restore = None  # a later fit goes on from the model as it is

        def on_epoch_begin(self, epoch, logs=None):
            start = 0
            if self._first:
                self._first = False
                done = step_of(self.model) - epoch * steps
                if 0 < done < steps:
                    start = self._log_resume(epoch, done)
            self._epoch, self._batches, self._since = epoch, steps - start, 0
            if engine == "grain":
                dataset.set_epoch(first_epoch + epoch, start)

        def on_train_batch_end(self, batch, logs=None):
            last = batch + 1 >= self._batches
            if last and self._batches < steps:  # a resumed epoch's remaining batches: done
                self.cut, self.next_epoch = True, self._epoch + 1
                self.model.stop_training = True
            # Keras calls this once per execution (steps_per_execution): count its steps
            self._since, previous = batch + 1, self._since
            if save is not None and every and not last and self._since // every > previous // every:
                save(self.model, self._epoch)

        def on_epoch_end(self, epoch, logs=None):
            if save is not None:
                save(self.model, epoch + 1)

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
