"""What ``chute train`` wraps around a model while it trains: augmentation inside the train
step, freezing for transfer learning, and checkpoints of the model itself.

- :func:`with_augmentation`: the heavy augmentations (rotation, zoom, RandAugment,
  MixUp, CutMix, ...) applied to each batch inside the train step, so they run
  where the model runs (the accelerator), not on the host.
- :func:`freeze`: a ``keras.applications`` backbone frozen for head-only
  epochs, or unfrozen (all of it, or its top N layers) for fine-tuning;
  BatchNormalization layers stay frozen, so they keep inference-mode statistics.
- :func:`checkpoints`: ``best.keras`` and ``last.keras`` of the model (not of a
  wrapper), the best score kept beside them so that a resumed run compares with
  it.
- :func:`progress`: a phase's history kept epoch by epoch, and early stopping's
  patience counted over it, across any number of resumes.

Example:
    >>> trainer = with_augmentation(model, augmentation)  # doctest: +SKIP
    >>> trainer.compile(...); trainer.fit(dataset)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from typing import Any

from chute.fit import rundir
from chute.fit.backbones import BACKBONE_LAYER
from chute.format import storage
from chute.lazy import keras
from chute.read.augment import DeviceAugmentation

log = logging.getLogger(__name__)


def with_augmentation(model: Any, augmentation: DeviceAugmentation) -> Any:
    """A model that trains ``model``, augmenting each batch first inside its train step.

    Predictions and evaluation are ``model``'s own; only ``fit`` augments. On JAX
    the train step is a pure function of the model's state: the augmentation
    layers' seeds are among its non-trainable variables, advanced step by step.
    """
    jax = keras.backend.backend() == "jax"

    class AugmentedTraining(keras.Model):
        def __init__(self):
            super().__init__(name=f"{model.name}_augmented")
            self.base = model
            self.augmentations = [*augmentation.layers, *augmentation.mixing]  # tracked

        def call(self, images, training=False):
            return self.base(images, training=training)

        def train_step(self, *args):
            # JAX's train step is a pure function of its state: the seeds must travel in it.
            if jax:
                return _jax_train_step(self, augmentation, *args)
            images, labels, weights = keras.utils.unpack_x_y_sample_weight(args[0])
            if augmentation.mixing:
                images, labels = augmentation(images, labels)
            else:
                images = augmentation(images)
            return super().train_step(keras.utils.pack_x_y_sample_weight(images, labels, weights))

    return AugmentedTraining()


def _jax_train_step(trainer: Any, augmentation: DeviceAugmentation, state, data):
    """Keras's JAX train step on the batch augmented: the augmentation runs statelessly
    on the step's own copy of the non-trainable variables (its seeds among them)."""
    trainable_values, non_trainable_values, optimizer_values, metrics_values = state
    images, labels, weights = keras.utils.unpack_x_y_sample_weight(data)
    variables = trainer.non_trainable_variables
    mapping = list(zip(variables, non_trainable_values, strict=True))
    # Stateless: the layers read and advance the step's copy of their seeds, not the variables.
    with keras.StatelessScope(state_mapping=mapping) as scope:
        images, labels = _augmented(augmentation, images, labels)
    non_trainable_values = [scope.get_current_value(v) for v in variables]
    state = (trainable_values, non_trainable_values, optimizer_values, metrics_values)
    data = keras.utils.pack_x_y_sample_weight(images, labels, weights)
    # super() in its two-argument form: this function sits outside the class body.
    return super(type(trainer), trainer).train_step(state, data)


def _augmented(augmentation: DeviceAugmentation, images, labels):
    """What ``augmentation(images, labels)`` does, in Keras ops (any backend, in a step)."""
    ops = keras.ops
    out = ops.cast(images, "float32")
    for layer in augmentation.layers:
        out = layer(out, training=True)
    for layer in augmentation.mixing:
        mixed = layer({"images": out, "labels": labels}, training=True)
        out, labels = mixed["images"], mixed["labels"]
    # Back to uint8: the model rescales its own input, as it does for unaugmented batches.
    return ops.cast(ops.clip(ops.round(out), 0, 255), "uint8"), labels


def backbone_of(model: Any) -> Any | None:
    """The nested ``keras.applications`` backbone of a chute model, or None."""
    try:
        return model.get_layer(BACKBONE_LAYER)
    except ValueError:
        return None


def freeze(model: Any, phase: str, fine_tune: str | None) -> None:
    """Sets what trains in ``phase``: ``"all"`` (everything), ``"head"`` (the backbone
    frozen) or ``"fine-tune"`` (the backbone's top ``fine_tune`` layers, or all of
    them, unfrozen; BatchNormalization layers stay frozen)."""
    backbone = backbone_of(model)
    # Every layer on first: a phase's freezing never inherits the phase before it.
    model.trainable = True
    if backbone is None or phase == "all":
        return
    if phase == "head":
        backbone.trainable = False
        log.info("training the head, backbone frozen (BatchNorm in inference mode)")
        return
    backbone.trainable = True
    layers = backbone.layers
    first = 0 if fine_tune == "all" else max(0, len(layers) - int(fine_tune))
    for index, layer in enumerate(layers):
        # BatchNorm stays frozen: it keeps the pretrained inference-mode statistics.
        frozen = index < first or isinstance(layer, keras.layers.BatchNormalization)
        layer.trainable = not frozen
    log.info(
        "fine-tuning %s of the backbone's %d layers (BatchNorm stays frozen)",
        "all" if first == 0 else len(layers) - first,
        len(layers),
    )


def checkpoints(model: Any, run: Any, monitor: str) -> list:
    """Callbacks saving ``model`` (whatever wraps it in training) as
    ``checkpoints/last.keras`` each epoch and ``checkpoints/best.keras`` when
    ``monitor`` improves on the best so far, kept in ``checkpoints/best.json``."""
    best_file = run.join("checkpoints", "best.json")

    class Checkpoints(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            # staged: Keras writes local files (and TensorFlow's), not a bucket's
            with storage.staged_write(run.checkpoint("last")) as local:
                model.save(local)
            score = (logs or {}).get(monitor)
            if score is None:
                return
            best = None
            # The best score on disk, not in memory: a resumed run compares with earlier runs'.
            if storage.exists(best_file):
                best = json.loads(storage.read_bytes(best_file))["best"]
            if best is None or score > best:
                with storage.staged_write(run.checkpoint("best")) as local:
                    model.save(local)
                storage.write_atomic(best_file, json.dumps({"best": float(score)}).encode())

    return [Checkpoints()]


def progress(run: Any, phase: str, monitor: str, patience: int | None) -> Any:
    """A callback keeping a phase's history epoch by epoch in the run folder
    (``progress-<phase>.json``), so that a resumed run continues it rather than
    starting a new one, and stopping after ``patience`` epochs without a better
    ``monitor`` counting the epochs before the resume too. ``.history`` is the whole
    phase's history."""
    path = run.join(rundir.PROGRESS.format(phase))

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.history: dict[str, list[float]] = {}
            self.stopped = False  # early stopping ended the phase
            if storage.exists(path):  # epochs an interrupted run already did
                self.history = json.loads(storage.read_bytes(path))

        def resume_at(self, epoch: int) -> int:
            """The phase goes on from ``epoch`` (its backup's): epochs recorded after it
            (a backup set aside, an older one restored) are dropped. Returns ``epoch``."""
            self.history = {name: values[:epoch] for name, values in self.history.items()}
            return epoch

        def on_epoch_end(self, epoch, logs=None):
            for name, value in (logs or {}).items():
                self.history.setdefault(name, []).append(float(value))
            # Written every epoch: a kill between epochs loses nothing of the history.
            storage.write_atomic(path, json.dumps(self.history).encode())
            scores = self.history.get(monitor, [])
            if patience and scores:
                # Over the whole phase, resumes included: a restart does not reset the patience.
                waited = len(scores) - 1 - scores.index(max(scores))
                if waited >= patience:
                    log.info("no better %s for %d epochs: stopping", monitor, waited)
                    self.model.stop_training = self.stopped = True

        def finish(self) -> dict[str, list[float]]:
            """The phase's whole history; its file is no longer needed."""
            storage.remove_if_exists(path)
            return self.history

    return Progress()


def portable(model: Any) -> Any:
    """``model`` as a bundle keeps it, to predict on any device and Keras backend (itself
    when it already is): every layer's dtype policy float32 (a model trained in mixed
    precision predicts in float32 on a CPU), and BatchNormalization without
    ``synchronized`` (a tf.distribute training option the other backends refuse to
    load); same weights."""
    config = model.get_config()
    if not _portable_config(config):
        return model
    rebuilt = model.__class__.from_config(config)
    rebuilt.set_weights(model.get_weights())
    return rebuilt


def _portable_config(config: Any) -> bool:
    """Rewrites a model config in place as :func:`portable` says; True if anything changed."""
    changed = False
    if isinstance(config, dict):
        if config.get("class_name") == "DTypePolicy":
            name = config.get("config", {}).get("name", "")
            if name.startswith("mixed_"):
                config["config"]["name"] = "float32"
                return True
        if config.get("class_name") == "BatchNormalization":
            layer = config.get("config", {})
            changed |= bool(layer.pop("synchronized", False))  # its default: False
        for value in config.values():
            changed |= _portable_config(value)
    elif isinstance(config, list):
        for value in config:
            changed |= _portable_config(value)
    return changed
