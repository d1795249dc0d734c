"""``keras.applications`` backbones as chute models: uint8 in, the backbone's own
preprocessing rebuilt from built-in layers, a Dropout + Dense head.

Example:
    >>> shape = (96, 96, 3)
    >>> model, backbone = application_model("MobileNetV2", shape, 5, 0.2, shape)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from typing import Any

import numpy as np

from chute import checks
from chute.errors import ChuteError
from chute.fit.cnns import classifier, image_input
from chute.lazy import keras

log = logging.getLogger(__name__)

BACKBONE_LAYER = "backbone"
"""Name of the nested ``keras.applications`` model, e.g. to freeze it:
``model.get_layer(BACKBONE_LAYER).trainable = False``."""


def is_model_function(attribute: str) -> bool:
    """Whether ``keras.applications.<attribute>`` builds a model (``include_top``, ``weights``)."""
    function = getattr(keras.applications, attribute, None)
    if not inspect.isfunction(function):
        return False
    parameters = inspect.signature(function).parameters
    # A model function takes both; the module's helpers (decode_predictions, ...) do not.
    return "include_top" in parameters and "weights" in parameters


def application_names() -> list[str]:
    """Every ``keras.applications`` model function name."""
    return [a for a in dir(keras.applications) if not a.startswith("_") and is_model_function(a)]


# keras.applications' own input sizes where they are not 224
DEFAULT_SIZES = {
    "InceptionV3": 299,
    "InceptionResNetV2": 299,
    "Xception": 299,
    "NASNetLarge": 331,
    "EfficientNetB1": 240,
    "EfficientNetB2": 260,
    "EfficientNetB3": 300,
    "EfficientNetB4": 380,
    "EfficientNetB5": 456,
    "EfficientNetB6": 528,
    "EfficientNetB7": 600,
    "EfficientNetV2B1": 240,
    "EfficientNetV2B2": 260,
    "EfficientNetV2B3": 300,
    "EfficientNetV2S": 384,
    "EfficientNetV2M": 480,
    "EfficientNetV2L": 480,
}


def default_size(app_name: str) -> int:
    """The input size a ``keras.applications`` model is trained at on ImageNet (square).

    Example:
        >>> default_size("MobileNetV2"), default_size("EfficientNetB3")
        (224, 300)
    """
    return DEFAULT_SIZES.get(app_name, 224)


def keras_cache() -> str:
    """The folder Keras keeps downloaded weights in (``$KERAS_HOME/models``, by default
    ``~/.keras/models``)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "models")


def _download_failed(app_name: str, error: BaseException) -> str:
    """What to do when Keras cannot fetch a backbone's ImageNet weights (offline, most often)."""
    url = re.search(r"https?://\S+?\.h5", str(error))
    file = url[0].rsplit("/", 1)[-1] if url else "the weights file"
    where = f" from {url[0]}" if url else ""
    return (
        f"`weights='imagenet'`: Keras could not download {app_name}'s ImageNet weights "
        f"{file}{where} ({str(error).splitlines()[0][:200]}). Offline, put {file} into "
        f"Keras's cache folder {keras_cache()} (set KERAS_HOME to use another), and run "
        "the same command again; nothing else is needed"
    )


def _input_transform(family: str) -> tuple[list[int], list[float], list[float]]:
    """Reads ``keras.applications.<family>.preprocess_input`` as an affine map.

    Returns ``(order, scale, offset)`` such that, for pixels ``x`` in [0, 255],
    ``preprocess_input(x)[..., j] == x[..., order[j]] * scale[j] + offset[j]``:
    ``"tf"`` mode is ``x / 127.5 - 1``, ``"torch"`` is ``(x / 255 - mean) / std``,
    ``"caffe"`` is RGB to BGR minus the ImageNet mean, and the families that
    normalise inside the model (EfficientNet, ConvNeXt, ...) are the identity.
    """
    module = getattr(keras.applications, family, None)
    function = getattr(module, "preprocess_input", None)
    if function is None:
        log.warning(
            "keras.applications.%s has no preprocess_input; pixels kept in [0, 255]", family
        )
        return [0, 1, 2], [1.0] * 3, [0.0] * 3
    # Probed rather than kept in a table: the transform follows Keras as it changes.
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


def application_model(
    app_name: str,
    shape: tuple[int, int, int],
    num_classes: int,
    dropout: float,
    given_shape: Any,
    *,
    imagenet: bool = False,
) -> tuple[Any, Any]:
    """A keras.applications backbone between the uint8 input and a Dropout + Dense head.

    With ``imagenet``, the backbone's ImageNet weights come through Keras: from
    its cache, or downloaded into it.
    """
    function = getattr(keras.applications, app_name)
    family = function.__module__.rsplit(".", 1)[-1]
    order, scale, offset = _input_transform(family)
    kwargs: dict[str, Any] = {
        # 3 channels always: ImageNet backbones take RGB; a gray input is repeated below.
        "input_shape": (shape[0], shape[1], 3),
        "include_top": False,
        "weights": "imagenet" if imagenet else None,
        "pooling": "avg",
    }
    # A fixed name, so freezing and fine-tuning find the backbone (BACKBONE_LAYER).
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
        raise checks.bad_value("input_shape", given_shape, allowed) from None
    except Exception as error:  # Keras raises a bare Exception when a download fails
        if not imagenet:
            raise
        raise ChuteError(_download_failed(app_name, error)) from None

    inputs = image_input(shape)
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
    model = keras.Model(inputs, classifier(x, num_classes), name=app_name)
    return model, backbone
