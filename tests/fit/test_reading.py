"""chute train's reading rules (chute.fit.reading): a table over engine x backend x processes,
without Keras or data."""

from __future__ import annotations

import dataclasses
import types

import pytest

from chute import LoadOptions, TrainConfig
from chute.errors import ChuteError
from chute.fit import reading
from chute.fit.devices import Devices
from chute.format.spec import ImageSpec

ONE_CPU = Devices("cpu")
FOUR_JAX = Devices("cpu", "jax", replicas=4, names=("cpu:0",) * 4, devices_here=4)
TWO_JAX_PROCESSES = dataclasses.replace(FOUR_JAX, processes=2, process_index=1, devices_here=2)
TORCH_GPU = Devices("gpu", "torch", names=("cuda:0",), gpus=1)
MIRRORED = Devices("multi-gpu", replicas=2)
POD = Devices("tpu", replicas=8, hosts=2)
WORKERS = Devices("multiworker", replicas=4, hosts=2)


def _manifest(val: int = 30, image: ImageSpec | None = None):
    counts = {"train": 100, "val": val}
    return types.SimpleNamespace(
        num_examples=counts.__getitem__,
        image=image or ImageSpec(16, 16, 1),
        multi_label=False,
        location="/data",
    )


# devices, engine -> (train batch, repeat) and (val batch, pad, repeat, workers), per replica 8
TABLE = [
    (ONE_CPU, "tf", (8, False), (8, False, False, None)),
    (ONE_CPU, "grain", (8, True), (8, False, True, 0)),
    (MIRRORED, "tf", (16, False), (16, False, False, None)),
    (FOUR_JAX, "tf", (32, False), (32, True, False, None)),  # Keras splits every batch
    (FOUR_JAX, "grain", (32, True), (32, True, True, 0)),
    (TWO_JAX_PROCESSES, "tf", (16, True), (16, True, True, None)),  # its 2 devices' share
    (TWO_JAX_PROCESSES, "grain", (16, True), (16, True, True, 0)),
    (TORCH_GPU, "tf", (8, False), (8, False, False, None)),
    (POD, "tf", (8, True), (8, True, True, None)),  # per replica: distribute_datasets...
    (WORKERS, "tf", (8, True), (32, False, False, None)),  # chute's loop: the whole split
]


@pytest.mark.parametrize(("devices", "engine", "train", "val"), TABLE)
def test_each_split_is_read_as_the_devices_and_engine_need(devices, engine, train, val):
    config = TrainConfig(batch_size=8, seed=3, load=LoadOptions(engine=engine))
    got_train, got_val = reading.reading(config, devices, _manifest())
    assert (got_train.batch_size, got_train.repeat) == train
    assert got_train.training is None and got_train.seed == 3
    got = (got_val.batch_size, got_val.pad_final_batch, got_val.repeat, got_val.workers)
    assert got == val and got_val.training is False and got_val.sampling is None
    for options in (got_train, got_val):  # nothing else of `load` is changed
        changed = {
            f.name
            for f in dataclasses.fields(LoadOptions)
            if getattr(options, f.name) != getattr(config.load, f.name)
        }
        assert changed <= set(reading.CHOSEN_BY_TRAIN) | {"workers", "sampling"}


# a value other than LoadOptions' default for each option chute train chooses
OTHERWISE = {
    "batch_size": 5,
    "image_size": (9, 9),
    "augment": ("flip",),
    "augment_on": "device",
    "crop_fraction": 0.5,
    "seed": 11,
    "data_service": "grpc://localhost:5000",
    "training": True,
    "dtype": "float32",
    "label_mode": "categorical",
    "repeat": True,
    "pad_final_batch": True,
}


@pytest.mark.parametrize(
    ("devices", "engine", "name"),
    [
        (devices, engine, name)
        for devices, engine in ((ONE_CPU, "grain"), (POD, "tf"))
        for name in sorted(reading.CHOSEN_BY_TRAIN)
        if (engine, name) != ("grain", "data_service")  # the service runs tf.data pipelines
    ],
)
def test_the_options_load_cannot_set_are_those_reading_sets(devices, engine, name):
    """Set in `load` anyway (TrainConfig refuses it), each changes neither split: reading()
    sets every option of CHOSEN_BY_TRAIN (the test above: and no other)."""
    assert set(OTHERWISE) == set(reading.CHOSEN_BY_TRAIN)
    config = TrainConfig(batch_size=8, seed=3, load=LoadOptions(engine=engine))
    expected = reading.reading(config, devices, _manifest())
    load = dataclasses.replace(config.load, **{name: OTHERWISE[name]})
    object.__setattr__(config, "load", load)  # past TrainConfig's check
    assert reading.reading(config, devices, _manifest()) == expected
    with pytest.raises(ChuteError, match=f"`load.{name}` cannot be set for chute train"):
        TrainConfig(load=load)


@pytest.mark.parametrize(
    ("devices", "train", "val"),
    [
        (ONE_CPU, {}, {}),
        (FOUR_JAX, {}, {}),
        (POD, {"strategy"}, {"strategy"}),
        (WORKERS, {"strategy"}, set()),
        (TWO_JAX_PROCESSES, {"input_context"}, {"input_context"}),
    ],
)
def test_each_host_reads_its_own_part_through_its_pipeline(devices, train, val):
    assert set(reading.pipelines(devices, training=True)) == set(train)
    assert set(reading.pipelines(devices, training=False)) == set(val)


def test_a_jax_process_is_one_input_pipeline_of_as_many_as_processes():
    context = reading.pipelines(TWO_JAX_PROCESSES, training=True)["input_context"]
    assert (context.num_input_pipelines, context.input_pipeline_id) == (2, 1)


def test_the_service_repeats_training_and_grain_validation_uses_threads_unless_asked():
    config = TrainConfig(batch_size=8, data_service="grpc://localhost:5000")
    train, _ = reading.reading(config, ONE_CPU, _manifest())
    assert train.repeat and train.data_service == "grpc://localhost:5000"
    config = TrainConfig(batch_size=8, load=LoadOptions(engine="grain", workers=3))
    assert reading.reading(config, ONE_CPU, _manifest())[1].workers == 3


def test_no_val_split_no_val_options_and_labels_follow_the_loss():
    train, val = reading.reading(TrainConfig(label_smoothing=0.1), ONE_CPU, _manifest(val=0))
    assert val is None and train.label_mode == "categorical" and train.image_size == (16, 16)
    train, _ = reading.reading(TrainConfig(), ONE_CPU, _manifest(val=0))
    assert train.label_mode == "int"


@pytest.mark.parametrize(
    ("config", "devices", "where"),
    [
        (TrainConfig(), ONE_CPU, "host"),
        (TrainConfig(), Devices("gpu"), "device"),
        (TrainConfig(), Devices("tpu", "jax"), "device"),
        (TrainConfig(), TORCH_GPU, "host"),  # torch: heavy augmentations in the pipeline
        (TrainConfig(data_service="grpc://localhost:5000"), ONE_CPU, "device"),
        (TrainConfig(augment_on="host"), Devices("gpu"), "host"),
    ],
)
def test_heavy_augmentations_run_on_the_accelerator_unless_asked(config, devices, where):
    assert reading.augment_on(config, devices) == where
    assert reading.reading(config, devices, _manifest())[0].augment_on == where


def test_photos_kept_at_their_size_take_the_models_size_or_ask_for_one():
    photos = ImageSpec(None, None, 3, "jpeg", shorter_side=256)
    config = TrainConfig(model="MobileNetV2", crop_fraction=None)
    assert reading.input_size(config, _manifest(image=photos)) == (224, 224)
    assert reading.crop_fraction(config, _manifest(image=photos)) == 0.875
    with pytest.raises(ChuteError, match="pass image_size"):
        reading.input_size(TrainConfig(model="kannada-cnn"), _manifest(image=photos))
