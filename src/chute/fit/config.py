"""The options of a training run: one frozen, validated dataclass.

Flags of ``chute train`` and the keys of a TOML config file are its fields;
defaults and help are written here only.

Example:
    >>> TrainConfig(model="cifar-cnn", epochs=3).epochs
    3
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.fit.backend import BACKENDS
from chute.fit.processes import check_coordinator
from chute.fit.reading import CHOSEN_BY_TRAIN
from chute.fit.rendezvous import PROCESS_TIMEOUT
from chute.fit.strategy import KINDS, PRECISIONS
from chute.image.size import parse_image_size
from chute.read.options import LoadOptions
from chute.settings import from_mapping, option

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
AUGMENT_ON = ("auto", "host", "device")
AUTO = "auto"
"""An option chute train chooses from the data (see :mod:`chute.fit.recipe`)."""
SCHEDULES = (AUTO, "onecycle", "constant", "cosine", "exponential")
CLASS_WEIGHTS = (None, "balanced")
# What a TOML [load] table, and chute train's reading flags, may set.
LOAD_TABLE = tuple(f.name for f in dataclasses.fields(LoadOptions) if f.name not in CHOSEN_BY_TRAIN)


def _names(value: Any) -> tuple[str, ...] | None:
    """``"flip,zoom"`` (a flag or a TOML string) or a list, as a tuple of names;
    ``"none"`` (or an empty list) is none; ``None`` or ``"auto"`` leaves the choice to
    the recipe."""
    if value is None or value == AUTO:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "none":
            return ()
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return tuple(value)


MIX_ALLOWED = "DATASET=WEIGHT pairs (comma-separated), each weight above 0, summing below 1"


def parse_mix(value: Any) -> tuple[tuple[str, float], ...] | None:
    """``mix`` checked: datasets trained on beside the first, each with its share of every
    batch; a flag's ``"b=0.3,c=0.1"`` (split at each pair's last ``=``), a mapping, or
    pairs. The first dataset gets what is left (``1 - 0.3 - 0.1``).

    Example:
        >>> parse_mix("gs://b/x=0.3, ./c=0.1")
        (('gs://b/x', 0.3), ('./c', 0.1))
    """
    if value is None:
        return None
    pairs: Any = value
    if isinstance(value, str):
        pairs = [part.rsplit("=", 1) for part in value.split(",") if part.strip()]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise checks.bad_value("mix", value, MIX_ALLOWED)
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    checked = []
    try:
        for name, weight in pairs:
            name = str(name).strip() if isinstance(name, str) else os.fspath(name)
            weight = float(weight)
            if not name or not 0 < weight < 1:
                raise ValueError
            checked.append((name, weight))
    except (TypeError, ValueError):
        raise checks.bad_value("mix", value, MIX_ALLOWED) from None
    if not checked or sum(weight for _, weight in checked) >= 1:
        raise checks.bad_value("mix", value, MIX_ALLOWED)
    return tuple(checked)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (flags, or a TOML file, fill it).

    Options left at ``"auto"`` or ``None`` where this says "chosen from the data"
    are filled by :func:`chute.fit.recipe.choose` when the run starts.

    Attributes:
        model: a registry name (see ``chute.available_models()``); ``"auto"``:
            ``chute-cnn`` sized for the data (``MobileNetV2`` with
            ``weights="imagenet"``).
        epochs: passes over the training split (default 10; with ``time_limit``,
            the most it may take).
        time_limit: train as many epochs as fit in this many seconds (or
            ``"10m"``, ``"1h30m"``): measured after each epoch, with the
            schedule fitted to the epochs that fit (see :mod:`chute.fit.budget`);
            a resumed run spends what is left.
        batch_size: examples per step **per replica**; default (None): 128, halved
            down to 16 while a model trained from scratch would take fewer optimizer
            steps than it needs (see :func:`chute.fit.objective.choose_batch_size`).
        optimizer: ``adam``, ``adamw``, ``sgd`` (momentum 0.9) or ``rmsprop``.
        learning_rate: the initial (``onecycle``: the peak) learning rate; default:
            chosen from the data (3e-3 for Adam's one-cycle, 1e-3 for a pretrained
            backbone).
        schedule: ``onecycle`` (linear warm-up over the first fifth of the steps,
            then cosine decay to 0), ``constant``, ``cosine`` (decay to 0 over the
            run) or ``exponential``; ``auto``: ``onecycle`` from scratch,
            ``constant`` for a pretrained backbone.
        label_smoothing: 0 to 0.5; default: 0.1 for single-label data trained from
            scratch, else 0.
        class_weights: ``None`` or ``"balanced"`` (inverse class frequency).
        positive_weights: multi-label datasets: ``None``, or ``"balanced"`` (each
            label's positives weigh its negatives / positives in the binary
            cross-entropy, capped at 100: rare labels are not drowned out).
        steps_per_execution: steps per compiled call; default from the strategy.
        early_stopping: stop after this many epochs without validation gain.
        backup_every: back up every N training steps as well as each epoch. With
            ``engine="grain"`` a resumed run goes on from the very next batch;
            with ``engine="tf"`` it trains the interrupted epoch again from its
            first batch (tf.data cannot restore a shuffle's position).
        backend: the Keras backend, ``tensorflow``, ``jax`` or ``torch``; default:
            Keras's own (``KERAS_BACKEND``, else ``keras.json``). Fixed once Keras
            is imported: the CLI sets ``KERAS_BACKEND`` before that.
        strategy: ``auto``, ``tpu``, ``gpu``, ``cpu`` or ``multiworker`` (on JAX: every
            device of that kind, of every process; ``multiworker`` is TensorFlow's only).
        tpu: a TPU name or address.
        coordinator: JAX on several hosts (one process per host, joined by
            ``keras.distribution.initialize``): process 0's ``HOST:PORT``. With
            ``num_processes`` and ``process_id``; each defaults to Keras's
            ``KERAS_DISTRIBUTION_*`` variable, and on a Cloud TPU slice JAX finds all
            three itself (see :mod:`chute.fit.processes`).
        num_processes: JAX on several hosts: how many processes (hosts) train.
        process_id: JAX on several hosts: this process's index, from 0 (the chief,
            which writes the run directory) to ``num_processes - 1``.
        process_timeout: JAX on several hosts: seconds each process waits for the
            others to come (process 0 for all, the others for process 0 and then its
            word) before failing with a line naming those missing.
        precision: ``auto``, ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        augment: augmentation names for the training data (see ``chute.load``):
            ``crop`` and ``flip`` fused with decoding, the heavier ones where
            ``augment_on`` says; ``()`` (``--augment none``) for none; default
            (``None``, ``"auto"``): none (see :mod:`chute.fit.recipe`).
        augment_on: ``auto`` (on the accelerator when there is one, else the
            host), ``host`` or ``device``: where the heavy augmentations run.
        image_size: the model's input size; default: the stored size, or for
            photos kept at their aspect ratio the backbone's usual size (224 for
            most ``keras.applications`` models).
        crop_fraction: the centre crop of evaluation and ``predict`` (see
            ``chute.load``); default: from the dataset.
        weights: ``imagenet`` (a ``keras.applications`` backbone's pretrained
            weights, downloaded and cached by Keras) or a local weights file.
        fine_tune: with pretrained weights: ``all`` or a number N: after
            ``head_epochs`` epochs of training the new head on the frozen
            backbone, unfreeze all of it (or its top N layers; BatchNorm stays
            frozen) and train at ``fine_tune_learning_rate``. Without it, the
            backbone stays frozen throughout.
        head_epochs: epochs of the head alone before fine-tuning (default: a
            third of ``epochs``, at least 1).
        fine_tune_learning_rate: the learning rate after unfreezing (default:
            a tenth of ``learning_rate``).
        data_service: a ``tf.data`` service dispatcher (``grpc://HOST:PORT``)
            whose workers read and augment the training data (see
            ``chute.load``); validation reads locally. Heavy augmentations
            then run in the train step.
        seed: seeds Keras, the data order and augmentation (not the order of
            data read through ``data_service``).
        dataset_version: train on this version of the dataset (``chute convert
            --append`` adds one); default: the latest.
        mix: other datasets trained on with the first, each with its share of every
            training batch (``(("b", 0.3), ("c", 0.1))``, a mapping, or the flag's
            ``"b=0.3,c=0.1"``; the first dataset gets the rest). Their classes join
            the first one's by name; validation reads the first dataset's val split
            (see ``chute.load`` with ``weights``).
        load: how the data are read, the fields of
            :class:`~chute.read.options.LoadOptions` that chute train does not
            choose itself (``cache``, ``shuffle_buffer``, ``crop_scale``,
            ``crop_ratio``, ``skip_corrupt``): a ``LoadOptions``, or a mapping
            such as a TOML file's ``[load]`` table.
    """

    model: str = option(
        AUTO, "registry name or keras.applications model (auto: chute-cnn sized for the data)"
    )
    epochs: int | None = option(
        None, "passes over the training split (default 10; with --time-limit, the most)", type=int
    )
    time_limit: float | None = option(
        None, "train as many epochs as fit in this time (600, 90s, 10m, 1h30m)", type=str,
        metavar="DURATION",
    )  # fmt: skip
    # None: chosen for the data (objective.choose_batch_size), so a batch given by hand wins.
    batch_size: int | None = option(
        None, "examples per step per replica (default: 128, smaller when the data give too "
        "few steps)", type=int,
    )  # fmt: skip
    optimizer: str = option("adam", "optimizer", choices=OPTIMIZERS)
    learning_rate: float | None = option(
        None, "initial (onecycle: peak) learning rate (default: chosen from the data)", type=float
    )
    schedule: str = option(AUTO, "learning-rate schedule (auto: from the data)", choices=SCHEDULES)
    label_smoothing: float | None = option(
        None, "0 to 0.5 (default: 0.1 from scratch, single-label)", type=float
    )
    class_weights: str | None = option(
        None, "weigh classes by inverse frequency", type=str, choices=("balanced",)
    )
    positive_weights: str | None = option(
        None, "multi-label: weigh each label's positives by its negatives/positives", type=str,
        choices=("balanced",),
    )  # fmt: skip
    steps_per_execution: int | None = option(
        None, "steps per compiled call (default: from the strategy)", type=int
    )
    early_stopping: int | None = option(
        None, "stop after this many epochs without gain", type=int, metavar="PATIENCE"
    )
    backup_every: int | None = option(
        None, "also back up every N steps (engine grain: a resume goes on from that step)",
        type=int, metavar="N",
    )  # fmt: skip
    backend: str | None = option(
        None, "Keras backend (default: KERAS_BACKEND, else keras.json)", type=str,
        choices=BACKENDS,
    )  # fmt: skip
    strategy: str = option("auto", "tf.distribute strategy (JAX: devices)", choices=KINDS)
    tpu: str | None = option(None, "TPU name or address", type=str, metavar="ADDRESS")
    coordinator: str | None = option(
        None, "JAX on several hosts: process 0's address", type=str, metavar="HOST:PORT"
    )
    num_processes: int | None = option(
        None, "JAX on several hosts: processes, one per host", type=int
    )
    process_id: int | None = option(
        None, "JAX on several hosts: this process's index (0: the chief)", type=int, metavar="I"
    )
    process_timeout: float = option(
        PROCESS_TIMEOUT, "JAX on several hosts: seconds to wait for the other processes",
        metavar="SECONDS",
    )  # fmt: skip
    precision: str = option("auto", "Keras mixed-precision policy", choices=PRECISIONS)
    augment: tuple[str, ...] | None = option(
        None,
        "comma-separated: crop,flip,rotation,zoom,translation,contrast,brightness,"
        "randaugment,mixup,cutmix; none (the default)",
        type=_names,
        metavar="NAMES",
    )
    augment_on: str = option("auto", "where heavy augmentations run", choices=AUGMENT_ON)
    image_size: tuple[int, int] | None = option(
        None, "model input H[xW] (default: stored, or the backbone's)", type=str, metavar="H[xW]"
    )
    crop_fraction: float | None = option(
        None, "evaluation/predict centre crop (default: from the dataset)", type=float
    )
    weights: str | None = option(
        None, "'imagenet' (Keras downloads and caches it) or a local weights file", type=str,
        metavar="imagenet|FILE",
    )  # fmt: skip
    fine_tune: str | None = option(
        None, "after head-only epochs, unfreeze the backbone: 'all' or its top N layers",
        type=str, metavar="all|N",
    )  # fmt: skip
    head_epochs: int | None = option(
        None, "epochs of the head alone before fine-tuning (default: a third)", type=int
    )
    fine_tune_learning_rate: float | None = option(
        None, "learning rate after unfreezing (default: learning_rate / 10)", type=float
    )
    data_service: str | None = option(
        None, "read training batches from this tf.data service dispatcher", type=str,
        metavar="grpc://HOST:PORT",
    )  # fmt: skip
    seed: int = option(
        1337, "seeds Keras, the data order and augmentation, whichever --engine reads"
    )
    dataset_version: int | None = option(
        None, "train on this version of the dataset (chute inspect lists them; default: the "
        "latest)", type=int, metavar="N",
    )  # fmt: skip
    mix: tuple[tuple[str, float], ...] | None = option(
        None, "also train on these datasets, each this share of every batch (the first "
        "dataset gets the rest): DATASET=WEIGHT,...", type=str, metavar="B=0.3,C=0.1",
    )  # fmt: skip
    # a frozen LoadOptions: one default instance is safely shared
    load: LoadOptions = option(LoadOptions(), "how the data are read ([load])", flag=False)  # noqa: RUF009

    def __post_init__(self) -> None:
        if self.time_limit is not None:
            from chute.fit.budget import MOST_EPOCHS, parse_duration

            object.__setattr__(self, "time_limit", parse_duration(self.time_limit))
            if self.fine_tune is not None:
                raise ChuteError(
                    "`time_limit` fits one phase of training to the time; fine_tune has "
                    "two: pass epochs (and head_epochs) instead. Received: time_limit="
                    f"{self.time_limit:g}, fine_tune={self.fine_tune!r}"
                )
            if self.epochs is None:
                object.__setattr__(self, "epochs", MOST_EPOCHS)
        if self.epochs is None:
            object.__setattr__(self, "epochs", 10)
        checks.positive_int("epochs", self.epochs)
        checks.optional_positive_int("batch_size", self.batch_size)
        checks.one_of("optimizer", self.optimizer, OPTIMIZERS)
        if self.backend is not None:
            checks.one_of("backend", self.backend, BACKENDS)
        checks.one_of("strategy", self.strategy, KINDS)
        check_coordinator(self.coordinator)
        checks.optional_positive_int("num_processes", self.num_processes)
        if self.process_id is not None:
            # Bounded only when num_processes is given; else Keras's variables or JAX say.
            last = None if self.num_processes is None else self.num_processes - 1
            checks.int_in("process_id", self.process_id, 0, last)
        timeout = checks.positive_number(
            "process_timeout", self.process_timeout, "a positive number of seconds"
        )
        object.__setattr__(self, "process_timeout", timeout)
        checks.one_of("precision", self.precision, PRECISIONS)
        checks.one_of("schedule", self.schedule, SCHEDULES)
        if self.class_weights not in CLASS_WEIGHTS:
            raise checks.bad_value("class_weights", self.class_weights, "None or 'balanced'")
        if self.positive_weights not in CLASS_WEIGHTS:
            raise checks.bad_value("positive_weights", self.positive_weights, "None or 'balanced'")
        rate = self.learning_rate
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 10
        ):
            raise checks.bad_value("learning_rate", rate, "a number between 0 and 10")
        if self.label_smoothing is not None:
            checks.number_in(
                "label_smoothing", self.label_smoothing, 0, 0.5, what="a number from 0 to 0.5"
            )
        checks.optional_positive_int("steps_per_execution", self.steps_per_execution)
        checks.optional_positive_int("early_stopping", self.early_stopping)
        checks.optional_positive_int("backup_every", self.backup_every)
        object.__setattr__(self, "augment", _names(self.augment))
        checks.one_of("augment_on", self.augment_on, AUGMENT_ON)
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))
        if self.crop_fraction is not None:
            checks.number_in("crop_fraction", self.crop_fraction, 0.0, 1.0)
            if self.crop_fraction == 0:
                raise checks.bad_value("crop_fraction", 0, "a number in (0, 1]")
        if self.fine_tune is not None:
            text = str(self.fine_tune)
            if text != "all" and not (text.isdigit() and int(text) > 0):
                raise checks.bad_value(
                    "fine_tune", self.fine_tune, "'all' or a positive number of top layers"
                )
            # Kept as text: "all" or a number of layers, one type for the config file and the flag.
            object.__setattr__(self, "fine_tune", text)
            if self.weights is None:
                raise ChuteError(
                    "`fine_tune` unfreezes a pretrained backbone: pass weights ('imagenet' or "
                    f"a file). Received: fine_tune={self.fine_tune!r}, weights=None"
                )
        if self.fine_tune is not None and self.epochs < 2:
            raise checks.bad_value(
                "epochs", self.epochs, "at least 2 with fine_tune (head, then all)"
            )
        if self.head_epochs is not None:
            # With fine-tuning, at least one epoch must be left for it after the head's.
            last = self.epochs - 1 if self.fine_tune else self.epochs
            checks.int_in("head_epochs", self.head_epochs, 1, last)
        if self.fine_tune_learning_rate is not None:
            rate = self.fine_tune_learning_rate
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 10:
                raise checks.bad_value("fine_tune_learning_rate", rate, "a number between 0 and 10")
        checks.int_in("seed", self.seed, 0, what="a non-negative integer")
        if self.dataset_version is not None:
            checks.positive_int("dataset_version", self.dataset_version)
        object.__setattr__(self, "mix", parse_mix(self.mix))
        if self.data_service is not None:
            from chute.read.options import check_address

            address = check_address("data_service", self.data_service)
            object.__setattr__(self, "data_service", address)
        object.__setattr__(self, "load", _load_options(self.load))

    @property
    def pretrained(self) -> bool:
        """Whether the backbone starts from pretrained weights (ImageNet's or a file's)."""
        return self.weights is not None

    def phases(self) -> list[tuple[str, int]]:
        """The run's phases and their epochs: ``[("head", n), ("fine-tune", m)]`` when
        fine-tuning, else one phase (``"head"`` when a pretrained backbone stays frozen)."""
        if self.fine_tune is None:
            return [("head" if self.pretrained else "all", self.epochs)]
        # A third of the run for the head by default, at least one epoch.
        head = self.head_epochs or max(1, self.epochs // 3)
        return [("head", head), ("fine-tune", self.epochs - head)]

    @classmethod
    def from_toml(cls, path: str, **overrides: Any) -> TrainConfig:
        """Reads a TOML file (its top-level keys are the fields, its ``[load]`` table the
        ``load`` option's); ``overrides`` win, key by key within ``load``."""
        # tomllib is in the standard library from Python 3.11; tomli is the same parser before.
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
        for key, value in overrides.items():
            if key == "load" and isinstance(value, Mapping):  # a [load] table's keys win
                values["load"] = {**values.get("load", {}), **value}
            elif value is not None:
                values[key] = value
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Builds a config, naming unknown keys in the error."""
        return from_mapping(cls, values, "training option")


def _load_options(value: Any) -> LoadOptions:
    """``load`` as :class:`LoadOptions`, setting none of the options chute train chooses."""
    if isinstance(value, Mapping):
        value = LoadOptions.from_dict(value)
    elif not isinstance(value, LoadOptions):
        raise checks.bad_value("load", value, "a LoadOptions or a table of its fields")
    defaults = LoadOptions()
    for name, own in CHOSEN_BY_TRAIN.items():
        # Compared with the defaults: an option left alone is fine, one set by hand is refused.
        if getattr(value, name) != getattr(defaults, name):
            instead = f"set `{own}` instead" if own else "chute train chooses it for each split"
            raise ChuteError(
                f"`load.{name}` cannot be set for chute train: {instead}. "
                f"Received: load.{name}={getattr(value, name)!r}"
            )
    return value
