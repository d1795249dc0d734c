"""Hand-built tf.train.Example + TFRecord framing must be what TensorFlow reads and writes."""

from __future__ import annotations

import pytest
import tensorflow as tf
from helpers import tf_example

from chute.format import parse, records


@pytest.mark.parametrize(
    "features",
    [
        {"class": [3], "image": [b"abc"]},
        {"class": [0], "size": [75, 75], "image": [b"\x00" * 300]},
        {"class": [2**40, -5], "key": ["ಕ/1.png".encode()]},
        {"image": [b""], "class": [127, 128, 300]},
    ],
)
def test_example_bytes_equal_tensorflow_protobuf(features):
    assert records.encode_example(features) == tf_example(features)


@pytest.mark.parametrize("label", [0, 127, 128, 5000])
def test_fast_image_example_equals_generic_encoder(label):
    image = bytes(range(256)) * 30
    fast = records.image_example(
        image=image, label=label, height=60, width=128, channels=1, encoding="raw", key="c/ಖ.png"
    )
    slow = records.frame(
        records.encode_example(
            {
                "image": [image],
                "class": [label],
                "size": [60, 128],
                "channels": [1],
                "encoding": [b"raw"],
                "key": ["c/ಖ.png".encode()],
            }
        )
    )
    assert fast == slow


def test_framing_matches_tfrecord_writer(tmp_path):
    payloads = [b"", b"x", b"hello" * 1000]
    ours = tmp_path / "ours.tfrecord"
    ours.write_bytes(b"".join(records.frame(p) for p in payloads))
    theirs = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for p in payloads:
            writer.write(p)
    assert ours.read_bytes() == theirs.read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == payloads


def test_tensorflow_parses_image_example():
    framed = records.image_example(
        image=b"\x01\x02\x03\x04\x05\x06",
        label=7,
        height=2,
        width=3,
        channels=1,
        encoding="raw",
        key="a/b.png",
    )
    serialized = framed[12:-4]  # strip length, length CRC and data CRC
    parsed = tf.io.parse_single_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "class": tf.io.FixedLenFeature([], tf.int64),
            "size": tf.io.FixedLenFeature([2], tf.int64),
            "key": tf.io.FixedLenFeature([], tf.string),
            "encoding": tf.io.FixedLenFeature([], tf.string),
            "channels": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    assert parsed["class"].numpy() == 7
    assert parsed["size"].numpy().tolist() == [2, 3]
    assert parsed["image"].numpy() == b"\x01\x02\x03\x04\x05\x06"
    assert parsed["key"].numpy() == b"a/b.png"


@pytest.mark.parametrize(
    "target",
    [
        records.Target((0, 2, 5)),
        records.Target(()),  # a multi-label negative
        records.Target(1, 0.25),  # single-label, weighted
        records.Target((1, 4), 2.0),
    ],
)
def test_multi_label_and_weighted_records_are_what_tensorflow_writes(target):
    framed = records.image_example(
        image=b"\x00" * 6, label=target, height=2, width=3, channels=1, encoding="raw", key="k"
    )
    body = parse.unframe(framed)
    example = tf.train.Example.FromString(body)
    assert example.SerializeToString(deterministic=True) == body
    features = example.features.feature
    classes, weight = target
    if isinstance(classes, int):
        assert features["class"].int64_list.value == [classes] and "labels" not in features
    else:
        # labels in place of class: a codelab reader asking for `class` fails loudly
        assert list(features["labels"].int64_list.value) == list(classes)
        assert "class" not in features
    assert ("weight" in features) == (weight is not None)
    values = parse.record_values(body)
    if weight is not None:
        assert values["weight"] == [weight]
    parsed = tf.io.parse_example([body], records.parse_features(records.LABELS, records.WEIGHT))
    assert parsed["weight"].numpy().tolist() == [1.0 if weight is None else weight]


def test_targets_come_back_from_json_as_they_went():
    import json

    for target in (3, records.Target((0, 2), None), records.Target(1, 0.5)):
        back = records.from_json(json.loads(json.dumps(target)))
        assert back == target
        assert records.classes_in(back) == records.classes_in(target)
    assert records.target_of(3, None, None) == 3  # the bytes of every older dataset
