"""chute's own CNNs for small images, each taking uint8 pixels and rescaling inside.

* ``"chute-cnn"``: chute's default (chosen by :mod:`chute.fit.recipe`): a
  3x3 stem, then stages that halve the resolution by max-pooling *before* their
  convolutions (each Conv + BatchNorm + ReLU, width doubling up to 8x the
  stem's), global average pooling; as deep as the input size asks (stages until
  about 4 pixels are left), as wide as the recipe says (16 at the stem below
  100,000 images). On 28x28 glyphs it trains at 1.1x the images per
  CPU-second of the TensorFlow tutorial's 2-conv CNN and reaches 12 points more
  accuracy in 5 epochs (``benchmarks/bench_accuracy.py``).
* ``"kannada-cnn"``: the Kannada-MNIST style CNN (blocks of Conv2D +
  BatchNorm + ReLU, MaxPool, Dropout, then a Dense layer); small enough to
  train on a CPU at 32x32 to 75x75 grayscale.
* ``"cifar-cnn"``: the CIFAR-10 CNN of the Colab TPU article (Conv2D
  32/64/128 with BatchNorm, MaxPool and Dropout, then Dense with BatchNorm).
* ``"resnet-small"``: a small ResNet (three stages of two residual blocks with
  BatchNorm, global average pooling).

Example:
    >>> model = CNNS["kannada-cnn"]((32, 32, 1), 10, 0.2)  # doctest: +SKIP
    >>> stages((28, 28)), stages((224, 224))
    (3, 6)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chute.lazy import keras

DEFAULT_WIDTH = 16
"""chute-cnn's stem width where the recipe does not choose one."""

MIN_SIZE = 8  # three 2x2 poolings (or two stride-2 stages) need 8 pixels to leave one


def image_input(shape: tuple[int, int, int]) -> Any:
    """The uint8 image input of every chute model."""
    return keras.Input(shape=shape, dtype="uint8", name="image")


def classifier(x: Any, num_classes: int) -> Any:
    """The softmax output, float32 so mixed precision keeps float32 probabilities."""
    return keras.layers.Dense(
        num_classes, activation="softmax", dtype="float32", name="predictions"
    )(x)


# Keras's default 0.99 lets the moving statistics lag far behind on the few
# hundred steps small datasets train for: validation looks broken for epochs.
# An epoch of fewer steps than it takes this one to settle gets a lower momentum
# (models.batch_norm_momentum).
BN_MOMENTUM = 0.9


def set_batch_norm_momentum(model: Any, momentum: float) -> None:
    """Sets the momentum of every BatchNormalization layer, nested models' included.

    A layer reads its momentum each time it is traced, and saves it in its config, so
    setting it before the model's first call is as good as building the model with it.
    """
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = float(momentum)
        if hasattr(layer, "layers"):  # a keras.applications backbone inside the model
            set_batch_norm_momentum(layer, momentum)


def _conv_bn_relu(x: Any, filters: int, *, kernel_size: int = 3, strides: int = 1) -> Any:
    # No bias: the BatchNormalization after it has its own offset.
    x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False)(
        x
    )
    x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    return keras.layers.ReLU()(x)


def _image_input(shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """The uint8 input and its float version in [0, 1] (compute dtype of the policy)."""
    inputs = image_input(shape)
    # The model rescales its uint8 input itself, so the pipeline ships bytes, not floats.
    return inputs, keras.layers.Rescaling(1.0 / 255, name="rescale")(inputs)


def stages(size: tuple[int, int]) -> int:
    """How many resolution-halving stages chute-cnn gives images of ``size``: until
    about 4 pixels are left of the smaller side (28 -> 3, 32 -> 3, 64 -> 4, 224 -> 6).
    """
    smaller = min(size)
    count = 1
    while smaller / 2**count > 4.5:
        count += 1
    return max(2, count)


def _chute_cnn(
    shape: tuple[int, int, int], num_classes: int, dropout: float, width: int | None = None
) -> Any:
    """chute's default CNN (see the module's docstring); ``width``: the stem's filters."""
    width = width or DEFAULT_WIDTH
    inputs, x = _image_input(shape)
    x = _conv_bn_relu(x, width)
    count = stages(shape[:2])
    for stage in range(1, count + 1):
        # Pooling first: each stage's convolutions run at its lower resolution, a quarter
        # of the work of convolving first (and as accurate, benchmarks/bench_accuracy.py).
        x = keras.layers.MaxPooling2D()(x)
        filters = width * 2 ** min(stage, 3)
        for _ in range(1 if stage == count else 2):
            x = _conv_bn_relu(x, filters)
    # average, not max: as accurate on glyphs (0.951 vs 0.942, one seed), and max's
    # gradient came out NaN on JAX over 4 devices compiled at XLA's optimisation level 0
    x = keras.layers.GlobalAveragePooling2D()(x)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, classifier(x, num_classes), name="chute_cnn")


def _kannada_cnn(shape: tuple[int, int, int], num_classes: int, dropout: float) -> Any:
    """Kannada-MNIST style: three blocks of two Conv-BN-ReLU, MaxPool, Dropout; Dense 256."""
    inputs, x = _image_input(shape)
    for filters in (32, 64, 128):
        x = _conv_bn_relu(x, filters)
        x = _conv_bn_relu(x, filters)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, classifier(x, num_classes), name="kannada_cnn")


def _cifar_cnn(shape: tuple[int, int, int], num_classes: int, dropout: float) -> Any:
    """The CIFAR-10 CNN: Conv 32/64/128 pairs with BatchNorm, MaxPool, Dropout; Dense
    128 with BatchNorm."""
    inputs, x = _image_input(shape)
    for filters in (32, 64, 128):
        for _ in range(2):
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    # BatchNorm before the ReLU here too: without it Adam's first steps (each moving the
    # weights of its thousands of inputs by about the learning rate, together) silenced
    # most of the ReLUs for good (87% gave 0 for every image after 40 steps, 1% at the
    # start), and a run of a few hundred steps learned half what the Keras tutorials'
    # plain CNN does (benchmarks/bench_quality.py).
    x = keras.layers.Dense(128, use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, classifier(x, num_classes), name="cifar_cnn")


def _resnet_small(shape: tuple[int, int, int], num_classes: int, dropout: float) -> Any:
    """A ResNet-14: a 3x3 stem, three stages of two basic residual blocks, global pooling."""
    inputs, x = _image_input(shape)
    x = _conv_bn_relu(x, 32)
    for stage, filters in enumerate((32, 64, 128)):
        for block in range(2):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = _conv_bn_relu(x, filters, strides=strides)
            y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
            if strides != 1 or shortcut.shape[-1] != filters:
                # Projection shortcut where the block changes the resolution or width.
                shortcut = keras.layers.Conv2D(filters, 1, strides=strides, use_bias=False)(x)
                shortcut = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(shortcut)
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, classifier(x, num_classes), name="resnet_small")


CNNS: dict[str, Callable[..., Any]] = {
    "chute-cnn": _chute_cnn,
    "kannada-cnn": _kannada_cnn,
    "cifar-cnn": _cifar_cnn,
    "resnet-small": _resnet_small,
}
