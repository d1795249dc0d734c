"""How ``chute train`` reads its splits: one pure function from the run to ``LoadOptions``.

:func:`reading` turns a training config, the run's :class:`~chute.fit.devices.Devices`
and the manifest into the training and the validation split's
:class:`~chute.read.options.LoadOptions`; :func:`pipelines` says which input
pipeline of the run this process is (the strategy or input context that
``chute.load`` takes beside them). The rules, and why:

- one pipeline of global batches, unless every host reads its own part
  (``Devices.per_host``): then the per-replica batch under ``tf.distribute``
  (``distribute_datasets_from_function`` batches per replica), or the per-device
  batch times this process's devices for a JAX process; repeated, an epoch being
  the reader's steps (the smallest share's);
- the training data repeat through the tf.data service (each repetition a job
  of an epoch) and on the Grain engine (one stream from epoch to epoch, from
  where a resumed run stopped);
- validation sees every example once: per host, padded to the largest share's
  batches (weight 0) and repeated for Keras's fit (told its steps); on several
  JAX or torch devices padded too (Keras splits every batch evenly); on the Grain
  engine repeated (Keras cannot ask a Grain dataset its length) and read with
  threads (Keras iterates validation anew each epoch: worker processes would
  start each time); under ``MultiWorkerMirroredStrategy`` chute's loop validates
  the whole split on each worker.

Example:
    >>> train, val = reading(TrainConfig(), Devices("cpu"), manifest)  # doctest: +SKIP
    >>> train.batch_size, train.repeat, val.training  # doctest: +SKIP
    (128, False, False)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from chute.errors import ChuteError
from chute.fit import backbones, cnns, models
from chute.fit.devices import Devices
from chute.format.manifest import Manifest
from chute.lazy import tf
from chute.read.augment import MIXING
from chute.read.options import LoadOptions
from chute.read.target import default_crop_fraction

if TYPE_CHECKING:
    from chute.fit.config import TrainConfig

log = logging.getLogger(__name__)
DEFAULT_BATCH = 128
"""The per-replica batch when none is given and the data give enough steps with it."""

# The LoadOptions that chute train sets on every split, each from the training option
# named (None: from what the model, the devices and the split need). reading() sets
# these and only these (validation also its own sampling and workers), so `load` (a
# TOML [load] table, chute train's reading flags) sets the rest and never these.
CHOSEN_BY_TRAIN = {
    "batch_size": "batch_size",
    "image_size": "image_size",
    "augment": "augment",
    "augment_on": "augment_on",
    "crop_fraction": "crop_fraction",
    "seed": "seed",
    "data_service": "data_service",
    "training": None,
    "dtype": None,
    "label_mode": None,
    "repeat": None,
    "pad_final_batch": None,
}
_DEFAULTS = LoadOptions()


def reading(
    config: TrainConfig, devices: Devices, manifest: Manifest
) -> tuple[LoadOptions, LoadOptions | None]:
    """The training split's and the validation split's options (None: no val split).

    Raises:
        ChuteError: images stored at their own sizes without ``image_size`` for a model
            that has no usual size.
    """
    size = input_size(config, manifest)
    labels = "categorical" if categorical(config) else "int"
    if manifest.multi_label:  # a 0/1 per label: MixUp blends it, the loss smooths it
        labels = "multi_hot"
    host_batch = _per_host_batch(config, devices)  # None: one pipeline of global batches
    # the service and the Grain engine stream from epoch to epoch (fit is told the steps)
    grain = config.load.engine == "grain"
    streamed = config.data_service is not None or grain
    train = _chosen(
        config.load,
        batch_size=host_batch or global_batch(config, devices),
        image_size=size,
        label_mode=labels,
        repeat=host_batch is not None or streamed,
        augment=config.augment,
        augment_on=augment_on(config, devices),
        data_service=config.data_service,
        seed=config.seed,
    )
    if manifest.num_examples("val") == 0:
        return train, None
    per_host = val_per_host(devices)  # padded to the largest share's batches, repeated
    val = _chosen(
        # every example once, whatever training draws (sampling is for training only)
        dataclasses.replace(config.load, sampling=None),
        training=False,
        batch_size=host_batch if per_host else global_batch(config, devices),
        image_size=size,
        label_mode=labels,
        crop_fraction=crop_fraction(config, manifest),
        # Keras splits each batch evenly over JAX's (or torch's) devices
        pad_final_batch=per_host or (devices.backend != "tensorflow" and devices.replicas > 1),
        # Keras cannot ask a Grain dataset its length: told none, it reads to the end and
        # warns that the "input ran out of data"; told the steps, it reads them from each
        # evaluation's own iterator of the repeated split
        repeat=per_host or grain,
    )
    return train, dataclasses.replace(
        val,
        # Keras iterates validation anew each epoch: Grain would start its worker
        # processes each time (seconds); threads read as fast (benchmarks/README.md)
        workers=0 if grain and val.workers is None else val.workers,
    )


def _chosen(load: LoadOptions, **values: Any) -> LoadOptions:
    """``load`` with every option of :data:`CHOSEN_BY_TRAIN` set: to ``values``, the
    rest to LoadOptions' defaults (``load`` leaves them so: see ``TrainConfig``)."""
    unknown = set(values) - set(CHOSEN_BY_TRAIN)
    if unknown:  # `load` could set them, and this would overrule it unseen
        raise TypeError(f"not options chute train chooses: {sorted(unknown)}")
    chosen = {name: getattr(_DEFAULTS, name) for name in CHOSEN_BY_TRAIN}
    return dataclasses.replace(load, **{**chosen, **values})


def pipelines(devices: Devices, *, training: bool) -> dict[str, Any]:
    """``chute.load``'s ``strategy`` or ``input_context`` for this process's part of a
    split: the strategy under ``tf.distribute`` on several hosts
    (``distribute_datasets_from_function``); a JAX process's input context (one input
    pipeline per process: Keras assembles the processes' batches into global ones);
    nothing for one pipeline of global batches."""
    if not (devices.per_host if training else val_per_host(devices)):
        return {}
    # tf.distribute on several hosts: the strategy hands each host its input context itself.
    if devices.processes == 1:
        return {"strategy": devices.strategy}
    context = tf.distribute.InputContext(
        num_input_pipelines=devices.processes,
        input_pipeline_id=devices.process_index,
        num_replicas_in_sync=devices.processes,
    )
    return {"input_context": context}


def val_per_host(devices: Devices) -> bool:
    """Whether each host validates its own part: as it trains on one, except under
    chute's multi-worker loop, which validates the whole split on each worker."""
    return devices.per_host and devices.kind != "multiworker"


def _per_host_batch(config: TrainConfig, devices: Devices) -> int | None:
    """The batch of a host reading its own part (None: one pipeline of global batches):
    per replica under ``tf.distribute``; per device times this process's devices for a
    JAX process."""
    if not devices.per_host:
        return None
    if devices.processes > 1:
        # A JAX process feeds all its own devices: Keras assembles the processes' batches.
        return per_replica_batch(config) * devices.devices_here
    return per_replica_batch(config)


def global_batch(config: TrainConfig, devices: Devices) -> int:
    """Per-replica batch × replicas in sync: what one training step consumes."""
    return per_replica_batch(config) * devices.replicas


def per_replica_batch(config: TrainConfig) -> int:
    """``config.batch_size``; :data:`DEFAULT_BATCH` where it is left to chute and not
    chosen yet (``chute.train`` chooses it for the data before reading:
    :func:`chute.fit.objective.choose_batch_size`)."""
    return DEFAULT_BATCH if config.batch_size is None else config.batch_size


def categorical(config: TrainConfig) -> bool:
    """Whether labels are one-hot (label smoothing, MixUp and CutMix need them), else integers."""
    # Smoothed or mixed labels are fractions: only one-hot labels can carry them.
    return bool(config.label_smoothing) or any(name in MIXING for name in config.augment or ())


def augment_on(config: TrainConfig, devices: Devices) -> str:
    """Where the heavy augmentations run: ``"device"`` on an accelerator, through the
    tf.data service (its workers run graphs only) and with the Grain engine (whose
    workers crop and flip only), else ``"host"``; unless asked."""
    if config.augment_on != "auto":
        return config.augment_on
    # Augmentation in the step runs on TensorFlow and JAX only (see train._devices).
    if devices.backend == "torch":
        return "host"
    if config.load.engine == "grain":
        return "device"
    accelerator = devices.kind in ("tpu", "gpu", "multi-gpu")
    return "device" if accelerator or config.data_service else "host"


def crop_fraction(config: TrainConfig, manifest: Manifest) -> float:
    """Evaluation's centre crop: asked for, else the dataset's default."""
    return config.crop_fraction or default_crop_fraction(manifest.image)


def input_size(config: TrainConfig, manifest: Manifest) -> tuple[int, int]:
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
