"""A training phase's backup, written so that a kill at any instant leaves a good one.

Keras's ``BackupAndRestore`` writes ``latest.weights.h5`` in place (a kill during
the write leaves a file that never loads again) and records the epoch only at
an epoch's end (a second kill inside a resumed epoch goes back to epoch 0).
Here each backup is a new weights file (the model's and the optimizer's
variables, its step count included), written under a temporary name and then
renamed; ``state.json``, replaced atomically after it, names the current and
the previous backup with the epoch in progress, the optimizer step and the
random layers' seed states (which Keras's weights files leave out). So at
any instant ``state.json`` names whole files, and a file that cannot be read
(a disk that lost it) is set aside with a warning and the previous one used.

Example:
    >>> backup = Backup("runs/kn/backup")  # doctest: +SKIP
    >>> record = backup.restore(model)  # before fit: None when there is nothing to resume
    >>> model.fit(data, initial_epoch=record.epoch if record else 0)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np

from chute.format import storage
from chute.lazy import keras

log = logging.getLogger(__name__)

STATE = "state.json"  # names the backups: written last, atomically
SET_ASIDE = ".unreadable"  # suffix of a backup file that could not be read
# what a run from before state.json left: Keras's BackupAndRestore files and chute's seeds
_KERAS_WEIGHTS, _KERAS_METADATA, _SEEDS = (
    "latest.weights.h5",
    "training_metadata.json",
    "seeds.json",
)


@dataclasses.dataclass(frozen=True)
class Record:
    """What ``state.json`` records of one backup (:mod:`chute.fit.position` turns it
    into the point a phase resumes from).

    Attributes:
        epoch: the phase's epoch in progress (the next one when backed up at an epoch's
            end): ``fit``'s ``initial_epoch``.
        step: the optimizer steps the backup holds (the Grain engine's input position).
        weights: the weights file's name in the backup folder.
        seeds: the random layers' seed states (variable path -> values).
        samples: the examples of the epoch in progress already trained (None: not
            recorded, a backup of an older chute: ``step`` says where it is).
        global_batch: the examples of a training step when it was written.
        layout: ``(processes, replicas)`` of the run that wrote it.
    """

    epoch: int
    step: int
    weights: str
    seeds: dict[str, Any] = dataclasses.field(default_factory=dict)
    samples: int | None = None
    global_batch: int | None = None
    layout: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Record:
        layout = value.get("layout")
        return cls(
            int(value["epoch"]),
            int(value["step"]),
            str(value["weights"]),
            value["seeds"],
            # an older chute's backup records none of these
            samples=value.get("samples"),
            global_batch=value.get("global_batch"),
            layout=tuple(layout) if layout else None,
        )


class Backup:
    """The backup folder of one training phase: :meth:`save` and :meth:`restore`."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, name: str) -> str:
        return storage.join(self.folder, name)

    def save(
        self,
        model: Any,
        epoch: int,
        *,
        samples: int | None = None,
        global_batch: int | None = None,
        layout: tuple[int, int] | None = None,
    ) -> Record:
        """Backs ``model`` up (weights, optimizer, seed states) as being in ``epoch``,
        ``samples`` examples into it, trained ``global_batch`` at a time by ``layout``
        (processes, replicas): where a run on other hardware goes on from.

        The weights go to a new file, renamed into place once whole; then
        ``state.json`` names it (and the backup before it, kept as the fallback); then
        older files are deleted. A kill anywhere leaves ``state.json`` naming whole files.
        """
        storage.makedirs(self.folder)
        step = step_of(model)
        # Named by step, zero-padded: a new backup never overwrites the file state.json names.
        name = f"step-{step:010d}.weights.h5"
        partial = self._path(f"partial-{step:010d}.weights.h5")  # Keras wants .weights.h5
        # overwrite: a partial file left by a kill during an earlier write of this step;
        # staged: Keras writes local files (and TensorFlow's), not a bucket's
        with storage.staged_write(partial) as local:
            model.save_weights(local, overwrite=True)
        storage.rename(partial, self._path(name))
        record = Record(epoch, step, name, _seed_states(model), samples, global_batch, layout)
        current = self._state().get("current")
        # A second save at the same step (an epoch's end after a step backup) must not name itself.
        previous = current if current and current["weights"] != name else None
        state = {"current": record.to_dict(), "previous": previous}
        storage.write_atomic(self._path(STATE), json.dumps(state).encode())
        # Deleted only after state.json names the new file, so a kill here leaves both whole.
        keep = {name, *([previous["weights"]] if previous else []), STATE}
        for other in storage.listdir(self.folder):
            if other.endswith(".weights.h5") and other not in keep:
                storage.remove_if_exists(self._path(other))
        return record

    def restore(self, model: Any) -> Record | None:
        """:meth:`latest`, loaded into ``model`` (:meth:`load`); None when there is none."""
        record = self.latest()
        if record is not None:
            self.load(model, record)
        return record

    def latest(self) -> Record | None:
        """The newest readable backup; None when there is none (a new phase). Each
        unreadable one is renamed ``*.unreadable`` with a warning naming it, and the one
        before it is used. (Checked before ``fit``, which starts from its epoch.)"""
        candidates = self._candidates()
        for record in candidates:
            path = self._path(record.weights)
            problem = _unreadable(path)
            if problem is None:
                if record != candidates[0]:  # the next backup's fallback is this one
                    state = {"current": record.to_dict(), "previous": None}
                    storage.write_atomic(self._path(STATE), json.dumps(state).encode())
                return record
            # Renamed, not deleted: the damaged file stays for a person to look at.
            aside = problem != "missing"
            log.warning(
                "the backup %s cannot be read (%s)%s; resuming from the backup before it",
                path, problem, f": set aside as {record.weights}{SET_ASIDE}" * aside,
            )  # fmt: skip
            if aside:
                storage.rename(path, path + SET_ASIDE)
        if candidates:
            log.warning(
                "no backup in %s can be read: the phase starts again from its beginning",
                self.folder,
            )
        return None

    def load(self, model: Any, record: Record) -> None:
        """Loads backup ``record`` into ``model`` (built: in ``fit``, from its callbacks'
        ``on_train_begin``, as Keras's ``BackupAndRestore`` does), its optimizer built
        first, and the random layers' seed states."""
        # load_weights needs the optimizer's variables to exist, and Keras builds them only lazily.
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        with storage.staged_read(self._path(record.weights)) as local:
            model.load_weights(local)
        _restore_seeds(model, record)

    def stored_step(self, record: Record) -> int | None:
        """The optimizer steps held by backup ``record``'s weights file, read without a
        model (None: not found): a legacy record has none, and where its phase resumes
        is needed before ``fit`` builds the model to restore it into."""
        import h5py  # Keras's own weights format

        # Keras stores an optimizer's variables in order, its step count first; a
        # loss-scale optimizer's own comes before its inner one's, which is the model's
        names = ("optimizer/inner_optimizer/vars/0", "optimizer/vars/0")
        try:
            with (
                storage.open_file(self._path(record.weights)) as handle,
                h5py.File(handle, "r") as weights,
            ):
                found = [weights[name][()] for name in names if name in weights]
        except (OSError, ValueError) as error:  # what h5py raises for damage
            log.warning("the optimizer step of %s cannot be read: %s", record.weights, error)
            return None
        return int(found[0]) if found else None

    def _state(self) -> dict[str, Any]:
        path = self._path(STATE)
        return json.loads(storage.read_bytes(path)) if storage.exists(path) else {}

    def _candidates(self) -> list[Record]:
        """The backups to try, newest first."""
        if not storage.isdir(self.folder):
            return []
        state = self._state()
        # state.json, when there, is the only authority: it names whole files only.
        if state:
            found = [state.get("current"), state.get("previous")]
            return [Record.from_dict(entry) for entry in found if entry]
        legacy = self._legacy()
        return [legacy] if legacy else []

    def _legacy(self) -> Record | None:
        """The backup of a run from before ``state.json`` (Keras's files, chute's seeds)."""
        if not storage.exists(self._path(_KERAS_WEIGHTS)):
            return None
        epoch, seeds = 0, {}
        if storage.exists(self._path(_KERAS_METADATA)):
            epoch = int(json.loads(storage.read_bytes(self._path(_KERAS_METADATA)))["epoch"])
        if storage.exists(self._path(_SEEDS)):
            saved = json.loads(storage.read_bytes(self._path(_SEEDS)))
            seeds = {"step": saved["step"], **saved["states"]}
        # -1: the step is unknown; ResumePoint.of reads it from the weights file instead.
        return Record(epoch, int(seeds.pop("step", -1)), _KERAS_WEIGHTS, seeds)


def step_of(model: Any) -> int:
    """The optimizer's step count (a mirrored variable under tf.distribute too)."""
    return int(_numpy(model.optimizer.iterations))


def _numpy(variable: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable))


def _seed_variables(model: Any) -> list:
    # Keras's weights files leave these out, so the backup keeps them itself.
    return [v for v in model.variables if "seed_generator_state" in v.path]


def _seed_states(model: Any) -> dict[str, Any]:
    return {v.path: _numpy(v).tolist() for v in _seed_variables(model)}


def _restore_seeds(model: Any, record: Record) -> None:
    """The seed states saved with ``record``; a legacy backup's only if they are of its
    step (the seeds file was written beside the weights, not with them)."""
    if record.step == -1 or (record.step != step_of(model) and record.weights == _KERAS_WEIGHTS):
        if record.seeds:
            log.warning(
                "the random layers' states of this backup were not saved with it: dropout "
                "and augmentation draw anew from here"
            )
        return
    # in order, not by path: Keras numbers the layers' names per process (dropout_1 ...)
    variables = _seed_variables(model)
    if len(variables) != len(record.seeds):
        log.warning(
            "the backup holds %d random layers' states, the model has %d: dropout and "
            "augmentation draw anew from here",
            len(record.seeds), len(variables),
        )  # fmt: skip
        return
    for variable, values in zip(variables, record.seeds.values(), strict=True):
        variable.assign(np.asarray(values, variable.dtype))


def _unreadable(path: str) -> str | None:
    """Why the weights file ``path`` cannot be loaded (None: every array reads)."""
    if not storage.exists(path):
        return "missing"
    import h5py  # Keras's own weights format

    try:
        with storage.open_file(path) as handle, h5py.File(handle, "r") as weights:
            # Every array read in full: a damaged file can open but fail on one dataset.
            weights.visititems(lambda _, item: item[()] if isinstance(item, h5py.Dataset) else None)
    except Exception as error:  # h5py raises OSError, KeyError, ValueError... for damage
        return f"{type(error).__name__}: {error}"
    return None
