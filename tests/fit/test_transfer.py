"""Transfer learning: Keras's ImageNet weights through its cache (seeded here: nothing
downloads), the offline error, head-only epochs then fine-tuning, resumable."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import Killed, dying_epoch_timer, make_folder

import chute
from chute import ChuteError
from chute.fit import trainable
from chute.fit.models import build_model

SIZE = 96  # MobileNetV2 has ImageNet weights for 96, 128, 160, 192 and 224
WEIGHTS_FILE = f"mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{SIZE}_no_top.h5"
# The fine-tuning test trains MobileNet (v1): the same kind of backbone (BatchNorm after each
# convolution, the same preprocessing) in 87 layers instead of 155, so its three fits build
# and trace in about half the time. It has ImageNet weights for 128, 160, 192 and 224.
FINE_MODEL, FINE_SIZE = "MobileNet", 128
FINE_WEIGHTS_FILE = f"mobilenet_1_0_{FINE_SIZE}_tf_no_top.h5"


@pytest.fixture
def offline(monkeypatch):
    """Any download fails, as on a machine without network."""

    def refuse(*args, **kwargs):
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(urllib.request, "urlretrieve", refuse)


@pytest.fixture
def keras_home():
    """Keras's cache folder (tests/conftest.py points KERAS_HOME at a temporary one);
    what a test seeds there is removed after it."""
    home = Path(os.environ["KERAS_HOME"])
    yield home
    for name in (WEIGHTS_FILE, FINE_WEIGHTS_FILE):
        (home / "models" / name).unlink(missing_ok=True)


def seed_keras_cache(
    home: Path, app: str = "MobileNetV2", size: int = SIZE, file: str = WEIGHTS_FILE
) -> list[np.ndarray]:
    """Writes the no-top weights of ``keras.applications.<app>`` where Keras caches them
    (as ``file``), in the legacy HDF5 layout Keras downloads (known random values);
    returns them in layer order."""
    import h5py
    import keras

    backbone = getattr(keras.applications, app)(
        include_top=False, weights=None, input_shape=(size, size, 3), pooling="avg"
    )
    rng = np.random.default_rng(0)
    values = []
    path = home / "models" / file
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = b"2.2.4"
        f.attrs["backend"] = b"tensorflow"
        layer_names = []
        for layer in backbone.layers:
            weights = layer.trainable_weights + layer.non_trainable_weights
            if not weights:
                continue
            group = f.create_group(layer.name)
            names = []
            for number, weight in enumerate(weights):
                value = rng.normal(0, 0.05, weight.shape).astype(np.float32)
                if "variance" in weight.path:
                    value = np.abs(value) + 1.0
                name = f"{layer.name}/w{number}:0"
                group.create_dataset(name, data=value)
                names.append(name.encode())
                values.append(value)
            group.attrs["weight_names"] = names
            layer_names.append(layer.name.encode())
        f.attrs["layer_names"] = layer_names
    return values


def test_imagenet_weights_come_from_kerass_cache_offline(keras_home, offline):
    values = seed_keras_cache(keras_home)
    model = build_model(
        "MobileNetV2", input_shape=(SIZE, SIZE, 3), num_classes=3, weights="imagenet"
    )
    backbone = trainable.backbone_of(model)
    loaded = [
        np.asarray(w)
        for layer in backbone.layers
        for w in layer.trainable_weights + layer.non_trainable_weights
    ]
    assert len(loaded) == len(values)
    for got, want in zip(loaded, values, strict=True):
        np.testing.assert_array_equal(got, want)


def test_imagenet_offline_without_the_file_names_it_and_the_cache(keras_home, offline):
    assert not (keras_home / "models" / WEIGHTS_FILE).exists()
    with pytest.raises(ChuteError) as caught:
        build_model("MobileNetV2", input_shape=(SIZE, SIZE, 3), num_classes=3, weights="imagenet")
    message = str(caught.value)
    assert WEIGHTS_FILE in message
    assert str(keras_home / "models") in message
    assert "`weights='imagenet'`" in message


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """12 RGB photos of 2 classes, all in the train split: 3 steps of 4 an epoch. No val
    split: what is tested is which layers train in each phase and where a resumed run
    goes on, and without one no fit traces and runs an evaluation of the backbone."""
    root = tmp_path_factory.mktemp("transfer")
    src = make_folder(root / "src", {"a": 6, "b": 6}, size=(40, 52), mode="RGB")
    chute.convert(src, root / "out", shorter_side=36, workers=1)
    return root / "out"


@pytest.mark.slow
def test_fine_tune_trains_the_head_then_the_backbone_and_resumes(
    photos, tmp_path, monkeypatch, offline, keras_home
):
    """Head epochs with the backbone frozen, then fine-tuning at a lower rate; killed in
    the fine-tuning phase, the same command finishes the run."""
    from chute.fit import train as training

    seed_keras_cache(keras_home, FINE_MODEL, FINE_SIZE, FINE_WEIGHTS_FILE)
    options = {
        "model": FINE_MODEL,
        "weights": "imagenet",
        "fine_tune": "20",
        "epochs": 3,
        "head_epochs": 1,
        "batch_size": 4,
        "image_size": FINE_SIZE,
        "augment": ("crop", "flip", "zoom"),
        "augment_on": "device",
        "verbose": 0,
    }
    seen = []
    real_freeze = trainable.freeze

    def spy(model, phase, fine_tune):
        real_freeze(model, phase, fine_tune)
        backbone = trainable.backbone_of(model)
        training_layers = [layer.name for layer in backbone.layers if layer.trainable_weights]
        seen.append((phase, len(training_layers), backbone.trainable))

    # killed after the first fine-tuning epoch was backed up
    dying_timer = dying_epoch_timer(
        training, lambda epoch: bool(seen) and seen[-1][0] == "fine-tune" and epoch == 0
    )
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(trainable, "freeze", spy)
        patch.setattr(training, "_epoch_timer", dying_timer)
        with pytest.raises(Killed):
            chute.train(photos, run, **options)
    head, fine = seen
    assert head == ("head", 0, False)  # the backbone frozen
    assert fine[0] == "fine-tune" and 0 < fine[1] <= 20 and fine[2]
    assert not (run / "bundle").exists()
    result = chute.train(photos, run, **options)
    assert result.resumed
    assert result.epochs_run == 1  # the second fine-tuning epoch: the rest ran before
    assert len(result.final) and (run / "checkpoints" / "best.keras").exists()
    bundle = chute.load_bundle(run)
    assert bundle.input_size == (FINE_SIZE, FINE_SIZE) and bundle.crop_fraction == 0.875
    # the device augmentation trained the model but is not part of the saved one
    assert not any("zoom" in layer.name for layer in bundle.model.layers)


def test_fine_tune_needs_pretrained_weights():
    with pytest.raises(ChuteError, match="fine_tune"):
        chute.TrainConfig(model="MobileNetV2", fine_tune="all")
    with pytest.raises(ChuteError, match="fine_tune"):
        chute.TrainConfig(model="MobileNetV2", weights="imagenet", fine_tune="some")
    with pytest.raises(ChuteError, match="head_epochs"):
        chute.TrainConfig(model="MobileNetV2", weights="imagenet", fine_tune="all", epochs=3,
                          head_epochs=3)  # fmt: skip
    phases = chute.TrainConfig(
        model="MobileNetV2", weights="imagenet", fine_tune="all", epochs=6
    ).phases()
    assert phases == [("head", 2), ("fine-tune", 4)]
