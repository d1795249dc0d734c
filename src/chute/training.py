"""``chute train``: a Keras model trained on converted shards, under any strategy.

One flat function, :func:`train`, in the order things happen: pick the
strategy and precision; build and compile the model inside the strategy's
scope; stream the data with :func:`chute.load` at the global batch size
(per-replica batch × replicas); fit with checkpoints (best and last),
``BackupAndRestore`` (a killed run continues when the same command runs
again), optional early stopping, a CSV log and TensorBoard logs; then write
the run directory: the model bundle, history, curves, confusion, per-class
accuracy and the effective config.

Example:
    >>> result = train("./kn-shards", "./runs/kn", model="kannada-cnn", epochs=5)  # doctest: +SKIP
    >>> result.best_val_accuracy  # doctest: +SKIP
    0.97
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

from chute import manifest as manifest_lib
from chute import storage
from chute.errors import ChuteError
from chute.options import bad_value, one_of

log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
SCHEDULES = ("constant", "cosine", "exponential")
CLASS_WEIGHTS = (None, "balanced")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (flags, or a TOML file, fill it).

    Attributes:
        model: a registry name (see ``chute.models``).
        epochs: passes over the training split.
        batch_size: examples per step **per replica**.
        optimizer: ``adam``, ``adamw``, ``sgd`` (momentum 0.9) or ``rmsprop``.
        learning_rate: the initial learning rate.
        schedule: ``constant``, ``cosine`` (decay to 0 over the run) or ``exponential``.
        label_smoothing: 0 to 0.5.
        class_weights: ``None`` or ``"balanced"`` (inverse class frequency).
        steps_per_execution: steps per compiled call; default from the strategy.
        early_stopping: stop after this many epochs without validation gain.
        strategy: ``auto``, ``tpu``, ``gpu``, ``cpu`` or ``multiworker``.
        tpu: a TPU name or address.
        precision: ``auto``, ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        augment: augmentation names for the training data (see ``chute.load``).
        weights: a local weights file for the model.
        seed: seeds Keras, the data order and augmentation.
    """

    model: str = "kannada-cnn"
    epochs: int = 10
    batch_size: int = 128
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    schedule: str = "constant"
    label_smoothing: float = 0.0
    class_weights: str | None = None
    steps_per_execution: int | None = None
    early_stopping: int | None = None
    strategy: str = "auto"
    tpu: str | None = None
    precision: str = "auto"
    augment: tuple[str, ...] = ()
    weights: str | None = None
    seed: int = 1337

    def __post_init__(self) -> None:
        _positive("epochs", self.epochs)
        _positive("batch_size", self.batch_size)
        one_of("optimizer", self.optimizer, OPTIMIZERS)
        from chute.strategy import KINDS, PRECISIONS

        one_of("strategy", self.strategy, KINDS)
        one_of("precision", self.precision, PRECISIONS)
        one_of("schedule", self.schedule, SCHEDULES)
        if self.class_weights not in CLASS_WEIGHTS:
            raise bad_value("class_weights", self.class_weights, "None or 'balanced'")
        if (
            isinstance(self.learning_rate, bool)
            or not isinstance(self.learning_rate, int | float)
            or not 0 < self.learning_rate < 10
        ):
            raise bad_value("learning_rate", self.learning_rate, "a number between 0 and 10")
        if (
            not isinstance(self.label_smoothing, int | float)
            or not 0 <= self.label_smoothing <= 0.5
        ):
            raise bad_value("label_smoothing", self.label_smoothing, "a number from 0 to 0.5")
        for name in ("steps_per_execution", "early_stopping"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        augment = self.augment or ()
        if isinstance(augment, str):  # "flip,zoom" from a TOML file or a flag
            augment = [name.strip() for name in augment.split(",") if name.strip()]
        object.__setattr__(self, "augment", tuple(augment))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise bad_value("seed", self.seed, "a non-negative integer")

    @classmethod
    def from_toml(cls, path: str, **overrides: Any) -> TrainConfig:
        """Reads a TOML file (its top-level keys are the fields); ``overrides`` win."""
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            with open(path, "rb") as handle:
                values = tomllib.load(handle)
        except OSError as error:
            raise ChuteError(
                f"`config` cannot be read. Received: config={path!r} ({error})"
            ) from None
        except tomllib.TOMLDecodeError as error:
            raise ChuteError(f"`config` is not valid TOML: {path!r} ({error})") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Builds a config, naming unknown keys in the error."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ChuteError(f"Unknown training option(s) {unknown}. Allowed: {sorted(fields)}")
        return cls(**values)


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_value(name, value, "a positive integer")


@dataclasses.dataclass
class TrainResult:
    """What a run produced and how fast it went."""

    run_dir: str
    bundle: str
    best_val_accuracy: float | None
    final: dict[str, float]
    epochs_run: int
    seconds_per_epoch: float
    images_per_second: float
    replicas: int
    global_batch_size: int
    strategy: str
    precision: str
    resumed: bool = False


def train(
    data: str | os.PathLike,
    run_dir: str | os.PathLike,
    *,
    config: TrainConfig | None = None,
    overwrite: bool = False,
    verbose: int | str = "auto",
    **options: Any,
) -> TrainResult:
    """Trains a model on a converted dataset; writes everything into ``run_dir``.

    Args:
        data: a directory written by ``chute convert`` (local, ``gs://``, ...).
        run_dir: where the bundle, checkpoints, logs and reports go. Running the
            same command again after an interruption resumes the run.
        config: a :class:`TrainConfig`; or pass its fields as keywords.
        overwrite: start over in a ``run_dir`` holding a finished run.
        verbose: Keras's progress output.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ChuteError: bad options, data without a train split, or a finished run
            in ``run_dir`` (without ``overwrite``).
    """
    import keras
    import numpy as np

    from chute import bundle, models, pipeline, report
    from chute import strategy as strategy_lib

    if config is not None and options:
        raise ChuteError("Pass either `config` or option keywords, not both")
    config = config or TrainConfig.from_dict(options)
    data, run_dir = os.fspath(data), os.fspath(run_dir)
    models.check_model(config.model, config.weights)  # before anything heavy
    manifest = manifest_lib.load(data)
    if manifest.num_examples("train") == 0:
        raise ChuteError(f"{data} has no train split to train on")
    fs = storage.gfile()
    finished = storage.join(run_dir, "bundle", "chute.json")
    if fs.exists(finished) and not overwrite:
        raise ChuteError(
            f"`run_dir` {run_dir!r} holds a finished run. Pass overwrite=True (--overwrite) "
            "to train again there, or choose another run_dir"
        )
    if fs.exists(finished) and overwrite:
        for name in ("bundle", "checkpoints", "logs", "backup", "history.csv"):
            path = storage.join(run_dir, name)
            if fs.isdir(path):
                fs.rmtree(path)
            elif fs.exists(path):
                fs.remove(path)
    backup = storage.join(run_dir, "backup")
    resumed = fs.exists(backup)
    fs.makedirs(run_dir)

    # Strategy and precision first: the model must be built inside the scope.
    strategy = strategy_lib.auto_strategy(config.strategy, tpu=config.tpu)
    kind = strategy.chute_kind
    gpu_fp16 = kind in ("gpu", "multi-gpu") and strategy_lib.gpu_supports_mixed_float16()
    precision = strategy_lib.precision_policy(kind, config.precision, gpu_mixed_float16=gpu_fp16)
    previous_policy = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(config.seed)
    replicas = strategy.num_replicas_in_sync
    global_batch = strategy_lib.global_batch_size(config.batch_size, strategy)
    log.info(
        "global batch %d = %d per replica x %d replica(s)",
        global_batch,
        config.batch_size,
        replicas,
    )

    spec = manifest.image
    num_classes = manifest.num_classes
    categorical = config.label_smoothing > 0
    label_mode = "categorical" if categorical else "int"
    has_val = manifest.num_examples("val") > 0
    multiworker = kind == "multiworker"
    if multiworker:
        # Keras 3.15's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585):
        # these runs use chute's own loop (_fit_multiworker) with per-worker input.
        resolver = strategy.cluster_resolver
        cluster = resolver.cluster_spec().as_dict()
        workers = sum(len(cluster.get(t, [])) for t in ("chief", "worker"))
        worker_index = resolver.task_id + (
            1 if resolver.task_type == "worker" and "chief" in cluster else 0
        )
        if worker_index:  # the chief writes the run; the others keep their files apart
            run_dir = storage.join(run_dir, f"worker-{worker_index}")
            backup = storage.join(run_dir, "backup")
            fs.makedirs(run_dir)
        per_worker_batch = global_batch // workers
        steps = min(pipeline.pipeline_sizes(manifest, "train", workers)) // per_worker_batch
        train_ds = pipeline.load(
            manifest,
            "train",
            batch_size=config.batch_size,
            label_mode=label_mode,
            augment=list(config.augment),
            seed=config.seed,
            strategy=strategy,
            repeat=True,
        )
    # The whole global batch per step: Keras splits it across the replicas.
    else:
        train_ds = pipeline.load(
            manifest,
            "train",
            batch_size=global_batch,
            label_mode=label_mode,
            augment=list(config.augment),
            seed=config.seed,
        )
        steps = len(train_ds)
    val_ds = (
        pipeline.load(
            manifest, "val", batch_size=global_batch, label_mode=label_mode, training=False
        )
        if has_val
        else None
    )
    if steps == 0:
        raise ChuteError(
            f"The train split ({manifest.num_examples('train')} images) is smaller than one "
            f"global batch ({global_batch}); lower `batch_size`"
        )
    try:
        with strategy.scope():
            model = models.build_model(
                config.model,
                input_shape=(spec["height"], spec["width"], spec["channels"]),
                num_classes=num_classes,
                weights=config.weights,
            )
            if replicas > 1:
                # Batch statistics over the global batch, as on one device; every
                # replica (and worker) then also keeps the same moving statistics.
                for layer in _all_layers(model):
                    if isinstance(layer, keras.layers.BatchNormalization):
                        layer.synchronized = True
            model.compile(
                optimizer=_optimizer(keras, config, steps),
                loss=(
                    keras.losses.CategoricalCrossentropy(label_smoothing=config.label_smoothing)
                    if categorical
                    else keras.losses.SparseCategoricalCrossentropy()
                ),
                metrics=[
                    "accuracy",
                    (
                        keras.metrics.TopKCategoricalAccuracy
                        if categorical
                        else keras.metrics.SparseTopKCategoricalAccuracy
                    )(k=min(5, num_classes), name="top5"),
                ],
                steps_per_execution=config.steps_per_execution
                or strategy_lib.STEPS_PER_EXECUTION.get(kind, 1),
            )
        monitor = "val_accuracy" if has_val else "accuracy"
        checkpoints = storage.join(run_dir, "checkpoints")
        fs.makedirs(checkpoints)
        callbacks = [
            keras.callbacks.BackupAndRestore(backup),
            keras.callbacks.ModelCheckpoint(
                storage.join(checkpoints, "best.keras"), monitor=monitor, save_best_only=True
            ),
            keras.callbacks.ModelCheckpoint(storage.join(checkpoints, "last.keras")),
            keras.callbacks.CSVLogger(storage.join(run_dir, "history.csv"), append=True),
            keras.callbacks.TensorBoard(storage.join(run_dir, "logs")),
        ]
        if config.early_stopping:
            callbacks.append(
                keras.callbacks.EarlyStopping(
                    monitor=monitor, patience=config.early_stopping, restore_best_weights=True
                )
            )
        timer = _EpochTimer()
        callbacks.append(timer)
        class_weight = None
        if config.class_weights == "balanced":
            counts = np.maximum(1, np.asarray(manifest.splits["train"]["class_counts"], float))
            class_weight = dict(enumerate(counts.sum() / (num_classes * counts)))
        if multiworker:
            records, timer.seconds, resumed = _fit_multiworker(
                model,
                strategy,
                train_ds,
                val_ds,
                steps=steps,
                config=config,
                class_weight=class_weight,
                categorical=categorical,
                run_dir=run_dir,
                backup=backup,
                monitor=monitor,
            )
        else:
            records = model.fit(
                train_ds,
                validation_data=val_ds,
                epochs=config.epochs,
                callbacks=callbacks,
                class_weight=class_weight,
                shuffle=False,  # the dataset shuffles itself (Keras would only warn)
                verbose=verbose,
            ).history
        best_path = storage.join(checkpoints, "best.keras")
        # fit's EarlyStopping restores the best weights itself; otherwise load them.
        if fs.exists(best_path) and (multiworker or not config.early_stopping):
            model = bundle._load_model(best_path, compile=False)
        bundle_dir = bundle.save_bundle(
            model,
            storage.join(run_dir, "bundle"),
            **bundle.spec_from_manifest(manifest),
            info={"data": data, "model": config.model, "precision": precision},
        )
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)

    best = max(records[monitor]) if records.get(monitor) else None
    epochs_run = len(timer.seconds)
    per_epoch = float(np.median(timer.seconds)) if timer.seconds else 0.0
    images_per_s = steps * global_batch / per_epoch if per_epoch else 0.0
    result = TrainResult(
        run_dir=run_dir,
        bundle=bundle_dir,
        best_val_accuracy=float(best) if has_val and best is not None else None,
        final={k: float(v[-1]) for k, v in records.items() if v},
        epochs_run=epochs_run,
        seconds_per_epoch=per_epoch,
        images_per_second=images_per_s,
        replicas=replicas,
        global_batch_size=global_batch,
        strategy=kind,
        precision=precision,
        resumed=resumed,
    )
    _write(
        run_dir,
        "config.json",
        {
            "data": data,
            **dataclasses.asdict(config),
            "effective": {
                "strategy": kind,
                "precision": precision,
                "replicas": replicas,
                "global_batch_size": global_batch,
            },
        },
    )
    _write(run_dir, "history.json", records)
    _write(run_dir, "summary.json", dataclasses.asdict(result))
    report.draw_curves(records, storage.join(run_dir, "curves.png"))
    if has_val:
        from chute import evaluation

        evaluation.evaluate(bundle_dir, data, split="val", out_dir=run_dir)
    return result


class _EpochTimer:
    """Wall time of each epoch (training and validation)."""

    def __new__(cls):
        import keras

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds: list[float] = []

            def on_epoch_begin(self, epoch, logs=None):
                self._started = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds.append(time.perf_counter() - self._started)

        return Timer()


def _all_layers(model) -> list:
    """Every layer, including those inside nested models (keras.applications backbones)."""
    found = []
    for layer in model.layers:
        found.append(layer)
        if hasattr(layer, "layers"):
            found += _all_layers(layer)
    return found


def _fit_multiworker(
    model,
    strategy,
    train_ds,
    val_ds,
    *,
    steps,
    config,
    class_weight,
    categorical,
    run_dir,
    backup,
    monitor,
) -> tuple[dict[str, list[float]], list[float], bool]:
    """A plain training loop for MultiWorkerMirroredStrategy (Keras's fit fails there).

    Every worker runs the same number of steps (the smallest worker's share, so
    no collective waits for a worker that ran out of data), validates on the
    whole val split by itself (identical weights, no collectives), keeps a
    ``tf.train.CheckpointManager`` backup per epoch (a killed run resumes) and
    saves ``checkpoints/best.keras`` and ``last.keras`` like the fit path.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    with strategy.scope():
        optimizer = _optimizer(keras, config, steps)
        loss_fn = (
            keras.losses.CategoricalCrossentropy(
                label_smoothing=config.label_smoothing, reduction="none"
            )
            if categorical
            else keras.losses.SparseCategoricalCrossentropy(reduction="none")
        )
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    weights = None
    if class_weight:
        weights = tf.constant([class_weight[i] for i in range(len(class_weight))], tf.float32)
    global_batch = train_ds.global_batch_size
    k = min(5, model.output_shape[-1])

    def targets(labels):
        return tf.argmax(labels, -1) if categorical else tf.cast(labels, tf.int64)

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                probs = model(images, training=True)
                per_example = loss_fn(labels, probs)
                if weights is not None:
                    per_example *= tf.gather(weights, targets(labels))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            truth = targets(labels)
            right = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probs, -1), truth), tf.float32))
            top = tf.reduce_sum(tf.cast(tf.math.in_top_k(truth, probs, k), tf.float32))
            return tf.stack([loss, right, top])

        return strategy.reduce("SUM", strategy.run(step, args=next(iterator)), axis=None)

    @tf.function
    def val_step(images, labels):
        probs = model(images, training=False)
        truth = targets(labels)
        return tf.stack(
            [
                tf.reduce_sum(loss_fn(labels, probs)),
                tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probs, -1), truth), tf.float32)),
                tf.reduce_sum(tf.cast(tf.math.in_top_k(truth, probs, k), tf.float32)),
                tf.cast(tf.shape(probs)[0], tf.float32),
            ]
        )

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, backup, max_to_keep=1)
    resumed = manager.latest_checkpoint is not None
    if resumed:
        checkpoint.restore(manager.latest_checkpoint)
    history: dict[str, list[float]] = {}
    history_file = storage.join(run_dir, "history.json.partial")
    if resumed and storage.gfile().exists(history_file):
        with storage.gfile().GFile(history_file, "rb") as handle:
            history = json.loads(handle.read())
    seconds: list[float] = []
    scores = history.get(monitor, [])
    best = max(scores) if scores else None  # a resumed run keeps its best so far
    waited = len(scores) - 1 - scores.index(best) if scores else 0
    writer = tf.summary.create_file_writer(storage.join(run_dir, "logs"))  # TensorBoard
    iterator = iter(train_ds)
    for _ in range(int(epoch.numpy()), config.epochs):
        started = time.perf_counter()
        totals = np.zeros(3)
        for _ in range(steps):
            totals += train_step(iterator).numpy()
        seen = steps * global_batch
        results = {
            "loss": totals[0] / steps,
            "accuracy": totals[1] / seen,
            "top5": totals[2] / seen,
        }
        if val_ds is not None:
            sums = np.zeros(4)
            for images, labels in val_ds:
                sums += val_step(images, labels).numpy()
            results.update(
                val_loss=sums[0] / sums[3],
                val_accuracy=sums[1] / sums[3],
                val_top5=sums[2] / sums[3],
            )
        with writer.as_default():
            for name, value in results.items():
                history.setdefault(name, []).append(float(value))
                tf.summary.scalar(name, value, step=epoch)
        epoch.assign_add(1)
        model.save(storage.join(run_dir, "checkpoints", "last.keras"))
        if best is None or results[monitor] > best:
            best, waited = results[monitor], 0
            model.save(storage.join(run_dir, "checkpoints", "best.keras"))
        else:
            waited += 1
        manager.save()
        storage.write_atomic(history_file, json.dumps(history).encode())
        seconds.append(time.perf_counter() - started)
        log.info("epoch %d: %s", int(epoch.numpy()), {k: round(v, 4) for k, v in results.items()})
        if config.early_stopping and waited >= config.early_stopping:
            break
    storage.gfile().rmtree(backup)
    storage.gfile().remove(history_file)
    names = list(history)
    rows = ["epoch," + ",".join(names)] + [
        f"{e}," + ",".join(str(history[n][e]) for n in names) for e in range(len(history[names[0]]))
    ]
    storage.write_atomic(storage.join(run_dir, "history.csv"), ("\n".join(rows) + "\n").encode())
    return history, seconds, resumed


def _optimizer(keras, config: TrainConfig, steps_per_epoch: int):
    rate: Any = config.learning_rate
    total = max(1, steps_per_epoch * config.epochs)
    if config.schedule == "cosine":
        rate = keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=total)
    elif config.schedule == "exponential":
        rate = keras.optimizers.schedules.ExponentialDecay(
            config.learning_rate, decay_steps=max(1, steps_per_epoch), decay_rate=0.9
        )
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(rate, momentum=0.9)
    return {
        "adam": keras.optimizers.Adam,
        "adamw": keras.optimizers.AdamW,
        "rmsprop": keras.optimizers.RMSprop,
    }[config.optimizer](rate)


def _write(run_dir: str, name: str, value: Any) -> None:
    storage.write_atomic(
        storage.join(run_dir, name), json.dumps(value, indent=1, default=float).encode()
    )
