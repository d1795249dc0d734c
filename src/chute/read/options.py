"""The options of ``chute.load``: one frozen, validated dataclass.

Every value is checked when the object is built, before the dataset is opened,
and a bad one raises :class:`~chute.errors.ChuteError` naming the option, the
value received and what is allowed. The defaults and help of ``chute.load``'s
keywords, of a training config's ``[load]`` table and of ``chute train``'s
reading flags are written here only. What depends on the dataset (two classes
for ``label_mode="binary"``, an ``image_size`` for images stored at their own
sizes, the split's default ``training``) is checked by
:func:`chute.read.target.target`, for both engines.

Example:
    >>> options = LoadOptions(batch_size=64, augment="crop,flip", seed=1)
    >>> options.augment, options.training
    (('crop', 'flip'), None)
    >>> resolve(options, {"cache": "none"}).cache is None
    True
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.image.size import parse_image_size
from chute.read.augment import PLACES, AugmentSpec, parse_augment
from chute.settings import from_mapping, option

LABEL_MODES = ("auto", "int", "categorical", "binary", "multi_hot", None)
DTYPES = ("uint8", "float32", "bfloat16")
DEFAULT_CROP_SCALE = (0.08, 1.0)  # Inception-style random-resized crop: share of the area
DEFAULT_CROP_RATIO = (3 / 4, 4 / 3)  # and aspect ratio (width / height) of the window
CACHE_ALLOWED = "'auto', 'memory', 'disk:FOLDER' or None"
CACHE_OFF = "none"  # cache_dir: no shard cache (None: the default, on for remote data)
SIZE_ALLOWED = "a number of bytes > 0, or a size such as '50GB', '500MB' or '1.5TiB'"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_UNITS = {"": 1, "b": 1} | {
    prefix + unit: base**power
    for power, prefix in enumerate("kmgtp", 1)
    for unit, base in (("b", 1000), ("ib", 1024))
}
ENGINES = ("tf", "grain")
DISPATCHER_TIMEOUT = 60.0
"""Seconds ``chute.load`` waits for a tf.data service dispatcher to answer by default."""
_ADDRESS = re.compile(
    r"^(?:grpc://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$"
)
SAMPLING_ALLOWED = "None, 'balanced', or a mapping {class name or index: weight >= 0}"


def _names(value: Any) -> Any:
    """``"crop,flip"`` (a flag or a TOML string) or a list (names, Keras layers), as a tuple."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return tuple(value) if isinstance(value, list | tuple) else value


def _pair(text: str) -> tuple[float, ...]:
    """A flag's ``"0.08,1"`` as ``(0.08, 1.0)`` (the pair is checked by :class:`LoadOptions`)."""
    return tuple(float(part) for part in text.split(","))


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How ``chute.load`` reads a split (see the README's *chute.load* for the whole story).

    Attributes:
        batch_size: examples per batch **per replica**; the global batch is
            ``batch_size * replicas``.
        training: shuffle, drop the remainder and augment; ``None``: ``split == "train"``.
        image_size: ``(height, width)`` of the images yielded (``75`` and
            ``"75x100"`` too); ``None``: as stored.
        dtype: ``"uint8"`` (0-255), or ``"float32"``/``"bfloat16"`` scaled to [0, 1].
        label_mode: ``"int"``, ``"categorical"`` (one-hot), ``"binary"`` (two
            classes, float 0/1) or ``None`` (images only), as in Keras;
            ``"multi_hot"`` (a float 0/1 per class) for a multi-label dataset;
            ``"auto"``: ``"multi_hot"`` for a multi-label dataset, else ``"int"``.
        sample_weights: yield ``(images, labels, weights)`` with each record's weight
            (a dataset converted with a weight column); ``None``: when reading such a
            dataset for training.
        augment: training only: names (``"crop"``, ``"flip"``, ``"rotation"``,
            ``"zoom"``, ``"translation"``, ``"contrast"``, ``"brightness"``,
            ``"randaugment"``, ``"mixup"``, ``"cutmix"``; a list or ``"crop,flip"``)
            or Keras layers (see :mod:`chute.read.augment`).
        augment_on: ``"host"`` (heavy augmentations in the pipeline) or
            ``"device"`` (left to the train step: the dataset's
            ``device_augmentation``).
        crop_scale: ``(min, max)`` share of an image's area a random crop covers.
        crop_ratio: ``(min, max)`` aspect ratio (width / height) of a random crop.
        crop_fraction: evaluation's centre crop, a share of the shorter side in
            (0, 1]; ``None``: 0.875 for images stored at their aspect ratio, 1 otherwise.
        cache: ``"auto"`` (in RAM when the split fits what is left of the
            process's budget), ``"memory"``, ``"disk:FOLDER"`` or ``None``
            (``"none"`` in a TOML file or a flag).
        cache_dir: the folder of the shard cache, the verified local copy of a
            remote dataset's shards (:mod:`chute.read.cache`); ``None``: on for the
            Grain engine on a bucket, in ``$XDG_CACHE_HOME/chute/shards`` (else
            ``~/.cache/chute/shards``); the tf.data engine uses it only when given
            (it then reads ``s3://`` too); ``"none"``: off. Local datasets never use it.
        cache_limit: the most bytes the shard cache holds (``50_000_000_000``,
            ``"50GB"``, ``"500MB"``, ``"1.5TiB"``); ``None``: 80% of the free disk
            space there, less 1 GiB.
        seed: makes order and augmentation reproducible; ``None``: new each run.
        shuffle_buffer: records mixed together in training (at most 128 MB of them).
        pad_final_batch: evaluation: a full last batch and a weights element (0 on padding).
        repeat: repeat forever, each pass one epoch.
        skip_corrupt: skip and count damaged shards and images instead of raising.
        data_service: a ``tf.data`` service dispatcher ``grpc://HOST:PORT``
            whose workers run the training pipeline.
        data_service_timeout: seconds to wait for that dispatcher to answer
            before failing (TensorFlow alone would wait forever).
        engine: ``"tf"`` (a ``tf.data`` pipeline: window shuffle, epoch-level
            resume) or ``"grain"`` (a Grain dataset over the record indexes:
            global shuffle, iterators that save and restore their position).
        sampling: training only: ``None`` (every record once an epoch),
            ``"balanced"`` (every class equally likely, drawn with replacement,
            an epoch as long as before) or ``{class: weight}`` (a class's share
            of the draws; classes by name or index, missing ones weigh 0).
        workers: Grain engine: processes that decode and crop (``None``: one
            per core, or threads in the calling process where spawned workers would
            run the script's top level again: see :mod:`chute.read.grain.workers`;
            0: threads in the calling process).

    Example:
        >>> LoadOptions(image_size="224", augment=["crop", "flip"]).image_size
        (224, 224)
    """

    batch_size: int = option(128, "examples per batch per replica")
    training: bool | None = option(
        None, "shuffle, drop the remainder, augment (default: split == 'train')", flag=False
    )
    image_size: tuple[int, int] | None = option(
        None, "images yielded at H x W (default: as stored)", type=str, metavar="H[xW]"
    )
    dtype: str = option("uint8", "uint8, or float32/bfloat16 scaled to [0, 1]", choices=DTYPES)
    label_mode: str | None = option(
        "auto",
        "labels as in Keras, or multi_hot (auto: multi_hot for a multi-label dataset, else int)",
        choices=LABEL_MODES[:-1],
    )
    sample_weights: bool | None = option(
        None, "yield each record's weight (default: in training, when the dataset has them)",
        type=bool,
    )  # fmt: skip
    augment: tuple = option(
        (),
        "comma-separated: crop,flip,rotation,zoom,translation,contrast,brightness,"
        "randaugment,mixup,cutmix",
        type=_names,
        metavar="NAMES",
    )
    augment_on: str = option("host", "where heavy augmentations run", choices=PLACES)
    crop_scale: tuple[float, float] = option(
        DEFAULT_CROP_SCALE, "share of the area a random crop covers", type=_pair,
        metavar="MIN,MAX",
    )  # fmt: skip
    crop_ratio: tuple[float, float] = option(
        DEFAULT_CROP_RATIO, "aspect ratio (width / height) of a random crop", type=_pair,
        metavar="MIN,MAX",
    )  # fmt: skip
    crop_fraction: float | None = option(
        None, "evaluation's centre crop (default: from the dataset)", type=float
    )
    cache: str | None = option(
        "auto", "keep what is read: in RAM if it fits the budget, memory, disk:FOLDER or none",
        type=str, metavar="auto|memory|disk:FOLDER|none",
    )  # fmt: skip
    cache_dir: str | None = option(
        None, "folder of the local copy of a remote dataset's shards (default: on for a "
        "bucket with engine grain, ~/.cache/chute/shards; none: off)", type=str,
        metavar="FOLDER|none",
    )  # fmt: skip
    cache_limit: int | None = option(
        None, "most bytes that shard cache holds: 50GB, 500MB, 1.5TiB (default: from the "
        "free disk space)", type=str, metavar="SIZE",
    )  # fmt: skip
    seed: int | None = option(None, "makes order and augmentation reproducible", type=int)
    shuffle_buffer: int = option(8192, "records mixed together in training (<= 128 MB)")
    pad_final_batch: bool = option(False, "evaluation: pad the last batch, yield weights")
    repeat: bool = option(False, "repeat forever, each pass one epoch")
    skip_corrupt: bool = option(False, "skip and count damaged shards and images")
    data_service: str | None = option(
        None, "read training batches from this tf.data service dispatcher", type=str,
        metavar="grpc://HOST:PORT",
    )  # fmt: skip
    data_service_timeout: float = option(
        DISPATCHER_TIMEOUT,
        "seconds to wait for the tf.data service dispatcher",
        metavar="SECONDS",
    )
    engine: str = option(
        "tf", "tf (tf.data) or grain (random access, exact resume)", choices=ENGINES
    )
    sampling: str | tuple | None = option(
        None, "training draws: balanced, or CLASS=WEIGHT,... (default: each record once)",
        type=str, metavar="balanced|CLASS=W,...",
    )  # fmt: skip
    workers: int | None = option(
        None, "grain engine: decoding processes (default: one per core; 0: none)", type=int
    )
    shard_window: int | None = option(
        None, "grain engine: shuffle shards this many at a time (default: a global shuffle, "
        "or a window sized by cache_limit when the split does not fit it)", type=int,
    )  # fmt: skip

    def __post_init__(self) -> None:
        checks.positive_int("batch_size", self.batch_size, "a positive integer (per replica)")
        if self.training is not None:
            _boolean("training", self.training, "True, False or None")
        # object.__setattr__: a frozen dataclass stores its normalised values only this way.
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))
        checks.one_of("dtype", self.dtype, DTYPES)
        checks.one_of("label_mode", self.label_mode, LABEL_MODES)
        object.__setattr__(self, "augment", _names(self.augment))
        spec = parse_augment(self.augment)
        checks.one_of("augment_on", self.augment_on, PLACES)
        # MixUp and CutMix blend two labels: an integer label cannot hold the blend
        # ("auto" is resolved against the dataset, see chute.read.target).
        if spec.mixing and self.label_mode not in ("categorical", "multi_hot", "auto"):
            raise ChuteError(
                "`augment` with 'mixup' or 'cutmix' mixes labels: it needs label_mode="
                f"'categorical' (or 'multi_hot'). Received: label_mode={self.label_mode!r}"
            )
        if self.sample_weights is not None:
            _boolean("sample_weights", self.sample_weights, "True, False or None")
        object.__setattr__(self, "crop_scale", _range("crop_scale", self.crop_scale, 0.0, 1.0))
        object.__setattr__(self, "crop_ratio", _range("crop_ratio", self.crop_ratio, 0.0, 100.0))
        if self.crop_fraction is not None:
            fraction = checks.number_in("crop_fraction", self.crop_fraction, 0.0, 1.0)
            if fraction == 0:
                raise checks.bad_value("crop_fraction", self.crop_fraction, "a number in (0, 1]")
        object.__setattr__(self, "cache", _cache(self.cache))
        if self.shard_window is not None:
            checks.positive_int("shard_window", self.shard_window, "a positive integer or None")
        if self.seed is not None and not checks.is_int(self.seed):
            raise checks.bad_value("seed", self.seed, "an integer or None")
        checks.positive_int("shuffle_buffer", self.shuffle_buffer)
        for name in ("pad_final_batch", "repeat", "skip_corrupt"):
            _boolean(name, getattr(self, name))
        if self.pad_final_batch and self.training:
            raise ChuteError("`pad_final_batch` applies to evaluation (training=False) only")
        if self.pad_final_batch and self.label_mode is None:
            raise ChuteError(
                "`pad_final_batch` yields (images, labels, weights): it needs labels. "
                "Received: label_mode=None"
            )
        if self.data_service is not None:
            address = check_address("data_service", self.data_service)
            object.__setattr__(self, "data_service", address)
        timeout = checks.positive_number(
            "data_service_timeout", self.data_service_timeout, "a positive number of seconds"
        )
        object.__setattr__(self, "data_service_timeout", timeout)
        checks.one_of("engine", self.engine, ENGINES)
        if self.cache_dir is not None and not (isinstance(self.cache_dir, str) and self.cache_dir):
            raise checks.bad_value("cache_dir", self.cache_dir, "a folder, 'none' or None")
        object.__setattr__(self, "cache_limit", parse_size("cache_limit", self.cache_limit))
        object.__setattr__(self, "sampling", _sampling(self.sampling))
        if self.sampling is not None and self.training is False:
            raise ChuteError(
                f"`sampling` chooses training draws; it needs training. Received: "
                f"sampling={self.sampling!r} with training=False"
            )
        if self.workers is not None:
            checks.int_in("workers", self.workers, 0, what="None or an integer >= 0")
        # The service ships tf.data graphs to its workers; a Grain dataset is no such graph.
        if self.engine == "grain" and self.data_service is not None:
            raise ChuteError(
                "`data_service` runs tf.data pipelines; it needs engine='tf'. "
                "Received: engine='grain'"
            )

    @property
    def augment_spec(self) -> AugmentSpec:
        """``augment`` sorted into what is fused with decoding and the heavy rest."""
        return parse_augment(self.augment)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoadOptions:
        """Builds options from keywords (a TOML ``[load]`` table), naming unknown keys."""
        return from_mapping(cls, dict(values), "load option")


def resolve(options: LoadOptions | Mapping[str, Any] | None, overrides: Mapping) -> LoadOptions:
    """``options`` (default: every default) with ``overrides`` replacing its fields;
    unknown names are named in the error.

    Example:
        >>> resolve(None, {"batch_size": 32}).batch_size
        32
    """
    if options is None or isinstance(options, Mapping):
        return LoadOptions.from_dict({**(options or {}), **overrides})
    if not isinstance(options, LoadOptions):
        raise checks.bad_value("options", options, "a LoadOptions, a mapping of its fields or None")
    if not overrides:
        return options
    fields = {field.name for field in dataclasses.fields(LoadOptions)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ChuteError(f"Unknown load option(s) {unknown}. Allowed: {sorted(fields)}")
    # replace() runs __post_init__ again: the overrides are checked like any other value.
    return dataclasses.replace(options, **overrides)


def _boolean(name: str, value: Any, allowed: str = "True or False") -> None:
    if not isinstance(value, bool):
        raise checks.bad_value(name, value, allowed)


def _cache(value: Any) -> str | None:
    """``cache`` checked; ``"none"`` (TOML has no null) read as None."""
    if value is None or value == "none":
        return None
    if value in ("auto", "memory"):
        return value
    # "disk:" alone names no folder.
    if isinstance(value, str) and value.startswith("disk:") and len(value) > 5:
        return value
    raise checks.bad_value("cache", value, CACHE_ALLOWED)


def parse_size(name: str, value: Any) -> int | None:
    """A byte count from an integer or a size with a unit (``kB``, ``MB``, ``GB``, ``TB``:
    powers of 1000; ``KiB``, ``MiB``, ``GiB``, ``TiB``: of 1024; any case); None stays None.

    Example:
        >>> parse_size("cache_limit", "1.5GiB"), parse_size("cache_limit", "500mb")
        (1610612736, 500000000)
    """
    if value is None:
        return None
    if checks.is_int(value) and value > 0:
        return int(value)
    found = _SIZE.match(value) if isinstance(value, str) else None
    unit = found and _UNITS.get(found[2].lower())
    size = int(float(found[1]) * unit) if unit else 0
    if size <= 0:
        raise checks.bad_value(name, value, SIZE_ALLOWED)
    return size


def _sampling(value: Any) -> str | tuple[tuple[str | int, float], ...] | None:
    """``sampling`` checked: None, ``"balanced"``, or ``{class: weight}`` (a flag's
    ``"cat=2,dog=1"``) as sorted ``(class, weight)`` pairs.

    Example:
        >>> _sampling("cat=2, dog=0.5")
        (('cat', 2.0), ('dog', 0.5))
    """
    if value is None or value == "balanced":
        return value
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise checks.bad_value("sampling", value, SAMPLING_ALLOWED)
        try:
            value = {name.strip(): float(weight) for name, weight in pairs}
        except ValueError:
            raise checks.bad_value("sampling", value, SAMPLING_ALLOWED) from None
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    if not isinstance(value, Mapping) or not value:
        raise checks.bad_value("sampling", value, SAMPLING_ALLOWED)
    for name, weight in value.items():
        if not isinstance(name, str | int) or isinstance(name, bool):
            raise checks.bad_value("sampling", value, SAMPLING_ALLOWED)
        if not _real(weight) or weight < 0:
            raise checks.bad_value("sampling", value, SAMPLING_ALLOWED)
    if not any(value.values()):
        raise checks.bad_value("sampling", value, "weights with at least one above 0")
    # A sorted tuple: hashable (the options are frozen) and equal however it was written.
    return tuple(sorted(((k, float(w)) for k, w in value.items()), key=lambda p: str(p[0])))


def _range(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    """A ``(min, max)`` pair of numbers with ``low < min <= max <= high``."""
    pair = isinstance(value, list | tuple) and len(value) == 2 and all(map(_real, value))
    if not pair or not low < value[0] <= value[1] <= high:
        allowed = f"a (min, max) pair with {low:g} < min <= max <= {high:g}"
        raise checks.bad_value(name, value, allowed)
    return float(value[0]), float(value[1])


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_address(name: str, value: Any) -> str:
    """A tf.data service dispatcher's address as ``grpc://HOST:PORT``.

    Example:
        >>> check_address("data_service", "10.0.0.2:5050")
        'grpc://10.0.0.2:5050'
    """
    match = _ADDRESS.match(value) if isinstance(value, str) else None
    if match is None or not 0 < int(match["port"]) < 65536:
        raise checks.bad_value(name, value, "a dispatcher address grpc://HOST:PORT (or HOST:PORT)")
    return f"grpc://{match['host']}:{int(match['port'])}"
