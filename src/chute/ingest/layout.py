"""A conversion's layout: the image spec its options and the headers call for, and its shards.

``auto`` options are resolved here: grayscale when every image is, the common
size when there is one, raw pixels for small images (barely larger than PNG
and the fastest to read), JPEG for photographs, PNG otherwise. Every shard is
then planned before any image is encoded: a split's records are cut into
contiguous, near-equal runs sized from the expected bytes per record, so the
content of shard ``i`` depends only on the source and the options. That is
what makes a resumed conversion byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import re

from chute.errors import ChuteError
from chute.format.spec import ImageSpec
from chute.image.header import Probe
from chute.ingest.options import ConvertOptions

log = logging.getLogger(__name__)

RAW_AUTO_MAX_PIXELS = 128 * 128  # up to here raw pixels are barely larger than PNG
DEFAULT_MIN_SHARDS = 16
MIN_RECORDS_PER_SHARD = 64  # below this, more files only add open/seek overhead
EVALUATION_SHARD_SHARE = 4  # val/test shards keep >= 1/4 of a train shard's records
# train-00003-of-00016.tfrecord; an append's shards name their version: train-v0002-00000-of-00004
SHARD_NAME = re.compile(r"^(train|val|test)(?:-v(\d{4}))?-(\d{5})-of-(\d{5})\.tfrecord$")


def needs_headers(options: ConvertOptions) -> bool:
    """Whether some option is left for the images' headers to decide."""
    return (
        options.color_mode == "auto"
        or options.encoding == "auto"
        or (options.image_size is None and not options.keep_size and not options.shorter_side)
    )


def image_spec(options: ConvertOptions, probes: list[Probe] | None) -> ImageSpec:
    """The one image spec of a conversion: explicit options, else what the headers say.

    Args:
        options: the conversion's options.
        probes: every item's header; needed only when :func:`needs_headers`.

    Raises:
        ChuteError: every input was rejected, or sizes differ and no size was given.
    """
    probes = probes or []
    usable = [p for p in probes if p.reject is None]
    if needs_headers(options) and not usable:
        raise ChuteError(
            f"No usable image: all {len(probes)} inputs were rejected (first: "
            f"{next((p.reject for p in probes), '')}). Check the source"
        )
    if options.color_mode == "auto":
        # Grayscale only when every image is: one colour image would lose its colours otherwise.
        channels = 1 if all(p.grayscale for p in usable) else 3
    else:
        channels = 1 if options.color_mode == "grayscale" else 3
    height = width = None
    if options.image_size is not None:
        height, width = options.image_size
    elif not options.keep_size and not options.shorter_side:
        sizes = collections.Counter((p.height, p.width) for p in usable)
        if len(sizes) > 1:
            common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4))
            raise ChuteError(
                f"Images have {len(sizes)} different sizes ({common}, ...). Received: "
                "image_size=None; pass image_size (--image-size H or HxW) to resize them, or "
                "keep_size=True (--keep-size) to store each at its own size"
            )
        height, width = next(iter(sizes))
    encoding = options.encoding
    if encoding == "auto":
        jpeg_share = sum(p.format == "JPEG" for p in usable) / len(usable)
        if options.keep_size:
            # Own sizes: JPEG only when every file is one (stored untouched); else PNG.
            encoding = "jpeg" if jpeg_share == 1.0 else "png"
        elif options.shorter_side:  # scaled photos: re-encoded anyway
            encoding = "jpeg" if jpeg_share >= 0.5 else "png"
        elif height * width <= RAW_AUTO_MAX_PIXELS:
            encoding = "raw"
        else:
            encoding = "jpeg" if jpeg_share >= 0.5 else "png"
    spec = ImageSpec(
        height=height,
        width=width,
        channels=channels,
        encoding=encoding,
        quality=options.quality,
        resize=options.resize,
        interpolation=options.interpolation,
        shorter_side=options.shorter_side,
        keep_metadata=options.keep_metadata,
    )
    log.info("storing images as %s", spec.describe())
    return spec


def bytes_per_record(spec: ImageSpec, probes: list[Probe]) -> float:
    """Expected size of one record: exact for raw pixels, else from (a sample of) the
    source files' headers, assuming their compression ratio carries over."""
    overhead = 128  # framing, feature names, size, key
    if spec.fixed_size and spec.encoding == "raw":
        return spec.height * spec.width * spec.channels + overhead
    usable = [p for p in probes if p.reject is None]
    total = 0.0
    for p in usable:
        if spec.shorter_side and p.height:
            scale = min(1.0, spec.shorter_side / min(p.height, p.width))
            # Bytes scale with the area: the square of the side's scale.
            total += p.nbytes * scale * scale
        elif spec.height is None:
            total += p.nbytes
        else:
            raw = spec.height * spec.width * spec.channels
            scale = (spec.height * spec.width) / (p.height * p.width) if p.height else 1.0
            total += min(raw, p.nbytes * scale)
    return total / max(1, len(usable)) + overhead


def shard_name(split: str, index: int, count: int, version: int = 1) -> str:
    """``train-00003-of-00016.tfrecord``: split, index and count in the name; the
    dataset version that adds it too, from version 2 on (``chute convert --append``).

    Example:
        >>> shard_name("val", 0, 4), shard_name("train", 1, 2, version=3)
        ('val-00000-of-00004.tfrecord', 'train-v0003-00001-of-00002.tfrecord')
    """
    added = f"-v{version:04d}" if version > 1 else ""
    return f"{split}{added}-{index:05d}-of-{count:05d}.tfrecord"


def shard_runs(
    num_items: int,
    bytes_per_item: float,
    *,
    shard_size_mb: float,
    min_shards: int | None,
    hosts: int = 1,
    min_records: int = 0,
) -> list[tuple[int, int]]:
    """Cuts ``num_items`` records into ``[start, stop)`` runs, one per shard.

    The count is the larger of what the size bound needs and the minimum: an
    explicit ``min_shards`` (as far as each shard keeps ``min_records`` records),
    else ``DEFAULT_MIN_SHARDS`` per host when every shard can still hold
    ``MIN_RECORDS_PER_SHARD`` records; then rounded up to a multiple of ``hosts``
    (each host reads an equal number of files). Never more shards than records.

    Example:
        >>> shard_runs(10, 100.0, shard_size_mb=128, min_shards=3)
        [(0, 3), (3, 6), (6, 10)]
        >>> len(shard_runs(100_000, 100.0, shard_size_mb=128, min_shards=None, hosts=3))
        48
        >>> shard_runs(12, 100.0, shard_size_mb=128, min_shards=16, min_records=18)
        [(0, 12)]
    """
    by_size = math.ceil(num_items * bytes_per_item / (shard_size_mb * 1e6))
    if min_shards is None:
        min_shards = min(DEFAULT_MIN_SHARDS * hosts, num_items // MIN_RECORDS_PER_SHARD)
    elif min_records > 1:
        min_shards = min(min_shards, num_items // min_records)
    count = max(by_size, min_shards)
    count = -(-count // hosts) * hosts  # equal shares of files for the hosts
    count = max(1, min(num_items, count))
    bounds = [num_items * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


def evaluation_min_records(train_records_per_shard: int) -> int:
    """The records each val or test shard keeps at least when an explicit ``min_shards``
    cuts the split: a quarter of a train shard's (``min_shards`` is for the train split's
    readers).

    Example:
        >>> evaluation_min_records(74), evaluation_min_records(1251)
        (18, 312)
    """
    # An evaluation split is read once an epoch, in order: cut as finely as the train split
    # (--min-shards 16 made a 12-image val split 12 shards), its files only add opens. No
    # cap at 64 records: ImageNet's 50,000 val images at --min-shards 1024 (1,251 records a
    # train shard) were 781 files of 64; a quarter of a train shard makes them 160.
    return train_records_per_shard // EVALUATION_SHARD_SHARE


def split_of(name: str) -> str:
    """The split a shard file holds, from its name.

    Example:
        >>> split_of("val-00000-of-00004.tfrecord")
        'val'
    """
    return SHARD_NAME.match(name)[1]


@dataclasses.dataclass
class Shard:
    """One planned shard: its split, file name and the items it holds, in order."""

    split: str
    name: str
    indices: list[int]


def plan_shards(
    splits: dict[str, list[int]],
    bytes_per_record: float,
    options: ConvertOptions,
    version: int = 1,
) -> list[Shard]:
    """Every shard of every split, train first (the order the LeakGuard needs); val
    and test shards keep :func:`evaluation_min_records` of the train split's."""
    planned = []
    min_records = 0
    for split, indices in splits.items():
        runs = shard_runs(
            len(indices),
            bytes_per_record,
            shard_size_mb=options.shard_size_mb,
            min_shards=options.min_shards,
            hosts=options.hosts,
            min_records=0 if split == "train" else min_records,
        )
        if split == "train":
            # Train first (its order in splits): val and test then know a train shard's size.
            min_records = evaluation_min_records(len(indices) // len(runs))
        for number, (start, stop) in enumerate(runs):
            name = shard_name(split, number, len(runs), version)
            planned.append(Shard(split, name, indices[start:stop]))
    return planned
