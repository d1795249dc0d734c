"""A plain training loop for ``MultiWorkerMirroredStrategy``.

Keras 3.15's ``fit`` fails under that strategy (keras-team/keras#20585), so
multi-worker runs train here, with per-worker input (``chute.load`` with the
strategy), the same checkpoints and history as the ``fit`` path, and resume:
each worker keeps its own backup, and a restarted run first agrees on the last
epoch every worker backed up (a worker may have died between the chief's backup
of an epoch and its own).

Example:
    >>> history, seconds = fit_multiworker(model, strategy, train, val, steps=100,
    ...     config=config, class_weight=None, run=run, monitor="val_accuracy")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.fit.config import TrainConfig
from chute.fit.objective import make_loss, make_optimizer
from chute.fit.reading import categorical
from chute.fit.rundir import RunDir
from chute.fit.trainable import checkpoints
from chute.format import storage
from chute.lazy import keras, tf
from chute.read.load import info_of

log = logging.getLogger(__name__)


def fit_multiworker(
    model,
    strategy,
    train_ds,
    val_ds,
    *,
    steps: int,
    config: TrainConfig,
    class_weight: dict | None,
    run: RunDir,
    monitor: str,
    epochs: int,
    learning_rate: float,
    backup: str,
    augmentation=None,
) -> tuple[dict[str, list[float]], list[float]]:
    """A plain training loop for MultiWorkerMirroredStrategy (Keras's fit fails there).

    Every worker runs the same number of steps (the smallest worker's share, so
    no collective waits for a worker that ran out of data), validates on the
    whole val split by itself (identical weights, no collectives), keeps a
    ``tf.train.CheckpointManager`` backup per epoch (a killed run resumes from
    the last epoch every worker backed up) and saves ``checkpoints/best.keras``
    and ``last.keras`` like the fit path. One call trains one phase (``epochs``
    at ``learning_rate``, backed up in ``backup``); ``augmentation`` runs on
    each replica's batch in the step.

    Returns:
        The history (metric name -> value per epoch) and the seconds of each epoch run.
    """
    with strategy.scope():
        optimizer = _optimizer(config, steps, learning_rate=learning_rate, epochs=epochs)
        # its slots now, so a restore fills them at once (and a re-saved backup holds them)
        optimizer.build(model.trainable_variables)
        # A variable, so the epoch travels in the checkpoint with the weights.
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    global_batch = info_of(train_ds).global_batch_size
    train_step, val_step = _steps(model, strategy, optimizer, config, class_weight, augmentation,
                                  global_batch)  # fmt: skip
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = _manager(checkpoint, backup)
    history_file = storage.join(backup, "history.json")
    agreed = _agreed_epoch(strategy, _backed_up(manager))  # so every worker runs the same steps
    history = _resume(checkpoint, manager, history_file, agreed)
    seconds: list[float] = []
    scores = history.get(monitor, [])
    waited = len(scores) - 1 - scores.index(max(scores)) if scores else 0  # early stopping
    saving = checkpoints(model, run, monitor)  # last.keras, and best.keras over the whole run
    writer = tf.summary.create_file_writer(run.logs)  # TensorBoard
    # One iterator for the whole phase: each epoch takes the next `steps` batches from it.
    iterator = iter(train_ds)
    for _ in range(int(epoch.numpy()), epochs):
        started = time.perf_counter()
        totals = np.zeros(3)
        for _ in range(steps):
            totals += train_step(iterator).numpy()
        seen = steps * global_batch
        results = {
            # The loss is already a mean per batch (compute_average_loss); the counts are sums.
            "loss": totals[0] / steps,
            "accuracy": totals[1] / seen,
            "top5": totals[2] / seen,
        }
        if val_ds is not None:
            results.update(_validate(val_step, val_ds))
        with writer.as_default():
            for name, value in results.items():
                history.setdefault(name, []).append(float(value))
                tf.summary.scalar(name, value, step=epoch)
        epoch.assign_add(1)
        for callback in saving:
            callback.on_epoch_end(int(epoch.numpy()) - 1, results)
        scores = history[monitor]
        waited = 0 if scores[-1] >= max(scores) else waited + 1
        _back_up(manager, history_file, history, int(epoch.numpy()))
        seconds.append(time.perf_counter() - started)
        log.info("epoch %d: %s", int(epoch.numpy()), {k: round(v, 4) for k, v in results.items()})
        if config.early_stopping and waited >= config.early_stopping:
            break
    storage.rmtree(backup)  # the phase is done
    return history, seconds


def _manager(checkpoint, backup: str) -> Any:
    """This worker's backups, numbered by epoch; the last two kept, so that a worker
    one epoch ahead of another can go back to the other's epoch."""
    return tf.train.CheckpointManager(checkpoint, backup, max_to_keep=2)


def _backed_up(manager) -> int:
    """The epoch of this worker's latest backup (0: none)."""
    latest = manager.latest_checkpoint
    return _epoch_of(latest) if latest else 0


def _epoch_of(path: str) -> int:
    return int(path.rsplit("-", 1)[1])  # backups are numbered by epoch: backup/ckpt-3


def _agreed_epoch(strategy, mine: int) -> int:
    """The smallest of every worker's ``mine`` (an all-gather across the workers).

    Each worker backs up an epoch on its own, after the epoch's last collective step,
    so a worker killed between the chief's backup of an epoch and its own restarts one
    epoch behind; resumed from different epochs, the workers would run different
    numbers of steps, and the collectives of the one with more would wait forever.
    """
    value = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant([mine], tf.int64)
    )
    return int(tf.reduce_min(strategy.gather(value, axis=0)))


def _restore_point(checkpoints: list[str], epoch: int) -> str | None:
    """The backup of ``epoch`` among a worker's kept ones; None for epoch 0 (start afresh).

    Raises:
        ChuteError: that epoch's backup is not kept any more.
    """
    if epoch == 0:
        return None
    for path in checkpoints:
        if _epoch_of(path) == epoch:
            return path
    kept = [_epoch_of(path) for path in checkpoints]
    raise ChuteError(
        f"The workers agreed to resume from epoch {epoch}, but this worker's backup keeps "
        f"epochs {kept}; remove the run's backup folders to start the phase over"
    )


def _resume(checkpoint, manager, history_file: str, epoch: int) -> dict[str, list[float]]:
    """Restores this worker's backup of ``epoch`` (the one every worker has; nothing
    for 0) and returns the history up to it.

    A worker that was ahead backs ``epoch`` up again as its latest, so that the epoch
    it gives up is never taken for its latest after another interruption.
    """
    path = _restore_point(manager.checkpoints, epoch)
    if path is not None:
        checkpoint.restore(path)
    if _backed_up(manager) > epoch:
        log.info("resuming from epoch %d, the last one every worker backed up", epoch)
        manager.save(checkpoint_number=epoch)
    if epoch == 0 or not storage.exists(history_file):
        return {}
    history = json.loads(storage.read_bytes(history_file))
    return {name: values[:epoch] for name, values in history.items()}


def _back_up(manager, history_file: str, history: dict, epoch: int) -> None:
    """Backs up a finished epoch: its history first, then the checkpoint numbered by
    the epoch, so that a backup's history always reaches its latest checkpoint."""
    storage.makedirs(storage.dirname(history_file))  # the first backup makes the folder
    storage.write_atomic(history_file, json.dumps(history).encode())
    manager.save(checkpoint_number=epoch)


def _optimizer(config: TrainConfig, steps: int, *, learning_rate: float, epochs: int) -> Any:
    """The run's optimizer; under ``mixed_float16`` wrapped to scale the loss, since
    float16 gradients underflow without it (Keras's ``fit`` wraps it by itself)."""
    optimizer = make_optimizer(config, steps, learning_rate=learning_rate, epochs=epochs)
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _steps(model, strategy, optimizer, config, class_weight, augmentation, global_batch):
    """The distributed train step (loss, right, top-5 summed over replicas) and the
    validation step (sums over a batch), as ``tf.function``s."""
    loss_fn = make_loss(config, reduction="none")
    scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    is_categorical = categorical(config)
    weights = None
    if class_weight:
        # A tensor in label order, so the step looks weights up by label inside the graph.
        weights = tf.constant([class_weight[i] for i in range(len(class_weight))], tf.float32)
    # Fewer than five classes: top-5 is then every class.
    k = min(5, model.output_shape[-1])

    def targets(labels):
        return tf.argmax(labels, -1) if is_categorical else tf.cast(labels, tf.int64)

    def counts(probs, labels):
        truth = targets(labels)
        right = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probs, -1), truth), tf.float32))
        top = tf.reduce_sum(tf.cast(tf.math.in_top_k(truth, probs, k), tf.float32))
        return right, top

    @tf.function
    def train_step(iterator):
        def step(images, labels, sample_weights=None):
            # augmentation never comes with sample weights (see chute.read.target)
            if augmentation is not None:  # on the replica's device, like fit's wrapper
                if augmentation.mixing:
                    images, labels = augmentation(images, labels)
                else:
                    images = augmentation(images)
            with tf.GradientTape() as tape:
                # the loss in float32, whatever the model's output dtype
                probs = tf.cast(model(images, training=True), tf.float32)
                per_example = loss_fn(labels, probs)
                if weights is not None:
                    per_example *= tf.gather(weights, targets(labels))
                if sample_weights is not None:  # each record's own weight, as fit applies it
                    per_example *= tf.cast(sample_weights, tf.float32)
                # Divided by the global batch: the replicas' gradients are summed, not averaged.
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                scaled = optimizer.scale_loss(loss) if scaling else loss
            # a LossScaleOptimizer unscales the gradients (and skips a step that overflowed)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return tf.stack([loss, *counts(probs, labels)])

        return strategy.reduce("SUM", strategy.run(step, args=next(iterator)), axis=None)

    @tf.function
    def val_step(images, labels):
        probs = tf.cast(model(images, training=False), tf.float32)
        # The batch's own size: the last validation batch may be short.
        size = tf.cast(tf.shape(probs)[0], tf.float32)
        return tf.stack([tf.reduce_sum(loss_fn(labels, probs)), *counts(probs, labels), size])

    return train_step, val_step


def _validate(val_step, val_ds) -> dict[str, float]:
    """Loss, accuracy and top-5 over the whole val split, on this worker alone."""
    sums = np.zeros(4)
    for images, labels in val_ds:
        sums += val_step(images, labels).numpy()
    return {
        "val_loss": sums[0] / sums[3],
        "val_accuracy": sums[1] / sums[3],
        "val_top5": sums[2] / sums[3],
    }
