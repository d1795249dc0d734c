"""Reading a multi-label dataset with sample weights: multi-hot labels and each record's
weight on both engines, the same totals as the manifest and the list, and the label
modes and options such a dataset cannot give refused by name."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import chute
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib

ENGINES = ("tf", "grain")


def _read(data, split, engine, **options):
    extra = {"workers": 0} if engine == "grain" else {}
    return chute.load(data, split, batch_size=8, engine=engine, **extra, **options)


def _list_rows(data):
    source = manifest_lib.load(data).source["location"]
    with open(source, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("engine", ENGINES)
def test_evaluation_reads_each_images_labels_once_as_multi_hot_rows(multi_label_data, engine):
    manifest = manifest_lib.load(multi_label_data)
    assert manifest.multi_label and manifest.weighted
    for split in ("train", "val"):
        totals = np.zeros(manifest.num_classes)
        seen = 0
        for _, labels in _read(multi_label_data, split, engine, training=False):
            labels = np.asarray(labels)
            assert labels.dtype == np.float32 and labels.shape[1:] == (manifest.num_classes,)
            assert set(np.unique(labels)) <= {0.0, 1.0}
            totals += labels.sum(0)
            seen += len(labels)
        # the manifest counts the images carrying each label
        assert totals.tolist() == list(manifest.split(split).class_counts)
        assert seen == manifest.num_examples(split)


@pytest.mark.parametrize("engine", ENGINES)
def test_training_batches_carry_each_records_weight(multi_label_data, engine):
    manifest = manifest_lib.load(multi_label_data)
    batch = next(iter(_read(multi_label_data, "train", engine, seed=3)))
    images, labels, weights = (np.asarray(part) for part in batch)
    assert images.shape == (8, 16, 16, 3) and labels.shape == (8, manifest.num_classes)
    assert weights.dtype == np.float32 and set(weights) <= {1.0, 2.0, 3.0}
    # every weight of the list, read once each: their sum is the list's
    total = sum(
        float(np.asarray(batch[2]).sum())
        for split in ("train", "val")
        for batch in _read(multi_label_data, split, engine, training=False, sample_weights=True)
    )
    assert total == sum(float(row["weight"]) for row in _list_rows(multi_label_data))


def test_both_engines_give_an_image_the_same_labels(multi_label_data):
    tf_batches = list(_read(multi_label_data, "val", "tf", training=False))
    grain_batches = list(_read(multi_label_data, "val", "grain", training=False))
    for (tf_images, tf_labels), (g_images, g_labels) in zip(tf_batches, grain_batches, strict=True):
        np.testing.assert_array_equal(np.asarray(tf_images), np.asarray(g_images))
        np.testing.assert_array_equal(np.asarray(tf_labels), np.asarray(g_labels))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"label_mode": "int"},
            r"is multi-label .*`label_mode` must be 'multi_hot'.*label_mode='int'",
        ),
        ({"label_mode": "categorical"}, r"label_mode='categorical'"),
        ({"sampling": "balanced"}, r"`sampling` draws by class.*positive-weights"),
        (
            {"sample_weights": True, "pad_final_batch": True, "training": False},
            r"`sample_weights=True` cannot be combined with pad_final_batch=True",
        ),
    ],
)
def test_what_a_multi_label_dataset_cannot_give_is_refused(multi_label_data, options, message):
    with pytest.raises(ChuteError, match=message):
        chute.load(multi_label_data, "train", batch_size=8, **options)


def test_a_single_label_dataset_refuses_multi_hot_and_weights(shared_dataset):
    with pytest.raises(ChuteError, match=r"needs a multi-label dataset.*'categorical'"):
        chute.load(shared_dataset, "train", batch_size=4, label_mode="multi_hot")
    with pytest.raises(ChuteError, match=r"needs a dataset converted with a weight column"):
        chute.load(shared_dataset, "train", batch_size=4, sample_weights=True)
    # mixing needs one-hot labels: the default label mode resolves to int here
    with pytest.raises(ChuteError, match=r"needs label_mode='categorical'.*label_mode='auto'"):
        chute.load(shared_dataset, "train", batch_size=4, augment=["mixup"])
    # and reads as it always did: integer labels, no weights
    _, labels = next(iter(chute.load(shared_dataset, "train", batch_size=4)))
    assert np.asarray(labels).dtype == np.int32


def test_host_augmentation_and_a_disk_cache_keep_the_weights_apart(multi_label_data, tmp_path):
    # a Keras layer on the host transforms the images: labels and weights go on unchanged
    batch = next(iter(chute.load(multi_label_data, "train", batch_size=8, augment=["contrast"],
                                 augment_on="host", seed=1)))  # fmt: skip
    assert len(batch) == 3 and set(np.asarray(batch[2])) <= {1.0, 2.0, 3.0}
    # rows with and without weights are two caches, never one file read as the other
    cache = f"disk:{tmp_path}"
    for weights in (True, False, True):
        ds = chute.load(multi_label_data, "train", batch_size=8, cache=cache,
                        sample_weights=weights, seed=1)  # fmt: skip
        assert all(len(batch) == (3 if weights else 2) for batch in ds)


@pytest.mark.parametrize("weights", [False, True])
def test_label_rows_travel_packed_8_labels_a_byte_and_unpack_exactly(weights):
    """A float32 a label would make each cached, shuffled record's row 40 KB for 10,000
    labels (4 GB for 100,000 images): rows travel as bits, the weight as its own 4 bytes,
    and come out of the batch as the exact 0/1 rows and weights."""
    import types

    import tensorflow as tf

    from chute.format import records
    from chute.read.tf import shards
    from chute.read.tf.finish import labelled

    num_labels, lists = 10_001, [[0, 7, 8, 10_000], [], [5000]]
    indices = [[row, label] for row, labels in enumerate(lists) for label in labels]
    parsed = {
        records.LABELS: tf.sparse.SparseTensor(indices, [label for _, label in indices], (3, 5)),
        records.WEIGHT: tf.constant([0.5, 2.0, 1e-3], tf.float32),
    }
    plan = types.SimpleNamespace(multi_label=True, num_classes=num_labels, weights=weights,
                                 label_mode="categorical", shape=(2, 2, 1))  # fmt: skip
    rows = shards.targets(plan, parsed)
    assert rows.dtype == tf.uint8 and rows.shape == (3, 1251 + 4 * weights)
    out = labelled(plan, tf.zeros((3, 2, 2, 1), tf.uint8), rows)
    expected = np.zeros((3, num_labels), np.float32)
    for row, labels in enumerate(lists):
        expected[row, labels] = 1
    np.testing.assert_array_equal(out[1].numpy(), expected)
    if weights:
        np.testing.assert_array_equal(out[2].numpy(), np.float32([0.5, 2.0, 1e-3]))  # exact
