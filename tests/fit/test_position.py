"""Where a phase resumes (chute.fit.position): the arithmetic of a restored backup and of the
fit calls that finish its phase, without Keras; the backup callback with a stand-in model."""

from __future__ import annotations

import types

import pytest

from chute.errors import ChuteError
from chute.fit import position
from chute.fit.backup import Record
from chute.fit.position import FitCall, Resume, ResumePoint
from chute.fit.train import _fit_until_done
from chute.read.stream import StreamPosition


@pytest.mark.parametrize(
    ("record", "stored", "engine", "expected"),
    [
        (None, None, "grain", (0, 0, 0)),  # a new phase
        (Record(1, 10, "w"), None, "grain", (1, 4, 32)),  # epoch 1, 4 of 6 batches done
        (Record(2, 12, "w"), None, "grain", (2, 0, 0)),  # backed up at epoch 1's end
        (Record(1, 10, "w"), None, "tf", (1, 0, 0)),  # tf.data reads the epoch again
        # a legacy backup (Keras's files) records no step: its weights file's optimizer's
        (Record(2, -1, "w"), 15, "grain", (2, 3, 24)),
        (Record(2, -1, "w"), 12, "grain", (2, 0, 0)),
        (Record(2, -1, "w"), None, "grain", (2, 0, 0)),  # not even there: the epoch's start
    ],
)
def test_a_restored_backup_is_an_epoch_a_batch_and_the_examples_trained(
    record, stored, engine, expected
):
    point = ResumePoint.of(record, steps=6, global_batch=8, engine=engine, stored_step=stored)
    assert (point.epoch, point.batch, point.samples) == expected


def test_the_point_keeps_the_seed_states_of_its_backup():
    seeds = {"dropout/seed_generator_state": [1, 2]}
    assert ResumePoint.of(Record(0, 3, "w", seeds), steps=6, global_batch=8).seeds == seeds


def test_a_resumed_epoch_is_fit_alone_from_its_batch_then_the_rest_from_the_next():
    point = ResumePoint(epoch=1, batch=4, samples=32)
    first = point.fit_call(1, epochs=3, steps=6, first_epoch=2)
    # told the phase's epochs (the progress bar's "Epoch 2/3"): the callback stops it
    assert first == FitCall(1, 3, 2, StreamPosition(3, 4), cut=True)  # data epoch 2 + 1
    assert point.fit_call(2, epochs=3, steps=6, first_epoch=2) == FitCall(
        2, 3, 6, StreamPosition(4, 0)
    )
    # from its start (a new phase, or an epoch's end): one fit of every epoch left
    assert ResumePoint().fit_call(0, epochs=3, steps=None) == FitCall(0, 3, None, StreamPosition(0))


def test_the_tf_engine_says_an_interrupted_epoch_starts_again(caplog):
    with caplog.at_level("INFO", logger="chute.fit.position"):
        point = ResumePoint.of(Record(1, 10, "w"), steps=6, global_batch=8, engine="tf")
    assert "reads the epoch again from its first batch" in caplog.text
    assert point.fit_call(1, epochs=3, steps=6).cut is False


def _resume(record, stored_step=None, **options):
    store = types.SimpleNamespace(
        latest=lambda: record, load=lambda model, record: None, stored_step=lambda _: stored_step
    )
    return Resume(store, steps=6, global_batch=8, epochs=3, first_epoch=2, **options)


def test_a_legacy_backup_resumes_at_the_step_its_weights_file_holds():
    assert _resume(Record(1, -1, "w"), stored_step=9).point == ResumePoint(1, 3, 24)
    assert _resume(Record(1, -1, "w")).point == ResumePoint(1)  # none there: the epoch's start


def test_one_object_says_whether_a_fit_ended_a_resumed_epoch_and_where_the_next_starts():
    resume = _resume(Record(1, 10, "w"))
    kept = types.SimpleNamespace(stopped=False)
    calls = []

    def fit(initial_epoch):
        calls.append(resume.call(initial_epoch))

    _fit_until_done(fit, resume, kept, first=resume.point.epoch)
    assert [(c.initial_epoch, c.epochs, c.steps, c.start) for c in calls] == [
        (1, 3, 2, StreamPosition(3, 4)),
        (2, 3, 6, StreamPosition(4, 0)),
    ]
    assert not resume.cut and resume.next_epoch == 2
    unrepeated = _resume(None, repeated=False)  # tf.data's own length: fit is told none
    assert unrepeated.call(0).steps is None and not unrepeated.cut


def test_the_callback_backs_up_every_n_steps_but_not_on_an_epochs_last_batch():
    saved = []
    resume = _resume(Record(1, 10, "w"))
    callback = resume.callback(lambda model, epoch, samples: saved.append(epoch), every=1)
    callback.set_model(types.SimpleNamespace())
    resume.call(1)  # the resumed epoch's 2 remaining batches
    callback.on_train_begin()
    callback.on_epoch_begin(1)
    callback.on_train_batch_end(0)
    callback.on_train_batch_end(1)  # its last: the epoch's end backs it up
    callback.on_epoch_end(1)
    assert saved == [1, 2] and callback.model.stop_training  # the resumed epoch: done
    callback.model.stop_training = False
    resume.call(2)  # then whole epochs: fit stops after its last
    callback.on_epoch_begin(2)
    callback.on_epoch_end(2)
    assert saved == [1, 2, 3] and not callback.model.stop_training
    assert position._callback() is position._callback()  # one class


def test_keras_shows_a_resumed_epoch_as_the_phases_and_trains_only_its_rest(capsys):
    """Keras's progress bar says "Epoch k/N" only when told the phase's epochs (none at
    all when told 1): the cut fit is told them, trains the steps it is given and stops
    at that epoch's end; the next fit trains the epochs left."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((48, 3), "float32"), np.zeros((48, 2), "float32")  # 6 batches of 8
    resume = _resume(Record(0, 4, "w"))  # epoch 0 (the first), 4 of 6 batches done
    began = []
    callbacks = [
        resume.callback(),
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: began.append(epoch)),
    ]

    def fit(initial_epoch):
        call = resume.call(initial_epoch)
        model.fit(
            x, y, batch_size=8, shuffle=False, verbose=1, callbacks=callbacks,
            initial_epoch=call.initial_epoch, epochs=call.epochs, steps_per_epoch=call.steps,
        )  # fmt: skip

    _fit_until_done(fit, resume, types.SimpleNamespace(stopped=False), first=resume.point.epoch)
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch ")]
    assert shown == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert began == [0, 1, 2] and int(model.optimizer.iterations) == 2 + 2 * 6


def test_a_mixed_run_resumes_only_with_the_global_batch_it_was_backed_up_with():
    """A mixture's batches are composed for one global batch size: another is refused,
    naming the --batch-size that makes it on this many replicas; the same one resumes on
    another number of processes and replicas."""
    record = Record(1, 10, "w", samples=32, global_batch=16, layout=(1, 2))
    with pytest.raises(ChuteError, match=r"global batch of 16, now 8 .*--batch-size 4"):
        _resume(record, fixed_batch=True, layout=(1, 4))
    with pytest.raises(ChuteError, match="3 replica"):
        _resume(record, fixed_batch=True, layout=(1, 3))
    assert _resume(record, layout=(1, 4)).point.batch == 4  # one dataset: at its example
    kept = Record(1, 10, "w", samples=32, global_batch=8, layout=(1, 2))
    assert _resume(kept, fixed_batch=True, layout=(1, 8)).point == ResumePoint(1, 4, 32)
