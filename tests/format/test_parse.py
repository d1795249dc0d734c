"""Records read back in plain Python (chute.format.parse) equal what TensorFlow reads."""

from __future__ import annotations

import struct

import pytest
from helpers import tf_example

from chute.errors import ChuteError
from chute.format import parse, records


@pytest.mark.parametrize(
    "features",
    [
        {"class": [3], "image": [b"abc"]},
        {"class": [2**40, -5, 0], "key": ["ಕ/1.png".encode(), b""], "size": [75, 75]},
        {"image": [b"\x00" * 300], "weights": [0.5, -2.0]},  # a float list too
    ],
)
def test_plain_python_decoding_reads_what_tensorflow_writes(features):
    decoded = parse.decode_example(tf_example(features))
    assert decoded == {name: list(values) for name, values in features.items()}


def test_unframe_and_record_values_invert_image_example():
    framed = records.image_example(
        image=b"\x01\x02", label=300, height=1, width=2, channels=1, encoding="raw", key="ಕ.png"
    )
    values = parse.record_values(parse.unframe(framed))
    assert values["size"].tolist() == [1, 2]
    del values["size"]
    assert values == {
        "image": b"\x01\x02", "class": 300, "channels": 1, "encoding": "raw", "key": "ಕ.png"
    }  # fmt: skip
    for damage, message in [
        (framed[:-1] + bytes([framed[-1] ^ 1]), "record's CRC"),
        (bytes([framed[0] ^ 1]) + framed[1:], "length CRC"),
        (framed[:-3], "length field says"),
    ]:
        with pytest.raises(ChuteError, match=message):
            parse.unframe(damage)
    with pytest.raises(ChuteError, match=r"not a valid tf\.train\.Example \(a field runs past"):
        parse.decode_example(b"\x0a\x7f\x01")  # a field longer than the bytes


def test_plain_python_decoding_reads_unpacked_lists_and_skips_unknown_fields():
    field, varint = records._field, records._varint
    ints = field(3, b"\x08" + varint(5) + b"\x08" + varint(2**64 - 3))  # Int64List, unpacked
    floats = field(2, b"\x0d" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", -1.0))
    entries = b"".join(
        field(1, field(1, name) + field(2, feature))
        for name, feature in [(b"a", ints), (b"b", floats)]
    )
    example = field(1, entries) + b"\x10\x05"  # then an unknown varint field
    assert parse.decode_example(example) == {"a": [5, -3], "b": [1.5, -1.0]}


def test_both_decoders_agree_and_every_truncation_is_an_error():
    framed = records.image_example(
        image=bytes(range(256)) * 2, label=5000, height=16, width=32, channels=1,
        encoding="raw", key="k" * 200,  # lengths over 127 take two varint bytes
    )  # fmt: skip
    record = parse.unframe(framed)
    common = parse._decode_common(record)  # the fast path, for what writers write
    assert common == parse._decode_any(record) == parse.decode_example(record)
    assert common["class"] == [5000] and common["key"] == [b"k" * 200]
    for cut in range(1, len(record)):
        with pytest.raises(ChuteError, match=r"not a valid tf\.train\.Example"):
            parse.decode_example(record[:cut])


def test_raw_records_are_read_in_place_exactly_as_the_general_parse_reads_them():
    """The layout chute writes for a single-label raw image is read without the general
    parse; any record outside it (another size, multi-label, weighted, any changed byte
    that the general parse would read otherwise) is left to the general parse."""
    from chute.format import records as records_lib

    layout = records_lib.raw_layout(3, 2, 3)
    for label in (0, 127, 128, 70_000, -1):
        for key in ("a", "k" * 200, "dir/é.png"):
            image = bytes(range(18))
            record = parse.unframe(
                records_lib.image_example(image=image, label=label, height=2, width=3,
                                          channels=3, encoding="raw", key=key)
            )  # fmt: skip
            at, got = parse.raw_image_at(record, layout)
            assert record[at : at + 18] == image and got == label
    others = [
        records_lib.image_example(image=bytes(18), label=1, height=3, width=2, channels=3,
                                  encoding="raw", key="k"),
        records_lib.image_example(image=bytes(18), label=records_lib.Target((1, 2)), height=2,
                                  width=3, channels=3, encoding="raw", key="k"),
        records_lib.image_example(image=bytes(18), label=records_lib.Target(1, 0.5), height=2,
                                  width=3, channels=3, encoding="raw", key="k"),
    ]  # fmt: skip
    assert all(parse.raw_image_at(parse.unframe(r), layout) is None for r in others)
    record = parse.unframe(
        records_lib.image_example(image=bytes(18), label=9, height=2, width=3, channels=3,
                                  encoding="raw", key="kk")
    )  # fmt: skip
    start = parse.raw_image_at(record, layout)[0]
    for index in [*range(start), *range(start + 18, len(record))]:
        for bit in (0x01, 0x40, 0x80):
            bad = bytearray(record)
            bad[index] ^= bit
            found = parse.raw_image_at(bytes(bad), layout)
            if found is None:
                continue
            try:
                values = parse.record_values(bytes(bad))
            except UnicodeDecodeError:  # only the key's text changed: not read here
                continue
            assert values["class"] == found[1], index
            assert values["image"] == bytes(bad[found[0] : found[0] + 18]), index
            assert values["size"].tolist() == [2, 3], index
