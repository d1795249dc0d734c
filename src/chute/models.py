"""The model registry: a Keras image classifier by name, ready for uint8 images.

Every model built here takes the batches the input pipeline ships, **uint8
pixels** of shape ``(batch, height, width, channels)``, and does its own
casting and rescaling as its first layers, so the pipeline never converts to
float (four times fewer bytes through the host-to-device link) and a saved
model classifies raw pixels with nothing else to remember.

Names:

* ``"kannada-cnn"``: the Kannada-MNIST style CNN (blocks of Conv2D +
  BatchNorm + ReLU, MaxPool, Dropout, then a Dense layer); small enough to
  train on a CPU at 32x32 to 75x75 grayscale.
* ``"cifar-cnn"``: the CIFAR-10 CNN of the Colab TPU article (Conv2D
  32/64/128 with BatchNorm, MaxPool and Dropout, then Dense).
* ``"resnet-small"``: a small ResNet (three stages of two residual blocks with
  BatchNorm, global average pooling).
* ``"MobileNetV2"``, ``"EfficientNetB0"``, ``"ResNet50"``, or any other
  ``keras.applications`` model function by its Keras name: the backbone
  (``include_top=False``, average pooling) under a Dropout + Dense head. The
  backbone's own ``preprocess_input`` is reproduced with built-in layers
  (channel order, scale and offset, read off the function itself), and a
  grayscale input is repeated to three channels inside the model.

Weights are never downloaded: ``weights`` is ``None`` (random initialisation)
or the path of a local file. Every model uses built-in layers and ops only, so
``keras.models.load_model(path, safe_mode=True)`` reloads it without chute.
The softmax output layer is float32 whatever the mixed-precision policy.

TensorFlow and Keras are imported inside the functions, never at module
import time, so that ``chute --help`` stays instant.

Example:
    >>> model = build_model("kannada-cnn", input_shape=(75, 75, 1), num_classes=657)
    >>> model.output.shape
    (None, 657)
"""

from __future__ import annotations

import difflib
import inspect
import logging
import numbers
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chute.errors import ChuteError
from chute.options import bad_value

if TYPE_CHECKING:
    import keras

log = logging.getLogger(__name__)

MODEL_NAMES: tuple[str, ...] = (
    "kannada-cnn",
    "cifar-cnn",
    "resnet-small",
    "MobileNetV2",
    "EfficientNetB0",
    "ResNet50",
)
"""The registry names; any other ``keras.applications`` model name works too."""

_CNN_MIN_SIZE = 8  # three 2x2 poolings (or two stride-2 stages) need 8 pixels to leave one
_WEIGHTS_SUFFIXES = (".weights.h5", ".keras", ".h5")
BACKBONE_LAYER = "backbone"
"""Name of the nested ``keras.applications`` model, e.g. to freeze it:
``model.get_layer(BACKBONE_LAYER).trainable = False``."""


def available_models() -> list[str]:
    """The registry names, without importing TensorFlow.

    Any other ``keras.applications`` model function name (``"DenseNet121"``,
    ``"ConvNeXtTiny"``, ...) is accepted by :func:`build_model` as well.

    Example:
        >>> available_models()[:3]
        ['kannada-cnn', 'cifar-cnn', 'resnet-small']
    """
    return list(MODEL_NAMES)


def build_model(
    name: str,
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    weights: str | os.PathLike[str] | None = None,
    dropout: float = 0.2,
) -> keras.Model:
    """Builds the classifier ``name`` for uint8 images of ``input_shape``.

    The model is built under the current Keras dtype policy (call it inside a
    ``tf.distribute`` strategy's scope to place its variables there); its
    softmax output is float32 even under ``mixed_bfloat16`` or
    ``mixed_float16``. Every argument is checked before anything is built.

    Args:
        name: a registry name (see :data:`MODEL_NAMES`) or any
            ``keras.applications`` model function name; case and ``_``/``-``
            do not matter when the match is unique.
        input_shape: ``(height, width, channels)`` of the images, channels 1
            (grayscale) or 3 (RGB).
        num_classes: number of classes, at least 2.
        weights: ``None`` for random initialisation, or the path of a local
            ``.weights.h5`` / ``.keras`` file (or a legacy ``.h5`` file, e.g.
            the ``..._no_top.h5`` ImageNet weights of a backbone fetched ahead
            of time). It is loaded into the whole model if it fits, else into
            the ``keras.applications`` backbone. Nothing is ever downloaded.
        dropout: dropout rate in ``[0, 1)`` of the model's Dropout layers.

    Returns:
        An uncompiled ``keras.Model`` from uint8 ``(batch, *input_shape)`` to
        float32 class probabilities ``(batch, num_classes)``.

    Raises:
        ChuteError: unknown ``name``; ``input_shape`` not three positive
            integers with 1 or 3 channels, or smaller than the model allows;
            ``num_classes`` below 2; ``dropout`` outside ``[0, 1)``;
            ``weights`` missing, of an unknown kind, or not fitting the model.

    Example:
        >>> model = build_model("MobileNetV2", input_shape=(32, 32, 1), num_classes=5)
        >>> model.input.dtype, model.output.dtype
        ('uint8', 'float32')
    """
    if not isinstance(name, str) or not name:
        raise bad_value("name", name, "a model name: one of " + _names_text())
    shape = _check_input_shape(input_shape)
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, numbers.Integral)
        or num_classes < 2
    ):
        raise bad_value("num_classes", num_classes, "an integer of at least 2")
    num_classes = int(num_classes)
    if (
        isinstance(dropout, bool)
        or not isinstance(dropout, numbers.Real)
        or not 0.0 <= float(dropout) < 1.0
    ):
        raise bad_value("dropout", dropout, "a number in [0, 1)")
    dropout = float(dropout)
    weights_path = _check_weights(weights)

    builder = _CNNS.get(name) or _CNNS.get(_fold(name))
    if builder is not None:
        if min(shape[:2]) < _CNN_MIN_SIZE:
            raise bad_value(
                "input_shape",
                input_shape,
                f"at least {_CNN_MIN_SIZE}x{_CNN_MIN_SIZE} pixels for model {name!r}",
            )
        model = builder(shape, num_classes, dropout)
        backbone = None
    else:
        app_name = _resolve_application(name)
        model, backbone = _application_model(app_name, shape, num_classes, dropout, input_shape)

    if weights_path is not None:
        _load_weights(model, backbone, weights_path, name)
    log.info(
        "Built model %r (%s): input %s uint8, %d classes, %d parameters",
        name,
        model.name,
        shape,
        num_classes,
        model.count_params(),
    )
    return model


# --- argument checks ---------------------------------------------------------


def check_model(name: str, weights: str | os.PathLike[str] | None = None) -> None:
    """Checks a model name and weights file before any work (``build_model`` does too).

    Example:
        >>> check_model("kannada-cnn")
    """
    if name not in MODEL_NAMES:
        _resolve_application(name)
    _check_weights(weights)


def _names_text() -> str:
    names = ", ".join(repr(n) for n in MODEL_NAMES)
    return "{" + names + "} or another keras.applications model name (e.g. 'DenseNet121')"


def _fold(name: str) -> str:
    """The form names are compared in when the exact name is not found."""
    return name.lower().replace("_", "-")


def _check_input_shape(value: Any) -> tuple[int, int, int]:
    allowed = "(height, width, channels): three positive integers, channels 1 or 3"
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 3:
        raise bad_value("input_shape", value, allowed)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        raise bad_value("input_shape", value, allowed)
    height, width, channels = (int(v) for v in value)
    if height < 1 or width < 1 or channels not in (1, 3):
        raise bad_value("input_shape", value, allowed)
    return height, width, channels


def _check_weights(weights: Any) -> str | None:
    if weights is None:
        return None
    if not isinstance(weights, str | os.PathLike):
        raise bad_value("weights", weights, "None or the path of a local weights file")
    path = os.fspath(weights)
    if path.lower() == "imagenet":
        raise ChuteError(
            "`weights` must be None or the path of a local weights file: chute never "
            "downloads weights at run time. Fetch the backbone's ImageNet '..._no_top.h5' "
            f"file ahead of time and pass its path. Received: weights={path!r}"
        )
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise ChuteError(
            f"`weights` must name an existing local weights file; nothing is downloaded at "
            f"run time. Received: weights={path!r}, which does not exist"
        )
    if not path.lower().endswith(_WEIGHTS_SUFFIXES):
        raise bad_value(
            "weights", path, "a .weights.h5, .keras or .h5 file (what Keras saves weights as)"
        )
    return path


def _resolve_application(name: str) -> str:
    """The ``keras.applications`` attribute that ``name`` means, or a ChuteError."""
    import keras

    def is_model_function(attr: str) -> bool:
        fn = getattr(keras.applications, attr, None)
        if not inspect.isfunction(fn):
            return False
        parameters = inspect.signature(fn).parameters
        return "include_top" in parameters and "weights" in parameters

    if is_model_function(name):
        return name
    candidates = [a for a in dir(keras.applications) if not a.startswith("_")]
    folded = [a for a in candidates if _fold(a) == _fold(name) and is_model_function(a)]
    if len(folded) == 1:
        log.debug("Model name %r read as keras.applications.%s", name, folded[0])
        return folded[0]
    message = f"`name` must be one of {_names_text()}. Received: name={name!r}"
    known = list(MODEL_NAMES) + [a for a in candidates if is_model_function(a)]
    close = difflib.get_close_matches(name, dict.fromkeys(known), n=3, cutoff=0.6)
    if close:
        message += ". Did you mean " + " or ".join(repr(c) for c in close) + "?"
    raise ChuteError(message)


# Keras's default 0.99 lets the moving statistics lag far behind on the few
# hundred steps small datasets train for: validation looks broken for epochs.
_BN_MOMENTUM = 0.9

# --- the registry's own CNNs --------------------------------------------------


def _conv_bn_relu(x: Any, filters: int, *, kernel_size: int = 3, strides: int = 1) -> Any:
    import keras

    x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False)(
        x
    )
    x = keras.layers.BatchNormalization(momentum=_BN_MOMENTUM)(x)
    return keras.layers.ReLU()(x)


def _image_input(shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """The uint8 input and its float version in [0, 1] (compute dtype of the policy)."""
    import keras

    inputs = keras.Input(shape=shape, dtype="uint8", name="image")
    return inputs, keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs)


def _classifier(x: Any, num_classes: int) -> Any:
    """The softmax output, float32 so mixed precision keeps float32 probabilities."""
    import keras

    return keras.layers.Dense(
        num_classes, activation="softmax", dtype="float32", name="predictions"
    )(x)


def _kannada_cnn(shape: tuple[int, int, int], num_classes: int, dropout: float) -> keras.Model:
    """Kannada-MNIST style: three blocks of two Conv-BN-ReLU, MaxPool, Dropout; Dense 256."""
    import keras

    inputs, x = _image_input(shape)
    for filters in (32, 64, 128):
        x = _conv_bn_relu(x, filters)
        x = _conv_bn_relu(x, filters)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=_BN_MOMENTUM)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, _classifier(x, num_classes), name="kannada_cnn")


def _cifar_cnn(shape: tuple[int, int, int], num_classes: int, dropout: float) -> keras.Model:
    """The CIFAR-10 CNN: Conv 32/64/128 pairs with BatchNorm, MaxPool, Dropout; Dense."""
    import keras

    inputs, x = _image_input(shape)
    for filters in (32, 64, 128):
        for _ in range(2):
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.BatchNormalization(momentum=_BN_MOMENTUM)(x)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, _classifier(x, num_classes), name="cifar_cnn")


def _resnet_small(shape: tuple[int, int, int], num_classes: int, dropout: float) -> keras.Model:
    """A ResNet-14: a 3x3 stem, three stages of two basic residual blocks, global pooling."""
    import keras

    inputs, x = _image_input(shape)
    x = _conv_bn_relu(x, 32)
    for stage, filters in enumerate((32, 64, 128)):
        for block in range(2):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = _conv_bn_relu(x, filters, strides=strides)
            y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization(momentum=_BN_MOMENTUM)(y)
            if strides != 1 or shortcut.shape[-1] != filters:
                # Projection shortcut where the block changes the resolution or width.
                shortcut = keras.layers.Conv2D(filters, 1, strides=strides, use_bias=False)(x)
                shortcut = keras.layers.BatchNormalization(momentum=_BN_MOMENTUM)(shortcut)
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, _classifier(x, num_classes), name="resnet_small")


_CNNS: dict[str, Callable[[tuple[int, int, int], int, float], Any]] = {
    "kannada-cnn": _kannada_cnn,
    "cifar-cnn": _cifar_cnn,
    "resnet-small": _resnet_small,
}


# --- keras.applications backbones ---------------------------------------------


def _input_transform(family: str) -> tuple[list[int], list[float], list[float]]:
    """Reads ``keras.applications.<family>.preprocess_input`` as an affine map.

    Returns ``(order, scale, offset)`` such that, for pixels ``x`` in [0, 255],
    ``preprocess_input(x)[..., j] == x[..., order[j]] * scale[j] + offset[j]``:
    ``"tf"`` mode is ``x / 127.5 - 1``, ``"torch"`` is ``(x / 255 - mean) / std``,
    ``"caffe"`` is RGB to BGR minus the ImageNet mean, and the families that
    normalise inside the model (EfficientNet, ConvNeXt, ...) are the identity.
    Probing the function instead of keeping a table follows Keras as it changes.
    """
    import keras
    import numpy as np

    module = getattr(keras.applications, family, None)
    function = getattr(module, "preprocess_input", None)
    if function is None:
        log.warning(
            "keras.applications.%s has no preprocess_input; pixels kept in [0, 255]", family
        )
        return [0, 1, 2], [1.0] * 3, [0.0] * 3
    probe = np.zeros((5, 1, 1, 3), np.float32)
    for channel in range(3):
        probe[1 + channel, 0, 0, channel] = 255.0
    probe[4, 0, 0] = (17.0, 99.0, 201.0)  # a check that the map is affine
    out = np.asarray(function(probe.copy()), dtype=np.float64).reshape(5, 3)
    offset = out[0]
    effect = out[1:4] - offset  # effect[c, j]: what input channel c does to output j
    order: list[int] = []
    scale: list[float] = []
    for j in range(3):
        sources = np.flatnonzero(np.abs(effect[:, j]) > 1e-6)
        if len(sources) != 1:
            break
        order.append(int(sources[0]))
        scale.append(float(effect[sources[0], j]) / 255.0)
    expected = probe[4, 0, 0, order] * np.array(scale) + offset if len(order) == 3 else None
    if expected is None or not np.allclose(out[4], expected, rtol=1e-4, atol=1e-4):
        raise ChuteError(
            f"keras.applications.{family}.preprocess_input is not a per-channel scale and "
            "offset, so it cannot be rebuilt from serialisable layers; choose another model"
        )
    # float32 arithmetic in preprocess_input leaves noise past 7 digits (1.0000000299...).
    return order, [_round7(v) for v in scale], [_round7(v) for v in offset]


def _round7(value: float) -> float:
    return float(f"{value:.7g}")


def _application_model(
    app_name: str,
    shape: tuple[int, int, int],
    num_classes: int,
    dropout: float,
    given_shape: Any,
) -> tuple[keras.Model, keras.Model]:
    """A keras.applications backbone between the uint8 input and a Dropout + Dense head."""
    import keras

    function = getattr(keras.applications, app_name)
    family = function.__module__.rsplit(".", 1)[-1]
    order, scale, offset = _input_transform(family)
    kwargs: dict[str, Any] = {
        "input_shape": (shape[0], shape[1], 3),
        "include_top": False,
        "weights": None,  # never "imagenet": nothing is downloaded at run time
        "pooling": "avg",
    }
    if "name" in inspect.signature(function).parameters:
        kwargs["name"] = BACKBONE_LAYER
    try:
        backbone = function(**kwargs)
    except ValueError as error:
        minimum = re.search(r"at least (\d+)x(\d+)", str(error))
        allowed = (
            f"at least {minimum[1]}x{minimum[2]} pixels for {app_name}"
            if minimum
            else f"a shape {app_name} accepts ({str(error).splitlines()[0]})"
        )
        raise bad_value("input_shape", given_shape, allowed) from None

    inputs = keras.Input(shape=shape, dtype="uint8", name="image")
    x = inputs
    if shape[2] == 1:
        # The backbone wants 3 channels: repeat the gray one (built-in layer, no Lambda).
        x = keras.layers.Concatenate(name="gray_to_rgb")([x, x, x])
    elif order != [0, 1, 2]:
        # e.g. "caffe" mode wants BGR; a keras.ops call serialises in a functional model.
        x = keras.ops.flip(x, axis=-1) if order == [2, 1, 0] else keras.ops.take(x, order, -1)
    if len(set(scale)) == 1 and len(set(offset)) == 1:
        x = keras.layers.Rescaling(scale[0], offset[0], name="preprocess")(x)
    else:
        x = keras.layers.Rescaling(scale, offset, name="preprocess")(x)
    x = backbone(x)
    x = keras.layers.Dropout(dropout)(x)
    model = keras.Model(inputs, _classifier(x, num_classes), name=app_name)
    return model, backbone


# --- weights -----------------------------------------------------------------


def _load_weights(model: keras.Model, backbone: keras.Model | None, path: str, name: str) -> None:
    """Loads ``path`` into the whole model, else into the backbone, else a ChuteError.

    Keras raises on any variable it cannot fill, so a load that returns filled
    every variable of its target; the warnings of a failed attempt (one per
    unmatched layer) are dropped in favour of one clear error.
    """
    targets = [("the whole model", model)]
    if backbone is not None:
        targets.append(("the backbone", backbone))
    failures = []
    for what, target in targets:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                target.load_weights(path)
            except Exception as error:  # Keras and h5py raise ValueError, KeyError, OSError...
                failures.append(f"{what} ({_summary(error)})")
                continue
        for warning in caught:
            log.warning("Loading %s: %s", path, warning.message)
        log.info("Loaded weights from %s into %s of %r", path, what, name)
        return
    raise ChuteError(
        f"`weights` must be a weights file that fits model {name!r} (saved from the same "
        f"model, input channels and num_classes). Received: weights={path!r}, which does "
        "not fit " + ", nor ".join(failures)
    )


def _summary(error: BaseException) -> str:
    """The gist of a Keras loading error: its first two lines, without tensor dumps."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:2]) or type(error).__name__
    return text.split(" Target variable:")[0][:400]
