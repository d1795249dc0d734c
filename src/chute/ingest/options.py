"""The options of a conversion: one frozen, validated dataclass.

Every value is checked when the object is built, before any file is read or
written, and a bad one raises :class:`~chute.errors.ChuteError` naming the
option, the value received and what is allowed. The defaults, and the help
of ``chute convert``'s flags, are written here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format.spec import ENCODINGS, INTERPOLATIONS, MAX_SIDE, RESIZE_MODES
from chute.image.size import DEFAULT_MAX_PIXELS, parse_image_size
from chute.ingest.sources.base import LABEL_MODES, LabelRules
from chute.settings import from_mapping, option

COLOR_MODES = ("grayscale", "rgb", "auto")
# the options of multi-label and weighted sources: left out of to_dict() at their defaults
LABEL_OPTIONS = (
    "label_mode", "label_separator", "allow_empty_labels", "max_labels", "weight_column",
)  # fmt: skip
ENCODING_CHOICES = (*ENCODINGS, "auto")
# A quote or a line break would cut a CSV cell; a comma would end it: the cell holds the labels.
FORBIDDEN_SEPARATORS = ('"', "'", "\n", "\r", ",")
# The val share carved from train when a source comes with train and test only: what Keras
# users write as `validation_split=0.1`; without it `chute train` has no validation at all.
DEFAULT_VAL_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What a conversion produces. Two runs with equal options on the same source
    write the same bytes.

    Attributes:
        image_size: ``(height, width)`` to resize to; ``None`` keeps the size
            when every image has the same one (an error otherwise, unless
            ``keep_size``). Also accepts ``75`` or ``"75x100"``.
        resize: ``"stretch"`` (ignore aspect ratio), ``"crop"`` (centre crop
            to the target aspect ratio, Keras's ``crop_to_aspect_ratio``) or
            ``"pad"`` (pad with black to it, Keras's ``pad_to_aspect_ratio``).
        interpolation: resampling filter by name. ``nearest``, ``bilinear`` and
            ``area`` compute what ``tf.image.resize`` does (no antialiasing);
            ``bicubic`` and ``lanczos`` are OpenCV's (Keys a=-0.75, Lanczos-4).
        keep_size: store every image at its own size (PNG or JPEG only).
        color_mode: ``"grayscale"``, ``"rgb"`` or ``"auto"`` (grayscale when
            every image is grayscale).
        encoding: ``"raw"`` uint8 pixels, ``"png"``, ``"jpeg"`` or ``"auto"``
            (raw for small images, JPEG for photographs, PNG otherwise).
        quality: JPEG quality, 1-100.
        val_fraction: share of each class held out for validation; ``None`` (the
            default): ``DEFAULT_VAL_FRACTION`` (0.1) for a source that comes with
            train and test splits only (``keras:cifar10``, a ``train/`` + ``test/``
            tree), else 0. Pass 0 to keep no validation split.
        test_fraction: share of each class held out for testing.
        seed: seed of the split and of the record order.
        shard_size_mb: target size of one shard file.
        image_column: Parquet sources: the column holding the images (a
            ``{bytes, path}`` struct or bytes); default: the ``Image`` feature of
            the Hugging Face metadata, else ``image``.
        label_column: Parquet sources: the column holding the labels; default:
            the ``ClassLabel`` feature, else ``label``.
        hosts: hosts that will read the dataset in parallel (the hosts of a TPU
            pod slice, the workers of a multi-worker run): by default 16 shards
            per host, and every split's shard count a multiple of ``hosts``, so
            each host reads its own equal share of files.
        min_shards: minimum shards of the train split (read in a shuffled order
            of files, shared out by file among hosts and workers); val and test,
            read once per epoch in order, get it only as far as each of their
            shards keeps a quarter of a train shard's images (ImageNet's 50,000
            val images at 1,024: 160 shards, not 781).
            ``None`` means 16 for any split with enough images (at least 64 per
            shard).
        max_pixels: images with more pixels are rejected (decompression bombs).
        keep_metadata: JPEGs stored as they came (kept at their size, upright)
            keep their EXIF/XMP/IPTC, comments and trailing bytes; by default
            these are stripped, losslessly.
        shorter_side: keep each image's aspect ratio, scaled down so that its
            shorter side is at most this many pixels (smaller ones are kept as
            they are): photos stored larger than the training size, for
            random-resized crops when reading (``chute.load(augment=["crop"])``).
        label_mode: ``"single"`` (one class per image), ``"multi"`` (several labels
            per image: a CSV cell ``cat|night``, a JSON list, a Parquet list column) or
            ``"auto"`` (multi when the source holds lists, or a label cell holding
            ``label_separator``; the choice is logged). A class-per-folder tree is
            single-label: ``"multi"`` is refused for it.
        label_separator: between the labels of one CSV cell or WebDataset ``.txt``;
            not a comma (it would end the CSV cell), a quote or a line break.
        allow_empty_labels: multi-label: an image with no label is a valid negative
            (by default it is rejected, with its reason).
        max_labels: multi-label: an image with more labels is rejected (None: no limit).
        weight_column: the column (CSV header, JSONL key, Parquet column) of sample
            weights (finite, >= 0); None: no weights, whatever the columns are called.

    Example:
        >>> ConvertOptions(image_size="75", color_mode="grayscale").image_size
        (75, 75)
    """

    image_size: tuple[int, int] | None = option(
        None, "resize to H x W (default: the common size)", type=str, metavar="H[xW]"
    )
    resize: str = option("stretch", "how to reach the aspect ratio", choices=RESIZE_MODES)
    interpolation: str = option("bilinear", "resampling filter", choices=INTERPOLATIONS)
    keep_size: bool = option(False, "store each image at its own size")
    color_mode: str = option("auto", "grayscale when every image is", choices=COLOR_MODES)
    encoding: str = option(
        "auto", "raw up to 128x128, JPEG for photos, else PNG", choices=ENCODING_CHOICES
    )
    quality: int = option(90, "JPEG quality, 1-100")
    val_fraction: float | None = option(
        None,
        f"share of each class held out for validation (default: {DEFAULT_VAL_FRACTION} "
        "for a source with train and test splits only, else 0)",
        type=float,
    )
    test_fraction: float = option(0.0, "share of each class held out for testing")
    seed: int = option(1337, "seed of the split and the record order")
    # the TF performance guide advises 100-200 MB per file
    shard_size_mb: float = option(128.0, "target shard size in MB")
    min_shards: int | None = option(
        None,
        "shards of the train split at least; val and test get it as far as each shard keeps "
        "a quarter of a train shard's images (default: 16 when each gets >= 64)",
        type=int,
    )
    hosts: int = option(
        1, "hosts that will read it (TPU pod slice hosts, workers): 16 shards each, a multiple of N"
    )
    image_column: str | None = option(
        None, "Parquet: the column of images (default: the Image feature, or 'image')", type=str,
        metavar="NAME",
    )  # fmt: skip
    label_column: str | None = option(
        None, "Parquet: the column of labels (default: the ClassLabel feature, or 'label')",
        type=str, metavar="NAME",
    )  # fmt: skip
    max_pixels: int = option(DEFAULT_MAX_PIXELS, "reject larger images (decompression bombs)")
    keep_metadata: bool = option(False, "keep EXIF/XMP/GPS in JPEGs stored as they came")
    shorter_side: int | None = option(
        None, "keep aspect ratios, shorter side scaled down to N (for crops when training)",
        type=int, metavar="N",
    )  # fmt: skip
    label_mode: str = option(
        "auto", "one class per image, several, or auto (lists or a separator: multi)",
        choices=LABEL_MODES,
    )  # fmt: skip
    label_separator: str = option(
        "|", "between the labels of one CSV cell or WebDataset .txt", type=str, metavar="CHAR"
    )
    allow_empty_labels: bool = option(False, "multi-label: an image with no label is a negative")
    max_labels: int | None = option(
        None, "multi-label: reject images with more labels", type=int, metavar="N"
    )
    weight_column: str | None = option(
        None, "the column of sample weights (default: none)", type=str,
        metavar="NAME",
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))
        checks.one_of("resize", self.resize, RESIZE_MODES)
        checks.one_of("interpolation", self.interpolation, INTERPOLATIONS)
        checks.one_of("color_mode", self.color_mode, COLOR_MODES)
        checks.one_of("encoding", self.encoding, ENCODING_CHOICES)
        if not isinstance(self.keep_size, bool):
            raise checks.bad_value("keep_size", self.keep_size, "True or False")
        checks.int_in("quality", self.quality, 1, 100)
        if self.val_fraction is not None:  # None: decided by the source's splits
            checks.number_in("val_fraction", self.val_fraction, 0.0, 1.0, high_open=True)
        checks.number_in("test_fraction", self.test_fraction, 0.0, 1.0, high_open=True)
        if (self.val_fraction or 0.0) + self.test_fraction >= 1.0:
            raise checks.bad_value(
                "val_fraction + test_fraction",
                (self.val_fraction or 0.0) + self.test_fraction,
                "below 1 so that every class keeps training images",
            )
        checks.int_in("seed", self.seed, 0, 2**63 - 1)
        checks.positive_number(
            "shard_size_mb", self.shard_size_mb, "a positive number of megabytes"
        )
        if self.min_shards is not None:
            checks.int_in("min_shards", self.min_shards, 1, 100_000)
        checks.int_in("hosts", self.hosts, 1, 10_000)
        checks.int_in("max_pixels", self.max_pixels, 1, 2**40)
        if self.shorter_side is not None:
            checks.int_in("shorter_side", self.shorter_side, 1, MAX_SIDE)
            if self.image_size is not None or self.keep_size:
                raise ChuteError(
                    "`shorter_side` keeps each image's aspect ratio: it excludes `image_size` "
                    f"and `keep_size`. Received: shorter_side={self.shorter_side!r}, "
                    f"image_size={self.image_size!r}, keep_size={self.keep_size!r}"
                )
        if self.keep_size or self.shorter_side is not None:
            if self.keep_size and self.image_size is not None:
                raise ChuteError(
                    "`keep_size` and `image_size` exclude each other: keep_size stores every "
                    "image at its own size. "
                    f"Received: keep_size=True, image_size={self.image_size!r}"
                )
            if self.encoding == "raw":
                which = "keep_size=True" if self.keep_size else "shorter_side is set"
                raise checks.bad_value(
                    "encoding", self.encoding, f"'png', 'jpeg' or 'auto' when {which}"
                )
        elif self.resize != "stretch" and self.image_size is None:
            raise ChuteError(
                f"`resize` only applies with `image_size`. Received: resize={self.resize!r}, "
                "image_size=None"
            )
        self._check_labels()

    def _check_labels(self) -> None:
        checks.one_of("label_mode", self.label_mode, LABEL_MODES)
        separator = self.label_separator
        if (
            not isinstance(separator, str)
            or not separator
            or any(c in separator for c in FORBIDDEN_SEPARATORS)
        ):
            raise checks.bad_value(
                "label_separator",
                separator,
                "a non-empty string without a comma (it would end a CSV cell), a quote or a "
                "line break, such as '|' or ';'",
            )
        if not isinstance(self.allow_empty_labels, bool):
            raise checks.bad_value("allow_empty_labels", self.allow_empty_labels, "True or False")
        checks.optional_positive_int("max_labels", self.max_labels)
        column = self.weight_column
        if column is not None and (not isinstance(column, str) or not column.strip()):
            raise checks.bad_value("weight_column", column, "None or a column name")

    def for_source_splits(self, splits: Collection[str]) -> ConvertOptions:
        """These options with ``val_fraction`` decided for a source that comes with
        ``splits`` (the split names its items carry): when unset, ``DEFAULT_VAL_FRACTION``
        for train and test only, else 0. What a manifest stores is this decided value.

        Example:
            >>> ConvertOptions().for_source_splits({"train", "test"}).val_fraction
            0.1
            >>> ConvertOptions().for_source_splits(set()).val_fraction
            0.0
        """
        if self.val_fraction is not None:
            return self
        carve = "test" in splits and "val" not in splits
        return dataclasses.replace(self, val_fraction=DEFAULT_VAL_FRACTION if carve else 0.0)

    def label_rules(self) -> LabelRules:
        """How the source's labels (and weights) are read: what :func:`~chute.ingest.sources.scan`
        takes."""
        return LabelRules(
            mode=self.label_mode,
            separator=self.label_separator,
            allow_empty=self.allow_empty_labels,
            max_labels=self.max_labels,
            weight_column=self.weight_column,
        )

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (tuples become lists); the label options only
        where they differ from their defaults, so that a conversion that does not use them
        writes the manifest and work stamp an older chute wrote (and reads and resumes)."""
        out = dataclasses.asdict(self)
        # A list, as JSON gives it back: a stored stamp then compares equal to a fresh one.
        out["image_size"] = list(self.image_size) if self.image_size else None
        for field in dataclasses.fields(self):
            if field.name in LABEL_OPTIONS and out[field.name] == field.default:
                del out[field.name]
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ConvertOptions:
        """Builds options from :meth:`to_dict` output or keywords, naming unknown keys."""
        return from_mapping(cls, values, "option")
