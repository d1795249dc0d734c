"""Hand-built tf.train.Example + TFRecord framing must be what TensorFlow reads and writes."""

from __future__ import annotations

import pytest
import tensorflow as tf
from helpers import tf_example

from chute.format import records


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
