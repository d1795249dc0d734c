"""chute.verify and `chute verify`: a good dataset passes; each kind of damage is named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import make_folder, run_here

import chute
from chute.errors import ChuteError
from chute.format import records

TRAIN0 = "train-00000-of-00002.tfrecord"
VAL1 = "val-00001-of-00002.tfrecord"


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A freshly converted dataset (tests damage it): 3 classes, raw 12x10, 2+2 shards."""
    src = make_folder(tmp_path / "src", {"a": 10, "b": 8, "c": 6})
    out = tmp_path / "out"
    chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    return out


def _edit_manifest(out: Path, edit) -> None:
    path = out / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    edit(body)
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")


def _shard_entry(body: dict, file: str) -> dict:
    return next(
        s for split in body["splits"].values() for s in split["shards"] if s["file"] == file
    )


def _replace_shard(out: Path, file: str, framed: bytes) -> None:
    """Writes a well-framed shard and updates its bytes and sha256 (not its counts)."""
    (out / file).write_bytes(framed)

    def edit(body):
        entry = _shard_entry(body, file)
        entry["bytes"] = len(framed)
        entry["sha256"] = hashlib.sha256(framed).hexdigest()

    _edit_manifest(out, edit)


def _bad_files(report) -> set[str]:
    return {shard for shard, _ in report.problems}


def test_verify_passes_a_good_dataset(dataset):
    report = chute.verify(dataset)
    assert report.ok and report.problems == []
    assert report.num_shards == 4 and report.num_records == 24
    assert report.location == str(dataset)
    assert chute.verify(dataset / "manifest.json").ok  # the manifest file works too


def test_truncated_shard_is_named(dataset):
    path = dataset / TRAIN0
    path.write_bytes(path.read_bytes()[:-10])
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {TRAIN0}
    text = " ".join(problem for _, problem in report.problems)
    assert "truncated" in text or "size" in text


def test_flipped_byte_is_named(dataset):
    path = dataset / TRAIN0
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {TRAIN0}
    assert any("sha256" in problem for _, problem in report.problems)


def test_missing_shard_is_named(dataset):
    (dataset / VAL1).unlink()
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {VAL1}
    assert any("missing" in problem for _, problem in report.problems)


def test_tampered_shard_record_count_is_named(dataset):
    _edit_manifest(dataset, lambda body: _shard_entry(body, TRAIN0).__setitem__("num_records", 10))
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {TRAIN0}
    assert any("10" in problem and "records" in problem for _, problem in report.problems)


def test_tampered_split_size_is_caught(dataset):
    # num_examples is what readers trust for step counts; it must agree with the shards.
    def edit(body):
        body["splits"]["train"]["num_examples"] += 1

    _edit_manifest(dataset, edit)
    report = chute.verify(dataset)
    assert not report.ok, report


def test_tampered_class_counts_are_named(dataset):
    def edit(body):
        stored = _shard_entry(body, VAL1)["class_counts"]  # sparse: classes held, counts
        dense = [0] * len(body["class_names"])
        for label, count in zip(stored["classes"], stored["counts"], strict=True):
            dense[label] = count
        i = stored["classes"][0]  # move one record to another class
        dense[i] -= 1
        dense[(i + 1) % len(dense)] += 1
        held = [label for label, count in enumerate(dense) if count]
        stored.update(classes=held, counts=[dense[label] for label in held])

    _edit_manifest(dataset, edit)
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {VAL1}


def _record(label: int, size=(12, 10)) -> bytes:
    h, w = size
    return records.image_example(
        image=bytes(h * w), label=label, height=h, width=w, channels=1, encoding="raw", key="x"
    )


def test_label_out_of_range_is_named(dataset):
    manifest = chute.load_manifest(dataset)
    count = manifest.splits["val"]["shards"][1]["num_records"]
    _replace_shard(dataset, VAL1, _record(0) * (count - 1) + _record(3))
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {VAL1}
    assert any("label 3" in problem for _, problem in report.problems)


def test_image_off_the_spec_is_named(dataset):
    manifest = chute.load_manifest(dataset)
    count = manifest.splits["val"]["shards"][1]["num_records"]
    _replace_shard(dataset, VAL1, _record(0) * (count - 1) + _record(0, size=(5, 5)))
    report = chute.verify(dataset)
    assert not report.ok
    assert _bad_files(report) == {VAL1}
    assert any("spec" in problem for _, problem in report.problems)


def test_cli_verify_exit_codes(dataset):
    good = run_here("verify", dataset, "--no-progress")
    assert good.returncode == 0, good.stderr
    assert "ok" in good.stdout and "Traceback" not in good.stderr

    path = dataset / TRAIN0
    path.write_bytes(path.read_bytes()[:-10])
    bad = run_here("verify", dataset, "--no-progress")
    assert bad.returncode == 1
    assert TRAIN0 in bad.stderr
    assert VAL1 not in bad.stderr
    assert "Traceback" not in bad.stderr


def test_verify_without_a_manifest(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(ChuteError, match=r"manifest\.json"):
        chute.verify(empty)
    done = run_here("verify", empty, "--no-progress")
    assert done.returncode == 2
    assert "manifest.json" in done.stderr and str(empty) in done.stderr
    assert "Traceback" not in done.stderr


def test_verify_a_manifest_that_is_not_json(dataset):
    (dataset / "manifest.json").write_text("{not json")
    with pytest.raises(ChuteError, match="JSON"):
        chute.verify(dataset)


def test_verify_on_a_tf_filesystem_downloads_each_shard_once(tmp_path, monkeypatch):
    from chute.format import storage
    from chute.tools import verify as verification

    src = make_folder(tmp_path / "src", {"a": 10, "b": 8, "c": 6})
    out = f"ram://verify-{tmp_path.name}"
    chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    read_from = []
    real_read = verification._read_records

    def spy(path, manifest):
        read_from.append(path)
        return real_read(path, manifest)

    monkeypatch.setattr(verification, "_read_records", spy)
    report = chute.verify(out)
    assert report.ok and report.num_records == 24
    # The records come from the local copy made while hashing, not from ram:// again.
    assert len(read_from) == 4 and all(storage.is_local(p) for p in read_from)
    assert not any(Path(p).exists() for p in read_from)  # the copies are gone

    path = f"{out}/{TRAIN0}"
    data = bytearray(storage.read_bytes(path))
    data[len(data) // 2] ^= 0xFF
    storage.write_atomic(path, bytes(data))
    report = chute.verify(out)
    assert _bad_files(report) == {TRAIN0}
    assert any("sha256" in problem for _, problem in report.problems)


def test_a_version_2_manifest_with_dense_shard_counts_still_verifies(dataset):
    """Datasets converted before per-shard counts went sparse keep working."""

    def to_version_2(body):
        body["version"] = 2
        for split in body["splits"].values():
            for shard in split["shards"]:
                stored, dense = shard["class_counts"], [0] * len(body["class_names"])
                for label, count in zip(stored["classes"], stored["counts"], strict=True):
                    dense[label] = count
                shard["class_counts"] = dense

    _edit_manifest(dataset, to_version_2)
    assert chute.verify(dataset).ok
    assert chute.load_manifest(dataset).num_examples("val") == 6

    def move_one(body):
        dense = _shard_entry(body, VAL1)["class_counts"]
        i = next(i for i, n in enumerate(dense) if n)
        dense[i] -= 1
        dense[(i + 1) % len(dense)] += 1

    _edit_manifest(dataset, move_one)
    assert _bad_files(chute.verify(dataset)) == {VAL1}


@pytest.fixture
def long_shard(tmp_path: Path) -> tuple[Path, str, list[int]]:
    """A dataset whose one training shard holds 40 records: ``(OUT, shard, offsets)``, the
    byte offset of each record's frame (from its record index)."""
    from chute.format import index as record_index

    src = make_folder(tmp_path / "src", {"a": 20, "b": 20})
    out = tmp_path / "out"
    shard = chute.convert(src, out, min_shards=1, workers=1).manifest.splits["train"]["shards"][0]
    assert shard["num_records"] == 40
    data = (out / record_index.FOLDER / shard["index"]["file"]).read_bytes()
    offsets = record_index.RecordIndex.from_bytes(data).offsets.tolist()
    return out, shard["file"], offsets


def _problem(out: Path) -> str:
    report = chute.verify(out)
    assert not report.ok
    return " ".join(problem for _, problem in report.problems)


def test_a_byte_flipped_in_record_31_names_record_31_and_its_byte(long_shard):
    out, name, offsets = long_shard
    path = out / name
    data = bytearray(path.read_bytes())
    data[offsets[31] + 30] ^= 0xFF  # inside record 31's data
    path.write_bytes(bytes(data))
    text = _problem(out)
    assert f"the CRC of record 31 at byte {offsets[31]} is wrong" in text, text
    assert "about 0" not in text
    done = run_here("verify", out, "--no-progress")
    assert done.returncode == 1 and f"record 31 at byte {offsets[31]}" in done.stderr


def test_a_shard_truncated_near_its_end_names_the_last_record(long_shard):
    out, name, offsets = long_shard
    path = out / name
    path.write_bytes(path.read_bytes()[:-10])
    text = _problem(out)
    assert f"truncated: record 39 at byte {offsets[39]} is cut short" in text, text


def test_a_record_that_does_not_parse_is_named_by_its_number(long_shard):
    out, name, _ = long_shard
    _replace_shard(out, name, _record(0) * 31 + records.frame(b"not an Example") + _record(1) * 8)
    text = _problem(out)
    assert "record 31 does not parse or decode" in text, text


def test_a_local_split_is_read_in_one_pass_and_a_damaged_shard_in_it_is_named(
    many_shards, tmp_path, monkeypatch
):
    """96 small shards: a tf.data pass a shard cost more than its records (ImageNet's
    shape took 88 s), so a local split is read in one pass; a damaged shard in the middle
    stops it, is named alone, and the shards after it are still checked."""
    import shutil

    from chute.tools import verify as verification

    out = Path(shutil.copytree(many_shards, tmp_path / "out"))
    alone = []
    real_read = verification._read_records

    def spy(path, manifest):
        alone.append(Path(path).name)
        return real_read(path, manifest)

    monkeypatch.setattr(verification, "_read_records", spy)
    report = chute.verify(out)
    assert report.ok and report.num_records == 240 and alone == []  # no shard read alone
    damaged = "train-00040-of-00096.tfrecord"
    data = bytearray((out / damaged).read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a record: its CRC no longer holds
    (out / damaged).write_bytes(bytes(data))
    report = chute.verify(out)
    assert _bad_files(report) == {damaged}
    assert any("CRC" in problem or "corrupt" in problem for _, problem in report.problems)
    # read alone: from the last shard seen whole up to the damaged one; then one pass again
    assert alone[-1] == damaged and all(name <= damaged for name in alone)
    assert report.num_shards == 96 + 48 and report.num_records >= 240 - 2
