"""Chute's records read back in plain Python: no TensorFlow, for Grain's worker processes.

:func:`unframe` checks one TFRecord frame (its length and both CRCs) and returns
the record; :func:`decode_example` parses any serialised ``tf.train.Example``
(the inverse of :func:`chute.format.records.encode_example`); and
:func:`record_values` gives a chute record's features (see
:mod:`chute.format.records`) as Python and NumPy values, as
``tf.io.parse_example`` with :func:`~chute.format.records.parse_features` would.

Example:
    >>> from chute.format import records
    >>> framed = records.image_example(image=b"\\x00" * 6, label=2, height=2, width=3,
    ...                                channels=1, encoding="raw", key="a/1.png")
    >>> values = record_values(unframe(framed))
    >>> values["class"], values["size"].tolist(), values["encoding"], values["key"]
    (2, [2, 3], 'raw', 'a/1.png')
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO

import numpy as np

from chute.errors import ChuteError
from chute.format import records
from chute.format.records import ENCODING, KEY, SCHEMA

_STRINGS = (ENCODING, KEY)  # bytes features that are text

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def unframe(framed: bytes | memoryview) -> bytes:
    """The record inside one TFRecord frame, once its length and both CRCs are checked.

    Raises:
        ChuteError: the frame is short, or a CRC or the length is wrong (the caller
            adds which file and record).

    Example:
        >>> unframe(records.frame(b"hello"))
        b'hello'
        >>> unframe(records.frame(b"hello")[:-1] + b"!")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: the record's CRC is wrong (its bytes changed)
    """
    data = framed if isinstance(framed, bytes) else bytes(framed)
    if len(data) < records.FRAME_OVERHEAD:
        raise ChuteError(f"a record frame needs at least 16 bytes, this one has {len(data)}")
    (length,) = _LENGTH.unpack_from(data)
    if _CRC.unpack_from(data, 8)[0] != records.masked_crc(data[:8]):
        raise ChuteError("the record's length CRC is wrong (its header changed)")
    if length != len(data) - records.FRAME_OVERHEAD:
        raise ChuteError(
            f"the record's length field says {length} bytes, its frame holds "
            f"{len(data) - records.FRAME_OVERHEAD}"
        )
    record = data[12 : 12 + length]
    if _CRC.unpack_from(data, 12 + length)[0] != records.masked_crc(record):
        raise ChuteError("the record's CRC is wrong (its bytes changed)")
    return record


def read_records(handle: IO[bytes]) -> Iterator[bytes]:
    """Each record of a TFRecord file open for reading (local or ``storage.open_file``),
    in order, its frame checked by :func:`unframe`: what ``tf.data.TFRecordDataset``
    reads, without TensorFlow.

    Raises:
        ChuteError: the file ends inside a frame, or a CRC or length is wrong.

    Example:
        >>> import io
        >>> list(read_records(io.BytesIO(records.frame(b"a") + records.frame(b"bc"))))
        [b'a', b'bc']
    """
    while head := handle.read(12):
        if len(head) < 12:
            raise ChuteError("the file ends inside a record's header")
        yield unframe(head + handle.read(_LENGTH.unpack_from(head)[0] + 4))


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it."""
    byte = data[pos]
    # One byte, the common case: answered without the loop.
    if byte < 0x80:
        return byte, pos + 1
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        # Ten bytes hold 64 bits: a longer varint is damage, not a large number.
        if shift > 63:
            raise ChuteError("a varint is longer than 10 bytes")


def _field_at(data: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """The protobuf field at ``data[pos:end]``: ``(tag, value, value end, next position)``;
    ``value`` is a varint's value or where a length-delimited or fixed-size value starts."""
    tag = data[pos]
    pos += 1
    if tag >= 0x80:
        tag, pos = _read_varint(data, pos - 1)
    wire = tag & 7
    if wire == 2:
        size = data[pos]
        pos += 1
        if size >= 0x80:
            size, pos = _read_varint(data, pos - 1)
        after = pos + size
    elif wire == 0:
        value, after = _read_varint(data, pos)
        pos = value
    elif wire in (1, 5):  # fixed64, fixed32 (a float list's unpacked values)
        after = pos + (8 if wire == 1 else 4)
    else:
        raise ChuteError(f"it holds protobuf wire type {wire}")
    if after > end:
        raise ChuteError("a field runs past the end of the record")
    return tag, pos, after, after


def _signed(value: int) -> int:
    # int64 is written as its unsigned two's complement: negative labels come back negative.
    return value - (1 << 64) if value >= 1 << 63 else value


def _length_at(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(start, stop)`` of the length-delimited value whose length varint is at ``pos``."""
    size = data[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _read_varint(data, pos - 1)
    if pos + size > end:
        raise ChuteError("a field runs past the end of the record")
    return pos, pos + size


def _packed_ints(data: bytes, pos: int, end: int, values: list) -> None:
    """Appends the varints of a packed ``Int64List.value`` to ``values``."""
    while pos < end:
        number = data[pos]
        if number < 0x80:
            pos += 1
        else:
            number, pos = _read_varint(data, pos)
            number = _signed(number)
        values.append(number)
    if pos != end:
        raise ChuteError("a packed int64 list runs past its end")


def _feature_values(data: bytes, pos: int, end: int) -> list:
    """The values of one ``tf.train.Feature``: bytes, ints or floats."""
    values: list = []
    while pos < end:
        kind, start, stop, pos = _field_at(data, pos, end)
        if kind not in (0x0A, 0x12, 0x1A):  # bytes_list, float_list, int64_list
            continue
        while start < stop:
            if data[start] == 0x0A:  # one bytes value, or packed ints or floats
                size, value = data[start + 1], start + 2
                if size >= 0x80:
                    size, value = _read_varint(data, start + 1)
                start = value + size
                if start > stop:
                    raise ChuteError("a field runs past the end of the record")
                if kind == 0x0A:
                    values.append(data[value:start])
                elif kind == 0x1A:
                    _packed_ints(data, value, start, values)
                else:
                    values += [v for (v,) in struct.iter_unpack("<f", data[value:start])]
                continue
            tag, value, value_end, start = _field_at(data, start, stop)
            if kind == 0x1A and tag == 0x08:  # an unpacked int
                values.append(_signed(value))
            elif kind == 0x12 and tag == 0x0D:  # an unpacked float
                values += struct.unpack("<f", data[value:value_end])
    return values


def decode_example(serialized: bytes) -> dict[str, list]:
    """Parses a serialised ``tf.train.Example`` in plain Python (no TensorFlow): each
    feature's values, a list of bytes, ints or floats. The inverse of
    :func:`chute.format.records.encode_example`.

    Raises:
        ChuteError: the bytes are not a ``tf.train.Example``.

    Example:
        >>> decode_example(records.encode_example({"class": [3, -1], "image": [b"abc"]}))
        {'class': [3, -1], 'image': [b'abc']}
    """
    data = serialized if isinstance(serialized, bytes) else bytes(serialized)
    try:
        # The fast path for what chute and TensorFlow write; anything else takes the general one.
        return _decode_common(data)
    except (_Unusual, IndexError, UnicodeDecodeError):
        return _decode_any(data)


class _Unusual(Exception):
    """Bytes that :func:`_decode_common` does not read: :func:`_decode_any` does."""


def _varint_length(data: bytes, pos: int) -> tuple[int, int]:
    """``(start, stop)`` of the length-delimited value whose length is at ``pos``."""
    size, pos = _read_varint(data, pos)
    return pos, pos + size


def _decode_common(data: bytes) -> dict[str, list]:
    """The layout TensorFlow's and chute's writers produce (only known fields, each
    ending where its parent does, ints packed, no floats), about twice as fast as
    :func:`_decode_any`: a Python call costs as much as the work here, so a length
    under 128 (one byte) is read in place. Raises :class:`_Unusual` (or IndexError)
    otherwise."""
    features: dict[str, list] = {}
    end = len(data)
    pos = 0
    while pos < end:  # Example.features (one field, usually)
        if data[pos] != 0x0A:
            raise _Unusual
        size = data[pos + 1]
        entry, pos = (pos + 2, pos + 2 + size) if size < 0x80 else _varint_length(data, pos + 1)
        while entry < pos:  # its map entries: 0x0A, length, name field, Feature field
            if data[entry] != 0x0A:
                raise _Unusual
            size = data[entry + 1]
            part, entry = (
                (entry + 2, entry + 2 + size) if size < 0x80 else _varint_length(data, entry + 1)
            )
            if data[part] != 0x0A or data[part + 1] >= 0x80:  # the name, under 128 bytes
                raise _Unusual
            name = data[part + 2 : part + 2 + data[part + 1]].decode("utf-8")
            part += 2 + data[part + 1]
            if data[part] != 0x12:  # the Feature
                raise _Unusual
            size = data[part + 1]
            kind, part = (
                (part + 2, part + 2 + size) if size < 0x80 else _varint_length(data, part + 1)
            )
            if part != entry:
                raise _Unusual
            size = data[kind + 1]  # its one list: bytes (0x0A) or int64 (0x1A)
            value, part = (
                (kind + 2, kind + 2 + size) if size < 0x80 else _varint_length(data, kind + 1)
            )
            kind = data[kind]
            if part != entry or kind not in (0x0A, 0x1A):
                raise _Unusual
            values: list = []
            while value < part:  # the list's values (bytes) or packed values (ints)
                if data[value] != 0x0A:
                    raise _Unusual
                size = data[value + 1]
                start, value = (
                    (value + 2, value + 2 + size)
                    if size < 0x80
                    else _varint_length(data, value + 1)
                )
                if kind == 0x0A:
                    values.append(data[start:value])
                else:
                    _packed_ints(data, start, value, values)
            if value != part:
                raise _Unusual
            features[name] = values
        if entry != pos or pos > end:
            raise _Unusual
    return features


def _decode_any(data: bytes) -> dict[str, list]:
    """Any ``tf.train.Example`` (unknown fields skipped, unpacked lists, floats)."""
    features: dict[str, list] = {}
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, entry, entries_end, pos = _field_at(data, pos, end)
            while tag == 0x0A and entry < entries_end:  # Example.features: its map entries
                tag_entry, part, part_end, entry = _field_at(data, entry, entries_end)
                if tag_entry != 0x0A:
                    continue
                name, span = "", (0, 0)
                while part < part_end:  # one entry: the name (1), the Feature (2)
                    tag_part = data[part]
                    if tag_part not in (0x0A, 0x12):
                        _, _, _, part = _field_at(data, part, part_end)
                        continue
                    start, part = _length_at(data, part + 1, part_end)
                    if tag_part == 0x0A:
                        name = data[start:part].decode("utf-8")
                    else:
                        span = (start, part)
                features[name] = _feature_values(data, *span)
    # Malformed bytes surface as any of these: one error, naming the record as not an Example.
    except (IndexError, UnicodeDecodeError, struct.error, ChuteError) as error:
        raise ChuteError(f"the record is not a valid tf.train.Example ({error})") from None
    return features


_CLASS_NAME = b"\x0a\x05class\x12"  # a class entry's name field and its Feature's tag
_KEY_NAME = b"\x0a\x03key\x12"


def raw_image_at(record: bytes, layout: records.RawLayout) -> tuple[int, int] | None:
    """``(offset of the image bytes, class)`` of a record in exactly the layout chute
    writes for a single-label, unweighted raw image (``layout``:
    :func:`chute.format.records.raw_layout`), every byte of it checked; None for any
    other record (parse those with :func:`record_values`). What a reader of fixed-size
    raw images does per record without parsing the whole Example in Python.

    Example:
        >>> layout = records.raw_layout(1, 1, 2)
        >>> record = unframe(records.image_example(image=bytes([7, 8]), label=5, height=1,
        ...                  width=2, channels=1, encoding="raw", key="a"))
        >>> at, label = raw_image_at(record, layout)
        >>> list(record[at : at + 2]), label
        ([7, 8], 5)
        >>> raw_image_at(record, records.raw_layout(1, 2, 1)) is None  # another size
        True
    """
    head, middle, tail, image_bytes = layout
    try:
        if record[0] != 0x0A:
            return None
        length, pos = _read_varint(record, 1)
        if pos + length != len(record) or not record.startswith(head, pos):
            return None
        pos += len(head)
        # the class entry: 0A len, 0A 05 "class", 12 flen, 1A llen, 0A plen, one varint
        size = record[pos + 1]
        if record[pos] != 0x0A or size >= 0x80 or not record.startswith(_CLASS_NAME, pos + 2):
            return None
        end = pos + 2 + size
        flen, plen = record[pos + 10], record[pos + 14]
        if (record[pos + 11], record[pos + 13]) != (0x1A, 0x0A) or flen != plen + 4:
            return None
        label, stop = record[pos + 15], pos + 16  # one byte: a label under 128
        if label >= 0x80:
            label, stop = _read_varint(record, pos + 15)
        if stop != end or size != flen + 9 or record[pos + 12] != plen + 2:
            return None
        if not record.startswith(middle, end):
            return None
        image = end + len(middle)
        pos = len(record) - len(tail)  # where the tail must start
        # between the image and the tail: exactly the key entry (named "key"), its
        # Feature, its BytesList and the one value, each ending where the tail starts
        at = image + image_bytes
        if record[at] != 0x0A:
            return None
        size, at = _length(record, at + 1)
        if at + size != pos or not record.startswith(_KEY_NAME, at):
            return None
        size, at = _length(record, at + len(_KEY_NAME))
        for _ in range(2):  # the BytesList, then its value
            if at + size != pos or record[at] != 0x0A:
                return None
            size, at = _length(record, at + 1)
        if at + size != pos or not record.startswith(tail, pos):
            return None
        return image, _signed(label)
    except (IndexError, ChuteError):
        return None


def _length(record: bytes, at: int) -> tuple[int, int]:
    """``(length, where its bytes start)`` of the varint length at ``at`` (one byte below
    128, the usual case, read in place)."""
    size = record[at]
    return (size, at + 1) if size < 0x80 else _read_varint(record, at)


def record_values(serialized: bytes) -> dict:
    """A chute record's features (see :mod:`chute.format.records`) as Python and NumPy
    values, parsed without TensorFlow: ``image`` bytes, ``class`` and ``channels`` ints,
    ``size`` an int64 array ``[height, width]``, ``encoding`` and ``key`` strings.
    Features outside the schema keep :func:`decode_example`'s lists.

    Raises:
        ChuteError: the bytes are not a ``tf.train.Example``, or a schema feature has
            the wrong number of values.

    Example:
        >>> record = records.encode_example({"class": [7], "size": [2, 3], "key": [b"a"]})
        >>> values = record_values(record)
        >>> values["class"], values["size"].tolist(), values["key"]
        (7, [2, 3], 'a')
    """
    values: dict = decode_example(serialized)
    for name, found in values.items():
        if name not in SCHEMA:
            continue
        shape = SCHEMA[name][0]
        if len(found) != (shape[0] if shape else 1):
            raise ChuteError(
                f"the record's `{name}` feature holds {len(found)} values, the schema "
                f"says {shape[0] if shape else 1}"
            )
        if shape:
            values[name] = np.asarray(found, np.int64)
        elif name in _STRINGS:
            values[name] = found[0].decode("utf-8")
        else:
            values[name] = found[0]
    return values
