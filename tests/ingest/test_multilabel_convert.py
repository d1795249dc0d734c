"""Converting a multi-label list end to end: the records, the manifest's label counts,
the stratified split, rejects, and the same bytes for the same inputs."""

from __future__ import annotations

import json

import numpy as np
from helpers import MULTI_LABELS, tree_bytes, write_multi_label_list

import chute
from chute.format import manifest as manifest_lib
from chute.format import parse


def _records(out, split):
    """Every record of ``split``, parsed in plain Python (``labels`` is a list)."""
    found = []
    for path in manifest_lib.load(out).shard_paths(split):
        with open(path, "rb") as handle:
            found += [parse.record_values(r) for r in parse.read_records(handle)]
    return found


def test_a_multi_label_list_converts_to_labels_records_and_label_counts(tmp_path):
    listed = write_multi_label_list(tmp_path / "src", 60)
    chute.convert(
        listed,
        tmp_path / "out",
        val_fraction=0.25,
        allow_empty_labels=True,
        weight_column="weight",
        workers=1,
    )
    manifest = manifest_lib.load(tmp_path / "out")
    body = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert body["version"] == 4 and body["label_mode"] == "multi" and body["weighted"]
    assert manifest.class_names == sorted(MULTI_LABELS)
    total = np.zeros(len(MULTI_LABELS), int)
    for split in ("train", "val"):
        records = _records(tmp_path / "out", split)
        assert len(records) == manifest.num_examples(split)
        counts = np.zeros(len(MULTI_LABELS), int)
        for record in records:
            assert "class" not in record
            labels = record["labels"]
            assert labels == sorted(set(labels))
            counts[labels] += 1
        assert counts.tolist() == list(manifest.split(split).class_counts)
        total += counts
    # the val split keeps every label's share of the whole, within an image or two
    expected = total * manifest.num_examples("val") / 60
    got = np.asarray(manifest.split("val").class_counts)
    assert np.all(np.abs(got - expected) <= 2), (got, expected)


def test_unlabelled_images_are_rejects_unless_allowed_and_bytes_repeat(tmp_path):
    listed = write_multi_label_list(tmp_path / "src", 40)
    chute.convert(listed, tmp_path / "strict", val_fraction=0.25, workers=1)
    strict = manifest_lib.load(tmp_path / "strict")
    reasons = {reject["reason"].split(" (")[0] for reject in strict.rejects}
    assert strict.rejects and all("no labels" in reason for reason in reasons), reasons
    assert strict.num_examples("train") + strict.num_examples("val") == 40 - len(strict.rejects)
    chute.convert(listed, tmp_path / "again", val_fraction=0.25, workers=1)
    first, second = tree_bytes(tmp_path / "strict"), tree_bytes(tmp_path / "again")
    shards = [name for name in first if name.endswith(".tfrecord")]
    assert shards and all(first[name] == second[name] for name in shards)
