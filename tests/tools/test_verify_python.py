"""chute verify without TensorFlow: the damage tests of test_verify.py run again on the
plain-Python record checker (frames, Example parsing, OpenCV decoding) that verify uses
where TensorFlow is not installed; each must name the same shard, record and byte."""

from __future__ import annotations

import pytest
from helpers import make_folder
from tools.test_verify import (  # noqa: F401  (fixtures and tests, collected here again)
    _replace_shard,
    dataset,
    long_shard,
    test_a_byte_flipped_in_record_31_names_record_31_and_its_byte,
    test_a_record_that_does_not_parse_is_named_by_its_number,
    test_a_shard_truncated_near_its_end_names_the_last_record,
    test_flipped_byte_is_named,
    test_image_off_the_spec_is_named,
    test_label_out_of_range_is_named,
    test_tampered_class_counts_are_named,
    test_tampered_shard_record_count_is_named,
    test_truncated_shard_is_named,
    test_verify_passes_a_good_dataset,
)

import chute
from chute.format import records
from chute.tools import verify as verify_lib


@pytest.fixture(autouse=True)
def _without_tensorflow(monkeypatch):
    monkeypatch.setattr(verify_lib, "installed", lambda name: name != "tensorflow")
    monkeypatch.setattr(verify_lib, "tf", None)  # any use of TensorFlow fails the test


def test_a_jpeg_dataset_verifies_and_a_broken_jpeg_is_named(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3}, mode="RGB")
    out = tmp_path / "out"
    shard = chute.convert(src, out, encoding="jpeg", min_shards=1, workers=1).manifest
    assert chute.verify(out).ok
    name = shard.splits["train"]["shards"][0]["file"]
    broken = records.image_example(image=b"\xff\xd8 not a jpeg", label=0, height=12, width=10,
                                   channels=3, encoding="jpeg", key="x")  # fmt: skip
    _replace_shard(out, name, broken)
    report = chute.verify(out)
    assert any("record 0 does not parse or decode" in p for _, p in report.problems), report
