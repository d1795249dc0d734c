"""Record indexes: written by conversion for every shard, named in the manifest, added to
an older dataset by `chute index`, checked by `chute verify`."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import uuid
from pathlib import Path

import pytest
from helpers import make_folder, run_here

import chute
from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import records, storage

TRAIN0 = "train-00000-of-00002.tfrecord"
VAL1 = "val-00001-of-00002.tfrecord"


@pytest.fixture
def dataset(shared_dataset: Path, tmp_path: Path) -> Path:
    """A copy of the shared dataset (3 classes, raw 12x10, 2 + 2 shards) to change."""
    return Path(shutil.copytree(shared_dataset, tmp_path / "out"))


def _shards(out: Path | str) -> list[dict]:
    manifest = chute.load_manifest(str(out))
    return [shard for split in manifest.splits.values() for shard in split["shards"]]


def _unindex(out: Path) -> None:
    """Makes ``out`` a dataset converted before chute wrote indexes: no files, no fields."""
    path = out / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    for split in body["splits"].values():
        for shard in split["shards"]:
            del shard["index"]
            (out / record_index.index_name(shard["file"])).unlink()
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# -- the format ------------------------------------------------------------------------------


def test_index_bytes_round_trip_and_have_the_documented_layout():
    index = record_index.RecordIndex.from_lengths([5, 0, 300])
    data = index.to_bytes()
    assert len(data) == record_index.size_for(3) == 32 + 3 * 16
    assert data[:8] == b"CHUTEIDX" and data[8:12] == (1).to_bytes(4, "little")
    assert int.from_bytes(data[16:24], "little") == 3
    assert int.from_bytes(data[24:32], "little") == index.shard_bytes == 5 + 0 + 300 + 3 * 16
    assert int.from_bytes(data[48:56], "little") == 21  # record 1 starts after 16 + 5 bytes
    assert record_index.RecordIndex.from_bytes(data) == index


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d[:20], "fewer than its 32-byte header"),
        (lambda d: b"NOTINDEX" + d[8:], "starts with"),
        (lambda d: d[:-1], "a 2-record index has 64"),
        (lambda d: d[:40] + (99).to_bytes(8, "little") + d[48:], "record 1 does not start"),
        (lambda d: d[:24] + (1).to_bytes(8, "little") + d[32:], "end at byte"),
    ],
)
def test_a_damaged_index_is_refused_naming_what_is_wrong(damage, message):
    data = record_index.RecordIndex.from_lengths([5, 7]).to_bytes()
    with pytest.raises(ChuteError, match=message):
        record_index.RecordIndex.from_bytes(damage(data), "x.index")


def test_an_index_of_a_newer_chute_asks_for_an_upgrade():
    data = bytearray(record_index.RecordIndex.from_lengths([1]).to_bytes())
    data[8:12] = (2).to_bytes(4, "little")
    with pytest.raises(ChuteError, match=r"newer chute.*upgrade chute"):
        record_index.RecordIndex.from_bytes(bytes(data), "x.index")


def test_scan_checks_every_crc_and_the_end_of_the_file():
    shard = b"".join(records.frame(bytes([i]) * (i * 50)) for i in range(5))
    digest = hashlib.sha256()
    found = record_index.scan(io.BytesIO(shard), digest=digest)
    assert found.lengths.tolist() == [0, 50, 100, 150, 200]
    assert (
        found.shard_bytes == len(shard) and digest.hexdigest() == hashlib.sha256(shard).hexdigest()
    )
    damaged = bytearray(shard)
    damaged[int(found.offsets[3]) + 20] ^= 1
    with pytest.raises(ChuteError, match="CRC of record 3 at byte"):
        record_index.scan(io.BytesIO(bytes(damaged)), where="s")
    with pytest.raises(ChuteError, match="truncated: record 4"):
        record_index.scan(io.BytesIO(shard[:-3]), where="s")


# -- written by conversion -------------------------------------------------------------------


def test_conversion_writes_an_index_per_shard_named_in_the_manifest(shared_dataset):
    import tensorflow as tf

    shards = _shards(shared_dataset)
    assert len(shards) == 4
    for shard in shards:
        assert shard["index"]["file"] == shard["file"].replace(".tfrecord", ".index")
        data = (shared_dataset / shard["index"]["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["index"]["sha256"]
        index = record_index.RecordIndex.from_bytes(data)
        assert len(index) == shard["num_records"] and index.shard_bytes == shard["bytes"]
        # Each offset and length is where a sequential TFRecord reader finds that record.
        raw = (shared_dataset / shard["file"]).read_bytes()
        sequential = [
            r.numpy() for r in tf.data.TFRecordDataset(str(shared_dataset / shard["file"]))
        ]
        spans = zip(index.offsets.tolist(), index.lengths.tolist(), strict=True)
        at = [raw[o + 12 : o + 12 + n] for o, n in spans]
        assert at == sequential


def test_a_finished_conversion_holds_one_index_per_shard_and_no_partial_one(shared_dataset):
    names = {p.name for p in shared_dataset.iterdir()}
    indexes = {p for p in names if p.endswith(".index")}
    assert indexes == {record_index.index_name(s["file"]) for s in _shards(shared_dataset)}
    assert not any("partial" in name or name.endswith(".tmp") for name in names)


def test_a_resumed_conversion_writes_a_shard_again_when_its_index_is_gone(tmp_path, monkeypatch):
    from chute.ingest import writer
    from chute.ingest.writer import ShardWriter

    src = make_folder(tmp_path / "src", {"a": 8, "b": 8})
    reference = tmp_path / "reference"
    chute.convert(src, reference, val_fraction=0.25, min_shards=2, workers=1)
    out, calls = tmp_path / "out", []
    real = ShardWriter.write

    def crash_on_third(self, framed, labels):
        calls.append(self.path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(self, framed, labels)

    with monkeypatch.context() as patch:
        patch.setattr(ShardWriter, "write", crash_on_third)
        with pytest.raises(KeyboardInterrupt):
            chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    (out / record_index.index_name(TRAIN0)).unlink()  # its shard and note are there
    assert writer.load_note(str(out), TRAIN0) is None
    result = chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    assert result.resumed_shards == 1  # train-00001 kept; train-00000 written again
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        p.name: p.read_bytes() for p in reference.iterdir()
    }


# -- chute index -------------------------------------------------------------------------------


def test_chute_index_recreates_the_indexes_and_manifest_conversion_wrote(dataset):
    before = {p.name: p.read_bytes() for p in dataset.iterdir()}
    _unindex(dataset)
    report = chute.index(dataset)
    assert report.written == [s["file"] for s in _shards(dataset)] and report.num_shards == 4
    assert not report.already_indexed
    assert {p.name: p.read_bytes() for p in dataset.iterdir()} == before  # byte for byte
    assert chute.verify(dataset).ok


def test_chute_index_leaves_an_indexed_dataset_alone_and_says_so(dataset):
    manifest = dataset / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    assert chute.index(dataset).already_indexed
    done = run_here("index", dataset, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "already has the record indexes of its 4 shard(s): nothing to do" in done.stdout
    assert manifest.stat().st_mtime_ns == stamp


def test_cli_index_adds_indexes_then_verify_checks_them(dataset):
    _unindex(dataset)
    checked = run_here("verify", dataset, "--no-progress")
    assert checked.returncode == 0, checked.stderr
    assert "4 shard(s) have no record index" in checked.stdout and "chute index" in checked.stdout
    done = run_here("index", dataset, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "indexed 4 of 4 shard(s)" in done.stdout
    checked = run_here("verify", dataset, "--no-progress")
    assert checked.returncode == 0 and "no record index" not in checked.stdout
    assert chute.verify(dataset).num_indexes == 4


def test_chute_index_writes_again_an_index_that_was_deleted_or_changed(dataset):
    before = (dataset / record_index.index_name(VAL1)).read_bytes()
    (dataset / record_index.index_name(VAL1)).unlink()
    _flip(dataset / record_index.index_name(TRAIN0), 40)
    assert chute.index(dataset).written == [TRAIN0, VAL1]
    assert (dataset / record_index.index_name(VAL1)).read_bytes() == before
    assert chute.verify(dataset).ok


def test_chute_index_refuses_a_corrupt_shard_and_leaves_the_manifest(dataset):
    _unindex(dataset)
    manifest = (dataset / "manifest.json").read_bytes()
    shard = dataset / VAL1
    _flip(shard, shard.stat().st_size - 10)  # inside the last record's data
    with pytest.raises(ChuteError, match=f"Shard {VAL1} .* is corrupt: the CRC of record"):
        chute.index(dataset)
    assert (dataset / "manifest.json").read_bytes() == manifest
    done = run_here("index", dataset, "--no-progress")
    assert done.returncode == 2 and "chute index: error: Shard" in done.stderr


def test_chute_index_refuses_a_shard_that_is_not_the_manifests(dataset):
    _unindex(dataset)
    shard = dataset / TRAIN0
    shard.write_bytes(shard.read_bytes() + records.frame(b"one more"))  # well framed
    with pytest.raises(ChuteError, match=f"{TRAIN0} .* differs from the manifest"):
        chute.index(dataset)
    (dataset / TRAIN0).unlink()
    with pytest.raises(ChuteError, match=f"{TRAIN0} .* is missing"):
        chute.index(dataset)
    with pytest.raises(ChuteError, match=r"No manifest\.json"):
        chute.index(dataset / "nothing-here")


def test_chute_index_on_a_tensorflow_filesystem(dataset):
    import tensorflow as tf

    expected = {p.name: p.read_bytes() for p in dataset.iterdir()}
    _unindex(dataset)
    out = f"ram://chute-index-{uuid.uuid4().hex}/out"
    tf.io.gfile.makedirs(out)
    for path in dataset.iterdir():
        tf.io.gfile.copy(str(path), f"{out}/{path.name}")
    assert chute.index(out).written and chute.index(out).already_indexed
    for name, data in expected.items():
        assert storage.read_bytes(f"{out}/{name}") == data, name
    data = bytearray(storage.read_bytes(f"{out}/{record_index.index_name(VAL1)}"))
    data[-1] ^= 1
    storage.write_atomic(f"{out}/{record_index.index_name(VAL1)}", bytes(data))
    report = chute.verify(out)
    assert {shard for shard, _ in report.problems} == {VAL1}


# -- chute verify ------------------------------------------------------------------------------


def test_verify_names_a_tampered_index(dataset):
    _flip(dataset / record_index.index_name(TRAIN0), 45)  # in record 0's length
    report = chute.verify(dataset)
    assert {shard for shard, _ in report.problems} == {TRAIN0}
    text = " ".join(problem for _, problem in report.problems)
    assert "sha256 differs from the manifest" in text and "record index" in text
    done = run_here("verify", dataset, "--no-progress")
    assert done.returncode == 1 and f"BAD {TRAIN0}: record index" in done.stderr


def test_verify_names_a_missing_index(dataset):
    (dataset / record_index.index_name(VAL1)).unlink()
    report = chute.verify(dataset)
    assert report.problems == [
        (
            VAL1,
            f"record index missing: {VAL1[:-9]}.index is not there (run `chute index` to write it)",
        )
    ]


def test_verify_names_an_index_that_does_not_match_the_records_even_with_its_sha256(dataset):
    """An index of another shard, with the manifest edited to its sha256: only reading the
    records shows it is wrong."""
    wrong = record_index.RecordIndex.from_lengths([100, 60, 61])  # 3 records, other lengths
    target = _shards(dataset)[0]
    lengths = [int(v) for v in wrong.lengths]
    lengths[-1] += target["bytes"] - wrong.shard_bytes  # the same total size, so it parses
    data = record_index.RecordIndex.from_lengths(lengths).to_bytes()
    (dataset / target["index"]["file"]).write_bytes(data)
    path = dataset / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    body["splits"]["train"]["shards"][0]["index"]["sha256"] = hashlib.sha256(data).hexdigest()
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")
    report = chute.verify(dataset)
    assert [shard for shard, _ in report.problems] == [target["file"]]
    assert "does not match the shard's records" in report.problems[0][1]


def test_a_manifest_naming_an_index_outside_the_dataset_is_refused(dataset):
    path = dataset / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    body["splits"]["val"]["shards"][1]["index"]["file"] = "../elsewhere.index"
    path.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(ChuteError, match=r"splits\.val\.shards\[1\]\.index\.file"):
        chute.load_manifest(dataset)
