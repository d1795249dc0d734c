"""The model registry: every name builds, eats uint8, saves and reloads in safe mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chute.errors import ChuteError
from chute.fit.models import BACKBONE_LAYER, MODEL_NAMES, available_models, build_model

# (name, input_shape): each registry CNN in gray and RGB (one not square), and the
# one keras.applications backbone tested here, MobileNetV2, at its 32x32 minimum.
CASES = [
    ("kannada-cnn", (32, 32, 1)),
    ("kannada-cnn", (40, 36, 3)),
    ("cifar-cnn", (32, 32, 3)),
    ("cifar-cnn", (32, 32, 1)),
    ("resnet-small", (32, 32, 1)),
    ("resnet-small", (33, 31, 3)),
    ("MobileNetV2", (32, 32, 3)),
    ("MobileNetV2", (32, 32, 1)),
]
NUM_CLASSES = 5


def images(shape, n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def predict(model, x: np.ndarray) -> np.ndarray:
    return np.asarray(model(x, training=False))


@pytest.fixture(scope="module")
def built():
    """Models built once per (name, shape) and shared by the read-only tests."""
    cache = {}

    def get(name: str, shape: tuple[int, int, int]):
        if (name, shape) not in cache:
            cache[name, shape] = build_model(name, input_shape=shape, num_classes=NUM_CLASSES)
        return cache[name, shape]

    return get


def test_available_models_lists_the_registry_without_importing_tensorflow():
    assert available_models() == list(MODEL_NAMES)
    assert {"kannada-cnn", "cifar-cnn", "resnet-small", "MobileNetV2", "EfficientNetB0"} <= set(
        MODEL_NAMES
    )
    code = (
        "import sys, chute.fit.models as m; m.available_models(); "
        "print(sorted({'tensorflow', 'keras'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_forward_pass_on_uint8_gives_probabilities(built, name, shape):
    model = built(name, shape)
    assert model.input.dtype == "uint8"
    assert tuple(model.input.shape) == (None, *shape)
    x = images(shape)
    y = predict(model, x)
    assert y.shape == (len(x), NUM_CLASSES)
    assert y.dtype == np.float32
    assert np.all(y >= 0)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, atol=1e-5)
    if name in ("kannada-cnn", "cifar-cnn", "resnet-small"):
        # The pixels reach the classifier (a model fed a constant gives equal rows).
        # Not checked for MobileNetV2: at random initialisation in inference mode its
        # activations shrink to ~1e-11, so every row is uniform; the preprocessing
        # tests below show what its backbone receives.
        assert np.abs(y[0] - y[1]).max() > 1e-6


@pytest.mark.parametrize(
    "family", ["mobilenet_v2", "resnet", "efficientnet", "densenet", "inception_v3"]
)
def test_backbone_preprocessing_is_read_off_keras(family):
    import keras

    from chute.fit.backbones import _input_transform

    order, scale, offset = _input_transform(family)
    x = images((6, 5, 3), n=3).astype(np.float32)
    expected = getattr(keras.applications, family).preprocess_input(x.copy())
    np.testing.assert_allclose(x[..., order] * scale + offset, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("name", "shape", "family"),
    [
        ("MobileNetV2", (32, 32, 3), "mobilenet_v2"),  # x / 127.5 - 1
        ("MobileNetV2", (32, 32, 1), "mobilenet_v2"),  # gray repeated to RGB first
        ("ResNet50", (32, 32, 3), "resnet"),  # "caffe": RGB -> BGR minus the mean
    ],
)
def test_backbone_sees_what_keras_preprocess_input_gives(built, name, shape, family):
    import keras

    model = built(name, shape)
    # The "preprocess" layer feeds the backbone (a nested model's own .input is not
    # a tensor of the outer graph).
    preprocess = keras.Model(model.input, model.get_layer("preprocess").output)
    x = images(shape, n=2)
    rgb = np.repeat(x, 3, axis=-1) if shape[-1] == 1 else x
    expected = getattr(keras.applications, family).preprocess_input(rgb.astype(np.float32))
    np.testing.assert_allclose(predict(preprocess, x), expected, rtol=1e-5, atol=1e-4)


def test_gray_input_to_a_backbone_is_the_gray_image_repeated(built):
    gray = built("MobileNetV2", (32, 32, 1))
    rgb = build_model("MobileNetV2", input_shape=(32, 32, 3), num_classes=NUM_CLASSES)
    rgb.set_weights(gray.get_weights())
    x = images((32, 32, 1))
    np.testing.assert_allclose(
        predict(gray, x), predict(rgb, np.repeat(x, 3, axis=-1)), rtol=1e-5, atol=1e-6
    )


@pytest.fixture
def mixed_bfloat16():
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(("name", "shape"), [("kannada-cnn", (32, 32, 1)), CASES[-1]])
def test_mixed_precision_keeps_float32_output(mixed_bfloat16, name, shape):
    model = build_model(name, input_shape=shape, num_classes=NUM_CLASSES)
    convs = [layer for layer in _all_layers(model) if type(layer).__name__ == "Conv2D"]
    assert convs and all(layer.compute_dtype == "bfloat16" for layer in convs)
    assert model.get_layer("predictions").compute_dtype == "float32"
    y = model(images(shape), training=False)
    assert y.dtype == "float32"
    np.testing.assert_allclose(np.asarray(y).sum(axis=1), 1.0, atol=1e-3)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


@pytest.mark.parametrize(("name", "shape"), [CASES[0], CASES[2], CASES[5], CASES[6], CASES[7]])
def test_save_and_load_in_safe_mode_gives_the_same_predictions(built, tmp_path, name, shape):
    import keras

    model = built(name, shape)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert loaded.input.dtype == "uint8"
    x = images(shape, seed=1)
    np.testing.assert_allclose(predict(loaded, x), predict(model, x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_weights_file_round_trip(built, tmp_path, suffix):
    shape = (32, 32, 1)
    source = built("kannada-cnn", shape)
    path = tmp_path / f"saved{suffix}"
    if suffix == ".keras":
        source.save(path)
    else:
        source.save_weights(path)
    x = images(shape, seed=2)
    fresh = build_model("kannada-cnn", input_shape=shape, num_classes=NUM_CLASSES)
    assert np.abs(predict(fresh, x) - predict(source, x)).max() > 1e-4  # the check can fail
    loaded = build_model("kannada-cnn", input_shape=shape, num_classes=NUM_CLASSES, weights=path)
    np.testing.assert_allclose(predict(loaded, x), predict(source, x), rtol=1e-6, atol=1e-7)


def test_backbone_weights_file_loads_into_the_backbone(built, tmp_path):
    shape = (32, 32, 3)
    source = built("MobileNetV2", shape)
    path = tmp_path / "backbone.weights.h5"
    source.get_layer(BACKBONE_LAYER).save_weights(path)
    model = build_model("MobileNetV2", input_shape=shape, num_classes=3, weights=str(path))
    loaded = model.get_layer(BACKBONE_LAYER).get_weights()
    wanted = source.get_layer(BACKBONE_LAYER).get_weights()
    assert len(loaded) == len(wanted) > 100
    for a, b in zip(loaded, wanted, strict=True):
        np.testing.assert_array_equal(a, b)


def test_missing_weights_file_is_a_clear_error(tmp_path):
    path = tmp_path / "nowhere.weights.h5"
    with pytest.raises(ChuteError) as error:
        build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=3, weights=str(path))
    message = str(error.value)
    assert "`weights`" in message and str(path) in message and "download" in message


def test_imagenet_is_for_keras_applications_backbones():
    with pytest.raises(ChuteError, match=r"keras\.applications backbones"):
        build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=3, weights="imagenet")


def test_weights_of_another_model_is_a_clear_error(built, tmp_path):
    path = tmp_path / "kannada.weights.h5"
    built("kannada-cnn", (32, 32, 1)).save_weights(path)
    with pytest.raises(ChuteError, match=r"`weights`.*cifar-cnn") as error:
        build_model("cifar-cnn", input_shape=(32, 32, 1), num_classes=NUM_CLASSES, weights=path)
    assert str(path) in str(error.value)
    with pytest.raises(ChuteError, match=r"value\.shape=\(256, 5\)"):
        build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=7, weights=path)


def test_weights_of_an_unknown_kind_is_a_clear_error(tmp_path):
    path = tmp_path / "weights.txt"
    path.write_text("not weights")
    with pytest.raises(ChuteError, match=r"`weights` must be a \.weights\.h5, \.keras or \.h5"):
        build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=3, weights=path)


def test_unknown_name_lists_the_available_names():
    with pytest.raises(ChuteError) as error:
        build_model("alexnet", input_shape=(32, 32, 3), num_classes=3)
    message = str(error.value)
    assert "`name`" in message and "'alexnet'" in message
    assert all(repr(name) in message for name in MODEL_NAMES)
    # Names in keras.applications that are not model functions are not models.
    with pytest.raises(ChuteError, match="preprocess_input"):
        build_model("preprocess_input", input_shape=(32, 32, 3), num_classes=3)
    with pytest.raises(ChuteError, match="Did you mean 'MobileNetV2'"):
        build_model("MobileNetV9", input_shape=(32, 32, 3), num_classes=3)


def test_names_are_matched_ignoring_case_and_underscores():
    from chute.fit.models import check_model, resolve_model

    assert resolve_model("mobilenetv2") == "MobileNetV2"
    assert resolve_model("efficientnetb0") == "EfficientNetB0"
    assert resolve_model("Kannada_CNN") == "kannada-cnn"
    model = build_model("Kannada_CNN", input_shape=(8, 8, 1), num_classes=2)
    assert model.name == "kannada_cnn"
    # the check that chute train runs first accepts what build_model accepts
    check_model("Kannada_CNN")
    check_model("mobilenetv2")
    with pytest.raises(ChuteError, match="Kannada_CNX"):
        check_model("Kannada_CNX")


@pytest.mark.parametrize(
    "shape",
    [
        (32, 32),
        (32, 32, 2),
        (32, 32, 4),
        (0, 32, 1),
        (32, -1, 3),
        (32.0, 32, 1),
        (True, 32, 1),
        "32x32x1",
        None,
        32,
    ],
)
def test_bad_input_shape(shape):
    with pytest.raises(ChuteError, match=r"`input_shape` must be .*channels 1 or 3") as error:
        build_model("kannada-cnn", input_shape=shape, num_classes=3)
    assert f"input_shape={shape!r}" in str(error.value)


@pytest.mark.parametrize(
    ("name", "shape", "minimum"),
    [
        ("MobileNetV2", (16, 16, 3), "32x32"),
        ("MobileNetV2", (32, 31, 1), "32x32"),
        ("kannada-cnn", (7, 32, 1), "8x8"),
        ("resnet-small", (32, 4, 3), "8x8"),
    ],
)
def test_input_too_small_names_the_minimum(name, shape, minimum):
    with pytest.raises(ChuteError, match=rf"`input_shape` must be at least {minimum}") as error:
        build_model(name, input_shape=shape, num_classes=3)
    assert f"input_shape={shape!r}" in str(error.value)


@pytest.mark.parametrize("num_classes", [1, 0, -3, 2.0, "10", True, None])
def test_bad_num_classes(num_classes):
    with pytest.raises(ChuteError, match=r"`num_classes` must be an integer of at least 2"):
        build_model("cifar-cnn", input_shape=(32, 32, 3), num_classes=num_classes)


@pytest.mark.parametrize("dropout", [1.0, -0.1, "0.2", None, float("nan")])
def test_bad_dropout(dropout):
    with pytest.raises(ChuteError, match=r"`dropout` must be a number in \[0, 1\)"):
        build_model("cifar-cnn", input_shape=(32, 32, 3), num_classes=3, dropout=dropout)


def test_dropout_zero_is_allowed_and_used():
    model = build_model("resnet-small", input_shape=(8, 8, 3), num_classes=2, dropout=0.0)
    rates = [layer.rate for layer in model.layers if type(layer).__name__ == "Dropout"]
    assert rates == [0.0]


def test_str_path_and_pathlike_weights_both_work(built, tmp_path: Path):
    path = tmp_path / "w.weights.h5"
    built("cifar-cnn", (32, 32, 3)).save_weights(path)
    for weights in (path, str(path)):
        model = build_model("cifar-cnn", input_shape=(32, 32, 3), num_classes=5, weights=weights)
        assert model.output.shape == (None, 5)


def test_weights_on_a_tensorflow_filesystem(built):
    import tensorflow as tf

    tf.io.gfile.makedirs("ram://chute-models")
    path = "ram://chute-models/kannada.weights.h5"
    source = built("kannada-cnn", (32, 32, 1))
    source.save_weights(path)
    model = build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=5, weights=path)
    x = images((32, 32, 1), seed=3)
    np.testing.assert_allclose(predict(model, x), predict(source, x), rtol=1e-6, atol=1e-7)
    with pytest.raises(ChuteError, match="does not exist"):
        build_model("kannada-cnn", input_shape=(32, 32, 1), num_classes=5, weights=path + "x")
