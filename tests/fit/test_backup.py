"""A phase's backup: whole files named by state.json, the one before kept, an unreadable
one set aside, Keras's files of an older run still resumed; early stopping at a cut epoch."""

from __future__ import annotations

import json
import types
from pathlib import Path

import keras
import numpy as np
import pytest

from chute.fit import backup as backup_lib
from chute.fit import rundir, trainable
from chute.fit.train import _fit_until_done


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)  # (its layers' names differ from an earlier model's)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dropout(0.5)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _train_steps(model: keras.Model, steps: int) -> None:
    x, y = np.ones((steps * 2, 3), "float32"), np.zeros((steps * 2, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)


def _same(a: keras.Model, b: keras.Model) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def test_a_backup_restores_weights_optimizer_step_seeds_and_epoch(tmp_path):
    model = _model(1)
    _train_steps(model, 3)
    store = backup_lib.Backup(str(tmp_path / "backup"))
    saved = store.save(model, epoch=1)
    assert (saved.epoch, saved.step) == (1, 3) and saved.seeds  # Dropout's seed state

    fresh = _model(2)
    assert not _same(model, fresh)
    point = backup_lib.Backup(str(tmp_path / "backup")).restore(fresh)
    assert point == saved
    assert _same(model, fresh) and backup_lib.step_of(fresh) == 3
    assert [v.numpy().tolist() for v in fresh.variables if "seed" in v.path] == list(
        saved.seeds.values()
    )


def test_state_names_the_newest_whole_backup_and_the_one_before(tmp_path):
    model = _model(1)
    store = backup_lib.Backup(str(tmp_path))
    for epoch in range(3):
        _train_steps(model, 2)
        store.save(model, epoch)
    state = json.loads((tmp_path / backup_lib.STATE).read_text())
    assert state["current"]["step"] == 6 and state["previous"]["step"] == 4
    weights = sorted(p.name for p in tmp_path.glob("*.weights.h5"))
    assert weights == [state["previous"]["weights"], state["current"]["weights"]]  # no more


def test_a_half_written_backup_leaves_the_one_before_in_use(tmp_path, monkeypatch):
    """A kill inside the weights write leaves a partial file that state.json never names."""
    model = _model(1)
    store = backup_lib.Backup(str(tmp_path))
    _train_steps(model, 2)
    good = store.save(model, 0)
    expected = [w.copy() for w in model.get_weights()]
    _train_steps(model, 2)

    class Killed(BaseException):
        pass

    real = keras.Model.save_weights

    def dying(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        Path(path).write_bytes(Path(path).read_bytes()[:100])
        raise Killed

    monkeypatch.setattr(keras.Model, "save_weights", dying)
    with pytest.raises(Killed):
        store.save(model, 1)
    monkeypatch.undo()
    fresh = _model(2)
    assert store.restore(fresh) == good
    assert all(np.array_equal(a, b) for a, b in zip(expected, fresh.get_weights(), strict=True))


def test_an_unreadable_backup_is_set_aside_and_the_one_before_restored(tmp_path, caplog):
    model = _model(1)
    store = backup_lib.Backup(str(tmp_path))
    _train_steps(model, 2)
    before = store.save(model, 0)
    _train_steps(model, 2)
    newest = store.save(model, 1)
    damaged = tmp_path / newest.weights
    damaged.write_bytes(b"\0" * 64 + damaged.read_bytes()[64:])
    with caplog.at_level("WARNING", logger="chute.fit.backup"):
        point = store.restore(_model(2))
    assert point == before
    assert str(damaged) in caplog.text and "cannot be read" in caplog.text
    assert not damaged.exists() and Path(f"{damaged}{backup_lib.SET_ASIDE}").exists()

    (tmp_path / before.weights).write_bytes(b"not hdf5")  # nothing readable left
    with caplog.at_level("WARNING", logger="chute.fit.backup"):
        assert store.restore(_model(2)) is None
    assert "starts again from its beginning" in caplog.text


def test_a_backup_of_kerass_backup_and_restore_still_resumes(tmp_path):
    """A run interrupted before chute wrote state.json: Keras's files and seeds.json."""
    model = _model(1)
    _train_steps(model, 3)
    model.save_weights(str(tmp_path / "latest.weights.h5"))
    (tmp_path / "training_metadata.json").write_text(json.dumps({"epoch": 2, "batch": 0}))
    seeds = {v.path: v.numpy().tolist() for v in model.variables if "seed" in v.path}
    (tmp_path / "seeds.json").write_text(json.dumps({"step": 3, "states": seeds}))
    fresh = _model(2)
    point = backup_lib.Backup(str(tmp_path)).restore(fresh)
    assert point.epoch == 2 and point.step == 3
    assert _same(model, fresh)


@pytest.mark.parametrize("scaled", [False, True])
def test_a_legacy_backup_without_its_step_has_it_in_its_weights_file(tmp_path, scaled):
    """Keras's files alone (no seeds.json): the record has no step, the optimizer's (a
    loss-scale optimizer's inner one's) is read from the file, where the phase resumes."""
    model = _model(1)
    if scaled:
        model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), "mse")
    _train_steps(model, 3)
    model.save_weights(str(tmp_path / "latest.weights.h5"))
    store = backup_lib.Backup(str(tmp_path))
    record = store.latest()
    assert record.step == -1 and store.stored_step(record) == backup_lib.step_of(model) == 3
    (tmp_path / "latest.weights.h5").write_bytes(b"not hdf5")
    assert store.stored_step(record) is None


def test_nothing_to_restore_in_a_new_phase(tmp_path):
    assert backup_lib.Backup(str(tmp_path / "none")).restore(_model(1)) is None


def test_early_stopping_at_the_end_of_a_resumed_epoch_ends_the_phase(tmp_path):
    """A resumed epoch ends early (cut) and is also where early stopping stops: no more
    fit calls (the run went on for another epoch)."""
    run = rundir.prepare(tmp_path / "run", overwrite=False)
    kept = trainable.progress(run, "all", "val_accuracy", patience=1)
    kept.set_model(types.SimpleNamespace(stop_training=False))
    where = types.SimpleNamespace(cut=True, next_epoch=2)
    calls = []

    def fit(initial_epoch):
        calls.append(initial_epoch)
        for score in (0.5, 0.5)[len(calls) - 1 :]:  # epoch 1 does not beat epoch 0
            kept.on_epoch_end(len(calls), {"val_accuracy": score})

    _fit_until_done(fit, where, kept, first=1)
    assert calls == [1] and kept.stopped

    kept, calls[:] = trainable.progress(run, "all", "val_accuracy", patience=5), []
    kept.set_model(types.SimpleNamespace(stop_training=False))

    def fit_once_more(initial_epoch):
        calls.append(initial_epoch)
        where.cut = len(calls) == 1

    _fit_until_done(fit_once_more, where, kept, first=1)
    assert calls == [1, 2]  # no early stop: the next fit goes on from the next epoch


def test_progress_keeps_the_epochs_of_the_backup_it_resumes_from(tmp_path):
    """Epochs recorded after the backup that is restored (the newest was unreadable) are
    trained again, so they leave the history."""
    run = rundir.prepare(tmp_path / "run", overwrite=False)
    (tmp_path / "run" / "progress-all.json").write_text(json.dumps({"loss": [3.0, 2.0, 1.0]}))
    kept = trainable.progress(run, "all", "val_accuracy", patience=None)
    assert kept.resume_at(2) == 2 and kept.history == {"loss": [3.0, 2.0]}


def test_overwrite_replaces_an_interrupted_runs_progress(tmp_path):
    started = {"model": "kannada-cnn"}
    rundir.prepare(tmp_path, overwrite=False, started=started)
    (tmp_path / "backup").mkdir()
    (tmp_path / "progress-all.json").write_text("{}")
    (tmp_path / "progress-fine-tune.json").write_text("{}")
    run = rundir.prepare(tmp_path, overwrite=True, started={"model": "cifar-cnn"})
    assert not run.resumed
    assert not list(tmp_path.glob("progress-*")) and not (tmp_path / "backup").exists()
