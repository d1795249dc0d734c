"""The record format: one schema for every writer and reader, and TFRecord framing.

Records are standard ``tf.train.Example`` protos. Worker processes build and
frame them here without TensorFlow (which would cost seconds and hundreds of
MB per process); the bytes are exactly what ``tf.io.TFRecordWriter`` and
``tf.train.Example`` would produce, so any TensorFlow reader, including the
"Keras on TPU" codelab's (``image`` + ``class``), reads them unchanged. Every
chute reader and checker parses them with :func:`parse_features`; readers
without TensorFlow (Grain's worker processes) use :mod:`chute.format.parse`.

Features of every record:

* ``image`` (bytes): PNG, JPEG, or raw uint8 pixels in HWC order.
* ``class`` (int64): the label index into the manifest's class names.
* ``size`` (int64 x2): ``[height, width]`` of this image.
* ``channels`` (int64): 1 or 3.
* ``encoding`` (bytes): ``b"raw"``, ``b"png"`` or ``b"jpeg"``.
* ``key`` (bytes): the image's source key (relative path or array index).

Multi-label datasets (manifest ``label_mode: "multi"``) write ``labels`` (int64
list: the sorted class indices the image carries, empty for a negative) in place
of ``class``; a dataset with sample weights adds ``weight`` (float) to each record.
Single-label records are byte for byte what they were.

Example:
    >>> record = frame(encode_example({"class": [3], "image": [b"abc"]}))
    >>> len(record) == 8 + 4 + len(encode_example({"class": [3], "image": [b"abc"]})) + 4
    True
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import google_crc32c

from chute.lazy import tf

IMAGE = "image"
CLASS = "class"
SIZE = "size"
CHANNELS = "channels"
ENCODING = "encoding"
KEY = "key"
LABELS = "labels"  # multi-label datasets: the image's class indices (int64 list)
WEIGHT = "weight"  # datasets with sample weights: the image's weight (float)
# A record's float feature is float32: a larger weight (finite in float64) cannot be stored.
MAX_WEIGHT = 3.4028234663852886e38
# name -> (shape, dtype name) of each feature
SCHEMA = {
    IMAGE: ([], "string"),
    CLASS: ([], "int64"),
    SIZE: ([2], "int64"),
    CHANNELS: ([], "int64"),
    ENCODING: ([], "string"),
    KEY: ([], "string"),
}


def parse_features(*names: str) -> dict:
    """The ``tf.io.parse_example`` spec of the named features (all of them when none is named).

    Example:
        >>> sorted(parse_features(IMAGE, CLASS))  # doctest: +SKIP
        ['class', 'image']
    """
    return {name: _parse_spec(name) for name in (names or SCHEMA)}


def _parse_spec(name: str):
    if name == LABELS:  # any number per image: a sparse row, made multi-hot by the reader
        return tf.io.VarLenFeature(tf.int64)
    if name == WEIGHT:
        return tf.io.FixedLenFeature([], tf.float32, default_value=1.0)
    return tf.io.FixedLenFeature(SCHEMA[name][0], getattr(tf, SCHEMA[name][1]))


FRAME_OVERHEAD = 16  # length (8), its CRC (4) and the data's CRC (4) around each record
# TFRecord's mask constant: a CRC stored masked so that CRCs of CRCs do not look valid.
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1


# Small values (labels, channels) are the common case: one cached byte, no loop.
_ONE_BYTE = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    value &= _U64  # negative int64 values are encoded as 10-byte two's complement
    out = bytearray()
    # Seven bits a byte, low first; the high bit says another byte follows.
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(values: Sequence[bytes] | Sequence[int] | Sequence[float]) -> bytes:
    if values and isinstance(values[0], bytes | bytearray | memoryview):
        bytes_list = b"".join(_field(1, bytes(v)) for v in values)
        return _field(1, bytes_list)  # Feature.bytes_list
    if values and isinstance(values[0], float):  # packed float32, as TensorFlow writes them
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))  # float_list
    if not values:  # an empty int64 list (a multi-label negative), as protobuf writes it
        return _field(3, b"")
    # Packed, as protobuf serialises repeated int64 by default: the same bytes as TensorFlow's.
    packed = b"".join(_varint(int(v)) for v in values)
    return _field(3, _field(1, packed))  # Feature.int64_list, packed values


def encode_example(features: Mapping[str, Sequence[bytes] | Sequence[int]]) -> bytes:
    """Serialises a ``tf.train.Example`` whose features are bytes or int64 lists.

    Keys are written in sorted order, so the same features give the same bytes.
    """
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, _feature(values)))
        for key, values in sorted(features.items())
    )
    return _field(1, entries)  # Example.features


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (bytes)."""
    # google_crc32c: CRC32C in C, far faster than Python and no TensorFlow import.
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def frame(record: bytes) -> bytes:
    """Wraps one serialised record in TFRecord framing (length, CRCs)."""
    length = struct.pack("<Q", len(record))
    return (
        length
        + struct.pack("<I", masked_crc(length))
        + record
        + struct.pack("<I", masked_crc(record))
    )


# Label, channels and size repeat from image to image: their entries are built once.
@functools.lru_cache(maxsize=8192)
def _entry(name: str, value: bytes | int | float | tuple[int, ...]) -> bytes:
    """One serialised map entry of ``Features.feature`` (cached: most repeat)."""
    values = [value] if isinstance(value, bytes | int | float) else list(value)
    return _field(1, _field(1, name.encode()) + _field(2, _feature(values)))


@functools.lru_cache(maxsize=4096)
def _bytes_entry_head(name: str, size: int) -> bytes:
    """The bytes that precede a ``size``-byte value in a bytes-feature map entry."""
    list_len = 1 + len(_varint(size)) + size  # BytesList.value
    feature_len = 1 + len(_varint(list_len)) + list_len  # Feature.bytes_list
    name_field = _field(1, name.encode())
    body_len = len(name_field) + 1 + len(_varint(feature_len)) + feature_len
    return (
        b"\x0a"
        + _varint(body_len)
        + name_field
        + b"\x12"
        + _varint(feature_len)
        + b"\x0a"
        + _varint(list_len)
        + b"\x0a"
        + _varint(size)
    )


class Target(NamedTuple):
    """What a record says of its image besides the pixels, when more than one class:
    ``classes`` (a multi-label set, sorted) and ``weight`` (None: no weight feature).
    A plain ``int`` stands for a single class with no weight, the common case."""

    classes: int | tuple[int, ...]
    weight: float | None = None


def target_of(label: int, labels: tuple[int, ...] | None, weight: float | None) -> int | Target:
    """The value a record is built from: ``label`` itself for a single-label image with no
    weight (what every pre-existing dataset holds), else a :class:`Target`.

    Example:
        >>> target_of(3, None, None), target_of(-1, (0, 2), None)
        (3, Target(classes=(0, 2), weight=None))
    """
    if labels is None and weight is None:
        return label
    return Target(tuple(labels) if labels is not None else label, weight)


def classes_in(target: int | Target | Sequence) -> tuple[int, ...]:
    """The class indices a target holds (one for a single label), for counting.

    Accepts a target read back from JSON (a list) too.

    Example:
        >>> classes_in(3), classes_in(Target((0, 2), 0.5)), classes_in([[1], None])
        ((3,), (0, 2), (1,))
    """
    if isinstance(target, int):
        return (target,)
    classes = target[0]
    return (classes,) if isinstance(classes, int) else tuple(classes)


def from_json(value: int | list) -> int | Target:
    """A target as JSON gave it back (a list for a :class:`Target`).

    Example:
        >>> from_json([[0, 2], 0.5])
        Target(classes=(0, 2), weight=0.5)
    """
    if isinstance(value, int):
        return value
    classes, weight = value
    return Target(classes if isinstance(classes, int) else tuple(classes), weight)


class RawLayout(NamedTuple):
    """The fixed parts of a single-label, unweighted record of a raw image of one size
    (see :func:`raw_layout`): only the class and the key vary between such records."""

    head: bytes  # before the class entry
    middle: bytes  # between the class entry and the image's bytes
    tail: bytes  # the size entry, which ends the record
    image_bytes: int  # the image's length


def raw_layout(channels: int, height: int, width: int) -> RawLayout:
    """The :class:`RawLayout` of a raw ``height`` x ``width`` x ``channels`` image's record
    as :func:`image_example` writes it; :func:`chute.format.parse.raw_image_at` reads
    such records without a general parse.

    Example:
        >>> head, middle, tail, _ = raw_layout(1, 2, 3)
        >>> record = image_example(image=bytes(6), label=4, height=2, width=3, channels=1,
        ...                        encoding="raw", key="k")
        >>> head in record and middle in record and record.endswith(tail + record[-4:])
        True
    """
    size = height * width * channels
    return RawLayout(
        _entry(CHANNELS, channels),
        _entry(ENCODING, b"raw") + _bytes_entry_head(IMAGE, size),
        _entry(SIZE, (height, width)),
        size,
    )


def image_example(
    *,
    image: bytes,
    label: int | Target,
    height: int,
    width: int,
    channels: int,
    encoding: str,
    key: str,
) -> bytes:
    """Builds and frames the record of one image (see the module docstring).

    ``label`` is a class index, or a :class:`Target` (a multi-label set, a weight).
    The same bytes as ``frame(encode_example({...}))``, built without copying
    the image more than once (this runs once per image in the workers).
    """
    key_bytes = key.encode("utf-8")
    classes, weight = (label, None) if isinstance(label, int) else label
    if isinstance(classes, int):
        class_entry, labels_entry = _entry(CLASS, classes), b""
    else:  # a multi-label record: ``labels`` in place of ``class`` (empty: a negative)
        class_entry, labels_entry = b"", _entry(LABELS, tuple(classes))
    weight_entry = b"" if weight is None else _entry(WEIGHT, float(weight))
    entries = b"".join(
        (  # sorted by feature name, as encode_example writes them
            _entry(CHANNELS, channels),
            class_entry,
            _entry(ENCODING, encoding.encode()),
            _bytes_entry_head(IMAGE, len(image)),
            # The image goes in as it is: the head before it is built from its length alone.
            image,
            _bytes_entry_head(KEY, len(key_bytes)),
            key_bytes,
            labels_entry,
            _entry(SIZE, (height, width)),
            weight_entry,
        )
    )
    return frame(b"\x0a" + _varint(len(entries)) + entries)
