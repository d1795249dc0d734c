"""The multi-worker training loop's pieces: its optimizer and its train step."""

from __future__ import annotations

import numpy as np
import pytest

from chute import TrainConfig
from chute.fit import loop


@pytest.fixture
def policy():
    import keras

    def use(name: str) -> None:
        keras.mixed_precision.set_global_policy(name)

    try:
        yield use
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _one_step(policy_name: str, use, start: list[np.ndarray]) -> list[np.ndarray]:
    """The weights of a tiny model after one SGD step of the loop's train step."""
    import keras
    import tensorflow as tf

    use(policy_name)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.set_weights(start)
    config = TrainConfig(optimizer="sgd", learning_rate=0.5)
    optimizer = loop._optimizer(config, 1, learning_rate=0.5, epochs=1)
    scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaling == (policy_name == "mixed_float16")
    strategy = tf.distribute.get_strategy()
    train_step, _ = loop._steps(model, strategy, optimizer, config, None, None, 8)
    rng = np.random.default_rng(1)
    x = rng.random((8, 4), dtype=np.float32) * 0.1
    y = rng.integers(0, 3, 8)
    train_step(iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(8)))
    return [np.asarray(w, np.float64) for w in model.get_weights()]


def test_mixed_float16_steps_like_float32(policy):
    """Loss scaling on, and undone: the float16 step moves the weights as far as float32's."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)).astype(np.float32), np.zeros(3, np.float32)]
    full = _one_step("float32", policy, start)
    half = _one_step("mixed_float16", policy, start)
    moved = [f - s for f, s in zip(full, start, strict=True)]
    assert max(float(np.abs(m).max()) for m in moved) > 1e-3  # the step did something
    for f, h in zip(full, half, strict=True):
        np.testing.assert_allclose(h, f, atol=2e-3)
