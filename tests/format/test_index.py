"""Record indexes: written by conversion for every shard, named in the manifest, added to
an older dataset by `chute index`, checked by `chute verify`."""

from __future__ import annotations

import collections
import fnmatch
import glob
import hashlib
import io
import json
import logging
import shutil
import uuid
from pathlib import Path

import pytest
from helpers import all_records, codelab_read_tfrecord, colour_jpegs, make_folder, run_here

import chute
from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import records, storage

TRAIN0 = "train-00000-of-00002.tfrecord"
VAL1 = "val-00001-of-00002.tfrecord"
# How readers with no chute code find a split's shards (TFDS-style names, the codelab's
# list_files, a recursive glob): each must find shards and nothing else.
SHARD_GLOBS = ("train-*", "train*", "*train*", "*-of-*", "*.tfrecord", "**/*.tfrecord")


@pytest.fixture
def dataset(shared_dataset: Path, tmp_path: Path) -> Path:
    """A copy of the shared dataset (3 classes, raw 12x10, 2 + 2 shards) to change."""
    return Path(shutil.copytree(shared_dataset, tmp_path / "out"))


def _index(out: Path, shard_file: str) -> Path:
    """Where conversion writes the record index of ``shard_file``: ``OUT/index/``."""
    return out / record_index.FOLDER / record_index.index_name(shard_file)


def _files(out: Path) -> dict[str, bytes]:
    """Every file under ``out``, by its path relative to ``out``."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


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
            _index(out, shard["file"]).unlink()
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")


def _old_layout(out: Path) -> None:
    """Makes ``out`` a dataset as chute wrote it before the ``index/`` folder: each index
    beside its shard (the manifest names an index by its file name in both layouts)."""
    for path in (out / record_index.FOLDER).iterdir():
        path.rename(out / path.name)
    (out / record_index.FOLDER).rmdir()


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
        data = (shared_dataset / "index" / shard["index"]["file"]).read_bytes()
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
    names = set(_files(shared_dataset))
    indexes = {p for p in names if p.endswith(".index")}
    assert indexes == {
        f"index/{record_index.index_name(s['file'])}" for s in _shards(shared_dataset)
    }
    assert not any("partial" in name or name.endswith(".tmp") for name in names)


def _interrupted_at_the_third_shard(tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """``(src, reference, out)``: a conversion of ``src`` into ``out`` killed while writing
    its third shard, and the same conversion uninterrupted in ``reference``."""
    from chute.ingest.writer import ShardWriter

    src = make_folder(tmp_path / "src", {"a": 8, "b": 8})
    reference = tmp_path / "reference"
    chute.convert(src, reference, val_fraction=0.25, min_shards=2, workers=1)
    out, calls = tmp_path / "out", []
    real = ShardWriter.write

    def crash_on_third(self, framed, labels, **given):
        calls.append(self.path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(self, framed, labels, **given)

    with monkeypatch.context() as patch:
        patch.setattr(ShardWriter, "write", crash_on_third)
        with pytest.raises(KeyboardInterrupt):
            chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    return src, reference, out


def test_a_resumed_conversion_writes_a_shard_again_when_its_index_is_gone(tmp_path, monkeypatch):
    from chute.ingest import writer

    src, reference, out = _interrupted_at_the_third_shard(tmp_path, monkeypatch)
    _index(out, TRAIN0).unlink()  # its shard and note are there
    assert writer.load_note(str(out), TRAIN0) is None
    result = chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    assert result.resumed_shards == 1  # train-00001 kept; train-00000 written again
    assert _files(out) == _files(reference)


@pytest.mark.parametrize(
    "damage",
    [
        lambda note: note.update(sha256="x"),
        lambda note: note.update(bytes="12"),
        lambda note: note.pop("num_records"),
        lambda note: note.update(index=None),
        lambda note: note.pop("digests"),  # a note as an older chute wrote it
    ],
)
def test_a_damaged_shard_note_has_that_shard_written_again(tmp_path, damage):
    import base64

    from chute.ingest import writer

    with writer.ShardWriter(str(tmp_path / TRAIN0)) as shard:
        shard.write(records.frame(b"r") * 2, [0, 1])
    note = Path(writer.note_path(str(tmp_path), TRAIN0))
    note.parent.mkdir()
    # The shard's entry, and what became of each of its records (as write_shard notes it).
    info = dict(shard.info, digests=base64.b64encode(bytes(64)).decode(), missing=[], fates={})
    note.write_text(json.dumps(info))
    assert writer.load_note(str(tmp_path), TRAIN0) == info
    damaged = dict(info)
    damage(damaged)
    note.write_text(json.dumps(damaged))
    assert writer.load_note(str(tmp_path), TRAIN0) is None


def test_a_note_cut_short_by_a_crash_has_its_shard_written_again(tmp_path):
    # Notes are not synced before their rename: a power cut may leave one empty or cut.
    from chute.ingest import writer

    with writer.ShardWriter(str(tmp_path / TRAIN0)) as shard:
        shard.write(records.frame(b"r"), [0])
    note = Path(writer.note_path(str(tmp_path), TRAIN0))
    note.parent.mkdir()
    for damaged in (b"", json.dumps(shard.info).encode()[:40], bytes(100)):
        note.write_bytes(damaged)
        assert writer.load_note(str(tmp_path), TRAIN0) is None


# -- the dataset folder under shard globs -------------------------------------------------------


def test_every_usual_shard_glob_finds_only_shards(shared_dataset):
    import tensorflow as tf

    shards = {s["file"] for s in _shards(shared_dataset)}
    for pattern in SHARD_GLOBS:
        expected = {name for name in shards if fnmatch.fnmatch(name, pattern.split("/")[-1])}
        assert expected, pattern  # the pattern does find this dataset's shards
        found = glob.glob(str(shared_dataset / pattern), recursive=True)
        assert {Path(p).name for p in found} == expected, pattern
        assert {Path(p).name for p in tf.io.gfile.glob(str(shared_dataset / pattern))} <= shards
    manifest = chute.load_manifest(shared_dataset)
    for pattern, splits in (("/train*", ["train"]), ("/*-of-*", ["train", "val"])):
        files = tf.data.Dataset.list_files(str(shared_dataset) + pattern, shuffle=False)
        count = sum(1 for _ in tf.data.TFRecordDataset(files))  # no DataLossError
        assert count == sum(manifest.num_examples(split) for split in splits), pattern


def test_the_codelab_reader_over_list_files_reads_every_training_record(tmp_path):
    """The "Keras on TPU" codelab's reader over ``list_files(OUT + "/train*")``."""
    import tensorflow as tf

    colour_jpegs(tmp_path / "src", per_class=4)
    out = str(tmp_path / "out")
    manifest = chute.convert(
        tmp_path / "src", out, image_size=16, encoding="jpeg", val_fraction=0.25, workers=1
    ).manifest

    read_tfrecord = codelab_read_tfrecord([16, 16])

    filenames = tf.data.Dataset.list_files(out + "/train*")
    dataset = tf.data.TFRecordDataset(filenames, num_parallel_reads=tf.data.AUTOTUNE)
    dataset = dataset.map(read_tfrecord, num_parallel_calls=tf.data.AUTOTUNE)
    seen = collections.Counter(int(label) for _, label in dataset.as_numpy_iterator())
    assert [seen[label] for label in range(3)] == manifest.splits["train"]["class_counts"]


def test_an_overwritten_conversion_leaves_only_its_own_indexes(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 8, "b": 8})
    out = tmp_path / "out"
    chute.convert(src, out, min_shards=2, workers=1)
    manifest = chute.convert(src, out, min_shards=3, overwrite=True, workers=1).manifest
    names = {s["index"]["file"] for s in manifest.splits["train"]["shards"]}
    assert {p.name for p in (out / record_index.FOLDER).iterdir()} == names
    assert len(names) == 3 and all("-of-00003" in name for name in names)


# -- datasets written before the index folder -------------------------------------------------


def test_an_old_layout_dataset_is_read_then_moved_by_chute_index(dataset, caplog):
    expected, shards = _files(dataset), [s["file"] for s in _shards(dataset)]
    _old_layout(dataset)
    train = [name for name in shards if name.startswith("train-")]
    assert len(glob.glob(str(dataset / "train-*"))) == 2 * len(train)  # the globs' trouble
    with caplog.at_level(logging.WARNING, logger="chute"):
        source = chute.grain_source(dataset, "train")
        assert [source[i]["key"] for i in range(len(source))] == [
            r["key"] for r in all_records(dataset, "train")
        ]
    assert f"`chute index {dataset}` moves them into index/" in caplog.text
    report = chute.verify(dataset)
    assert report.ok and report.num_indexes == report.old_layout_indexes == len(shards)
    checked = run_here("verify", dataset, "--no-progress")
    assert checked.returncode == 0 and "`chute index" in checked.stdout, checked.stdout

    report = chute.index(dataset)
    assert report.moved == shards and report.written == []
    assert not report.already_indexed
    assert _files(dataset) == expected  # byte for byte what conversion writes now
    for pattern in SHARD_GLOBS:
        found = glob.glob(str(dataset / pattern), recursive=True)
        assert found and all(name.endswith(".tfrecord") for name in found), pattern
    assert chute.index(dataset).already_indexed
    assert chute.verify(dataset).old_layout_indexes == 0


def test_cli_index_says_it_moved_old_layout_indexes(dataset):
    shards = [s["file"] for s in _shards(dataset)]
    _old_layout(dataset)
    (dataset / record_index.index_name(shards[-1])).unlink()  # one to write as well
    done = run_here("index", dataset, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert f"moved {len(shards) - 1} record index(es)" in done.stdout
    assert "into its index/ folder" in done.stdout
    assert f"indexed 1 of {len(shards)} shard(s)" in done.stdout
    assert not list(dataset.glob("*.index"))
    assert len(list(dataset.glob("index/*.index"))) == len(shards)
    assert chute.verify(dataset).ok


def test_chute_index_on_an_old_layout_on_a_tensorflow_filesystem(dataset):
    expected = _files(dataset)
    _old_layout(dataset)
    out = f"ram://chute-old-layout-{uuid.uuid4().hex}/out"
    for name, data in _files(dataset).items():
        storage.write_atomic(f"{out}/{name}", data)
    assert len(chute.grain_source(out, "val")) == 6
    assert len(chute.index(out).moved) == len(_shards(dataset))
    for name, data in expected.items():
        assert storage.read_bytes(f"{out}/{name}") == data, name
    assert not storage.glob(f"{out}/*.index")


def test_a_conversion_resumed_over_old_layout_indexes_writes_the_new_layout(tmp_path, monkeypatch):
    """A conversion an older chute started (indexes beside the shards) ends like a fresh
    one: its shards are written again with their indexes in index/, none left beside."""
    src, reference, out = _interrupted_at_the_third_shard(tmp_path, monkeypatch)
    _old_layout(out)
    chute.convert(src, out, val_fraction=0.25, min_shards=2, workers=1)
    assert _files(out) == _files(reference)


# -- chute index -------------------------------------------------------------------------------


def test_chute_index_recreates_the_indexes_and_manifest_conversion_wrote(dataset):
    before = _files(dataset)
    _unindex(dataset)
    report = chute.index(dataset)
    assert report.written == [s["file"] for s in _shards(dataset)] and report.num_shards == 4
    assert not report.already_indexed
    assert _files(dataset) == before  # byte for byte
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
    before = _index(dataset, VAL1).read_bytes()
    _index(dataset, VAL1).unlink()
    _flip(_index(dataset, TRAIN0), 40)
    assert chute.index(dataset).written == [TRAIN0, VAL1]
    assert _index(dataset, VAL1).read_bytes() == before
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

    expected = _files(dataset)
    _unindex(dataset)
    out = f"ram://chute-index-{uuid.uuid4().hex}/out"
    tf.io.gfile.makedirs(out)
    for name, data in _files(dataset).items():
        storage.write_atomic(f"{out}/{name}", data)
    assert chute.index(out).written and chute.index(out).already_indexed
    for name, data in expected.items():
        assert storage.read_bytes(f"{out}/{name}") == data, name
    data = bytearray(storage.read_bytes(f"{out}/index/{record_index.index_name(VAL1)}"))
    data[-1] ^= 1
    storage.write_atomic(f"{out}/index/{record_index.index_name(VAL1)}", bytes(data))
    report = chute.verify(out)
    assert {shard for shard, _ in report.problems} == {VAL1}


# -- chute verify ------------------------------------------------------------------------------


def test_verify_names_a_tampered_index(dataset):
    _flip(_index(dataset, TRAIN0), 45)  # in record 0's length
    report = chute.verify(dataset)
    assert {shard for shard, _ in report.problems} == {TRAIN0}
    text = " ".join(problem for _, problem in report.problems)
    assert "sha256 differs from the manifest" in text and "record index" in text
    done = run_here("verify", dataset, "--no-progress")
    assert done.returncode == 1 and f"BAD {TRAIN0}: record index" in done.stderr


def test_verify_names_a_missing_index(dataset):
    _index(dataset, VAL1).unlink()
    report = chute.verify(dataset)
    assert report.problems == [
        (
            VAL1,
            f"record index missing: index/{VAL1[:-9]}.index is not there "
            "(run `chute index` to write it)",
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
    (dataset / "index" / target["index"]["file"]).write_bytes(data)
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
