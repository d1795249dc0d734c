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
