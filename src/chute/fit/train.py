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
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.fit import backend as backend_lib
from chute.fit import backup as backup_lib
from chute.fit import logs as logs_lib
from chute.fit import models, position, reading, rundir, trainable
from chute.fit import processes as processes_lib
from chute.fit import recipe as recipe_lib
from chute.fit import strategy as strategy_lib
from chute.fit.config import TrainConfig
from chute.fit.devices import Devices
from chute.fit.objective import (
    choose_batch_size,
    make_loss,
    make_metrics,
    make_optimizer,
    multi_label_positives,
    warn_if_short,
)
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.bundle import load_model, save_bundle
from chute.lazy import extra, installed, keras, tensorflow_builds
from chute.read.augment import FUSED, DeviceAugmentation
from chute.read.load import info_of, load

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    """What a run produced and how fast it went."""

    run_dir: str
    bundle: str
    best_val_accuracy: float | None  # single-label runs; None for a multi-label one
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
    best_val_map: float | None = None  # multi-label runs: the best epoch's mAP estimate


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
    engine: str = "tf"  # the reading engine ("grain": a stream that resumes mid-epoch)
    val_steps: int | None = None  # with per_host under Keras's fit
    val_padded: float = 1.0  # validation examples Keras counts per real one (padding)
    val_weighted: bool = False  # validation batches are padded, with weights (0: padding)
    positives: Any = None  # multi-label: each label's positive weight (None: single-label)
    mixture: Any = None  # with --mix: the training data's MixInfo (images of each an epoch)
    class_counts: tuple[float, ...] = ()  # each class's examples in what training reads
    # multi-label: which labels the monitored split (val, else train) has a positive of
    labels_present: Any = None


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
    callbacks: Sequence[Any] = (),
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
        verbose: Keras's progress output: ``"auto"``, its bar (1) where standard output
            is a terminal, else one line per epoch (2), as tqdm's ``disable=None`` does.
        callbacks: more ``keras.callbacks.Callback`` objects for Keras's ``fit``, run
            after chute's own (its checkpoints, backups and logs) on every process.
            Not under ``MultiWorkerMirroredStrategy``, which trains in chute's own loop.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ChuteError: bad options, data without a train split, or in ``run_dir`` a
            finished run or an interrupted one of other options (without ``overwrite``).
    """
    # Where the run reads and writes, first: "s3://" alone would become a local folder "s3:".
    if not isinstance(data, manifest_lib.Manifest):
        storage.check_location(data, "data")
    storage.check_location(run_dir, "run_dir")
    # Two sources of options would leave it unclear which one wins.
    if config is not None and options:
        raise ChuteError("Pass either `config` or option keywords, not both")
    config = config or TrainConfig.from_dict(options)
    callbacks = _check_callbacks(callbacks)
    # the backend first: Keras is imported on it (the config records the one used)
    config = dataclasses.replace(config, backend=backend_lib.resolve(config.backend))
    config = _engine_without_tensorflow(config)
    # "auto" is chute-cnn (or, with ImageNet weights, MobileNetV2): checkable before the data
    config = dataclasses.replace(config, model=recipe_lib.default_model(config))
    models.check_model(config.model, config.weights)  # before anything heavy
    _check_run_dir(os.fspath(run_dir), config)
    manifest = _training_data(data, config.dataset_version)
    # With --mix: the datasets read as one; the first in their joined classes from here on.
    mixture = _mixture(manifest, config)
    manifest = mixture.first if mixture is not None else manifest
    config, recipe = recipe_lib.choose(
        config,
        examples=manifest.num_examples("train"),
        num_classes=manifest.num_classes,
        image_size=reading.input_size(config, manifest),
        channels=manifest.image.channels,
        multi_label=manifest.multi_label,
    )
    processes = processes_lib.join(config)  # JAX on several hosts: one process each
    _check_one_process_options(config, processes, callbacks)
    # Recorded with the run folder: a later run with other options must not resume this backup.
    started = {**_started_with(config, manifest, mixture), "width": recipe.width}
    run = processes_lib.prepare_run(
        run_dir, overwrite=overwrite, processes=processes, started=started
    )
    devices = _devices(config)
    # Chosen for the data once the replicas are known; from here on, the number itself.
    batch = choose_batch_size(
        config, train_examples=manifest.num_examples("train"), replicas=devices.replicas
    )
    config = dataclasses.replace(config, batch_size=batch)
    precision = _precision(config, devices)
    # on JAX, Keras's distribution is current for the whole run (fit splits each batch
    # over its devices); a tf.distribute strategy is entered where variables are made
    with _global_policy(precision), devices.run_scope():
        keras.utils.set_random_seed(config.seed)
        inputs = _inputs(manifest, config, devices, mixture)
        model = _built_model(config, manifest, devices, inputs, recipe.width)
        history, seconds = _fit_phases(
            model, devices, inputs, config, manifest, run, _keras_verbose(verbose), callbacks
        )
        if not processes.chief:  # the chief writes the run directory, bundle and reports
            chiefs = rundir.RunDir(os.fspath(run_dir), run.resumed)
            # No bundle here: only the chief's run folder holds one.
            return _result(chiefs, None, inputs, history, seconds, devices, precision)
        with processes_lib.alone(devices):  # the chief alone: not a collective
            bundle = _save_best(model, manifest, run, config, precision, inputs, recipe)
    result = _result(run, bundle, inputs, history, seconds, devices, precision)
    _write_reports(run, result, config, history, manifest)
    # Evaluated from the saved bundle, so the report measures what a user will load.
    if inputs.val is not None:
        from chute.fit.evaluate import evaluate

        shard_cache = {"cache_dir": config.load.cache_dir, "cache_limit": config.load.cache_limit}
        evaluate(bundle, manifest, split="val", out_dir=run.path, **shard_cache)
    return result


def _started_with(
    config: TrainConfig, manifest: manifest_lib.Manifest, mixture: Any = None
) -> dict[str, Any]:
    """What a run's backup depends on: the model's layers and shapes, the classes, its
    training phases, the optimizer's variables (optimizer, precision: a loss-scale
    optimizer), the augmentation layers in the train step, the batch size (the steps the
    schedule follows; the Grain engine rescales them), the engine, the data (each read
    split's fingerprint), and from a bucket the options that size the order's shard
    blocks. An interrupted run resumes only with the same."""
    stored = [manifest.image.height, manifest.image.width]
    return {
        "model": config.model,
        # The size the model sees: the manifest's when no other is asked for.
        "input_size": list(config.image_size) if config.image_size else stored,
        "channels": manifest.image.channels,
        "class_names": list(manifest.class_names),
        # Which version of the dataset: an append makes another (chute convert --append).
        "dataset_version": manifest.version,
        # The data: a backup's position is in an order of these records (a dataset
        # converted again, even with the same classes, is other data).
        "data": {
            name: {
                "examples": split.examples,
                "shards": len(split.shards),
                "fingerprint": split.fingerprint(),
            }
            for name, split in manifest.splits.items()
            if name in ("train", "val")  # what a run reads
        },
        "fine_tune": config.fine_tune,
        "head_epochs": config.head_epochs,
        "backend": config.backend,
        "optimizer": config.optimizer,
        "precision": config.precision,
        "augment": list(config.augment or ()),
        "augment_on": config.augment_on,
        # Left to chute, the batch follows from the training examples and the epochs:
        # another number of epochs could choose another batch.
        "batch_size": (
            config.batch_size if config.batch_size is not None else f"auto, {config.epochs} epochs"
        ),
        "engine": config.load.engine,
        # A sigmoid head has the softmax's shapes: only this tells the two runs apart.
        **({"label_mode": "multi"} if manifest.multi_label else {}),
        # The Grain engine's backups say where they are in examples of one global order:
        # such a run resumes on another batch size or device count (rundir skips the
        # batch size when both runs record this; an older run's backup counts steps).
        **({"position": "examples"} if config.load.engine == "grain" else {}),
        # The datasets mixed in: where, their share, and their data (as "data" above).
        **({"mix": _mix_record(mixture)} if mixture is not None else {}),
        # A bucket's split larger than the cache is read in shard blocks sized by these.
        **(
            {"cache_limit": config.load.cache_limit, "shard_window": config.load.shard_window}
            if config.load.engine == "grain" and not storage.is_local(manifest.location)
            else {}
        ),
    }


def _mixture(manifest: manifest_lib.Manifest, config: TrainConfig) -> Any:
    """With ``config.mix``: the first dataset and the others as one
    (:class:`~chute.read.mixture.Mixture`), the first with the share left; else None."""
    if not config.mix:
        return None
    from chute.read.mixture import mixture_of, reading_options

    # What a mixture cannot be read with, refused before the run folder is written.
    reading_options(dataclasses.replace(config.load, data_service=config.data_service))
    for location, _ in config.mix:
        storage.check_location(location, "mix")
    others = [manifest_lib.load(location) for location, _ in config.mix]
    for other in others:
        if other.num_examples("train") == 0:
            raise ChuteError(
                f"{other.location} (in `mix`) has no train split to train on. Received: "
                f"mix={config.mix!r}"
            )
    weights = [1 - sum(weight for _, weight in config.mix), *(w for _, w in config.mix)]
    mixture = mixture_of([manifest, *others], weights)
    log.info(
        "training on %d datasets as one: %d classes (%d from %s)",
        len(others) + 1,
        len(mixture.class_names),
        manifest.num_classes,
        manifest.location,
    )
    return mixture


def _mix_record(mixture: Any) -> list[dict[str, Any]]:
    """What a run records of the datasets it mixes: where, share, version, train data, and
    each one's labels in the run's classes."""
    return [
        {
            "location": manifest.location,
            "weight": weight,
            "dataset_version": manifest.version,
            "examples": manifest.num_examples("train"),
            "fingerprint": manifest.split("train").fingerprint(),
            "label_map": [int(label) for label in labels],
        }
        for manifest, weight, labels in zip(
            mixture.manifests, mixture.shares, mixture.maps, strict=True
        )
    ]


def _check_run_dir(run_dir: str, config: TrainConfig) -> None:
    """Refuses, before anything is built or written, a run folder that a run cannot
    write: chute's multi-worker loop keeps its backups and logs through TensorFlow,
    which opens local paths, ``gs://`` and ``ram://`` but not ``s3://`` or ``az://``."""
    if _multiworker(config) and not storage.tensorflow_opens(run_dir):
        raise ChuteError(
            "Under MultiWorkerMirroredStrategy the run folder is written by TensorFlow, "
            f"which cannot write to {run_dir!r}. Received: run_dir={run_dir!r}; pass a "
            "local folder, or a gs:// one"
        )


def _training_data(data: Any, version: int | None = None) -> manifest_lib.Manifest:
    """The dataset to train on, as it was at ``version`` (None: the latest)."""
    manifest = manifest_lib.load(data)
    if version is not None:
        manifest = manifest.at_version(version, "dataset_version")
    # Caught here rather than by an empty dataset deep inside Keras's fit.
    if manifest.num_examples("train") == 0:
        raise ChuteError(f"{manifest.location} has no train split to train on")
    return manifest


def _devices(config: TrainConfig) -> Devices:
    """A ``tf.distribute`` strategy's devices on TensorFlow; on JAX and torch, Keras's
    (TensorFlow, which only reads the input there, kept off the accelerators first)."""
    if config.backend == "tensorflow":
        return strategy_lib.tensorflow_devices(config.strategy, tpu=config.tpu)
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
    # Before TensorFlow runs anything: later, it already holds the accelerators JAX or torch
    # needs. Without TensorFlow there is nothing to keep off them.
    if installed("tensorflow"):
        backend_lib.keep_tensorflow_off_accelerators()
    return backend_lib.devices(config.backend, config.strategy, tpu=config.tpu)


def _precision(config: TrainConfig, devices: Devices) -> str:
    return strategy_lib.precision_policy(
        devices.kind,
        config.precision,
        gpu_mixed_float16=devices.gpu_mixed_float16,
        gpus=devices.gpus,
    )


@contextlib.contextmanager
def _global_policy(precision: str) -> Iterator[None]:
    """Keras's global mixed-precision policy for the run; the caller's afterwards."""
    # The policy is global in Keras: restored, so a caller in Python gets its own back.
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _inputs(
    manifest: manifest_lib.Manifest, config: TrainConfig, devices: Devices, mixture: Any = None
) -> _Inputs:
    """The training and validation datasets, and the steps of an epoch (the reader's).

    One input pipeline yields the whole global batch, which Keras splits across
    the replicas; or, under ``MultiWorkerMirroredStrategy``, on TPU pod slices
    and as one of several JAX processes, each host reads its own part (the rules:
    :mod:`chute.fit.reading`).
    """
    global_batch = reading.global_batch(config, devices)
    log.info(
        "global batch %d = %d per replica x %d replica(s)",
        global_batch,
        config.batch_size,
        devices.replicas,
    )
    # each class's examples in what training reads (a mixture: expected, by its shares)
    if mixture is not None:
        counts = mixture.class_counts("train")
    else:
        counts = (manifest.split("train").class_counts, manifest.num_examples("train"))
    positives = multi_label_positives(config, manifest, counts)  # before reading: fails fast
    weighted = manifest.weighted and config.load.sample_weights is not False
    if config.class_weights is not None and weighted:
        raise ChuteError(
            f"{manifest.location} has sample weights, which Keras cannot apply together with "
            "class weights: pass sample_weights=False (--no-sample-weights) to weigh by "
            f"class instead, or leave class_weights out. Received: class_weights="
            f"{config.class_weights!r}"
        )
    if manifest.multi_label and devices.kind == "multiworker":
        raise ChuteError(
            f"{manifest.location} is multi-label: training it under "
            "MultiWorkerMirroredStrategy (chute's own loop) is not supported yet; train on "
            "one worker, or with the JAX backend on several hosts. Received: "
            f"{devices.kind} strategy"
        )
    train_options, val_options = reading.reading(config, devices, manifest)
    train = load(
        mixture if mixture is not None else manifest,
        "train",
        train_options,
        **reading.pipelines(devices, training=True),
    )
    steps = info_of(train).steps
    if steps == 0:
        raise ChuteError(
            f"The train split ({manifest.num_examples('train')} images) is smaller than one "
            f"global batch ({global_batch}); lower `batch_size`"
        )
    val, val_steps, val_padded = None, None, 1.0
    if val_options is not None:
        val = load(manifest, "val", val_options, **reading.pipelines(devices, training=False))
        # a repeated split never ends: Keras is told its steps
        val_steps = info_of(val).steps if val_options.repeat else None
    if val_options is not None and val_options.pad_final_batch:
        # Keras counts the padding among the examples it averages
        val_padded = info_of(val).steps * global_batch / manifest.num_examples("val")
    return _Inputs(
        train,
        val,
        steps,
        global_batch,
        # multi-label: the mAP estimate (the Keras metric named "map"), higher is better
        ("val_" if val is not None else "") + ("map" if manifest.multi_label else "accuracy"),
        (*train_options.image_size, manifest.image.channels),
        reading.crop_fraction(config, manifest),
        train_options.augment_on,
        repeated=train_options.repeat,
        engine=train_options.engine,
        val_steps=val_steps,
        val_padded=val_padded,
        val_weighted=val_options is not None and val_options.pad_final_batch,
        positives=positives,
        labels_present=_labels_present(manifest, "val" if val is not None else "train"),
        mixture=info_of(train).mixture,
        class_counts=tuple(float(n) for n in counts[0]),
    )


def _labels_present(manifest, split: str) -> list[bool] | None:
    """Multi-label: per label, whether ``split`` holds a positive of it (the labels the
    mAP is averaged over, as ``evaluate`` does); None for single-label data."""
    if not manifest.multi_label:
        return None
    return [count > 0 for count in manifest.split(split).class_counts]


def _built_model(
    config: TrainConfig,
    manifest: manifest_lib.Manifest,
    devices: Devices,
    inputs: _Inputs,
    width: int | None,
) -> Any:
    """The model, built inside the devices' scope (compiled per phase, see _fit_phases)."""
    examples = manifest.num_examples("train")
    warn_if_short(config, inputs.steps, global_batch=inputs.global_batch, train_examples=examples)
    with devices.scope():
        model = models.build_model(
            config.model,
            input_shape=inputs.input_shape,
            num_classes=manifest.num_classes,
            weights=config.weights,
            steps_per_epoch=inputs.steps,  # BatchNorm's moving statistics settle in an epoch
            multi_label=manifest.multi_label,
            width=width,
        )
        if devices.replicas > 1 and config.backend == "tensorflow":
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
            # A tenth by default: the unfrozen backbone's pretrained weights should move slowly.
            rate = config.fine_tune_learning_rate or config.learning_rate / 10
        backup = run.backup if len(named) == 1 else storage.join(run.backup, name)
        first = sum(phase.epochs for phase in phases)
        phases.append(_Phase(name, epochs, rate, backup, first))
    return phases


def _engine_without_tensorflow(config: TrainConfig) -> TrainConfig:
    """``config``, reading with the Grain engine where TensorFlow (which tf.data, the
    default engine, needs) is not installed; said in one line."""
    if config.load.engine != "tf" or installed("tensorflow"):
        return config
    if not installed("grain"):
        raise ChuteError(
            "chute train reads with tf.data (TensorFlow) or Grain, and neither is installed "
            f"here: {extra('grain')} (no TensorFlow), or {tensorflow_builds()}"
        )
    log.info("TensorFlow is not installed: the Grain engine reads the data (--engine grain)")
    return dataclasses.replace(config, load=dataclasses.replace(config.load, engine="grain"))


def _multiworker(config: TrainConfig) -> bool:
    """Whether the run trains under MultiWorkerMirroredStrategy (chute's own loop)."""
    return config.backend == "tensorflow" and (
        config.strategy == "multiworker"
        or (config.strategy == "auto" and strategy_lib.count_workers() > 1)
    )


def _check_one_process_options(
    config: TrainConfig, processes: processes_lib.Processes, callbacks: list
) -> None:
    """Refuses, before anything is written, what only a run in one process can do: a
    ``time_limit`` (over several processes or workers each would time its own epochs
    and stop on its own), and ``callbacks`` under MultiWorkerMirroredStrategy (trained
    in chute's own loop, not Keras's fit)."""
    workers = max(processes.count, 1)
    if _multiworker(config):
        if callbacks:
            raise ChuteError(
                "`callbacks` go to Keras's fit, which MultiWorkerMirroredStrategy runs do "
                f"not use (chute's own loop trains them). Received: {len(callbacks)} callbacks"
            )
        workers = max(workers, strategy_lib.count_workers(), 2)
    if config.time_limit is not None and workers > 1:
        raise ChuteError(
            "`time_limit` times each epoch in one process; over several workers or "
            "processes each would decide on its own when to stop: pass epochs instead. "
            f"Received: time_limit={config.time_limit:g} on {workers} processes"
        )


def _check_callbacks(callbacks: Any) -> list:
    """``callbacks`` as a list of Keras callbacks, else a ChuteError naming what came."""
    if callbacks is None:
        return []
    listed = list(callbacks) if isinstance(callbacks, list | tuple) else None
    if listed is None or not all(isinstance(c, keras.callbacks.Callback) for c in listed):
        raise ChuteError(
            "`callbacks` must be a list of keras.callbacks.Callback objects. Received: "
            f"callbacks={callbacks!r}"
        )
    return listed


def _fit_phases(model, devices: Devices, inputs: _Inputs, config, manifest, run, verbose, extra=()):
    """Trains phase after phase; returns the history and the seconds of each epoch.

    A finished phase leaves its weights and history in the backup folder, so a
    resumed run goes on from the phase it stopped in.
    """
    storage.makedirs(run.join("checkpoints"))
    if not installed("tensorflow"):  # Keras's TensorBoard callback writes through tf.summary
        log.info("No TensorBoard logs: they need TensorFlow (%s)", tensorflow_builds())
    class_weight = None
    if config.class_weights == "balanced":
        # At least 1: a class without examples would otherwise divide by zero.
        counts = np.maximum(1, np.asarray(inputs.class_counts, float))
        class_weight = dict(enumerate(counts.sum() / (manifest.num_classes * counts)))
    history: dict[str, list[float]] = {}
    seconds: list[float] = []
    phases = _phases(config, run)
    for phase in phases:
        done = storage.join(phase.backup, "done.json")
        if len(phases) > 1 and storage.exists(done):  # finished by an earlier run
            finished = json.loads(storage.read_bytes(done))
            with storage.staged_read(storage.join(phase.backup, "end.weights.h5")) as local:
                model.load_weights(local)
            _extend(history, finished["history"])
            continue
        # Before compiling: Keras reads which weights are trainable when the model is compiled.
        trainable.freeze(model, phase.name, config.fine_tune)
        phase_history, phase_seconds = _fit(
            model, devices, inputs, config, run, phase, class_weight, verbose, extra
        )
        _extend(history, phase_history)
        seconds += phase_seconds
        if len(phases) > 1 and devices.chief:
            storage.makedirs(phase.backup)
            end = storage.join(phase.backup, "end.weights.h5")
            # the chief alone (not a collective); staged: Keras writes no bucket
            with processes_lib.alone(devices), storage.staged_write(end) as local:
                model.save_weights(local)
            body = {"history": phase_history}
            storage.write_atomic(done, json.dumps(body, default=float).encode())
    storage.remove_if_exists(run.backup)  # every phase is done
    return history, seconds


def _extend(history: dict, more: dict) -> None:
    for name, values in more.items():
        history.setdefault(name, []).extend(float(v) for v in values)


def _fit(
    model,
    devices: Devices,
    inputs: _Inputs,
    config,
    run,
    phase: _Phase,
    class_weight,
    verbose,
    extra=(),
):
    """One phase: Keras's fit (or chute's loop under MultiWorkerMirroredStrategy)."""
    augmentation = None
    heavy = [name for name in config.augment if name not in FUSED]
    if inputs.augment_on == "device" and heavy:
        with devices.scope():  # its layers' seed variables live with the model's
            augmentation = DeviceAugmentation(heavy, config.seed)
    # Keras's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
    if devices.kind == "multiworker":
        from chute.fit.loop import fit_multiworker

        return fit_multiworker(
            model,
            devices.strategy,
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
    trainer = _compiled(model, devices, inputs, config, phase, augmentation)
    timer = _epoch_timer()
    kept = trainable.progress(run, phase.name, inputs.monitor, config.early_stopping)
    resume = position.Resume(
        backup_lib.Backup(phase.backup),
        steps=inputs.steps,
        global_batch=inputs.global_batch,
        epochs=phase.epochs,
        first_epoch=phase.first_epoch,
        engine=inputs.engine,
        repeated=inputs.repeated,
        layout=(devices.processes, devices.replicas),
        # a mixture's batches are composed for one global batch size
        fixed_batch=inputs.mixture is not None,
    )
    budgets = _budget(config, run, inputs, phase, devices)
    callbacks = [
        *([_padded_val_loss(inputs.val_padded)] if inputs.val_padded != 1 else []),
        # before the logs and the history: they record each mixed dataset's images
        *([_mix_counts(inputs.mixture)] if inputs.mixture is not None else []),
        # first: the others see saved epochs (and the restored model); every process
        # restores, only the chief writes backups, alone
        resume.callback(_saver(resume, devices), config.backup_every),
        *processes_lib.chief_only(
            devices,
            [
                *trainable.checkpoints(model, run, inputs.monitor),
                *logs_lib.callbacks(run, tensorboard=installed("tensorflow")),
            ],
        ),
        kept,
        timer,
        *budgets,
        *extra,
    ]

    def fit(initial_epoch: int) -> None:
        call = resume.call(initial_epoch)
        trainer.fit(
            # the Grain engine's stream from the call's batch on (Keras iterates a dataset
            # a few times before training, to learn its shapes: each time from there)
            inputs.train.stream(call.start) if inputs.engine == "grain" else inputs.train,
            validation_data=inputs.val,
            epochs=call.epochs,
            initial_epoch=call.initial_epoch,
            steps_per_epoch=call.steps,
            validation_steps=inputs.val_steps,
            callbacks=callbacks,
            class_weight=class_weight,
            shuffle=False,  # the dataset shuffles itself (Keras would only warn)
            verbose=verbose,
        )

    # epochs recorded after the restored backup (a newer one was unreadable) go
    _fit_until_done(fit, resume, kept, first=kept.resume_at(resume.point.epoch), budgets=budgets)
    return kept.finish(), timer.seconds


def _mix_counts(mixture: Any) -> Any:
    """A callback that puts each mixed dataset's images of the epoch into its logs (so
    into the history and ``history.csv``): ``images_<dataset folder>``."""
    from chute.read.mixture import folder_name

    names = []
    for location in mixture.datasets:
        name = f"images_{folder_name(location)}"
        names.append(name if name not in names else f"{name}_{len(names)}")

    class MixCounts(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs.update({name: float(n) for name, n in zip(names, mixture.images, strict=True)})

    return MixCounts()


def _budget(config: TrainConfig, run, inputs: _Inputs, phase: _Phase, devices: Devices) -> list:
    """With a ``time_limit``: the callback that fits the run to it (none otherwise)."""
    if config.time_limit is None:
        return []
    from chute.fit import budget

    return [
        budget.callback(
            limit=config.time_limit,
            state_file=run.join("budget.json"),
            steps=inputs.steps,
            most=phase.epochs,
            peak=phase.learning_rate,
            schedule=config.schedule,
            chief=devices.chief,
        )
    ]


def _compiled(model, devices: Devices, inputs: _Inputs, config, phase: _Phase, augmentation):
    """What ``fit`` trains: the model (with the augmentation layers in front, when they
    run in the train step), compiled for the phase inside the devices' scope."""
    with devices.scope():
        # Only fit augments: checkpoints and the bundle keep the bare model, which predicts as is.
        trainer = (
            model if augmentation is None else trainable.with_augmentation(model, augmentation)
        )
        # Padded validation batches weigh the padding 0: metrics that count weights
        multi = inputs.positives is not None
        metrics = make_metrics(
            config, model.output_shape[-1], multi_label=multi, present=inputs.labels_present
        )
        padded = inputs.val_weighted
        trainer.compile(
            optimizer=make_optimizer(
                config, inputs.steps, learning_rate=phase.learning_rate, epochs=phase.epochs
            ),
            loss=make_loss(config, positives=inputs.positives),
            metrics=None if padded else metrics,
            weighted_metrics=metrics if padded else None,
            steps_per_execution=config.steps_per_execution or devices.steps_per_execution,
        )
    return trainer


def _fit_until_done(fit: Any, where: Any, kept: Any, *, first: int, budgets=()) -> None:
    """Calls ``fit(initial_epoch)`` from ``first`` until the phase is over: a fit that
    trained only the rest of a resumed epoch (``where.cut``) is followed by one from the
    next epoch (``where.next_epoch``), unless early stopping (``kept.stopped``) or a time
    budget (``budgets``' ``stopped``) ended the phase at that epoch."""
    epoch = first
    while True:
        fit(epoch)
        if not where.cut or kept.stopped or any(b.stopped for b in budgets):
            return
        epoch = where.next_epoch


def _saver(resume: position.Resume, devices: Devices) -> Any:
    """The backup's ``save`` as this process runs it: the chief's alone (not a
    collective on several JAX processes), none on the other processes."""
    if not devices.chief:
        return None

    def save(model: Any, epoch: int, samples: int) -> None:
        with processes_lib.alone(devices):
            resume.store.save(
                model, epoch, samples=samples, global_batch=resume.global_batch,
                layout=resume.layout,
            )  # fmt: skip

    return save


def _save_best(model, manifest, run, config: TrainConfig, precision: str, inputs, recipe):
    """The best checkpoint as a model bundle (holding the model, ready for evaluation)."""
    best = run.checkpoint("best")  # the best epoch of the whole run, resumes included
    if storage.exists(best):
        model = load_model(best)
    model = trainable.portable(model)  # float32 layers, same weights: predicts anywhere
    tuned = None
    if manifest.multi_label:  # before chute.json: a bundle in place always has its thresholds
        from chute.fit import thresholds

        tuned = thresholds.tuned(
            model, manifest, config.load,
            input_size=inputs.input_shape[:2], crop_fraction=inputs.crop_fraction,
        )  # fmt: skip
    return save_bundle(
        model,
        run.bundle,
        class_names=manifest.class_names,
        image=manifest.image,
        crop_fraction=inputs.crop_fraction,
        thresholds=tuned,
        tta=recipe.tta,
        info={
            "data": manifest.location,
            **({"mix": inputs.mixture.to_dict()["datasets"]} if inputs.mixture else {}),
            "model": config.model,
            "precision": precision,
            "backend": config.backend,
            "recipe": recipe.summary,
        },
    )


def _result(
    run, bundle, inputs: _Inputs, history, seconds, devices: Devices, precision
) -> TrainResult:
    best = max(history[inputs.monitor]) if history.get(inputs.monitor) else None
    best = float(best) if inputs.val is not None and best is not None else None
    multi = inputs.positives is not None
    # The median: the first epoch includes compiling and would skew a mean.
    per_epoch = float(np.median(seconds)) if seconds else 0.0
    return TrainResult(
        run_dir=run.path,
        bundle=bundle.location if bundle is not None else run.bundle,
        best_val_accuracy=None if multi else best,
        best_val_map=best if multi else None,
        final={k: float(v[-1]) for k, v in history.items() if v},
        epochs_run=len(seconds),
        seconds_per_epoch=per_epoch,
        images_per_second=inputs.steps * inputs.global_batch / per_epoch if per_epoch else 0.0,
        replicas=devices.replicas,
        global_batch_size=inputs.global_batch,
        strategy=devices.kind,
        precision=precision,
        resumed=run.resumed,
        backend=devices.backend,
        processes=devices.processes,
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


def _padded_val_loss(padded: float) -> Any:
    """A callback scaling ``val_loss`` back to the real examples, before the other
    callbacks see it: Keras averages the validation loss over every example of the padded
    batches (padding included, at loss 0)."""

    # Defined inside: Keras is imported lazily, so no Keras class exists at import time.
    class PaddedValLoss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs and "val_loss" in logs:
                logs["val_loss"] = float(logs["val_loss"]) * padded

    return PaddedValLoss()


def _keras_verbose(verbose: int | str) -> int | str:
    """``verbose`` for Keras's ``fit``, "auto" resolved: Keras's own "auto" draws its bar
    (carriage returns, ANSI codes, every step) into a log file or a pipe too."""
    if verbose != "auto":
        return verbose
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


def _epoch_timer() -> Any:
    """A callback keeping the wall time of each epoch (training and validation)."""

    # Defined inside: Keras is imported lazily, so no Keras class exists at import time.
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
        # Nested models (a keras.applications backbone) hide their BatchNormalization layers.
        if hasattr(layer, "layers"):
            found += _all_layers(layer)
    return found
