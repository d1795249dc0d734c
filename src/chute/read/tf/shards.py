"""One shard read as blocks of ``(images, labels)``, checked as it is read.

Each block of up to 256 records is parsed with one vectorised
``parse_example`` and checked in the same call: raw images must have the
manifest's length (and, read at their stored size, are decoded there with one
``decode_raw``), PNG and JPEG ones its signature (they leave as bytes, for the
per-image decoder).
Per-record steps on serialized records cost more than parsing them, so there
are none. A shard that fails its CRC, is truncated or is missing ends early;
an empty block marks each shard's end, where the records read are compared
with the count the manifest expects. Either problem raises an error naming
the shard, or, with ``skip_corrupt``, is dropped and counted.

Example:
    >>> blocks = shard_blocks(plan, names, expected, None)(0, -1)  # doctest: +SKIP
"""

from __future__ import annotations

from chute.format import records
from chute.lazy import tf
from chute.read.tf.plan import BLOCK, ReadPlan

SIGNATURES = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8"}
_GLOB = r"([*?\[\]\\])"  # characters tf.io.matching_files treats as a pattern


def shard_blocks(plan: ReadPlan, names, expected, corrupt):
    """``(file index, draw) -> blocks of (images, labels)`` of one shard, for ``interleave``.

    Args:
        plan: the read plan (how images are stored).
        names: the shards' paths (a string tensor).
        expected: each shard's record count (an int64 tensor).
        corrupt: an int64 variable of one count per shard, or None to raise instead:
            each reading of a shard raises its count to the records it lost (damaged or
            missing) if that is more, so a shard read by several class streams, or
            several times an epoch, counts once.

    ``draw`` is a random int64 in training (blocks of 128-256 records, a new
    size per shard and epoch, so block boundaries move), -1 otherwise (blocks
    of 256).
    """
    # Parsed a block at a time: per-record steps on serialized records cost more than parsing.
    label = records.LABELS if plan.multi_label else records.CLASS
    weight = (records.WEIGHT,) if plan.weights else ()
    features = records.parse_features(records.IMAGE, label, *weight)
    stored = plan.stored
    if stored.encoding == "raw":
        shape = [-1, *stored.shape]
        problem = "have raw images of the wrong length"
    else:
        signature = SIGNATURES[stored.encoding]
        problem = f"are not {stored.encoding.upper()} images"

    def read(file_index, draw):
        path, want = tf.gather(names, file_index), tf.gather(expected, file_index)
        # 128 to 256 records, new per shard and epoch, so block boundaries move between epochs.
        size = tf.where(
            draw < 0, tf.constant(BLOCK, tf.int64), BLOCK // 2 + draw % (BLOCK // 2 + 1)
        )

        def check_block(state, block):
            seen, skipped = state
            read_now = tf.size(block, out_type=tf.int64)
            parsed = tf.io.parse_example(block, features)
            data, labels = parsed[records.IMAGE], targets(plan, parsed)
            if stored.encoding == "raw":
                ok = tf.equal(tf.strings.length(data), shape[1] * shape[2] * shape[3])
            else:
                ok = tf.equal(tf.strings.substr(data, 0, len(signature)), signature)
            at_end = tf.equal(read_now, 0)
            if corrupt is not None:
                # Only at the shard's end is the shortfall known: a truncated shard just stops.
                lost = tf.where(at_end, tf.maximum(want - seen, 0), tf.constant(0, tf.int64))
                skipped += tf.reduce_sum(tf.cast(tf.logical_not(ok), tf.int64))
                count = tf.IndexedSlices(
                    tf.reshape(skipped + lost, [1]), tf.reshape(file_index, [1])
                )
                # scatter_max, not add: a shard read several times an epoch counts its losses once.
                checks = [corrupt.scatter_max(count)]
                data, labels = tf.boolean_mask(data, ok), tf.boolean_mask(labels, ok)
            else:
                checks = [
                    _check(tf.logical_or(tf.logical_not(at_end), tf.equal(seen, want)),
                           ["chute: shard", path, "is corrupt, truncated or missing: read", seen,
                            "of", want, "records. Run `chute verify`, or pass skip_corrupt=True"]),
                    _check(tf.reduce_all(ok),
                           ["chute: records in shard", path, problem,
                            "(run `chute verify`, or pass skip_corrupt=True)"]),
                ]  # fmt: skip
            with tf.control_dependencies(checks):
                if stored.encoding == "raw" and not plan.per_image:
                    # After the checks: a wrong-length record would fail here with a worse message.
                    data = tf.reshape(tf.io.decode_raw(data, tf.uint8), shape)
                # tf.identity inside the dependencies: the checks run before the block leaves.
                return (seen + read_now, skipped), (tf.identity(data), labels)

        # A missing shard reads as empty: TensorFlow's reader would retry opening it
        # forever under ignore_errors. (A glob pattern matching exactly the path.)
        exists = tf.size(tf.io.matching_files(tf.strings.regex_replace(path, _GLOB, r"\\\1")))
        found = tf.data.TFRecordDataset(path).take(
            tf.where(exists > 0, tf.constant(-1, tf.int64), 0)
        )
        # A bad record ends the shard (ignore_errors); the count at the end tells.
        blocks = found.ignore_errors().batch(size)
        end = tf.data.Dataset.from_tensors(tf.constant([], tf.string))  # marks the shard's end
        start = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))  # records read, skipped
        return blocks.concatenate(end).scan(start, check_block)

    return read


def targets(plan: ReadPlan, parsed: dict):
    """A block's labels as one tensor a record: the class (int64, as ever); with sample
    weights, float32 rows of the class and then the weight; for a multi-label dataset,
    uint8 rows of the labels' bits (:func:`packed_width` bytes) and then the weight's
    four bytes (one tensor, so every later step that gathers, shuffles, caches or batches
    labels carries them unchanged; :func:`.finish.labelled` unpacks them)."""
    if plan.multi_label:
        # A bit a label, 8 to a byte: a float32 a label would make each record's row 40 KB
        # for 10,000 labels (4 GB in the RAM cache and the shuffle buffer for 100,000 images).
        width = packed_width(plan.num_classes)
        bits = tf.sparse.to_indicator(parsed[records.LABELS], width * 8)
        bits = tf.reshape(tf.cast(bits, tf.int32), (-1, width, 8))
        labels = tf.cast(tf.reduce_sum(bits * _BIT_VALUES, axis=-1), tf.uint8)
        if plan.weights:  # the float32 weight's own bytes
            weight = tf.bitcast(tf.cast(parsed[records.WEIGHT], tf.float32), tf.uint8)
            labels = tf.concat([labels, weight], axis=1)
        return labels
    else:
        labels = parsed[records.CLASS]
        if not plan.weights:
            return labels
        labels = tf.cast(labels[:, None], tf.float32)  # exact: class indices < 2**24
    if plan.weights:
        labels = tf.concat([labels, parsed[records.WEIGHT][:, None]], axis=1)
    return labels


_BIT_VALUES = (128, 64, 32, 16, 8, 4, 2, 1)  # the bits of a byte, the first label highest


def packed_width(num_labels: int) -> int:
    """The bytes of a multi-label record's packed label bits (8 labels a byte).

    Example:
        >>> packed_width(10_000), packed_width(9)
        (1250, 2)
    """
    return -(-num_labels // 8)


def unpacked(rows, num_labels: int):
    """Packed label bytes (``(batch, packed_width)`` uint8) as ``(batch, num_labels)``
    float32 0/1 rows: what :func:`targets` packed."""
    masks = tf.constant(_BIT_VALUES, tf.uint8)
    bits = tf.bitwise.bitwise_and(tf.expand_dims(rows, -1), masks) > 0
    bits = tf.reshape(bits, (-1, packed_width(num_labels) * 8))[:, :num_labels]
    return tf.cast(bits, tf.float32)


def _check(condition, message):
    """An assertion op raising InvalidArgumentError with ``message`` when ``condition`` is false.

    The plain op: ``tf.debugging.Assert`` wraps string messages in a ``tf.cond``.
    """
    return tf.raw_ops.Assert(condition=condition, data=message, summarize=3)
