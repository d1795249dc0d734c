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


def test_sample_weights_weigh_each_examples_loss_as_keras_fit_does():
    """A batch of (images, labels, weights): weights 2 step as far as a batch of each example
    twice at weight 1 would, and weight 0 examples move nothing."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(2)
    start = [rng.normal(size=(4, 3)).astype(np.float32), np.zeros(3, np.float32)]
    x = rng.random((8, 4), dtype=np.float32)
    y = rng.integers(0, 3, 8)

    def step(batch) -> list[np.ndarray]:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.set_weights(start)
        config = TrainConfig(optimizer="sgd", learning_rate=0.5)
        optimizer = loop._optimizer(config, 1, learning_rate=0.5, epochs=1)
        train_step, _ = loop._steps(model, tf.distribute.get_strategy(), optimizer, config,
                                    None, None, 8)  # fmt: skip
        train_step(iter(tf.data.Dataset.from_tensors(batch)))
        return [np.asarray(w) for w in model.get_weights()]

    halves = np.array([2, 2, 2, 2, 0, 0, 0, 0], np.float32)
    weighted = step((x, y, halves))
    doubled = step((np.concatenate([x[:4], x[:4]]), np.concatenate([y[:4], y[:4]])))
    for w, d in zip(weighted, doubled, strict=True):
        np.testing.assert_allclose(w, d, rtol=1e-5, atol=1e-6)
    plain = step((x, y))
    assert any(np.abs(w - p).max() > 1e-4 for w, p in zip(weighted, plain, strict=True))
