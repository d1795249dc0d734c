"""``chute train``: a Keras model trained on converted shards, on any backend and strategy.

:func:`train` reads as the steps of a run: settle the Keras backend, check the
options and the data, join the other hosts' processes on JAX (see
:mod:`chute.fit.processes`), claim the run directory, pick the strategy (a
``tf.distribute`` one on TensorFlow; on JAX every device through
``keras.distribution``, on torch one device, see :mod:`chute.fit.backend`) and
precision, stream the data with ``chute.load``, build and compile the model
inside the strategy's scope, fit (Keras's ``fit``, or chute's loop under
``MultiWorkerMirroredStrategy``), save the best model as a bundle, and write
the reports.

Example:
    >>> result = train("./kn-shards", "./runs/kn", model="kannada-cnn", epochs=5)  # doctest: +SKIP
    >>> result.best_val_accuracy  # doctest: +SKIP
    0.97
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.fit import backbones, cnns, models, position, rundir, trainable
from chute.fit import backend as backend_lib
from chute.fit import backup as backup_lib
from chute.fit import processes as processes_lib
from chute.fit import strategy as strategy_lib
from chute.fit.config import TrainConfig
from chute.fit.objective import categorical, make_loss, make_metrics, make_optimizer, warn_if_short
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.bundle import load_model, save_bundle
from chute.lazy import keras
from chute.read.augment import FUSED, DeviceAugmentation
from chute.read.load import info_of, load
from chute.read.options import LoadOptions
from chute.read.plan import default_crop_fraction

log = logging.getLogger(__name__)


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
    backend: str = "tensorflow"  # the Keras backend it trained on
    processes: int = 1  # JAX processes (hosts) that trained together


@dataclasses.dataclass
class _Inputs:
    """The datasets of a run and what they imply."""

    train: Any
    val: Any | None
    steps: int  # training steps per epoch, as the reader counts them
    global_batch: int
    monitor: str  # what "best" means: val_accuracy, or accuracy without a val split
    input_shape: tuple[int, int, int]
    crop_fraction: float
    augment_on: str  # where the heavy augmentations run: "host" or "device"
    repeated: bool = False  # the training data repeats: fit is told the steps of an epoch
    val_steps: int | None = None  # with per_host under Keras's fit
    val_padded: float = 1.0  # validation examples Keras counts per real one (padding)
    val_weighted: bool = False  # validation batches are padded, with weights (0: padding)


@dataclasses.dataclass(frozen=True)
class _Phase:
    """A stretch of a run with one set of trainable layers and one learning rate."""

    name: str  # "all", "head" or "fine-tune"
    epochs: int
    learning_rate: float
    backup: str  # its own BackupAndRestore folder: a resumed run continues the phase
    first_epoch: int = 0  # the run's epochs before it (the Grain engine's data epoch)


def train(
    data: str | os.PathLike | manifest_lib.Manifest,
    run_dir: str | os.PathLike,
    *,
    config: TrainConfig | None = None,
    overwrite: bool = False,
    verbose: int | str = "auto",
    **options: Any,
) -> TrainResult:
    """Trains a model on a converted dataset; writes everything into ``run_dir``.

    Args:
        data: a directory written by ``chute convert`` (local, ``gs://``, ...),
            or its ``Manifest``.
        run_dir: where the bundle, checkpoints, logs and reports go. Running the
            same command again after an interruption resumes the run.
        config: a :class:`TrainConfig`; or pass its fields as keywords.
        overwrite: start over in a ``run_dir`` holding a finished run, or an
            interrupted one started with other options (model, input, classes,
            fine-tuning, backend); the same options resume an interrupted run.
        verbose: Keras's progress output.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ChuteError: bad options, data without a train split, or in ``run_dir`` a
            finished run or an interrupted one of other options (without ``overwrite``).
    """
    if config is not None and options:
        raise ChuteError("Pass either `config` or option keywords, not both")
    config = config or TrainConfig.from_dict(options)
    # the backend first: Keras is imported on it (the config records the one used)
    config = dataclasses.replace(config, backend=backend_lib.resolve(config.backend))
    models.check_model(config.model, config.weights)  # before anything heavy
    manifest = _training_data(data)
    processes = processes_lib.join(config)  # JAX on several hosts: one process each
    started = _started_with(config, manifest)
    run = processes_lib.prepare_run(
        run_dir, overwrite=overwrite, processes=processes, started=started
    )
    strategy = _strategy(config)
    precision = _precision(config, strategy)
    with _global_policy(precision), _distribution(strategy):
        keras.utils.set_random_seed(config.seed)
        inputs = _inputs(manifest, config, strategy)
        model = _built_model(config, manifest, strategy, inputs)
        history, seconds = _fit_phases(model, strategy, inputs, config, manifest, run, verbose)
        if not processes.chief:  # the chief writes the run directory, bundle and reports
            chiefs = rundir.RunDir(os.fspath(run_dir), run.resumed)
            return _result(
                chiefs, None, inputs, history, seconds, strategy, precision, config.backend
            )
        with processes_lib.alone(strategy):  # the chief alone: not a collective
            bundle = _save_best(model, manifest, run, config, precision, strategy, inputs)
    result = _result(run, bundle, inputs, history, seconds, strategy, precision, config.backend)
    _write_reports(run, result, config, history, manifest)
    if inputs.val is not None:
        from chute.fit.evaluate import evaluate

        evaluate(bundle, manifest, split="val", out_dir=run.path)
    return result


def _started_with(config: TrainConfig, manifest: manifest_lib.Manifest) -> dict[str, Any]:
    """What a run's backup depends on: the model's layers and shapes, the classes, its
    training phases, the optimizer's variables (optimizer, precision: a loss-scale
    optimizer), the augmentation layers in the train step, and the step count that the
    input position and the schedule follow (the batch size). An interrupted run resumes
    only with the same."""
    stored = [manifest.image.height, manifest.image.width]
    return {
        "model": config.model,
        "input_size": list(config.image_size) if config.image_size else stored,
        "channels": manifest.image.channels,
        "class_names": list(manifest.class_names),
        "fine_tune": config.fine_tune,
        "head_epochs": config.head_epochs,
        "backend": config.backend,
        "optimizer": config.optimizer,
        "precision": config.precision,
        "augment": list(config.augment),
        "augment_on": config.augment_on,
        "batch_size": config.batch_size,
    }


def _training_data(data: Any) -> manifest_lib.Manifest:
    manifest = manifest_lib.load(data)
    if manifest.num_examples("train") == 0:
        raise ChuteError(f"{manifest.location} has no train split to train on")
    return manifest


def _strategy(config: TrainConfig) -> Any:
    """A ``tf.distribute`` strategy on TensorFlow; on JAX and torch, their devices
    (TensorFlow, which only reads the input there, kept off the accelerators first)."""
    if config.backend == "tensorflow":
        return strategy_lib.auto_strategy(config.strategy, tpu=config.tpu)
    if config.backend == "torch" and (config.steps_per_execution or 1) > 1:
        raise ChuteError(
            "Keras on torch runs one step per call. Received: steps_per_execution="
            f"{config.steps_per_execution}, backend='torch'; leave it out (1)"
        )
    heavy = any(name not in FUSED for name in config.augment)
    in_step = config.augment_on == "device" or config.data_service
    if config.backend == "torch" and heavy and in_step:
        raise ChuteError(
            "Augmentation inside the train step runs on TensorFlow and JAX; on torch the "
            "heavy augmentations run in the input pipeline (not through the tf.data service). "
            f"Received: augment_on={config.augment_on!r}, data_service={config.data_service!r}, "
            "backend='torch'; pass augment_on='host' (or 'auto'), without data_service"
        )
    backend_lib.keep_tensorflow_off_accelerators()
    return backend_lib.devices(config.backend, config.strategy, tpu=config.tpu)


def _distribution(strategy: Any) -> Any:
    """On JAX, Keras's distribution made current for the whole run (``fit`` splits each
    batch over its devices); a ``tf.distribute`` strategy is entered where needed."""
    if isinstance(strategy, backend_lib.KerasDevices):
        return strategy.scope()
    return contextlib.nullcontext()


def _precision(config: TrainConfig, strategy: Any) -> str:
    kind = strategy.chute_kind
    if isinstance(strategy, backend_lib.KerasDevices):  # JAX or torch knows its GPUs
        gpus, gpu_fp16 = strategy.gpus, strategy.gpu_mixed_float16
    else:
        gpus = strategy_lib.count_gpus() if kind in ("gpu", "multi-gpu", "multiworker") else 0
        gpu_fp16 = gpus > 0 and strategy_lib.gpu_supports_mixed_float16()
    return strategy_lib.precision_policy(
        kind, config.precision, gpu_mixed_float16=gpu_fp16, gpus=gpus
    )


@contextlib.contextmanager
def _global_policy(precision: str) -> Iterator[None]:
    """Keras's global mixed-precision policy for the run; the caller's afterwards."""
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _input_size(config: TrainConfig, manifest: manifest_lib.Manifest) -> tuple[int, int]:
    """The model's input size: asked for, else as stored, else the backbone's usual one."""
    if config.image_size is not None:
        return config.image_size
    if manifest.image.fixed_size:
        return manifest.image.size
    resolved = models.resolve_model(config.model)
    if resolved in cnns.CNNS:
        raise ChuteError(
            f"{manifest.location} stores images at their own sizes; pass image_size "
            f"(--image-size H or HxW) for model {config.model!r}. Received: image_size=None"
        )
    size = backbones.default_size(resolved)
    log.info("image size %dx%d: %s's own", size, size, resolved)
    return size, size


def _inputs(manifest: manifest_lib.Manifest, config: TrainConfig, strategy: Any) -> _Inputs:
    """The training and validation datasets, and the steps of an epoch (the reader's).

    One input pipeline yields the whole global batch, which Keras splits across
    the replicas; or, under ``MultiWorkerMirroredStrategy``, on TPU pod slices
    and as one of several JAX processes, each host reads its own part (see
    :func:`_train_split`).
    """
    global_batch = strategy_lib.global_batch_size(config.batch_size, strategy)
    log.info(
        "global batch %d = %d per replica x %d replica(s)",
        global_batch,
        config.batch_size,
        strategy.num_replicas_in_sync,
    )
    size = _input_size(config, manifest)
    crop_fraction = config.crop_fraction or default_crop_fraction(manifest.image)
    label_mode = "categorical" if categorical(config) else "int"
    read = dataclasses.replace(config.load, image_size=size, label_mode=label_mode)
    augment_on = _augment_on(config, strategy)
    train = _train_split(manifest, config, strategy, read, augment_on)
    steps = info_of(train).steps
    if steps == 0:
        raise ChuteError(
            f"The train split ({manifest.num_examples('train')} images) is smaller than one "
            f"global batch ({global_batch}); lower `batch_size`"
        )
    val, val_steps = _val_split(manifest, config, strategy, read, crop_fraction)
    val_weighted = val is not None and info_of(val).options.pad_final_batch
    val_padded = 1.0
    if val_weighted:  # Keras counts the padding among the examples it averages
        val_padded = info_of(val).steps * global_batch / manifest.num_examples("val")
    return _Inputs(
        train,
        val,
        steps,
        global_batch,
        "val_accuracy" if val is not None else "accuracy",
        (*size, manifest.image.channels),
        crop_fraction,
        augment_on,
        repeated=info_of(train).options.repeat,
        val_steps=val_steps,
        val_padded=val_padded,
        val_weighted=val_weighted,
    )


def _augment_on(config: TrainConfig, strategy: Any) -> str:
    """Where the heavy augmentations run: ``"device"`` on an accelerator and through the
    tf.data service (its workers run graphs only), else ``"host"``; unless asked."""
    if config.augment_on != "auto":
        return config.augment_on
    if isinstance(strategy, backend_lib.KerasDevices) and strategy.backend == "torch":
        return "host"
    accelerator = strategy.chute_kind in ("tpu", "gpu", "multi-gpu")
    return "device" if accelerator or config.data_service else "host"


def _train_split(
    manifest: manifest_lib.Manifest,
    config: TrainConfig,
    strategy: Any,
    read: LoadOptions,
    augment_on: str,
) -> Any:
    """The training data, in one of three ways.

    Per host: each host reads its own shards at its replicas' batch
    (``distribute_datasets_from_function``; a JAX process at its devices'),
    repeated; an epoch is the smallest host's share (the reader's steps).
    Through the tf.data service: repeated, each repetition a job of an epoch's
    batches (a job cut short by a lost worker ends sooner). Otherwise one
    pipeline of global batches, one epoch a pass.
    """
    training = {
        "augment": list(config.augment),
        "augment_on": augment_on,
        "data_service": config.data_service,
        "seed": config.seed,
    }
    if _per_host(strategy):
        return load(
            manifest,
            "train",
            read,
            **_per_host_reading(config, strategy),
            repeat=True,
            **training,
        )
    global_batch = strategy_lib.global_batch_size(config.batch_size, strategy)
    # The Grain engine's stream goes on from epoch to epoch (Keras keeps one iterator
    # when it is told the steps), from where the position callback puts it.
    repeat = config.data_service is not None or read.engine == "grain"
    return load(manifest, "train", read, batch_size=global_batch, repeat=repeat, **training)


def _val_split(
    manifest: manifest_lib.Manifest,
    config: TrainConfig,
    strategy: Any,
    read: LoadOptions,
    crop_fraction: float,
) -> tuple[Any | None, int | None]:
    """The validation data (None without a val split), and its steps when Keras must be
    told them.

    Keras's fit on several hosts: each host validates its own share, padded to the
    largest share's batches (weight 0 on the padding), repeated for every epoch.
    On several JAX devices: one pipeline, its last batch padded too (Keras splits
    every batch evenly over the devices). Otherwise one pipeline; chute's
    multi-worker loop validates the whole split on each worker.
    """
    if manifest.num_examples("val") == 0:
        return None, None
    evaluation = {"training": False, "crop_fraction": crop_fraction, "sampling": None}
    if read.engine == "grain" and read.workers is None:
        # Keras iterates validation anew each epoch: Grain would start its worker
        # processes each time (seconds); threads read as fast (benchmarks/README.md)
        evaluation["workers"] = 0
    if _per_host(strategy) and strategy.chute_kind != "multiworker":
        val = load(
            manifest,
            "val",
            read,
            **_per_host_reading(config, strategy),
            pad_final_batch=True,
            repeat=True,
            **evaluation,
        )
        return val, info_of(val).steps
    global_batch = strategy_lib.global_batch_size(config.batch_size, strategy)
    if isinstance(strategy, backend_lib.KerasDevices) and strategy.num_replicas_in_sync > 1:
        evaluation["pad_final_batch"] = True
    if read.engine != "grain":
        return load(manifest, "val", read, batch_size=global_batch, **evaluation), None
    # Keras cannot ask a Grain dataset its length: told none, it reads to the end and
    # warns that the "input ran out of data". Told the steps, it reads them from each
    # evaluation's own iterator of the repeated split.
    val = load(manifest, "val", read, batch_size=global_batch, repeat=True, **evaluation)
    return val, info_of(val).steps


def _per_host(strategy: Any) -> bool:
    """Whether every host reads its own input: under several workers, a TPU pod slice or
    several JAX processes (one pipeline feeding them all would read everything on each host)."""
    if getattr(strategy, "processes", 1) > 1:
        return True
    return strategy.chute_kind == "multiworker" or strategy_lib.count_hosts(strategy) > 1


def _per_host_reading(config: TrainConfig, strategy: Any) -> dict[str, Any]:
    """How a host reads its part: through ``distribute_datasets_from_function`` at the
    per-replica batch under ``tf.distribute``; as one of several JAX processes, through
    its input context at its devices' share of the global batch (Keras assembles the
    processes' batches into global ones)."""
    if getattr(strategy, "processes", 1) > 1:
        return processes_lib.reading(strategy, config.batch_size)
    return {"batch_size": config.batch_size, "strategy": strategy}


def _built_model(
    config: TrainConfig, manifest: manifest_lib.Manifest, strategy: Any, inputs: _Inputs
) -> Any:
    """The model, built inside the strategy's scope (compiled per phase, see _fit_phases)."""
    examples = manifest.num_examples("train")
    warn_if_short(config, inputs.steps, global_batch=inputs.global_batch, train_examples=examples)
    with strategy.scope():
        model = models.build_model(
            config.model,
            input_shape=inputs.input_shape,
            num_classes=manifest.num_classes,
            weights=config.weights,
            steps_per_epoch=inputs.steps,  # BatchNorm's moving statistics settle in an epoch
        )
        if strategy.num_replicas_in_sync > 1 and config.backend == "tensorflow":
            # Batch statistics over the global batch, as on one device; every
            # replica (and worker) then also keeps the same moving statistics.
            # (On JAX they are already: one program runs over the whole sharded batch.)
            for layer in _all_layers(model):
                if isinstance(layer, keras.layers.BatchNormalization):
                    layer.synchronized = True
    return model


def _phases(config: TrainConfig, run) -> list[_Phase]:
    """Head-only epochs then fine-tuning, or one phase; each with its own backup."""
    named = config.phases()
    phases: list[_Phase] = []
    for name, epochs in named:
        rate = config.learning_rate
        if name == "fine-tune":
            rate = config.fine_tune_learning_rate or config.learning_rate / 10
        backup = run.backup if len(named) == 1 else storage.join(run.backup, name)
        first = sum(phase.epochs for phase in phases)
        phases.append(_Phase(name, epochs, rate, backup, first))
    return phases


def _fit_phases(model, strategy, inputs: _Inputs, config, manifest, run, verbose):
    """Trains phase after phase; returns the history and the seconds of each epoch.

    A finished phase leaves its weights and history in the backup folder, so a
    resumed run goes on from the phase it stopped in.
    """
    storage.makedirs(run.join("checkpoints"))
    class_weight = None
    if config.class_weights == "balanced":
        counts = np.maximum(1, np.asarray(manifest.splits["train"]["class_counts"], float))
        class_weight = dict(enumerate(counts.sum() / (manifest.num_classes * counts)))
    history: dict[str, list[float]] = {}
    seconds: list[float] = []
    phases = _phases(config, run)
    for phase in phases:
        done = storage.join(phase.backup, "done.json")
        if len(phases) > 1 and storage.exists(done):  # finished by an earlier run
            finished = json.loads(storage.read_bytes(done))
            model.load_weights(storage.join(phase.backup, "end.weights.h5"))
            _extend(history, finished["history"])
            continue
        trainable.freeze(model, phase.name, config.fine_tune)
        phase_history, phase_seconds = _fit(
            model, strategy, inputs, config, run, phase, class_weight, verbose
        )
        _extend(history, phase_history)
        seconds += phase_seconds
        if len(phases) > 1 and processes_lib.is_chief(strategy):
            storage.makedirs(phase.backup)
            with processes_lib.alone(strategy):  # the chief alone: not a collective
                model.save_weights(storage.join(phase.backup, "end.weights.h5"))
            body = {"history": phase_history}
            storage.write_atomic(done, json.dumps(body, default=float).encode())
    storage.remove_if_exists(run.backup)  # every phase is done
    return history, seconds


def _extend(history: dict, more: dict) -> None:
    for name, values in more.items():
        history.setdefault(name, []).extend(float(v) for v in values)


def _fit(model, strategy, inputs: _Inputs, config, run, phase: _Phase, class_weight, verbose):
    """One phase: Keras's fit (or chute's loop under MultiWorkerMirroredStrategy)."""
    augmentation = None
    heavy = [name for name in config.augment if name not in FUSED]
    if inputs.augment_on == "device" and heavy:
        with strategy.scope():  # its layers' seed variables live with the model's
            augmentation = DeviceAugmentation(heavy, config.seed)
    if strategy.chute_kind == "multiworker":
        from chute.fit.loop import fit_multiworker

        return fit_multiworker(
            model,
            strategy,
            inputs.train,
            inputs.val,
            steps=inputs.steps,
            config=config,
            class_weight=class_weight,
            run=run,
            monitor=inputs.monitor,
            epochs=phase.epochs,
            learning_rate=phase.learning_rate,
            backup=phase.backup,
            augmentation=augmentation,
        )
    with strategy.scope():
        trainer = (
            model if augmentation is None else trainable.with_augmentation(model, augmentation)
        )
        # Padded validation batches weigh the padding 0: metrics that count weights
        metrics = make_metrics(config, model.output_shape[-1])
        padded = inputs.val_weighted
        trainer.compile(
            optimizer=make_optimizer(
                config, inputs.steps, learning_rate=phase.learning_rate, epochs=phase.epochs
            ),
            loss=make_loss(config),
            metrics=None if padded else metrics,
            weighted_metrics=metrics if padded else None,
            steps_per_execution=config.steps_per_execution
            or backend_lib.steps_per_execution(strategy),
        )
    timer = _EpochTimer()
    kept = trainable.progress(run, phase.name, inputs.monitor, config.early_stopping)
    # every process restores (on several JAX processes a collective: the same values, the
    # chief's, see processes.prepare_run); only the chief writes backups, alone
    store = backup_lib.Backup(phase.backup)
    point = store.latest()  # fit starts from its epoch; its weights load in fit (built)
    epoch = kept.resume_at(point.epoch if point else 0)
    where = position.input_position(
        inputs.train,
        steps=inputs.steps,
        first_epoch=phase.first_epoch,
        engine=info_of(inputs.train).options.engine,
        save=_saver(store, strategy),
        every=config.backup_every,
        restore=None if point is None else functools.partial(store.load, point=point),
    )
    callbacks = [
        *([_PaddedValLoss(inputs.val_padded)] if inputs.val_padded != 1 else []),
        where,  # first: the others see saved epochs (and the position, the restored step)
        *processes_lib.chief_only(
            strategy,
            [
                *trainable.checkpoints(model, run, inputs.monitor),
                keras.callbacks.CSVLogger(run.join("history.csv"), append=True),
                keras.callbacks.TensorBoard(run.logs),
            ],
        ),
        kept,
        timer,
    ]

    def fit(initial_epoch: int) -> None:
        trainer.fit(
            inputs.train,
            validation_data=inputs.val,
            epochs=phase.epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=inputs.steps if inputs.repeated else None,
            validation_steps=inputs.val_steps,
            callbacks=callbacks,
            class_weight=class_weight,
            shuffle=False,  # the dataset shuffles itself (Keras would only warn)
            verbose=verbose,
        )

    _fit_until_done(fit, where, kept, first=epoch)
    return kept.finish(), timer.seconds


def _fit_until_done(fit: Any, where: Any, kept: Any, *, first: int) -> None:
    """Calls ``fit(initial_epoch)`` from ``first`` until the phase is over: a resumed epoch
    ends early (``where.cut``) and the next call goes on from the next epoch, unless
    early stopping (``kept.stopped``) ended the phase at that epoch."""
    epoch = first
    while True:
        fit(epoch)
        if not where.cut or kept.stopped:
            return
        epoch = where.next_epoch


def _saver(store: backup_lib.Backup, strategy: Any) -> Any:
    """``store.save`` as this process runs it: the chief's alone (not a collective on
    several JAX processes), none on the other processes."""
    if not processes_lib.is_chief(strategy):
        return None

    def save(model: Any, epoch: int) -> None:
        with processes_lib.alone(strategy):
            store.save(model, epoch)

    return save


def _save_best(model, manifest, run, config: TrainConfig, precision: str, strategy, inputs):
    """The best checkpoint as a model bundle (holding the model, ready for evaluation)."""
    best = run.checkpoint("best")  # the best epoch of the whole run, resumes included
    if storage.exists(best):
        model = load_model(best)
    return save_bundle(
        trainable.portable(model),  # float32 layers, same weights: predicts anywhere
        run.bundle,
        class_names=manifest.class_names,
        image=manifest.image,
        crop_fraction=inputs.crop_fraction,
        info={
            "data": manifest.location,
            "model": config.model,
            "precision": precision,
            "backend": config.backend,
        },
    )


def _result(
    run, bundle, inputs: _Inputs, history, seconds, strategy, precision, backend
) -> TrainResult:
    best = max(history[inputs.monitor]) if history.get(inputs.monitor) else None
    per_epoch = float(np.median(seconds)) if seconds else 0.0
    return TrainResult(
        run_dir=run.path,
        bundle=bundle.location if bundle is not None else run.bundle,
        best_val_accuracy=float(best) if inputs.val is not None and best is not None else None,
        final={k: float(v[-1]) for k, v in history.items() if v},
        epochs_run=len(seconds),
        seconds_per_epoch=per_epoch,
        images_per_second=inputs.steps * inputs.global_batch / per_epoch if per_epoch else 0.0,
        replicas=strategy.num_replicas_in_sync,
        global_batch_size=inputs.global_batch,
        strategy=strategy.chute_kind,
        precision=precision,
        resumed=run.resumed,
        backend=backend,
        processes=getattr(strategy, "processes", 1),
    )


def _write_reports(run, result: TrainResult, config: TrainConfig, history, manifest) -> None:
    """``config.json`` (the effective config), ``history.json``, ``summary.json``, curves."""
    from chute.fit.plots import draw_curves

    effective = {
        "strategy": result.strategy,
        "precision": result.precision,
        "replicas": result.replicas,
        "global_batch_size": result.global_batch_size,
    }
    run.write_json(
        "config.json",
        {"data": manifest.location, **dataclasses.asdict(config), "effective": effective},
    )
    run.write_json("history.json", history)
    # CSVLogger wrote it epoch by epoch (not under chute's multi-worker loop); written anew
    # from the whole history, the epochs of a run resumed from an older backup appear once
    if history:
        names = sorted(history)
        rows = ["epoch," + ",".join(names)] + [
            f"{e}," + ",".join(str(history[n][e]) for n in names)
            for e in range(len(history[names[0]]))
        ]
        storage.write_atomic(run.join("history.csv"), ("\n".join(rows) + "\n").encode())
    run.write_json("summary.json", dataclasses.asdict(result))
    draw_curves(history, run.join("curves.png"))


class _PaddedValLoss:
    """Keras averages the validation loss over every example of the padded batches
    (padding included, at loss 0): ``val_loss`` scaled back to the real examples, before
    the other callbacks see it."""

    def __new__(cls, padded: float):
        class PaddedValLoss(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if logs and "val_loss" in logs:
                    logs["val_loss"] = float(logs["val_loss"]) * padded

        return PaddedValLoss()


class _EpochTimer:
    """Wall time of each epoch (training and validation), as a Keras callback."""

    def __new__(cls):
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
