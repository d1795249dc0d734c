"""``chute convert --append``: new images as the dataset's next version, never rewriting a
shard; the dataset's options, classes and images kept (copies skipped and counted);
stratified placement; resumable after kills; locked; versions read back as they were."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import kill_after, make_folder, run_here, tree_bytes, write_multi_label_list

import chute
from chute.errors import ChuteError
from chute.format import contents
from chute.ingest import lock, resume
from chute.ingest.writer import ShardWriter

BASE = {"cat": 20, "dog": 20}


class Crash(Exception):
    pass


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """Version 1: cats and dogs, 20 each, a fifth of each class in val."""
    out = tmp_path / "out"
    chute.convert(make_folder(tmp_path / "v1", BASE), out, workers=1, val_fraction=0.2)
    return out


def _new(tmp_path: Path, classes: dict[str, int], seed: int = 1, name: str = "v2") -> Path:
    return make_folder(tmp_path / name, classes, seed=seed)


def _stored(out: Path) -> dict[str, bytes]:
    """What a version wrote besides the manifest (which holds its time): shards,
    indexes, hashes, rejects, the source listing."""
    return {name: data for name, data in tree_bytes(out).items() if name != "manifest.json"}


def _without_times(manifest: dict) -> dict:
    for entry in manifest.get("versions", []):
        entry.pop("created", None)
    return manifest


def test_an_append_adds_shards_and_classes_and_never_rewrites_a_shard(dataset, tmp_path):
    before = tree_bytes(dataset)
    first = chute.load_manifest(dataset)
    result = chute.convert(_new(tmp_path, {"dog": 10, "eel": 10}), dataset, append=True, workers=1)
    manifest = result.manifest
    assert manifest.version == 2 and manifest.class_names == ["cat", "dog", "eel"]
    after = tree_bytes(dataset)
    for name, data in before.items():  # every shard and index of version 1, as it was
        if name.endswith((".tfrecord", ".index")):
            assert after[name] == data, name
    new = [s.name for split in manifest.splits.values() for s in split.shards if s.version == 2]
    assert new and all("-v0002-" in name for name in new)
    # Stratified as the first conversion: a fifth of each new class's images in val.
    assert manifest.versions[1]["added"] == {"train": 16, "val": 4}
    assert manifest.splits["train"].class_counts == (16, 24, 8)
    assert manifest.splits["val"].class_counts == (4, 6, 2)
    assert manifest.versions[1]["copies_skipped"] == 0 and manifest.versions[1]["num_classes"] == 3
    # Version 1 reads back as it was: its shards, its classes, its counts.
    old = chute.load_manifest(dataset).at_version(1)
    assert old.class_names == first.class_names and old.splits == first.splits
    assert old.splits["train"].fingerprint() == first.splits["train"].fingerprint()
    assert chute.verify(dataset).ok
    listed = chute.inspect(dataset)
    assert "versions: 2" in listed and "v2: train +16, val +4" in listed


def test_copies_of_the_datasets_images_are_skipped_and_counted(dataset, tmp_path):
    # The same five cats (seed 0, class 0) and three foxes the dataset does not have.
    new = make_folder(tmp_path / "v2", {"cat": 5})
    make_folder(tmp_path / "foxes", {"fox": 3}, seed=7)
    (tmp_path / "foxes" / "fox").rename(new / "fox")
    manifest = chute.convert(new, dataset, append=True, workers=1).manifest
    entry = manifest.versions[1]
    assert entry["copies_skipped"] == 5
    assert sum(entry["added"].values()) == 3 and manifest.class_names[-1] == "fox"
    assert len(contents.read(str(dataset), 2)) == 3  # what this version kept
    # The same cats again are found in version 1's hashes: nothing new, no version 3.
    again = chute.convert(make_folder(tmp_path / "v3", {"cat": 5}), dataset, append=True,
                          workers=1)  # fmt: skip
    assert again.already_done and again.manifest.version == 2
    # Its shards held nothing: neither left in the folder nor named in the manifest.
    assert not list(dataset.glob("*-v0003-*")) and not list(dataset.glob("index/*-v0003-*"))
    assert not (dataset / "hashes" / "v0003.sha256").exists()
    assert chute.verify(dataset).ok


def test_a_presplit_source_keeps_its_splits_and_a_rerun_appends_nothing(dataset, tmp_path):
    new = tmp_path / "v2"
    make_folder(new / "train", {"dog": 6}, seed=3)
    make_folder(new / "val", {"dog": 2}, seed=4)
    first = chute.convert(new, dataset, append=True, workers=1)
    assert first.manifest.versions[1]["added"] == {"train": 6, "val": 2}
    again = chute.convert(new, dataset, append=True, workers=1)
    assert again.already_done and again.manifest.version == 2
    # The source of version 1 itself: already there.
    assert chute.convert(tmp_path / "v1", dataset, append=True, workers=1).already_done


def test_what_an_append_cannot_do_is_refused_before_anything_is_written(dataset, tmp_path):
    new = _new(tmp_path, {"eel": 5})
    before = tree_bytes(dataset)
    with pytest.raises(ChuteError, match=r"image_size=\[5, 5\] \(the dataset's: \[12, 10\]\)"):
        chute.convert(new, dataset, append=True, image_size=5)
    with pytest.raises(ChuteError, match="pass one of them"):
        chute.convert(new, dataset, append=True, overwrite=True)
    with pytest.raises(ChuteError, match="there is none in"):
        chute.convert(new, tmp_path / "nothing", append=True)
    labels = write_multi_label_list(tmp_path / "multi", count=20)
    with pytest.raises(ChuteError, match="multi-label images and the dataset single-label"):
        chute.convert(labels, dataset, append=True, workers=1)
    assert tree_bytes(dataset) == before
    done = run_here("convert", new, dataset, "--append", "--seed", "7")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "seed=7 (the dataset's: 1337)" in done.stderr, done.stderr
    assert tree_bytes(dataset) == before


def test_an_append_is_locked_against_another_writer(dataset, tmp_path):
    holder = {"pid": 1, "host": socket.gethostname() + "-elsewhere", "since": "earlier"}
    (dataset / lock.LOCK_NAME).write_text(json.dumps(holder))
    with pytest.raises(ChuteError, match="Another chute convert is writing into `output`"):
        chute.convert(_new(tmp_path, {"eel": 5}), dataset, append=True, workers=1)
    assert chute.load_manifest(dataset).version == 1


@pytest.mark.slow  # two appends in processes of their own, started together
def test_two_appends_racing_leave_both_versions_whole(dataset, tmp_path):
    """Two live ``chute convert --append`` processes into one dataset: each either appends
    or, while the other holds the lock, is refused naming it (exit 2, nothing written);
    a refused one run again appends. The dataset ends at version 3 with both sources'
    images, verified, no lock or work left."""
    sources = [_new(tmp_path, {"eel": 30}, name="eels"), _new(tmp_path, {"fox": 30}, 2, "foxes")]
    racing = [subprocess.Popen(_append_cmd(src, dataset), stderr=subprocess.PIPE, text=True)
              for src in sources]  # fmt: skip
    for process, src in zip(racing, sources, strict=True):
        _, err = process.communicate(timeout=240)
        assert process.returncode in (0, 2), err
        if process.returncode == 2:  # the other held the lock: refused before any write
            assert "Another chute convert is writing into `output`" in err, err
            assert "Traceback" not in err
            again = subprocess.run(_append_cmd(src, dataset), capture_output=True, text=True)
            assert again.returncode == 0, again.stderr
    manifest = chute.load_manifest(dataset)
    assert manifest.version == 3 and manifest.class_names[:2] == ["cat", "dog"]
    assert sorted(manifest.class_names[2:]) == ["eel", "fox"]  # in the order they landed
    assert manifest.num_examples("train") + manifest.num_examples("val") == 40 + 60
    assert chute.verify(dataset).ok
    assert not (dataset / lock.LOCK_NAME).exists() and not (dataset / resume.WORK_DIR).exists()


def _crash_on_write(monkeypatch, calls: list, crash_at: int) -> None:
    real = ShardWriter.write

    def write(self, framed, labels, **given):
        calls.append(self.path)
        real(self, framed, labels, **given)
        if len(calls) == crash_at:
            raise Crash(f"simulated kill after write #{crash_at}")

    monkeypatch.setattr(ShardWriter, "write", write)


def test_an_append_killed_twice_resumes_to_the_same_bytes(dataset, tmp_path, monkeypatch):
    new = _new(tmp_path, {"dog": 30, "eel": 30})
    reference = tmp_path / "reference"
    reference_base = tree_bytes(dataset)
    chute.convert(tmp_path / "v1", reference, workers=1, val_fraction=0.2)
    chute.convert(new, reference, append=True, workers=1, min_shards=6)
    calls: list = []
    for crash_at in (2, 4):  # two kills, each after another shard
        with monkeypatch.context() as patch:
            calls.clear()
            _crash_on_write(patch, calls, crash_at)
            with pytest.raises(Crash):
                chute.convert(new, dataset, append=True, workers=1, min_shards=6)
        # A reader still sees version 1, whole: the manifest is replaced last.
        assert chute.load_manifest(dataset).version == 1
        assert (dataset / resume.WORK_DIR).is_dir()
        for name, data in reference_base.items():
            if name.endswith(".tfrecord"):
                assert (dataset / name).read_bytes() == data
    result = chute.convert(new, dataset, append=True, workers=1, min_shards=6)
    assert result.resumed_shards >= 3
    assert _stored(dataset) == _stored(reference)
    written = _without_times(json.loads((dataset / "manifest.json").read_text()))
    assert written == _without_times(json.loads((reference / "manifest.json").read_text()))
    assert not (dataset / resume.WORK_DIR).exists()


def test_a_version_reads_back_the_same_records(dataset, tmp_path):
    pytest.importorskip("tensorflow")

    def labels(version=None) -> list:
        batches = chute.load(dataset, "train", version=version, batch_size=8, training=False,
                             cache=None)  # fmt: skip
        return [int(v) for _, y in batches for v in y.numpy()]

    first = labels()
    chute.convert(_new(tmp_path, {"eel": 10}), dataset, append=True, workers=1)
    assert labels(version=1) == first
    assert sorted(labels()) == sorted(first + [2] * 8)
    with pytest.raises(ChuteError, match="`version` must be a version from 1 to 2"):
        chute.load(dataset, "train", version=3)


def test_a_training_run_is_not_resumed_on_a_newer_version(dataset, tmp_path, monkeypatch):
    from chute.fit import train as training

    class Stop(Exception):
        pass

    fast = {"model": "kannada-cnn", "batch_size": 8, "epochs": 1, "strategy": "cpu"}
    run = tmp_path / "run"
    with monkeypatch.context() as patch:  # started.json written, then stopped before training
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(Stop()))
        with pytest.raises(Stop):
            chute.train(dataset, run, **fast)
    assert json.loads((run / "started.json").read_text())["dataset_version"] == 1
    (run / "backup").mkdir()  # killed mid-run
    chute.convert(_new(tmp_path, {"dog": 10}), dataset, append=True, workers=1)
    with pytest.raises(ChuteError) as refused:
        chute.train(dataset, run, **fast)
    assert "the run reads version 2 of the dataset and started on version 1" in str(refused.value)
    assert "--dataset-version 1 resumes it there" in str(refused.value)
    with monkeypatch.context() as patch:  # on the version it started with: resumed
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(Stop()))
        with pytest.raises(Stop):
            chute.train(dataset, run, dataset_version=1, **fast)
    assert (run / "backup").is_dir()


def test_an_append_into_a_bucket(s3_endpoint, tmp_path):
    """On S3 (moto on 127.0.0.1): the new shards go beside the old, the manifest is
    replaced last (one PUT), and version 1 still reads as it was."""
    from object_stores import new_s3_bucket

    from chute.format import storage

    out = new_s3_bucket(s3_endpoint) + "/out"
    first = chute.convert(make_folder(tmp_path / "v1", BASE), out, workers=1, val_fraction=0.2)
    old = {
        s.name: storage.read_bytes(f"{out}/{s.name}") for s in first.manifest.splits["train"].shards
    }
    manifest = chute.convert(_new(tmp_path, {"eel": 10}), out, append=True, workers=1).manifest
    assert manifest.version == 2 and manifest.class_names == ["cat", "dog", "eel"]
    assert all(storage.read_bytes(f"{out}/{name}") == data for name, data in old.items())
    assert chute.load_manifest(out).at_version(1).splits == first.manifest.splits
    assert storage.exists(contents.path(out, 2)) and chute.verify(out).ok


def _append_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "chute", "convert", str(src), str(out), "--append",
            "--workers", "1", "--min-shards", "12", "--no-progress"]  # fmt: skip


def _notes(out: Path) -> int:
    return len(list((out / resume.WORK_DIR).glob("*.tfrecord.json")))


def _kill_after(src: Path, out: Path, notes: int) -> int:
    """Kills the CLI's append once more than ``notes`` shards are done (helpers.kill_after)."""
    finished = lambda: chute.load_manifest(out).version == 2  # noqa: E731
    return kill_after(_append_cmd(src, out), lambda: _notes(out), finished, notes)


@pytest.mark.slow  # appends in processes, two of them killed with SIGKILL
def test_an_append_killed_with_sigkill_twice_resumes_to_the_same_bytes(dataset, tmp_path):
    new = make_folder(tmp_path / "many", {"dog": 600, "eel": 600}, size=(8, 8), seed=2)
    before = tree_bytes(dataset)
    first = _kill_after(new, dataset, 0)
    second = _kill_after(new, dataset, first) if first else 0
    if not (first and second and second < 12):
        pytest.skip("the append finished before it could be killed twice")
    # Between the kills a reader saw version 1 whole: its manifest and shards as they were.
    assert chute.load_manifest(dataset).version == 1
    assert all(tree_bytes(dataset)[name] == data for name, data in before.items()
               if name.endswith((".tfrecord", ".index", ".json")))  # fmt: skip
    rerun = subprocess.run(_append_cmd(new, dataset), capture_output=True, text=True,
                           timeout=240)  # fmt: skip
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    assert "resumed:" in rerun.stdout and "version 2:" in rerun.stdout, rerun.stdout
    reference = tmp_path / "reference"
    chute.convert(tmp_path / "v1", reference, workers=1, val_fraction=0.2)
    chute.convert(new, reference, append=True, workers=1, min_shards=12)
    assert _stored(dataset) == _stored(reference)
    written = _without_times(json.loads((dataset / "manifest.json").read_text()))
    assert written == _without_times(json.loads((reference / "manifest.json").read_text()))
    assert chute.verify(dataset).ok


def test_what_the_review_found_stays_mended(dataset, tmp_path):
    """A failed append leaves the dataset's rejects.csv; an append of nothing new adds no
    version; numbered classes are not matched against named ones; a dataset whose source
    came split may carve val from an append; a dataset_version out of range is named."""
    rejects = (dataset / "rejects.csv").read_bytes()
    # A list naming one file twice (a reject) and a new class only in val: refused.
    images = _new(tmp_path, {"dog": 3, "eel": 1}, name="listed")
    rows = ["path,label,split", "dog/000.png,dog,train", "dog/000.png,dog,train",
            "eel/000.png,eel,val"]  # fmt: skip
    (images / "list.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(ChuteError, match="'eel'"):
        chute.convert(images / "list.csv", dataset, append=True, workers=1)
    assert (dataset / "rejects.csv").read_bytes() == rejects
    # Every image a copy: no version 2, nothing left behind.
    copies = chute.convert(make_folder(tmp_path / "same", {"cat": 4}), dataset, append=True)
    assert copies.already_done and chute.load_manifest(dataset).version == 1
    assert not list(dataset.glob("*-v0002-*")) and not (dataset / resume.WORK_DIR).exists()
    # Arrays without class names number their classes: no match for cats and dogs.
    np.savez(tmp_path / "numbered.npz", x=np.zeros((4, 10, 12), np.uint8), y=[0, 1, 0, 1])
    with pytest.raises(ChuteError, match="save the class names with the arrays"):
        chute.convert(tmp_path / "numbered.npz", dataset, append=True, workers=1)
    with pytest.raises(ChuteError, match="`dataset_version` must be a version from 1 to 1"):
        chute.train(dataset, tmp_path / "run", dataset_version=2, model="kannada-cnn")


def test_a_dataset_whose_source_came_split_may_carve_val_from_an_append(tmp_path):
    src = tmp_path / "v1"
    make_folder(src / "train", {"cat": 8})
    make_folder(src / "val", {"cat": 2}, seed=9)
    out = tmp_path / "out"
    chute.convert(src, out, workers=1)
    carved = chute.convert(_new(tmp_path, {"cat": 10}), out, append=True, val_fraction=0.2,
                           workers=1).manifest  # fmt: skip
    assert carved.versions[1]["added"] == {"train": 8, "val": 2}


def test_the_first_conversion_run_again_removes_a_killed_appends_shards(
    dataset, tmp_path, monkeypatch
):
    new = _new(tmp_path, {"dog": 30, "eel": 30})
    with monkeypatch.context() as patch:
        _crash_on_write(patch, [], 3)
        with pytest.raises(Crash):
            chute.convert(new, dataset, append=True, workers=1, min_shards=6)
    assert list(dataset.glob("*-v0002-*"))  # written, and named by no manifest
    again = chute.convert(tmp_path / "v1", dataset, workers=1, val_fraction=0.2)
    assert again.already_done and again.manifest.version == 1
    assert not list(dataset.glob("*-v0002-*")) and not list(dataset.glob("index/*-v0002-*"))
    assert not (dataset / resume.WORK_DIR).exists() and chute.verify(dataset).ok
