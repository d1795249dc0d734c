"""The default recipe: what is chosen for which data, the schedule's shape, the time
budget, flip test-time augmentation."""

from __future__ import annotations

import itertools
import json
import types

import numpy as np
import pytest

from chute.errors import ChuteError
from chute.fit import budget, recipe
from chute.fit.config import TrainConfig

GLYPHS = dict(examples=54_000, num_classes=10, image_size=(28, 28), channels=1, multi_label=False)
PHOTOS = dict(examples=8_000, num_classes=16, image_size=(32, 32), channels=3, multi_label=False)


def test_the_recipe_for_small_grayscale_images():
    config, chosen = recipe.choose(TrainConfig(epochs=5), **GLYPHS)
    assert config.model == "chute-cnn"
    assert (config.schedule, config.learning_rate) == ("onecycle", recipe.PEAK_RATE["adam"])
    assert config.label_smoothing == recipe.LABEL_SMOOTHING
    assert chosen.width == 16
    assert config.augment == ()
    assert chosen.tta is None
    # the one line says what the data are and what was chosen for them
    line = chosen.summary
    said = (
        "small grayscale 28x28", "10 classes", "54,000 images", "chute-cnn width 16",
        "3 stages", "one-cycle", "over 5 epochs", "label smoothing 0.1", "augment none",
    )  # fmt: skip
    for words in said:
        assert words in line, (words, line)


def test_nothing_is_augmented_unless_asked_whatever_the_images():
    # translations (and flips for photos) cost accuracy on every dataset of the benchmark
    for data in (GLYPHS, {**GLYPHS, "examples": 400}, PHOTOS, {**PHOTOS, "examples": 100}):
        config, chosen = recipe.choose(TrainConfig(), **data)
        assert (config.augment, chosen.tta) == ((), None)


def test_colour_images_are_not_augmented_unless_asked_and_flips_bring_tta():
    config, chosen = recipe.choose(TrainConfig(), **{**PHOTOS, "examples": 100})
    assert (config.augment, chosen.tta, chosen.kind) == ((), None, "colour")
    config, chosen = recipe.choose(TrainConfig(augment="flip,zoom"), **PHOTOS)
    assert (config.augment, chosen.tta) == (("flip", "zoom"), "flip")


def test_width_follows_the_number_of_images():
    _, small = recipe.choose(TrainConfig(), **{**GLYPHS, "examples": recipe.WIDE_FROM - 1})
    _, large = recipe.choose(TrainConfig(), **{**GLYPHS, "examples": recipe.WIDE_FROM})
    assert (small.width, large.width) == (16, 32)


def test_what_a_user_sets_wins_option_by_option():
    asked = TrainConfig(
        model="kannada-cnn",
        schedule="constant",
        learning_rate=0.01,
        label_smoothing=0.0,
        augment="none",
        optimizer="sgd",
    )
    config, chosen = recipe.choose(asked, **PHOTOS)
    assert (config.model, config.schedule, config.learning_rate) == (
        "kannada-cnn",
        "constant",
        0.01,
    )
    assert (config.label_smoothing, config.augment, chosen.tta, chosen.width) == (
        0.0,
        (),
        None,
        None,
    )
    # an optimizer of the user's own gets its own peak rate
    config, _ = recipe.choose(TrainConfig(optimizer="sgd"), **GLYPHS)
    assert config.learning_rate == recipe.PEAK_RATE["sgd"]


def test_a_pretrained_backbone_keeps_the_plain_recipe():
    config, chosen = recipe.choose(TrainConfig(weights="imagenet"), **PHOTOS)
    assert config.model == recipe.PRETRAINED_MODEL
    assert (config.schedule, config.learning_rate) == ("constant", recipe.PLAIN_RATE)
    assert (config.label_smoothing, config.augment, chosen.tta) == (0.0, (), None)
    # pretrained: never augmented by default, whatever the images
    config, _ = recipe.choose(TrainConfig(weights="imagenet"), **{**GLYPHS, "examples": 100})
    assert config.augment == ()


def test_multi_label_data_get_no_label_smoothing_unless_asked():
    labels = {**PHOTOS, "multi_label": True}
    config, chosen = recipe.choose(TrainConfig(), **labels)
    assert config.label_smoothing == 0.0
    assert "colour multi-label" in chosen.summary
    # no test-time flips: a multi-label model's thresholds are tuned on the image alone
    assert recipe.choose(TrainConfig(augment="flip"), **labels)[1].tta is None
    assert recipe.choose(TrainConfig(label_smoothing=0.2), **labels)[0].label_smoothing == 0.2


def test_chute_cnn_is_as_deep_as_the_input_asks():
    from chute.fit.cnns import stages
    from chute.fit.models import build_model

    assert [stages((s, s)) for s in (8, 28, 32, 64, 224)] == [2, 3, 3, 4, 6]
    narrow = build_model("chute-cnn", input_shape=(28, 28, 1), num_classes=10)
    wide = build_model("chute-cnn", input_shape=(28, 28, 1), num_classes=10, width=32)
    assert wide.count_params() > 3 * narrow.count_params()
    pools = [layer for layer in narrow.layers if type(layer).__name__ == "MaxPooling2D"]
    assert len(pools) == 3
    with pytest.raises(ChuteError, match=r"width.*only chute-cnn.*Received: width=8"):
        build_model("kannada-cnn", input_shape=(28, 28, 1), num_classes=10, width=8)


def test_one_cycle_warms_up_over_a_fifth_then_decays_to_zero():
    from chute.fit.objective import learning_rate_schedule, make_optimizer

    config = TrainConfig(schedule="onecycle", learning_rate=3e-3, epochs=5)
    schedule = learning_rate_schedule(config, steps_per_epoch=10)
    rates = [float(schedule(step)) for step in range(51)]
    # the optimizer starts on it: at step 0, nothing yet
    assert float(make_optimizer(config, steps_per_epoch=10).learning_rate) == 0.0
    peak = int(np.argmax(rates))
    assert peak == 10  # 20% of 50 steps
    assert rates[0] == 0.0
    assert rates[peak] == pytest.approx(3e-3, rel=1e-6)
    assert all(a < b for a, b in itertools.pairwise(rates[: peak + 1]))
    assert all(a >= b for a, b in itertools.pairwise(rates[peak:]))
    assert rates[-1] == pytest.approx(0.0, abs=1e-9)


def test_durations_are_read_as_people_write_them():
    assert budget.parse_duration("10m") == 600
    assert budget.parse_duration("1h30m") == 5400
    assert budget.parse_duration("90s") == 90
    assert budget.parse_duration("45") == 45
    assert budget.parse_duration(2.5) == 2.5
    for bad in ("soon", "10 minutes", "-5", "0", 0, True, "m", [1]):
        with pytest.raises(ChuteError, match=r"time_limit.*Received: time_limit="):
            budget.parse_duration(bad)
    assert TrainConfig(time_limit="10m").epochs == budget.MOST_EPOCHS
    assert TrainConfig(time_limit="10m", epochs=7).epochs == 7
    with pytest.raises(ChuteError, match=r"time_limit.*fine_tune"):
        TrainConfig(time_limit="10m", fine_tune="all", weights="imagenet")


def test_the_epochs_that_fit_the_time_left():
    fit = dict(epoch_seconds=[100.0], done=1, most=50)
    assert budget.budget_epochs(limit=600, spent=100, **fit) == 6
    assert budget.budget_epochs(limit=600, spent=590, **fit) == 1  # the next would overrun
    assert budget.budget_epochs(limit=10_000, spent=100, **fit) == 50  # at most `most`
    # the mean of the epochs so far (the first, which compiles, weighs less over time)
    assert (
        budget.budget_epochs(limit=600, spent=250, epoch_seconds=[150, 100], done=2, most=50) == 4
    )


def test_the_budget_schedule_ends_at_zero_with_the_last_epoch():
    rates = [
        budget.rate_at(step, peak=1.0, warmup=10, total=40, schedule="onecycle")
        for step in range(41)
    ]
    assert rates[0] == 0 and rates[10] == 1.0 and rates[40] == pytest.approx(0, abs=1e-12)
    assert budget.rate_at(5, peak=0.1, warmup=10, total=40, schedule="constant") == 0.1


def _fake_clock(monkeypatch, epoch_seconds: float) -> None:
    """Every epoch takes ``epoch_seconds`` by chute.fit.budget's clock."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += epoch_seconds  # called at each epoch's start and end: end - start
        return now[0]

    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=monotonic))


@pytest.mark.slow
def test_a_time_limit_trains_the_epochs_that_fit_and_keeps_the_best(
    train_data, tmp_path, monkeypatch
):
    import chute

    _fake_clock(monkeypatch, 5.0)
    run = tmp_path / "run"
    # 12 s at 5 s an epoch: after epoch 1, 7 s left hold one more; after epoch 2, none
    result = chute.train(train_data, run, time_limit="12s", batch_size=8, strategy="cpu", verbose=0)
    assert result.epochs_run == 2
    state = json.loads((run / "budget.json").read_text())
    assert state["spent"] == pytest.approx(10.0)
    assert state["epochs"] == 2
    assert (run / "bundle" / "chute.json").exists()
    started = json.loads((run / "config.json").read_text())
    assert started["time_limit"] == 12.0
    # --overwrite starts the budget afresh (another limit too): 17 s hold 3 epochs
    again = chute.train(
        train_data, run, time_limit="17s", batch_size=8, strategy="cpu", verbose=0,
        overwrite=True,
    )  # fmt: skip
    assert again.epochs_run == 3
    assert json.loads((run / "budget.json").read_text())["spent"] == pytest.approx(15.0)


def test_a_resumed_run_spends_only_what_is_left(tmp_path, monkeypatch):
    import keras

    _fake_clock(monkeypatch, 5.0)
    state = tmp_path / "budget.json"
    # an earlier process spent 10 of the 12 seconds over 2 epochs
    state.write_text(
        json.dumps({"limit": 12.0, "spent": 10.0, "epoch_seconds": [5, 5], "epochs": 2})
    )
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    timer = budget.callback(
        limit=12.0, state_file=str(state), steps=2, most=100, peak=0.1, schedule="onecycle",
        chief=True,
    )  # fmt: skip
    history = model.fit(
        np.zeros((4, 2)), np.zeros((4, 1)), batch_size=2, epochs=100, initial_epoch=2,
        callbacks=[timer], verbose=0,
    )  # fmt: skip
    # one more epoch (its 5 s overrun nothing: 2 s were left, so it is the last)
    assert len(history.history["loss"]) == 1
    assert json.loads(state.read_text())["spent"] == pytest.approx(15.0)
    # the rate followed the fitted schedule step by step: step 1 of a 2-step warm-up
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
    # another limit on resume is refused, naming both
    with pytest.raises(ChuteError, match=r"time_limit=12 .*Received: time_limit=60"):
        budget.callback(
            limit=60.0, state_file=str(state), steps=2, most=100, peak=0.1,
            schedule="onecycle", chief=True,
        )  # fmt: skip


def _bundle(tmp_path, tta):
    import keras

    from chute.format.bundle import save_bundle
    from chute.format.spec import ImageSpec

    # a model that sees left from right: the mean of its columns' weights differ
    inputs = keras.Input((4, 4, 1), dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    outputs = keras.layers.Dense(3, activation="softmax", dtype="float32", name="predictions")(x)
    model = keras.Model(inputs, outputs)
    weights = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32) * 3
    model.layers[-1].set_weights([weights, np.zeros(3, np.float32)])
    spec = ImageSpec(height=4, width=4, channels=1)
    return save_bundle(
        model, tmp_path / f"bundle-{tta}", class_names=["a", "b", "c"], image=spec, tta=tta
    )


def test_flip_tta_is_the_mean_of_the_image_and_its_mirror(tmp_path):
    from chute.format.bundle import load_bundle

    saved = _bundle(tmp_path, "flip")
    bundle = load_bundle(saved.location)
    assert bundle.tta == "flip"
    assert json.loads((tmp_path / "bundle-flip" / "chute.json").read_text())["tta"] == "flip"
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (5, 4, 4, 1), dtype=np.uint8)
    alone = bundle.scores(images, tta=False)
    mirrored = bundle.scores(images[:, :, ::-1], tta=False)
    assert not np.allclose(alone, mirrored, atol=1e-3)  # the model tells the sides apart
    np.testing.assert_allclose(bundle.scores(images), (alone + mirrored) / 2, rtol=1e-5, atol=1e-6)
    # a flip-symmetric image scores as without test-time flips
    symmetric = np.concatenate([images[:, :, :2], images[:, :, 1::-1]], axis=2)
    np.testing.assert_allclose(
        bundle.scores(symmetric), bundle.scores(symmetric, tta=False), rtol=1e-5, atol=1e-6
    )
    # a bundle without it scores the image alone, and says nothing of it
    plain = load_bundle(_bundle(tmp_path, None).location)
    np.testing.assert_allclose(plain.scores(images), alone, rtol=1e-5, atol=1e-6)
    assert "tta" not in json.loads((tmp_path / "bundle-None" / "chute.json").read_text())


def test_an_unknown_tta_is_refused(tmp_path):
    with pytest.raises(ChuteError, match=r"tta.*Received: tta='rotate'"):
        _bundle(tmp_path, "rotate")
    assert not (tmp_path / "bundle-rotate").exists()


def test_callbacks_must_be_keras_callbacks(train_data, tmp_path):
    import chute

    with pytest.raises(ChuteError, match=r"callbacks.*keras.callbacks.Callback.*Received"):
        chute.train(train_data, tmp_path / "run", callbacks=[print], epochs=1)
    assert not (tmp_path / "run").exists()


def test_cli_time_limit_and_augment_none_are_checked_before_anything_runs(
    train_data, tmp_path, capsys
):
    from chute import cli

    run = tmp_path / "run"
    assert cli.main(["train", str(train_data), "--run-dir", str(run), "--time-limit", "soon"]) == 2
    err = capsys.readouterr().err
    assert "time_limit" in err and "'soon'" in err and "10m" in err
    assert "Traceback" not in err
    assert not run.exists()
    assert TrainConfig(augment="none").augment == ()
    assert TrainConfig(augment="auto").augment is None


def test_the_budget_counts_steps_when_a_call_runs_several(tmp_path, monkeypatch):
    import keras

    _fake_clock(monkeypatch, 5.0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)  # Keras calls back once per 2 steps
    timer = budget.callback(
        limit=100.0, state_file=str(tmp_path / "budget.json"), steps=4, most=100, peak=0.1,
        schedule="onecycle", chief=True,
    )  # fmt: skip
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=1, callbacks=[timer],
              verbose=0)  # fmt: skip
    # the second call began at step 2 of the 4-step warm-up
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
    assert timer.step == 4


def test_a_time_limit_is_refused_over_several_processes_or_workers():
    from chute.fit import train as training
    from chute.fit.processes import Processes

    config = TrainConfig(time_limit="10m", backend="tensorflow")
    training._check_one_process_options(config, Processes(count=1), [])  # one process: fine
    with pytest.raises(ChuteError, match=r"time_limit.*pass epochs.*time_limit=600 on 2"):
        training._check_one_process_options(config, Processes(count=2, index=0), [])
    workers = TrainConfig(time_limit="10m", backend="tensorflow", strategy="multiworker")
    with pytest.raises(ChuteError, match=r"time_limit"):
        training._check_one_process_options(workers, Processes(count=1), [])
    import keras

    plain = TrainConfig(backend="tensorflow", strategy="multiworker")
    with pytest.raises(ChuteError, match=r"`callbacks`.*MultiWorkerMirroredStrategy"):
        training._check_one_process_options(plain, Processes(), [keras.callbacks.Callback()])
    training._check_one_process_options(plain, Processes(), [])


def test_a_resumed_epoch_the_budget_ended_is_not_followed_by_another():
    from chute.fit import train as training

    calls = []
    where = types.SimpleNamespace(cut=True, next_epoch=3)
    kept = types.SimpleNamespace(stopped=False)
    spent = types.SimpleNamespace(stopped=True)
    training._fit_until_done(calls.append, where, kept, first=2, budgets=[spent])
    assert calls == [2]
    spent.stopped = False
    calls.clear()
    where_once = types.SimpleNamespace(cut=True, next_epoch=3)

    def fit(epoch):
        calls.append(epoch)
        where_once.cut = epoch == 2  # the first fit trained a cut epoch, the next whole ones

    training._fit_until_done(fit, where_once, kept, first=2, budgets=[spent])
    assert calls == [2, 3]


def test_on_jax_the_fitted_rate_holds_for_a_whole_epoch(tmp_path, monkeypatch):
    import keras

    _fake_clock(monkeypatch, 5.0)
    # JAX's fit reads the variables once an epoch: the rate of the epoch's middle step
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    timer = budget.callback(
        limit=100.0, state_file=str(tmp_path / "budget.json"), steps=4, most=100, peak=0.1,
        schedule="onecycle", chief=True,
    )  # fmt: skip
    seen = []

    class Rate(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))

    monkeypatch.undo()  # the model itself trains on this machine's backend
    _fake_clock(monkeypatch, 5.0)
    model.fit(
        np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=1, callbacks=[timer, Rate()],
        verbose=0,
    )  # fmt: skip
    # step 2 of a 4-step warm-up, for every step of the epoch
    assert seen == pytest.approx([0.05] * 4)
