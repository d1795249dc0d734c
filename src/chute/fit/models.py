"""The model registry: a Keras image classifier by name, ready for uint8 images.

Every model built here takes the batches the input pipeline ships, **uint8
pixels** of shape ``(batch, height, width, channels)``, and does its own
casting and rescaling as its first layers, so the pipeline never converts to
float (four times fewer bytes through the host-to-device link) and a saved
model classifies raw pixels with nothing else to remember.

Names: chute's own CNNs (:mod:`chute.fit.cnns`: ``"chute-cnn"``, ``"kannada-cnn"``,
``"cifar-cnn"``, ``"resnet-small"``), and ``"MobileNetV2"``,
``"EfficientNetB0"``, ``"ResNet50"`` or any other ``keras.applications``
model function by its Keras name (:mod:`chute.fit.backbones`). Case and
``_``/``-`` do not matter when the match is unique.

``weights`` is ``None`` (random initialisation), ``"imagenet"`` (a
``keras.applications`` backbone's pretrained weights, through Keras's own
download and cache) or the path of a local file. Every model uses built-in layers and ops only, so
``keras.models.load_model(path, safe_mode=True)`` reloads it without chute.
The softmax output layer is float32 whatever the mixed-precision policy.

Example:
    >>> model = build_model("kannada-cnn", input_shape=(75, 75, 1), num_classes=657)
    >>> model.output.shape
    (None, 657)
"""

from __future__ import annotations

import difflib
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.fit import backbones, cnns
from chute.fit.backbones import BACKBONE_LAYER
from chute.format import storage
from chute.lazy import keras

log = logging.getLogger(__name__)

__all__ = [
    "BACKBONE_LAYER",
    "MODEL_NAMES",
    "available_models",
    "batch_norm_momentum",
    "build_model",
    "check_model",
]

MODEL_NAMES: tuple[str, ...] = (
    "chute-cnn",
    "kannada-cnn",
    "cifar-cnn",
    "resnet-small",
    "MobileNetV2",
    "EfficientNetB0",
    "ResNet50",
)
"""The registry names; any other ``keras.applications`` model name works too."""

_WEIGHTS_SUFFIXES = (".weights.h5", ".keras", ".h5")
IMAGENET = "imagenet"

# What BatchNorm's moving statistics may keep of their start (mean 0, variance 1) after
# one epoch. The start is far from the activations' own (a convolution of [0, 1] pixels
# has variances near 1e-3): a 1e-4 share of it leaves the variance plus BatchNorm's
# epsilon (1e-3) within 5 %, so every epoch's validation is in inference mode what
# training saw.
SETTLED = 1e-4


def available_models() -> list[str]:
    """The registry names, without importing TensorFlow.

    Any other ``keras.applications`` model function name (``"DenseNet121"``,
    ``"ConvNeXtTiny"``, ...) is accepted by :func:`build_model` as well.

    Example:
        >>> available_models()[:3]
        ['chute-cnn', 'kannada-cnn', 'cifar-cnn']
    """
    return list(MODEL_NAMES)


def batch_norm_momentum(steps_per_epoch: int | None) -> float:
    """The BatchNorm momentum with which the moving statistics settle within one epoch.

    Keras's moving statistics start at mean 0 and variance 1 and move towards each
    batch's by ``1 - momentum`` a step. At momentum 0.9 they keep 0.35 of that start
    after 10 steps, so a model trained on a few hundred images in inference mode
    (validation, predict) normalises by statistics that are mostly the start, and its
    validation accuracy falls to chance while the training accuracy climbs. An epoch of
    ``steps_per_epoch`` steps therefore gets the momentum that keeps :data:`SETTLED`
    of the start after it, at most chute's usual 0.9 (whose moving statistics follow
    the weights within about ten steps of a long run).

    Args:
        steps_per_epoch: optimizer steps per epoch; ``None``: not known (0.9).

    Example:
        >>> batch_norm_momentum(None), batch_norm_momentum(1000)
        (0.9, 0.9)
        >>> round(batch_norm_momentum(2), 4)
        0.01
    """
    if steps_per_epoch is None:
        return cnns.BN_MOMENTUM
    steps = checks.positive_int("steps_per_epoch", steps_per_epoch)
    # momentum ** steps == SETTLED; never above 0.9, which already settles within a long epoch.
    return min(cnns.BN_MOMENTUM, SETTLED ** (1 / steps))


def build_model(
    name: str,
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    weights: str | os.PathLike[str] | None = None,
    dropout: float = 0.2,
    steps_per_epoch: int | None = None,
    multi_label: bool = False,
    width: int | None = None,
) -> Any:
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
        weights: ``None`` for random initialisation; ``"imagenet"`` for a
            ``keras.applications`` backbone's ImageNet weights (Keras downloads
            them once into its cache, ``~/.keras/models``; offline, a clear
            error names the file to put there); or the path of a local
            ``.weights.h5`` / ``.keras`` file (or a legacy ``.h5`` file, e.g.
            a backbone's ``..._no_top.h5``), loaded into the whole model if it
            fits, else into the backbone.
        dropout: dropout rate in ``[0, 1)`` of the model's Dropout layers.
        steps_per_epoch: the optimizer steps of an epoch it will train for: every
            BatchNorm layer (a backbone's too) gets the momentum with which its moving
            statistics settle within an epoch (see :func:`batch_norm_momentum`);
            ``None``: chute's CNNs keep 0.9, a backbone its own.
        multi_label: a sigmoid output (an independent score per label, for images
            that carry several) in place of the softmax.
        width: ``"chute-cnn"``'s stem filters (each stage doubles them, up to 8x);
            default 16. Only chute-cnn has a width.

    Returns:
        An uncompiled ``keras.Model`` from uint8 ``(batch, *input_shape)`` to
        float32 class probabilities ``(batch, num_classes)`` (label scores with
        ``multi_label``).

    Raises:
        ChuteError: unknown ``name``; ``input_shape`` not three positive
            integers with 1 or 3 channels, or smaller than the model allows;
            ``num_classes`` below 2; ``dropout`` outside ``[0, 1)``;
            ``weights`` missing, of an unknown kind, or not fitting the model;
            ``steps_per_epoch`` not a positive integer; ``width`` not a positive
            integer, or given for another model.

    Example:
        >>> model = build_model("MobileNetV2", input_shape=(32, 32, 1), num_classes=5)
        >>> model.input.dtype, model.output.dtype
        ('uint8', 'float32')
    """
    # Every argument checked first: a bad one fails before a backbone is downloaded or built.
    resolved = resolve_model(name)
    shape = _check_input_shape(input_shape)
    # one label is a valid multi-label task (present or not); one class is no classifier
    least = 1 if multi_label else 2
    num_classes = checks.int_in(
        "num_classes", num_classes, least, what=f"an integer of at least {least}"
    )
    dropout = checks.number_in("dropout", dropout, 0.0, 1.0, high_open=True)
    weights_path = _check_weights(weights, resolved)
    imagenet = weights_path == IMAGENET
    if steps_per_epoch is not None:
        checks.positive_int("steps_per_epoch", steps_per_epoch)
    if width is not None:
        checks.positive_int("width", width)
        if resolved != "chute-cnn":
            raise checks.bad_value("width", width, f"None for model {name!r} (only chute-cnn)")

    if resolved in cnns.CNNS:
        if min(shape[:2]) < cnns.MIN_SIZE:
            raise checks.bad_value(
                "input_shape",
                input_shape,
                f"at least {cnns.MIN_SIZE}x{cnns.MIN_SIZE} pixels for model {name!r}",
            )
        sized = {} if width is None else {"width": width}
        model, backbone = cnns.CNNS[resolved](shape, num_classes, dropout, **sized), None
    else:
        model, backbone = backbones.application_model(
            resolved, shape, num_classes, dropout, input_shape, imagenet=imagenet
        )
    if multi_label:
        model = _sigmoid_head(model)
    # ImageNet weights were loaded by keras.applications itself, while building the backbone.
    if weights_path is not None and not imagenet:
        _load_weights(model, backbone, weights_path, name)
    if steps_per_epoch is not None:
        momentum = batch_norm_momentum(steps_per_epoch)
        cnns.set_batch_norm_momentum(model, momentum)
        log.debug("BatchNorm momentum %.4g (%d steps per epoch)", momentum, steps_per_epoch)
    log.info(
        "Built model %r (%s): input %s uint8, %d classes, %d parameters",
        name,
        model.name,
        shape,
        num_classes,
        model.count_params(),
    )
    return model


def _sigmoid_head(model: Any) -> Any:
    """The model with a sigmoid output in place of its softmax: one independent score
    per label (float32, as the softmax was), for multi-label data."""
    softmax = model.get_layer("predictions")
    scores = keras.layers.Dense(
        softmax.units, activation="sigmoid", dtype="float32", name="predictions"
    )
    # the same graph up to the head (and the same backbone object, for fine-tuning)
    return keras.Model(model.input, scores(softmax.input), name=model.name)


def check_model(model: str, weights: str | os.PathLike[str] | None = None) -> str:
    """Checks a model name and weights file before any work, as :func:`build_model` does;
    returns the name resolved. An unknown name is named ``model`` in the error, as a
    training config (``--model``) and ``chute bench --model`` call it.

    Example:
        >>> check_model("Kannada_CNN")
        'kannada-cnn'
    """
    resolved = resolve_model(model, argument="model")
    _check_weights(weights, resolved)
    return resolved


def resolve_model(name: Any, *, argument: str = "name") -> str:
    """The registry name or ``keras.applications`` function that ``name`` means.

    An exact name wins; otherwise names are compared without case and with
    ``_`` read as ``-``, and the match must be unique.

    Args:
        name: the name asked for.
        argument: what the error calls it (``"model"`` for a training config).

    Raises:
        ChuteError: no model (or several) go by that name; close names are suggested.

    Example:
        >>> resolve_model("Kannada_CNN")
        'kannada-cnn'
    """
    if not isinstance(name, str) or not name:
        raise checks.bad_value(argument, name, "a model name: one of " + _names_text())
    # An exact name wins, so a folded match can never shadow a real keras.applications name.
    if name in cnns.CNNS:
        return name
    if _fold(name) in cnns.CNNS:
        return _fold(name)
    if backbones.is_model_function(name):
        return name
    applications = backbones.application_names()
    folded = [a for a in applications if _fold(a) == _fold(name)]
    # Only a unique folded match: two names that fold alike would make the guess arbitrary.
    if len(folded) == 1:
        log.debug("Model name %r read as keras.applications.%s", name, folded[0])
        return folded[0]
    message = f"`{argument}` must be one of {_names_text()}. Received: {argument}={name!r}"
    # dict.fromkeys: the names without repeats, in order, so the suggestions are stable.
    known = dict.fromkeys([*MODEL_NAMES, *applications])
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        message += ". Did you mean " + " or ".join(repr(c) for c in close) + "?"
    raise ChuteError(message)


def _names_text() -> str:
    names = ", ".join(repr(n) for n in MODEL_NAMES)
    return "{" + names + "} or another keras.applications model name (e.g. 'DenseNet121')"


def _fold(name: str) -> str:
    """The form names are compared in when the exact name is not found."""
    return name.lower().replace("_", "-")


def _check_input_shape(value: Any) -> tuple[int, int, int]:
    allowed = "(height, width, channels): three positive integers, channels 1 or 3"
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 3:
        raise checks.bad_value("input_shape", value, allowed)
    if not all(checks.is_int(v) for v in value):
        raise checks.bad_value("input_shape", value, allowed)
    height, width, channels = (int(v) for v in value)
    if height < 1 or width < 1 or channels not in (1, 3):
        raise checks.bad_value("input_shape", value, allowed)
    return height, width, channels


def _check_weights(weights: Any, model: str) -> str | None:
    if weights is None:
        return None
    allowed = "None, 'imagenet' or the path of a local weights file"
    if not isinstance(weights, str | os.PathLike):
        raise checks.bad_value("weights", weights, allowed)
    path = os.fspath(weights)
    if path.lower() == IMAGENET:
        if model in cnns.CNNS:
            raise ChuteError(
                f"`weights='imagenet'` is for keras.applications backbones; {model!r} is "
                "chute's own CNN. Received: weights='imagenet'"
            )
        return IMAGENET
    # Checked before building: the error names the path and says only 'imagenet' is downloaded.
    if not storage.exists(path):
        raise ChuteError(
            f"`weights` must be {allowed}. Received: weights={path!r}, which does not exist "
            "(a path is read as it is; only 'imagenet' is downloaded, by Keras)"
        )
    if not path.lower().endswith(_WEIGHTS_SUFFIXES):
        raise checks.bad_value(
            "weights", path, "a .weights.h5, .keras or .h5 file (what Keras saves weights as)"
        )
    return path


def _load_weights(model: Any, backbone: Any, path: str, name: str) -> None:
    """Loads ``path`` into the whole model, else into the backbone, else a ChuteError.

    Keras raises on any variable it cannot fill, so a load that returns filled
    every variable of its target; the warnings of a failed attempt (one per
    unmatched layer) are dropped in favour of one clear error.
    """
    targets = [("the whole model", model)]
    if backbone is not None:
        # A backbone's own file (e.g. ..._no_top.h5) fits the backbone, not the whole model.
        targets.append(("the backbone", backbone))
    failures = []
    for what, target in targets:
        # Kept aside: a failed attempt's warnings (one per layer) would drown the one clear error.
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
    # Keras appends the target variable's whole value: cut, so the error stays readable.
    return text.split(" Target variable:")[0][:400]
