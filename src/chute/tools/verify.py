"""``chute verify``: re-read every shard and check it against the manifest.

Checks, per shard: the file exists with the manifest's size and sha256;
every record's CRCs hold and it parses; every image decodes to the
manifest's spec (size, channels, encoding); every label is in range (a
multi-label record's ``labels``, else its ``class``) and every weight, where the
dataset has them, a finite number >= 0; the record count and per-class counts
(multi-label: the images carrying each label) match; and, where the manifest names one,
the shard's record index (:mod:`chute.format.index`) is there with the
manifest's sha256 and gives every record's true offset and length. Indexes
are optional (``chute index`` adds them to a dataset converted without, and
moves those an older chute wrote beside the shards into ``index/``).
A damaged shard is named with the record where reading stopped and its byte
offset. Records are checked with tf.data where TensorFlow is installed, else in
plain Python (:func:`_read_records_python`): the same checks, so a bucket is
verified on a JAX + Grain machine without TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

import cv2
import numpy as np

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.format import parse, records, storage
from chute.format.splits import Shard
from chute.image import crop
from chute.lazy import installed, tf
from chute.read import cache as shard_cache

log = logging.getLogger(__name__)
_READ_BLOCK = 8 << 20
_LENGTH = struct.Struct("<Q")  # a TFRecord frame's first field


@dataclasses.dataclass
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        location: the dataset directory.
        num_shards: shards checked.
        num_records: records read.
        num_indexes: shards with a record index named in the manifest (each checked).
        old_layout_indexes: of those, the indexes found beside their shard (an older
            chute's layout, read by shard globs: ``chute index`` moves them).
        problems: ``(shard file, what is wrong)`` pairs; empty when all is well.
        cache_dir: the shard cache whose copies were checked too (``cache_dir=``), or None.
        cached_copies: of the dataset's shards and record indexes, the copies found there.
        evicted: ``(file, its copy in the cache)`` of the cached copies that differed from
            the manifest, each deleted (a read fetches it again): not a problem of the dataset.
    """

    location: str
    num_shards: int = 0
    num_records: int = 0
    num_indexes: int = 0
    old_layout_indexes: int = 0
    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    cache_dir: str | None = None
    cached_copies: int = 0
    evicted: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify(
    path: str | os.PathLike | manifest_lib.Manifest,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> VerifyReport:
    """Re-reads every shard of a converted dataset and checks it against its manifest.

    Args:
        path: the converted directory (local, ``gs://``, ``ram://``), its
            ``manifest.json``, or the ``Manifest`` read from it.
        progress: called as ``progress("verify", shards_done, shards_total)``.
        cache_dir: a shard cache (``chute.load``'s ``cache_dir``) whose copies of this
            dataset's files are hashed too: a warm cache trusts its copies' sizes, so a
            copy damaged at its size is found here, and deleted (a read fetches it again).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is False when any shard is bad,
        and ``report.problems`` names each bad shard and what is wrong.

    Example:
        >>> report = verify("./kn-shards")  # doctest: +SKIP
        >>> report.ok, report.num_records  # doctest: +SKIP
        (True, 26000)
    """
    manifest = manifest_lib.load(path)
    report = VerifyReport(manifest.location)
    total_shards = sum(len(split.shards) for split in manifest.splits.values())
    for name, split in manifest.splits.items():
        count, class_counts, shards_ok = 0, [0] * manifest.num_classes, True
        # A local split's records in one tf.data pass (a pass per shard cost more than its
        # records: 1,805 small shards took 88 s); a bucket's, shard by shard as downloaded.
        local = storage.is_local(manifest.location) and installed("tensorflow")
        read_all = _read_split(manifest, split.shards) if local else {}
        for shard in split.shards:
            problems, read, read_counts = _check_shard(manifest, shard, read_all.get(shard.name))
            # kept in the report, not logged: the command prints each problem once
            report.problems += [(shard.name, problem) for problem in problems]
            shards_ok = shards_ok and not problems
            count += read
            if read_counts:
                class_counts = [a + b for a, b in zip(class_counts, read_counts, strict=True)]
            report.num_shards += 1
            report.num_records += read
            report.num_indexes += shard.index is not None
            report.old_layout_indexes += _old_layout(manifest.location, shard)
            if progress:
                progress("verify", report.num_shards, total_shards)
        # The split's totals are what readers use for step counts: they must
        # match what its shards really hold.
        # Only when every shard read whole: a damaged shard's count says nothing of the split's.
        if shards_ok and split.examples != count:
            report.problems.append(
                (
                    f"{name} split",
                    f"num_examples is {split.examples}, its shards hold {count}",
                )
            )
        elif shards_ok and list(split.class_counts) != class_counts:
            report.problems.append(
                (f"{name} split", "per-class counts differ from what its shards hold")
            )
    if cache_dir is not None:
        shards = [shard for split in manifest.splits.values() for shard in split.shards]
        report.cache_dir = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
        found = shard_cache.check_copies(report.cache_dir, manifest.location, shards)
        report.cached_copies, report.evicted = found
    return report


def _check_shard(
    manifest: manifest_lib.Manifest, shard: Shard, records_read: tuple | None = None
) -> tuple[list[str], int, list[int]]:
    """Problems of one shard, and the record and per-class counts it really holds
    (``records_read``: what :func:`_read_split` found in its records, else read here)."""
    path = storage.join(manifest.location, shard.name)
    if not storage.exists(path):
        return ["missing: the file is not there"], 0, []
    problems = []
    size = storage.size(path)
    # Reported, but reading goes on: the records say where the damage is.
    if size != shard.bytes:
        problems.append(f"size is {size} bytes, the manifest says {shard.bytes} (truncated?)")
    with _hashed_copy(path) as (readable, digest):
        if digest != shard.sha256:
            problems.append("sha256 differs from the manifest: the file changed or is corrupt")
        if records_read is None:
            records_read = _read_records(readable, manifest)
        count, class_counts, problem = records_read
        if shard.index is not None:
            problems += _check_index(manifest.location, shard, readable)
    # A record problem explains the counts, so the counts are compared only without one.
    if problem:
        problems.append(problem)
    elif count != shard.records:
        problems.append(f"holds {count} records, the manifest says {shard.records}")
    elif class_counts != manifest.shard_class_counts(shard):
        problems.append("per-class counts differ from the manifest")
    return problems, count, class_counts


def _old_layout(location: str, shard: Shard) -> bool:
    """Whether the shard's index is read from beside it (an older chute's layout)."""
    if shard.index is None:
        return False
    return record_index.in_old_layout(location, shard.index.file)


def _check_index(location: str, shard: Shard, readable: str) -> list[str]:
    """Problems of a shard's record index: missing, not the manifest's sha256, not an
    index, or offsets and lengths that are not the records' (read from ``readable``)."""
    path = record_index.find(location, shard.index.file)
    name = record_index.shown(location, shard.index.file, path)
    if path is None:
        return [f"record index missing: {name} is not there (run `chute index` to write it)"]
    data = storage.read_bytes(path)
    problems = []
    if record_index.sha256(data) != shard.index.sha256:
        problems.append(
            f"record index {name}: sha256 differs from the manifest: the index changed or is "
            "corrupt (run `chute index` to write it again)"
        )
    try:
        index = record_index.RecordIndex.from_bytes(data, f"record index {name}")
    except ChuteError as error:
        return [*problems, str(error)]
    try:
        with open(readable, "rb") as handle:
            truth = record_index.scan(handle, where=shard.name)
    except ChuteError:  # the shard's own damage: the record check reports it
        return problems
    if index != truth:
        common = min(len(index), len(truth))
        # The first entry that differs, so the message says where the index goes wrong.
        wrong = np.flatnonzero(
            (index.offsets[:common] != truth.offsets[:common])
            | (index.lengths[:common] != truth.lengths[:common])
        )
        where = f"from record {wrong[0]}" if len(wrong) else f"{len(index)} of {len(truth)} records"
        problems.append(
            f"record index {name} does not match the shard's records ({where}): delete it and "
            "run `chute index` to write it again"
        )
    return problems


@contextlib.contextmanager
def _hashed_copy(path: str) -> Iterator[tuple[str, str]]:
    """``(a path to read the records from, the file's sha256)``.

    A local file is hashed where it is (the records are then read from the
    page cache). A remote one (``gs://``) is copied to a temporary local file
    while it is hashed, so verifying downloads each shard once, not twice.
    """
    digest = hashlib.sha256()
    if storage.is_local(path):
        with storage.open_file(path, "rb") as handle:
            while block := handle.read(_READ_BLOCK):
                digest.update(block)
        yield path, digest.hexdigest()
        return
    with tempfile.TemporaryDirectory(prefix="chute-verify-") as tmp:
        local = os.path.join(tmp, "shard.tfrecord")
        with storage.open_file(path, "rb") as handle, open(local, "wb") as copy:
            while block := handle.read(_READ_BLOCK):
                digest.update(block)
                copy.write(block)
        yield local, digest.hexdigest()


def _read_split(manifest: manifest_lib.Manifest, shards: list[Shard]) -> dict[str, tuple]:
    """:func:`_read_records` of every shard of a local split, by name, through one
    tf.data pipeline (its check traced once, not once a shard). Where a shard fails, the
    pipeline stops: the shards from the last one seen whole are read one at a time (each
    failure named as :func:`_read_records` names it), then one pipeline goes on after."""
    found: dict[str, tuple] = {}
    # A missing shard is named by _check_shard; the pipeline reads those that are there.
    shards = [s for s in shards if storage.exists(storage.join(manifest.location, s.name))]
    paths = [storage.join(manifest.location, shard.name) for shard in shards]
    start = 0
    while start < len(shards):
        try:
            found.update(_read_many(paths, start, manifest, shards))
            return found
        except _Stopped as stopped:
            found.update(stopped.found)
            resume_at = stopped.at
        # Shards from the one being read when it failed, alone, up to the damaged one.
        for number in range(resume_at, len(shards)):
            found[shards[number].name] = _read_records(paths[number], manifest)
            start = number + 1
            if found[shards[number].name][2] is not None:
                break
    return found


class _Stopped(Exception):
    """TensorFlow stopped a pipeline over several shards: what it found of the shards
    seen whole, and the first shard not seen whole."""

    def __init__(self, found: dict[str, tuple], at: int):
        super().__init__(at)
        self.found, self.at = found, at


def _read_many(paths: list[str], start: int, manifest, shards: list[Shard]) -> dict[str, tuple]:
    """Reads shards ``start..`` in one pipeline; :class:`_Stopped` where TensorFlow
    stops it (a damaged record, one that does not parse)."""
    check = _record_check(manifest)
    numbers = tf.range(start, len(paths), dtype=tf.int64)
    dataset = (
        tf.data.Dataset.from_tensor_slices((numbers, tf.constant(paths[start:])))
        # deterministic: record numbers in a message are each file's own order.
        .flat_map(lambda number, path: tf.data.TFRecordDataset(path).map(lambda s: (number, s)))
        .map(lambda number, s: (number, *check(s)), num_parallel_calls=tf.data.AUTOTUNE,
             deterministic=True)
        .batch(1024)  # a Python step per record would cost more than the check
    )  # fmt: skip
    found: dict[str, tuple] = {}
    counts = {number: np.zeros(manifest.num_classes, np.int64) for number in range(len(paths))}
    seen = dict.fromkeys(range(start, len(paths)), 0)
    current = start
    try:
        for numbers_read, outputs, ok in dataset.as_numpy_iterator():
            for number in np.unique(numbers_read):
                mine = numbers_read == number
                shard = shards[number]
                if shard.name in found:  # a problem found in it already
                    continue
                part = {key: value[mine] for key, value in outputs.items()}
                bad = np.flatnonzero(~ok[mine])
                if len(bad):
                    problem = (
                        f"record {seen[number] + bad[0]} does not match the image spec "
                        f"{manifest.image.describe()}"
                    )
                else:
                    problem = _tally(part, seen[number], counts[number], manifest.num_classes)
                if problem:
                    found[shard.name] = (seen[number], [], problem)
                seen[number] += int(mine.sum())
            current = int(numbers_read[-1])
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        # Shards before the one being read are whole; it and the rest are read again.
        for number in range(start, current):
            found.setdefault(shards[number].name, (seen[number], counts[number].tolist(), None))
        raise _Stopped(found, current) from None
    for number in range(start, len(paths)):
        found.setdefault(shards[number].name, (seen[number], counts[number].tolist(), None))
    return found


def _record_check(manifest: manifest_lib.Manifest):
    """The tf.data function checking one serialized record: ``(label outputs, ok)``."""
    spec = manifest.image
    height, width, channels, encoding = (*spec.shape, spec.encoding)
    features = {**records.parse_features(records.IMAGE, records.SIZE), **_label_features(manifest)}

    def check(serialized):
        example = tf.io.parse_single_example(serialized, features)
        size = example[records.SIZE]
        if encoding == "raw":
            ok = tf.equal(
                tf.cast(tf.strings.length(example[records.IMAGE]), tf.int64),
                size[0] * size[1] * channels,
            )
        else:
            image = tf.io.decode_image(
                example[records.IMAGE], channels=channels, expand_animations=False
            )
            shape = tf.shape(image, out_type=tf.int64)
            ok = tf.reduce_all(tf.equal(shape[:2], size))
        if height is not None:
            ok = tf.logical_and(ok, tf.reduce_all(tf.equal(size, [height, width])))
        return _label_outputs(example, serialized, manifest), ok

    return check


def _read_records(path: str, manifest: manifest_lib.Manifest) -> tuple[int, list[int], str | None]:
    """Parses and decodes every record; returns (count, class counts, first problem)."""
    if not installed("tensorflow"):
        return _read_records_python(path, manifest)
    spec = manifest.image
    check = _record_check(manifest)
    dataset = (
        tf.data.TFRecordDataset(path)
        # deterministic: the record numbers in a message must be the file's own order.
        .map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Checked in batches of 1024: a Python step per record would cost more than the check.
        .batch(1024)
    )
    # `count` moves a batch at a time: where a batch fails, the message names the record
    # found by reading again from the batch's start (the failure path only).
    count = 0
    class_counts = np.zeros(manifest.num_classes, np.int64)
    try:
        for outputs, ok in dataset.as_numpy_iterator():
            bad = np.flatnonzero(~ok)
            if len(bad):
                return (
                    count,
                    [],
                    f"record {count + bad[0]} does not match the image spec {spec.describe()}",
                )
            problem = _tally(outputs, count, class_counts, manifest.num_classes)
            if problem:
                return count, [], problem
            count += len(ok)
    # TensorFlow's message names no record or byte: the framing is scanned again to say which.
    except tf.errors.DataLossError:
        return count, [], _damage(path, count)
    except tf.errors.InvalidArgumentError as error:
        number = _first_failing(tf.data.TFRecordDataset(path).skip(count).map(check), count)
        return (
            count,
            [],
            f"record {number} does not parse or decode: {error.message.splitlines()[0]}",
        )
    return count, class_counts.tolist(), None


def _label_features(manifest: manifest_lib.Manifest) -> dict:
    """The parse spec of what a record says of its image besides the pixels."""
    features = records.parse_features(records.LABELS if manifest.multi_label else records.CLASS)
    if manifest.weighted:
        # No default (readers take 1.0): a record without its weight is damage to name.
        features[records.WEIGHT] = tf.io.FixedLenFeature([], tf.float32)
    return features


def _label_outputs(example: dict, serialized, manifest: manifest_lib.Manifest) -> dict:
    """A record's labels as :func:`_tally` checks them: its ``class``, or (multi-label)
    ``carried`` (a 0/1 row over the classes), ``outside`` (its labels out of range, -1
    where in range) and ``present`` (whether it has a ``labels`` feature); ``weight``."""
    outputs = {}
    if manifest.weighted:
        outputs[records.WEIGHT] = example[records.WEIGHT]
    if not manifest.multi_label:
        outputs[records.CLASS] = example[records.CLASS]
        return outputs
    num_classes = manifest.num_classes
    labels = example[records.LABELS].values
    inside = (labels >= 0) & (labels < num_classes)
    # one_hot gives a row of zeros for a label out of range: those are reported, not counted.
    hot = tf.reduce_sum(tf.one_hot(labels, num_classes, dtype=tf.int64), axis=0)
    outputs["carried"] = tf.minimum(hot, 1)
    # The first label out of range, found by its position (-1: none).
    outputs["outside"] = tf.concat([tf.boolean_mask(labels, ~inside), [-1]], 0)[0]
    outputs["outside_any"] = tf.reduce_any(~inside)
    # A VarLenFeature reads a missing `labels` as an empty list (a negative): the
    # Example's own feature names say whether it is there.
    _, (entries,) = tf.io.decode_proto(
        tf.reshape(serialized, [1]), "tensorflow.Example", ["features"], [tf.string]
    )
    _, (entries,) = tf.io.decode_proto(
        tf.reshape(entries, [-1]), "tensorflow.Features", ["feature"], [tf.string]
    )
    _, (names,) = tf.io.decode_proto(
        tf.reshape(entries, [-1]), "tensorflow.Features.FeatureEntry", ["key"], [tf.string]
    )
    outputs["present"] = tf.reduce_any(tf.equal(names, records.LABELS))
    return outputs


def _tally(outputs: dict, count: int, class_counts: np.ndarray, num_classes: int) -> str | None:
    """Adds one batch of :func:`_label_outputs` to ``class_counts``; the first problem
    (naming its record, numbered from ``count``) instead, if there is one."""
    problems = []  # (record, what is wrong): the batch's first is reported
    if records.CLASS in outputs:
        labels = outputs[records.CLASS]
        outside = np.flatnonzero((labels < 0) | (labels >= num_classes))
        if len(outside):
            problems.append((outside[0], _outside(labels[outside[0]], num_classes)))
        carried = np.bincount(labels[(labels >= 0) & (labels < num_classes)], minlength=num_classes)
    else:
        missing = np.flatnonzero(~outputs["present"])
        if len(missing):
            problems.append((missing[0], f"does not parse or decode: {_no(records.LABELS)}"))
        outside = np.flatnonzero(outputs["outside_any"])
        if len(outside):
            problems.append((outside[0], _outside(outputs["outside"][outside[0]], num_classes)))
        carried = outputs["carried"].sum(axis=0)
    if records.WEIGHT in outputs:
        weights = outputs[records.WEIGHT]
        wrong = np.flatnonzero(~(np.isfinite(weights) & (weights >= 0)))
        if len(wrong):
            problems.append((wrong[0], _wrong_weight(weights[wrong[0]])))
    if problems:
        number, problem = min(problems, key=lambda found: found[0])
        return f"record {count + number} {problem}"
    class_counts += carried
    return None


def _outside(label: int, num_classes: int) -> str:
    return f"has label {label}, outside 0..{num_classes - 1}"


def _no(feature: str) -> str:
    return f"it has no `{feature}` feature"


def _wrong_weight(weight: float) -> str:
    return f"has weight {weight:g}, not a finite number >= 0"


def _read_records_python(
    path: str, manifest: manifest_lib.Manifest
) -> tuple[int, list[int], str | None]:
    """:func:`_read_records` without TensorFlow: each frame's CRCs, the Example parsed by
    :mod:`chute.format.parse`, the image decoded by OpenCV (as the Grain engine reads)."""
    class_counts = np.zeros(manifest.num_classes, np.int64)
    count, pos = 0, 0
    with open(path, "rb") as handle, _mapped(handle) as data:
        while pos < len(data):
            # a frame cut short or a wrong CRC: the framing scan's message names record and byte
            if pos + 8 > len(data):
                return count, [], _damage(path, count)
            end = pos + _LENGTH.unpack_from(data, pos)[0] + records.FRAME_OVERHEAD
            try:
                record = parse.unframe(data[pos:end])
            except ChuteError:
                return count, [], _damage(path, count)
            try:
                values = parse.record_values(record)
            except ChuteError as error:
                return count, [], f"record {count} does not parse or decode: {error}"
            try:
                classes = _check_record(values, manifest)
            except ChuteError as error:
                return count, [], f"record {count} {error}"
            # a set: an image carrying a label counts once for it, as the manifest counts
            class_counts[list(set(classes))] += 1
            count += 1
            pos = end
    return count, class_counts.tolist(), None


@contextlib.contextmanager
def _mapped(handle: IO[bytes]) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, mapped rather than read (a shard may be hundreds of MB)."""
    if os.fstat(handle.fileno()).st_size == 0:  # an empty file cannot be mapped
        yield b""
        return
    with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        yield data


def _check_record(values: dict, manifest: manifest_lib.Manifest) -> tuple[int, ...]:
    """The class (or, multi-label, classes) of one parsed record, once its image matches
    the manifest's spec, its labels are in range and its weight (if any) is good.

    Raises:
        ChuteError: the record lacks a feature, its image does not decode (the message
            starts "does not parse or decode"), the image is off the spec, a label is
            out of range or the weight is not a finite number >= 0.
    """
    spec = manifest.image
    target = records.LABELS if manifest.multi_label else records.CLASS
    wanted = (records.IMAGE, target, records.SIZE, *([records.WEIGHT] * manifest.weighted))
    missing = [name for name in wanted if name not in values]
    if missing:
        raise ChuteError(f"does not parse or decode: {_no(missing[0])}")
    image, size = values[records.IMAGE], values[records.SIZE].tolist()
    if spec.encoding == "raw":
        ok = len(image) == size[0] * size[1] * spec.channels
    else:
        try:
            pixels = crop.decode(image, spec.encoding, (0, 0, spec.channels))
        except (ValueError, cv2.error) as error:
            raise ChuteError(f"does not parse or decode: {error}") from None
        ok = list(pixels.shape[:2]) == size
    if spec.height is not None:
        ok = ok and size == [spec.height, spec.width]
    if not ok:
        raise ChuteError(f"does not match the image spec {spec.describe()}")
    labels = values[target]
    classes = tuple(int(label) for label in labels) if manifest.multi_label else (int(labels),)
    outside = [label for label in classes if not 0 <= label < manifest.num_classes]
    if outside:
        raise ChuteError(_outside(outside[0], manifest.num_classes))
    if manifest.weighted:
        weight = values[records.WEIGHT]
        if len(weight) != 1:
            raise ChuteError(f"does not parse or decode: its `weight` holds {len(weight)} values")
        if not (np.isfinite(weight[0]) and weight[0] >= 0):
            raise ChuteError(_wrong_weight(weight[0]))
    return classes


def _damage(path: str, count: int) -> str:
    """What TensorFlow's DataLossError was: the record whose length or CRC is wrong or
    that is cut short, and its byte offset (one plain-Python pass over the framing)."""
    try:
        with storage.open_file(path, "rb") as handle:
            record_index.scan(handle, where="the shard")
    except ChuteError as error:
        return str(error)
    return f"truncated or corrupt after record {count} (a record's CRC or length is wrong)"


def _first_failing(dataset: tf.data.Dataset, first: int) -> int:
    """The number of the first record of ``dataset`` (records from number ``first``, one
    at a time) whose check raises."""
    number = first
    try:
        for _ in dataset:
            number += 1
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError):
        pass
    return number
