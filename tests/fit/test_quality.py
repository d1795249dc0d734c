"""A run of few steps learns what its data allow: BatchNorm's moving statistics settle
within an epoch, and a run too short for its model says so."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from helpers import write_banded

import chute
from chute import ChuteError, TrainConfig
from chute.fit import cnns
from chute.fit.models import SETTLED, batch_norm_momentum, build_model
from chute.fit.objective import (
    MIN_STEPS,
    SMALLEST_CHOSEN_BATCH,
    choose_batch_size,
    warn_if_short,
)


def test_momentum_leaves_the_settled_share_of_the_start_after_one_epoch():
    for steps in (1, 2, 3, 10, 50, 87):
        momentum = batch_norm_momentum(steps)
        assert 0 < momentum < cnns.BN_MOMENTUM
        # float64 powers of numbers in (0, 1): exact to far better than 1e-9
        assert momentum**steps == pytest.approx(SETTLED, rel=1e-9)
    # where 0.9 settles within the epoch already, it stays (and for an unknown epoch)
    assert SETTLED > 0.9**88
    for steps in (88, 100, 10_000, None):
        assert batch_norm_momentum(steps) == cnns.BN_MOMENTUM == 0.9
    momenta = [batch_norm_momentum(steps) for steps in range(1, 120)]
    assert momenta == sorted(momenta)  # more steps, more momentum


@pytest.mark.parametrize("steps", [0, -1, 2.5, "3", True])
def test_momentum_of_a_bad_step_count_is_a_clear_error(steps):
    with pytest.raises(ChuteError, match="steps_per_epoch"):
        batch_norm_momentum(steps)
    with pytest.raises(ChuteError, match="steps_per_epoch"):
        build_model("kannada-cnn", input_shape=(16, 16, 1), num_classes=3, steps_per_epoch=steps)


def _momenta(model) -> list[float]:
    import keras

    found = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer.momentum)
        if hasattr(layer, "layers"):
            found += _momenta(layer)
    return found


@pytest.mark.parametrize(
    ("name", "shape"), [("kannada-cnn", (16, 16, 1)), ("MobileNetV2", (32, 32, 3))]
)
def test_build_model_gives_every_batch_norm_the_momentum_of_its_epoch(name, shape):
    model = build_model(name, input_shape=shape, num_classes=3, steps_per_epoch=4)
    momenta = _momenta(model)
    assert len(momenta) >= 7  # kannada-cnn has 7; MobileNetV2's backbone dozens
    assert set(momenta) == {batch_norm_momentum(4)}  # the same float, set as it is
    # saved with the model: a reloaded (or resumed) model keeps it
    copy = model.__class__.from_config(model.get_config())
    assert set(_momenta(copy)) == {batch_norm_momentum(4)}


def test_build_model_without_steps_keeps_the_models_own_momentum():
    model = build_model("cifar-cnn", input_shape=(16, 16, 3), num_classes=3)
    assert set(_momenta(model)) == {0.9}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kannada-cnn", "cifar-cnn"])
def test_the_features_the_classifier_sees_stay_alive_through_the_first_steps(name):
    import keras

    # 10 steps of Adam at chute's default learning rate, on noise (what kills a ReLU
    # is the size of the first steps, not the data)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(128) % 10
    keras.utils.set_random_seed(0)
    model = build_model(name, input_shape=(32, 32, 3), num_classes=10)
    last_dropout = [layer for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    features = keras.Model(model.input, last_dropout[-1].input)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    model.fit(images, labels, batch_size=64, epochs=5, verbose=0)
    silent = np.asarray(features(images, training=True)).max(axis=0) <= 0
    # With BatchNorm before its ReLU a unit is 0 for all 128 images practically never;
    # cifar-cnn's Dense + ReLU without it had 48-59% of its 128 units so after 10 steps.
    assert silent.mean() < 0.1, f"{silent.sum()} of {silent.size} features are 0 for every image"


def test_a_short_run_is_warned_of_with_its_steps_and_the_way_out(caplog):
    config = TrainConfig(model="kannada-cnn", epochs=5, batch_size=256)
    with caplog.at_level(logging.WARNING, logger="chute.fit.objective"):
        assert warn_if_short(config, 2, global_batch=256, train_examples=594)
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "10 optimizer steps" in message and "2 per epoch" in message
    assert "594 training images" in message and "kannada-cnn" in message
    # 5 epochs of at least 100 / 5 = 20 steps: batches of at most 594 // 20 = 29
    assert "--batch-size 29 or less" in message
    assert f"--epochs {math.ceil(MIN_STEPS / 2)}" in message


def test_the_suggested_batch_is_per_replica_and_left_out_when_none_fits(caplog):
    config = TrainConfig(epochs=1, batch_size=64)  # 2 replicas: global batches of 128
    with caplog.at_level(logging.WARNING, logger="chute.fit.objective"):
        warn_if_short(config, 10, global_batch=128, train_examples=1280)
        warn_if_short(config, 1, global_batch=128, train_examples=150)
    first, second = (r.getMessage() for r in caplog.records)
    assert "--batch-size 6 or less" in first and "--epochs 10" in first  # 1280 // 100 // 2
    assert "--batch-size" not in second and "--epochs 100" in second


def test_a_run_of_enough_steps_or_from_pretrained_weights_is_not_warned_of(caplog):
    config = TrainConfig(epochs=MIN_STEPS // 10)
    pretrained = TrainConfig(model="MobileNetV2", weights="imagenet", epochs=1)
    with caplog.at_level(logging.WARNING, logger="chute.fit.objective"):
        assert not warn_if_short(config, 10, global_batch=128, train_examples=1280)
        assert not warn_if_short(pretrained, 10, global_batch=128, train_examples=1280)
    assert not caplog.records


@pytest.fixture(scope="module")
def banded(tmp_path_factory):
    """3 classes x 24 16x16 images told apart by a band's row: train 54, val 18."""
    root = tmp_path_factory.mktemp("banded")
    write_banded(root / "src", per_class=24, size=16)
    chute.convert(root / "src", root / "shards", val_fraction=0.25, workers=1)
    return root / "shards"


@pytest.mark.slow
def test_a_run_of_few_steps_validates_as_well_as_it_trains(banded, tmp_path, caplog):
    # 6 steps an epoch, 18 in all: at BatchNorm's old momentum 0.9 the moving statistics
    # kept 0.15 of their start (variance 1, where the first layer's is near 1e-2), and the
    # model predicted one class in inference mode (val accuracy 1/3) while it trained to 1.
    with caplog.at_level(logging.WARNING, logger="chute.fit.objective"):
        result = chute.train(
            banded, tmp_path / "run", model="kannada-cnn", epochs=3, batch_size=9,
            strategy="cpu", verbose=0,
        )  # fmt: skip
    history = result.final
    # 18 validation images of 3 classes: chance is 1/3; the bands are plain enough that
    # the model learns them within a few steps, and a settled model validates as it trains
    assert history["accuracy"] > 0.8, history
    assert history["val_accuracy"] >= history["accuracy"] - 0.2, history
    assert result.best_val_accuracy >= 0.8, history
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("18 optimizer steps" in w and "--epochs 17" in w for w in warnings), warnings


def test_left_to_chute_a_small_dataset_gets_a_smaller_batch_and_the_reason(caplog):
    # 480 images, 10 epochs: batches of 128 give 3 steps an epoch, 30 in all; of 32, 150
    config = TrainConfig(model="kannada-cnn", epochs=10)
    assert config.batch_size is None  # not given: chute chooses
    with caplog.at_level(logging.INFO, logger="chute.fit.objective"):
        assert choose_batch_size(config, train_examples=480, replicas=1) == 32
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("batch size 32, not 128: 480 training images give 30 ")
    assert f"fewer than the {MIN_STEPS}" in message and "with 32, 150 steps" in message
    assert "--batch-size" in message


def test_a_chosen_batch_counts_every_replica_and_stops_at_its_floor():
    config = TrainConfig(epochs=10)
    # 2 replicas: global batches of 2 x 16 = 32 give 150 steps; 2 x 32, 70
    assert choose_batch_size(config, train_examples=480, replicas=2) == 16
    # never below the floor, however few the images (warn_if_short says the rest)
    assert choose_batch_size(config, train_examples=40, replicas=1) == SMALLEST_CHOSEN_BATCH


def test_enough_data_a_pretrained_backbone_or_a_batch_given_by_hand_keep_theirs(caplog):
    with caplog.at_level(logging.INFO, logger="chute.fit.objective"):
        # 1280 images: 10 steps an epoch x 10 epochs make 100
        assert choose_batch_size(TrainConfig(epochs=10), train_examples=1280, replicas=1) == 128
        pretrained = TrainConfig(model="MobileNetV2", weights="imagenet", epochs=1)
        assert choose_batch_size(pretrained, train_examples=480, replicas=1) == 128
        given = TrainConfig(epochs=10, batch_size=128)
        assert choose_batch_size(given, train_examples=480, replicas=1) == 128
    assert not caplog.records


@pytest.mark.slow
def test_a_run_left_to_choose_its_batch_records_the_one_it_chose(banded, tmp_path, caplog):
    import json

    with caplog.at_level(logging.INFO, logger="chute.fit.objective"):
        result = chute.train(
            banded, tmp_path / "run", model="kannada-cnn", epochs=1, strategy="cpu", verbose=0
        )
    # 54 training images: 3 steps of 16 (today's 128 is more than the whole split)
    assert result.global_batch_size == SMALLEST_CHOSEN_BATCH * result.replicas
    assert any(r.getMessage().startswith("batch size 16, not 128") for r in caplog.records)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["batch_size"] == 16
    started = json.loads((tmp_path / "run" / "started.json").read_text())
    assert started["batch_size"] == "auto, 1 epochs"
