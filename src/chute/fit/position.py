"""Where a phase resumes, as a value, and the one object that keeps its backups.

A restored backup (:class:`chute.fit.backup.Record`: the epoch in progress, the
optimizer steps, the random layers' seed states) becomes a :class:`ResumePoint`
once, before ``fit``: the epoch ``fit`` starts with, the batches of it already
trained and the examples they held. With ``engine="grain"`` every batch is a pure
function of its number (:mod:`chute.read.grain`), so the resumed epoch trains only
its remaining batches, the same ones an uninterrupted run trains, at the same
learning rate (the schedule follows the restored step count): one ``fit`` that
reads the split's stream from that batch and stops at that epoch's end, then one
of the epochs left (:meth:`ResumePoint.fit_call`). With ``engine="tf"``, tf.data
cannot restore a shuffle buffer's position (tensorflow#56372): an interrupted
epoch trains again from its first batch, and the log says so.

:class:`Resume` owns the phase's backup folder, its point and the Keras
callback that restores the backup once ``fit`` has built the model and writes
one every ``backup_every`` steps and at each epoch's end, recording the epoch in
progress, so a run killed any number of times resumes where the last kill
stopped it.

Example:
    >>> resume = Resume(Backup(folder), steps=100, global_batch=32, epochs=5)  # doctest: +SKIP
    >>> call = resume.call(resume.point.epoch)  # doctest: +SKIP
    >>> model.fit(train.stream(call.start), initial_epoch=call.initial_epoch,
    ...           epochs=call.epochs, steps_per_epoch=call.steps,
    ...           callbacks=[resume.callback()])  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from chute.errors import ChuteError
from chute.fit.backup import Backup, Record
from chute.lazy import keras
from chute.read.stream import StreamPosition

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitCall:
    """One call of Keras's ``fit`` in a phase.

    Attributes:
        initial_epoch: ``fit``'s ``initial_epoch``.
        epochs: ``fit``'s ``epochs``: the phase's (Keras's progress bar says
            ``Epoch k/epochs``), even for a cut call, which stops earlier.
        steps: ``fit``'s ``steps_per_epoch`` (None: the dataset's own length).
        start: where the training split's stream starts (the Grain engine's).
        cut: the call trains only the rest of a resumed epoch, then stops (the
            callback of :class:`Resume` sets ``stop_training`` at that epoch's end);
            the phase goes on with a call from the next epoch.
    """

    initial_epoch: int
    epochs: int
    steps: int | None
    start: StreamPosition
    cut: bool = False


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a phase resumes, from its restored backup (all 0 for a new phase).

    Attributes:
        epoch: the phase's epoch in progress: ``fit``'s ``initial_epoch``.
        batch: the batches of it already trained (0: from its start; always 0 on
            the tf.data engine, which reads an interrupted epoch again).
        samples: the examples of it already trained (``offset`` + ``batch`` × the
            global batch).
        seeds: the random layers' seed states the backup holds.
        offset: examples trained before batch 0 by a run of another global batch size
            (:class:`~chute.read.stream.StreamPosition`); 0 when it is the same.
    """

    epoch: int = 0
    batch: int = 0
    samples: int = 0
    seeds: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    offset: int = 0

    @classmethod
    def of(
        cls,
        record: Record | None,
        *,
        steps: int,
        global_batch: int,
        engine: str = "grain",
        stored_step: int | None = None,
    ) -> ResumePoint:
        """The point of a restored backup ``record`` (None: a new phase) in a phase of
        ``steps`` batches of ``global_batch`` examples per epoch. ``stored_step``: the
        optimizer steps its weights file holds, for a legacy backup whose record has
        none (``step == -1``: Keras's ``BackupAndRestore`` files).

        Example:
            >>> ResumePoint.of(Record(1, 10, "w.h5"), steps=6, global_batch=8)
            ResumePoint(epoch=1, batch=4, samples=32, seeds={}, offset=0)
        """
        if record is None:
            return cls()
        if record.samples is not None and record.global_batch:
            return cls._of_samples(record, steps=steps, global_batch=global_batch, engine=engine)
        step = record.step
        # Keras's own BackupAndRestore files record no step: the weights file's optimizer knows it.
        if step == -1 and stored_step is not None:
            step = stored_step
        # the optimizer steps of the epochs before it are whole epochs (a legacy backup
        # of a step unknown even to its weights file, -1, resumes at its epoch's start)
        done = step - record.epoch * steps
        # 0 or a whole epoch: an epoch's end, so fit starts at the epoch's first batch.
        if not 0 < done < steps:
            return cls(record.epoch, seeds=record.seeds)
        # tf.data cannot restore a shuffle buffer's position (tensorflow#56372).
        if engine != "grain":
            log.info(
                "resuming epoch %d, backed up after batch %d of %d: the tf.data engine "
                "reads the epoch again from its first batch (engine='grain' goes on "
                "from the next one)",
                record.epoch + 1, done, steps,
            )  # fmt: skip
            return cls(record.epoch, seeds=record.seeds)
        log.info(
            "resuming epoch %d at batch %d of %d: the input goes on from there",
            record.epoch + 1, done + 1, steps,
        )  # fmt: skip
        return cls(record.epoch, done, done * global_batch, record.seeds)

    @classmethod
    def _of_samples(
        cls, record: Record, *, steps: int, global_batch: int, engine: str
    ) -> ResumePoint:
        """The point of a backup that records the examples trained in its epoch: the
        same batches on the same global batch size, else the same example (elastic)."""
        samples, epoch = record.samples or 0, record.epoch
        if samples <= 0:  # the epoch's start
            return cls(epoch, seeds=record.seeds)
        # Whole batches of the new size left in the epoch (the order is cut to those).
        batch, offset = divmod(samples, global_batch)
        left = steps - bool(offset) - batch
        if left <= 0:
            # Less than a batch of the new size left: its last batch is trained again
            # (some examples twice), so that the epoch still ends (validation, history).
            log.warning(
                "resuming epoch %d: less than a global batch of %d is left of it after "
                "%d examples; its last batch is trained again",
                epoch + 1, global_batch, samples,
            )  # fmt: skip
            batch, offset, samples, left = steps - 1, 0, (steps - 1) * global_batch, 1
        if engine != "grain":
            log.info(
                "resuming epoch %d, backed up after %d of its examples: the tf.data engine "
                "reads the epoch again from its first batch (engine='grain' goes on from there)",
                epoch + 1, samples,
            )  # fmt: skip
            return cls(epoch, seeds=record.seeds)
        if record.global_batch != global_batch:
            log.info(
                "resuming epoch %d at example %d of %d: backed up with a global batch of %d, "
                "now %d; the input goes on at that example of the same order (%d batch(es) "
                "left in the epoch)",
                epoch + 1, samples + 1, steps * global_batch, record.global_batch,
                global_batch, left,
            )  # fmt: skip
        else:
            log.info(
                "resuming epoch %d at batch %d of %d: the input goes on from there",
                epoch + 1, batch + 1, steps,
            )  # fmt: skip
        return cls(epoch, batch, samples, record.seeds, offset)

    def fit_call(
        self, initial_epoch: int, *, epochs: int, steps: int | None, first_epoch: int = 0
    ) -> FitCall:
        """The ``fit`` that goes on from ``initial_epoch`` in a phase of ``epochs`` epochs
        of ``steps`` batches (None: the dataset's own length), whose epoch 0 is the
        data's ``first_epoch`` (a fine-tuning phase goes on from the head phase's epochs).

        Example:
            >>> call = ResumePoint(epoch=1, batch=4).fit_call(1, epochs=3, steps=6, first_epoch=2)
            >>> call.epochs, call.steps, call.start, call.cut
            (3, 2, StreamPosition(epoch=3, batch=4, offset=0), True)
        """
        start = StreamPosition(first_epoch + initial_epoch)
        # Only the resumed epoch is cut; every later call trains whole epochs.
        if initial_epoch != self.epoch or (self.batch == 0 and not self.offset):
            return FitCall(initial_epoch, epochs, steps, start)
        # the resumed epoch alone, of its remaining batches: Keras counts an epoch's steps
        # from 0, and the next call starts the next epoch's at its first batch. `epochs`
        # stays the phase's, so the progress bar says "Epoch k/N" (it prints no header at
        # all when told epochs=1); the callback stops the fit at this epoch's end.
        # (an epoch started `offset` examples in holds one whole batch less)
        remaining = (steps or 0) - bool(self.offset) - self.batch
        start = dataclasses.replace(start, batch=self.batch, offset=self.offset)
        return FitCall(initial_epoch, epochs, remaining, start, cut=True)


class Resume:
    """A phase's backups and where it resumes: its backup folder, the point restored
    from it (computed once, when made) and the Keras callback that restores and saves.

    ``cut`` and ``next_epoch`` say, after each ``fit``, whether it trained only the rest
    of a resumed epoch (its callback stopped it at that epoch's end) and which epoch the
    next ``fit`` starts with.
    """

    def __init__(
        self,
        store: Backup,
        *,
        steps: int,
        global_batch: int,
        epochs: int,
        first_epoch: int = 0,
        engine: str = "grain",
        repeated: bool = True,
        layout: tuple[int, int] | None = None,
        fixed_batch: bool = False,
    ):
        self.store, self.steps, self.epochs = store, steps, epochs
        self.global_batch, self.layout = global_batch, layout
        self.first_epoch, self.repeated = first_epoch, repeated
        # every process reads the record (on several JAX processes, the chief's copy)
        self.record = store.latest()
        was = self.record.global_batch if self.record is not None else None
        if fixed_batch and was and was != global_batch:
            # A mixture's batches are composed for one global batch size (chute.read.mixture).
            replicas = layout[1] if layout else 1
            raise ChuteError(
                f"This run mixes datasets, and each of its batches is composed for its global "
                f"batch size: it was backed up with a global batch of {was}, now {global_batch}"
                f" ({replicas} replica(s)). Pass --batch-size {was // replicas} to resume it"
                if was % replicas == 0
                else f"This run mixes datasets, and each of its batches is composed for its "
                f"global batch size: it was backed up with a global batch of {was}, which "
                f"{replicas} replica(s) cannot make (now {global_batch}); resume it on a "
                "number of devices that divides it, or pass --overwrite to start again"
            )
        # a legacy backup records no step: its weights file's optimizer holds it (the
        # stream's start is needed before fit, which restores the model)
        legacy = self.record is not None and self.record.step == -1
        self.point = ResumePoint.of(
            self.record,
            steps=steps,
            global_batch=global_batch,
            engine=engine,
            stored_step=store.stored_step(self.record) if legacy else None,
        )
        before = self.record.layout if self.record is not None else None
        if before and layout and tuple(before) != tuple(layout):
            # The Grain engine's order is global: any number of pipelines reads the same one.
            log.info(
                "resuming a run backed up on %d process(es) x %d replica(s) on %d x %d: "
                "the same global order of examples goes on",
                *before, *layout,
            )  # fmt: skip
        # After a cut fit, the next one starts with the epoch after the resumed one.
        self.next_epoch = self.point.epoch + 1
        self.current: FitCall | None = None  # the fit in progress, or the last one

    @property
    def cut(self) -> bool:
        """Whether the last ``fit`` trained only the rest of a resumed epoch."""
        return self.current is not None and self.current.cut

    def call(self, initial_epoch: int) -> FitCall:
        """The ``fit`` from ``initial_epoch`` (:meth:`ResumePoint.fit_call`)."""
        self.current = self.point.fit_call(
            initial_epoch,
            epochs=self.epochs,
            # A repeated dataset never ends: Keras must be told its steps.
            steps=self.steps if self.repeated else None,
            first_epoch=self.first_epoch,
        )
        return self.current

    def restored_step(self) -> int | None:
        """The optimizer step to set once the backup is restored, when it was written with
        another global batch: the resumed point in this run's steps (``epoch × steps +
        batch``), so that the learning-rate schedule, counted in steps, goes on at the same
        fraction of the phase. None: the backup's own step count holds."""
        record = self.record
        if record is None or not record.global_batch or record.global_batch == self.global_batch:
            return None
        return self.point.epoch * self.steps + self.point.batch

    def samples(self, batches: int) -> int:
        """The examples of the epoch in progress trained once the current ``fit`` has
        trained ``batches`` of it (a resumed epoch's began with the ones before)."""
        start = self.current.start if self.current is not None else StreamPosition(0)
        return start.offset + (start.batch + batches) * self.global_batch

    def callback(
        self, save: Callable[[Any, int, int], Any] | None = None, every: int | None = None
    ) -> Any:
        """The Keras callback restoring the backup, once, when the first ``fit`` begins
        (its model is built then; every process restores: on several JAX processes a
        collective, the same values), and writing backups with ``save(model, epoch,
        samples)`` (``samples``: the examples of the epoch trained)
        (None: this process writes none, e.g. a JAX process other than the chief) every
        ``every`` steps and at each epoch's end."""
        # A cached factory: Keras is imported lazily, so the class is made on first use.
        return _callback()(self, save, every)


@functools.cache
def _callback() -> type:
    """The class of :meth:`Resume.callback`, made once Keras is imported (lazily)."""

    class Backups(keras.callbacks.Callback):
        def __init__(self, resume: Resume, save, every):
            super().__init__()
            self.resume, self.save, self.every = resume, save, every
            self._restore = resume.record
            self._epoch, self._batches, self._since = 0, resume.steps, 0

        def on_train_begin(self, logs=None):
            if self._restore is not None:
                self.resume.store.load(self.model, self._restore)
                self._restore = None  # a later fit goes on from the model as it is
                step = self.resume.restored_step()
                if step is not None:
                    _set_step(self.model.optimizer, step)

        def on_epoch_begin(self, epoch, logs=None):
            # this fit's epochs have its steps: the rest of a resumed epoch, or whole ones
            self._epoch, self._since = epoch, 0
            current = self.resume.current
            self._batches = (current.steps if current else None) or self.resume.steps

        def on_train_batch_end(self, batch, logs=None):
            # Keras calls this once per execution (steps_per_execution): count its steps.
            # Never on an epoch's last batch, whose backup is the epoch's own: a backup
            # holding a whole epoch's steps is always that epoch's end.
            last = batch + 1 >= self._batches
            self._since, previous = batch + 1, self._since
            every = self.every
            if self.save and every and not last and self._since // every > previous // every:
                self.save(self.model, self._epoch, self.resume.samples(self._since))

        def on_epoch_end(self, epoch, logs=None):
            if self.save is not None:
                # epoch + 1: the epoch in progress once this one is over, where a restart begins.
                self.save(self.model, epoch + 1, 0)
            if self.resume.cut:  # the rest of a resumed epoch: the next fit goes on
                self.model.stop_training = True

    return Backups


def _set_step(optimizer: Any, step: int) -> None:
    """Sets ``optimizer``'s step count (a loss-scale optimizer's inner one's too)."""
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if each is not None:
            each.iterations.assign(step)
