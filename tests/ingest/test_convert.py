"""chute.convert and `chute convert`: manifest, shards, split, determinism, formats, errors."""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    COLOURS,
    all_records,
    codelab_read_tfrecord,
    colour_jpegs,
    decode,
    make_folder,
    read_records,
    run_cli,
    run_here,
    tree_bytes,
    write_image,
)
from PIL import Image

import chute
from chute.errors import ChuteError

SHARD_RE = re.compile(r"^(train|val|test)-(\d{5})-of-(\d{5})\.tfrecord$")


def _keys(out, split: str) -> list[str]:
    return [r["key"] for r in all_records(out, split)]


def _npz(path: Path, count: int, *, classes: int = 4, size=(4, 4)) -> Path:
    """A .npz source of ``count`` distinct tiny grayscale images (fast to make and convert)."""
    rng = np.random.default_rng(count)
    x = rng.integers(0, 256, size=(count, *size), dtype=np.uint8)
    x[:, 0, 0] = np.arange(count) % 256  # distinct even for tiny sizes
    x[:, 0, 1] = np.arange(count) // 256
    y = np.arange(count) % classes
    np.savez(path, x=x, y=y)
    return path


# -- the manifest ---------------------------------------------------------------------------


def test_manifest_describes_classes_spec_splits_and_shards(folder, tmp_path):
    out = tmp_path / "out"
    result = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    manifest = chute.load_manifest(out)
    assert result.manifest == manifest
    assert result.output == str(out)
    assert not result.already_done and result.resumed_shards == 0

    assert manifest.class_names == ["a", "b", "c"]
    assert manifest.image == chute.ImageSpec(height=12, width=10, channels=1, encoding="raw")
    assert manifest.num_examples("train") == 18 and manifest.num_examples("val") == 6
    assert result.num_written == {"train": 18, "val": 6}
    assert sorted(manifest.splits) == ["train", "val"]

    sizes = {"a": 10, "b": 8, "c": 6}
    for split in manifest.splits.values():
        assert len(split["shards"]) == 2
        assert sum(s["num_records"] for s in split["shards"]) == split["num_examples"]
        per_shard = [manifest.shard_class_counts(s) for s in split["shards"]]
        summed = [sum(col) for col in zip(*per_shard, strict=True)]
        assert summed == split["class_counts"]
        assert sum(split["class_counts"]) == split["num_examples"]
        for shard in split["shards"]:
            path = out / shard["file"]
            data = path.read_bytes()
            assert shard["bytes"] == len(data)
            assert shard["sha256"] == hashlib.sha256(data).hexdigest()
            records = read_records(path)
            assert shard["num_records"] == len(records)
            counts = collections.Counter(r["class"] for r in records)
            held = sorted(counts)  # stored sparse: the classes this shard holds
            assert shard["class_counts"] == {"classes": held, "counts": [counts[i] for i in held]}
            assert manifest.shard_class_counts(shard) == [counts[i] for i in range(3)]
            for record in records:  # the label is the key's class folder
                assert record["class"] == manifest.class_names.index(record["key"].split("/")[0])
                assert record["size"] == (12, 10) and record["channels"] == 1
                assert record["encoding"] == "raw"
    # every source image is in exactly one split
    keys = _keys(out, "train") + _keys(out, "val")
    assert sorted(keys) == sorted(f"{c}/{i:03d}.png" for c, n in sizes.items() for i in range(n))
    assert manifest.splits["train"]["class_counts"] == [
        n - v for n, v in zip(sizes.values(), manifest.splits["val"]["class_counts"], strict=True)
    ]

    assert manifest.options == chute.ConvertOptions(val_fraction=0.25, min_shards=2).to_dict()
    assert manifest.options["val_fraction"] == 0.25 and manifest.options["min_shards"] == 2
    assert manifest.source["location"] == str(folder)
    assert manifest.source["kind"] == "folder"
    assert manifest.source["num_items"] == 24
    assert re.fullmatch(r"[0-9a-f]{64}", manifest.source["fingerprint"])
    assert manifest.created_by == f"chute {chute.__version__}"
    assert manifest.rejects == [] and manifest.duplicates == []

    body = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert body["format"] == "chute.manifest" and body["version"] == 3
    assert body["class_names"] == ["a", "b", "c"]
    assert (out / "rejects.csv").read_text().splitlines() == ["key,reason"]
    assert not (out / ".chute-work").exists()


def test_source_fingerprint_follows_the_content(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    first = chute.convert(src, tmp_path / "o1", workers=1).manifest.source["fingerprint"]
    write_image(src / "a" / "001.png", seed=999)  # same name, other pixels
    second = chute.convert(src, tmp_path / "o2", workers=1).manifest.source["fingerprint"]
    assert first != second


def test_shard_file_names_carry_split_index_and_count(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 12, "b": 12, "c": 12})
    out = tmp_path / "out"
    manifest = chute.convert(
        src, out, val_fraction=0.25, test_fraction=0.25, min_shards=3, workers=1
    ).manifest
    expected = set()
    for name, split in manifest.splits.items():
        files = [s["file"] for s in split["shards"]]
        count = len(files)
        assert files == [f"{name}-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
        for i, file in enumerate(files):
            match = SHARD_RE.match(file)
            assert match and match[1] == name and int(match[2]) == i and int(match[3]) == count
        expected.update(files)
    assert sorted(manifest.splits) == ["test", "train", "val"]
    assert {p.name for p in out.glob("*.tfrecord")} == expected
    assert {p.name for p in out.iterdir()} == expected | {
        "index",  # the record indexes, out of the shards' globs
        "hashes",  # the images' content hashes, for an append's copies
        "manifest.json",
        "rejects.csv",
        "source-files.csv",
    }
    assert {p.name for p in (out / "index").iterdir()} == {
        f[: -len(".tfrecord")] + ".index" for f in expected
    }
    assert [p.name for p in (out / "hashes").iterdir()] == ["v0001.sha256"]
    assert (out / "hashes" / "v0001.sha256").stat().st_size == 32 * 36


# -- the split ------------------------------------------------------------------------------


def test_stratified_split_has_exact_counts_and_no_overlap(tmp_path):
    sizes = {"a": 20, "b": 10, "c": 7}
    src = make_folder(tmp_path / "src", sizes)
    out = tmp_path / "out"
    manifest = chute.convert(src, out, val_fraction=0.2, test_fraction=0.1, workers=1).manifest
    total = sum(sizes.values())
    assert manifest.num_examples("val") == round(total * 0.2)
    assert manifest.num_examples("test") == round(total * 0.1)
    assert manifest.num_examples("train") == total - round(total * 0.2) - round(total * 0.1)
    for split, fraction in (("val", 0.2), ("test", 0.1)):
        for n, got in zip(sizes.values(), manifest.splits[split]["class_counts"], strict=True):
            assert math.floor(n * fraction) <= got <= math.ceil(n * fraction), (split, n, got)
    assert all(c >= 1 for c in manifest.splits["train"]["class_counts"])
    keys = {s: set(_keys(out, s)) for s in ("train", "val", "test")}
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"]
    assert not keys["val"] & keys["test"]
    assert sum(len(k) for k in keys.values()) == total


@pytest.mark.parametrize(
    ("sizes", "val", "test"),
    [({"a": 1, "b": 6}, 0.5, 0.0), ({"a": 2, "b": 6}, 0.5, 0.4), ({"a": 1, "b": 1}, 0.5, 0.0)],
)
def test_every_class_keeps_a_training_image(tmp_path, sizes, val, test):
    src = make_folder(tmp_path / "src", sizes)
    out = tmp_path / "out"
    manifest = chute.convert(src, out, val_fraction=val, test_fraction=test, workers=1).manifest
    assert all(c >= 1 for c in manifest.splits["train"]["class_counts"])
    assert manifest.splits["train"]["class_counts"][0] == 1  # the smallest class
    kept = sum(manifest.num_examples(s) for s in ("train", "val", "test"))
    assert kept == sum(sizes.values())


def test_same_seed_same_split_other_seed_other_split(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 10, "b": 10, "c": 10})

    def run(name: str, seed: int) -> Path:
        out = tmp_path / name
        chute.convert(src, out, val_fraction=0.3, seed=seed, workers=1)
        return out

    one, again, other = run("one", 1), run("again", 1), run("other", 2)
    assert tree_bytes(one) == tree_bytes(again)
    assert set(_keys(one, "val")) == set(_keys(again, "val"))
    assert set(_keys(one, "val")) != set(_keys(other, "val"))
    assert chute.load_manifest(other).options["seed"] == 2
    assert len(_keys(other, "val")) == len(_keys(one, "val")) == 9


# -- shard count and size -------------------------------------------------------------------


def test_min_shards_is_honoured_with_near_equal_shards(folder, tmp_path):
    manifest = chute.convert(folder, tmp_path / "out", min_shards=5, workers=1).manifest
    counts = [s["num_records"] for s in manifest.splits["train"]["shards"]]
    assert len(counts) == 5 and sum(counts) == 24
    assert max(counts) - min(counts) <= 1


def test_never_more_shards_than_records(folder, tmp_path):
    manifest = chute.convert(folder, tmp_path / "out", min_shards=100, workers=1).manifest
    counts = [s["num_records"] for s in manifest.splits["train"]["shards"]]
    assert counts == [1] * 24


def test_tiny_shard_size_gives_more_shards_within_the_bound(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 12, "b": 12})
    default = chute.convert(src, tmp_path / "default", workers=1).manifest
    assert len(default.splits["train"]["shards"]) == 1
    limit_mb = 0.002
    small = chute.convert(src, tmp_path / "small", shard_size_mb=limit_mb, workers=1).manifest
    shards = small.splits["train"]["shards"]
    total = sum(s["bytes"] for s in shards)
    assert len(shards) >= math.ceil(total / (limit_mb * 1e6)) >= 2
    assert max(s["bytes"] for s in shards) <= 1.25 * limit_mb * 1e6
    assert sum(s["num_records"] for s in shards) == 24


@pytest.mark.parametrize(("count", "shards"), [(1024, 16), (2000, 16), (200, 3), (63, 1)])
def test_default_min_shards_is_16_only_when_each_gets_64(tmp_path, count, shards):
    src = _npz(tmp_path / "x.npz", count)
    manifest = chute.convert(src, tmp_path / "out", workers=1).manifest
    counts = [s["num_records"] for s in manifest.splits["train"]["shards"]]
    assert len(counts) == shards and sum(counts) == count
    assert min(counts) >= min(64, count)


@pytest.mark.parametrize(
    ("count", "hosts", "min_shards", "shards"),
    [(4096, 3, None, 48), (4096, 2, None, 32), (200, 3, None, 3), (100, 4, 5, 8), (24, 5, 1, 5)],
)
def test_hosts_get_16_shards_each_and_equal_shares_of_files(
    tmp_path, count, hosts, min_shards, shards
):
    # 4,096 records: 16 per host of at least 64 records; 200: as many as hold 64 each,
    # rounded up to a multiple of the hosts; an explicit minimum rounded up the same way.
    src = _npz(tmp_path / "x.npz", count)
    options = {"hosts": hosts, "min_shards": min_shards, "workers": 1}
    manifest = chute.convert(src, tmp_path / "out", **options).manifest
    counts = [s["num_records"] for s in manifest.splits["train"]["shards"]]
    assert len(counts) == shards and sum(counts) == count
    assert manifest.options["hosts"] == hosts


@pytest.mark.parametrize(
    ("count", "shards"), [(1600, [16, 1, 7]), (5000, [16, 1, 7]), (20_000, [16, 1, 7])]
)
def test_min_shards_cuts_evaluation_splits_only_into_shards_worth_reading(tmp_path, count, shards):
    # The train split gets the minimum asked for; val and test get it as far as each of their
    # shards keeps a quarter of a train shard's records: a 12-image val split is one shard,
    # not 12 one-image shards (and ImageNet's 50,000 val images at 1,024, 160, not 781).
    src = _npz(tmp_path / "x.npz", count)
    val_fraction = 12 / count
    options = {"val_fraction": val_fraction, "test_fraction": 0.1, "min_shards": 16, "workers": 1}
    manifest = chute.convert(src, tmp_path / "out", **options).manifest
    found = {name: split["shards"] for name, split in manifest.splits.items()}
    assert [len(found[name]) for name in ("train", "val", "test")] == shards
    train = manifest.num_examples("train")
    assert manifest.num_examples("val") == 12 and manifest.num_examples("test") == count // 10
    assert min(s["num_records"] for s in found["test"]) >= train // 16 // 4
    assert max(s["num_records"] for s in found["train"]) <= -(-train // 16)
    flag = " ".join(run_cli("convert", "--help").stdout.split())
    assert "--min-shards N shards of the train split at least; val and test get it" in flag


def test_hosts_from_the_command_line_and_bad_values(tmp_path):
    src = _npz(tmp_path / "x.npz", 256)
    result = run_cli("convert", src, tmp_path / "out", "--hosts", "2", "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert len(chute.load_manifest(tmp_path / "out").splits["train"]["shards"]) == 4
    bad = run_cli("convert", src, tmp_path / "bad", "--hosts", "0")
    assert bad.returncode == 2 and "`hosts` must be an integer from 1 to 10000" in bad.stderr


def test_an_output_from_before_an_option_existed_is_still_the_same_conversion(folder, tmp_path):
    # Manifests written before `hosts` existed lack it: its default was what they used.
    out = tmp_path / "out"
    first = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    manifest_file = out / "manifest.json"
    body = json.loads(manifest_file.read_text())
    del body["options"]["hosts"]
    manifest_file.write_text(json.dumps(body))
    again = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    assert again.already_done and again.manifest.splits == first.manifest.splits


# -- determinism ----------------------------------------------------------------------------


def test_output_is_byte_identical_whatever_the_workers(tmp_path, monkeypatch):
    from chute.ingest import workers

    pools = []
    real_pool = workers.start_pool

    def spy(*args, **kwargs):
        pools.append(real_pool(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(workers, "start_pool", spy)
    src = make_folder(tmp_path / "src", {"a": 50, "b": 50, "c": 50}, size=(6, 5))
    one = chute.convert(src, tmp_path / "w1", val_fraction=0.2, workers=1)
    two = chute.convert(src, tmp_path / "w2", val_fraction=0.2, workers=2)
    assert isinstance(pools[0], workers.InlinePool)
    assert isinstance(pools[1], workers.WorkerPool)  # really two processes
    assert two.num_written == one.num_written
    assert one.num_written == {"train": 120, "val": 30}
    # more than one 64-item encode chunk in one shard went through the pool
    assert one.manifest.splits["train"]["shards"][0]["num_records"] > 64
    assert tree_bytes(tmp_path / "w1") == tree_bytes(tmp_path / "w2")


# -- pixels and formats ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source_size", "target", "mode", "color_mode"),
    [((20, 16), (8, 6), "RGB", "rgb"), ((10, 12), (25, 30), "L", "grayscale")],
)
def test_raw_pixels_match_tf_image_resize_bilinear(tmp_path, source_size, target, mode, color_mode):
    # chute resizes as tf.image.resize does (no antialiasing, half-pixel centres), so the
    # stored uint8 pixels are tf's float result to within rounding.
    import tensorflow as tf

    src = make_folder(tmp_path / "src", {"a": 3, "b": 3}, size=source_size, mode=mode)
    out = tmp_path / "out"
    chute.convert(
        src, out, image_size=f"{target[0]}x{target[1]}", encoding="raw", color_mode=color_mode,
        interpolation="bilinear", workers=1,
    )  # fmt: skip
    records = all_records(out)
    assert len(records) == 6
    channels = 3 if mode == "RGB" else 1
    for record in records:
        assert record["size"] == target and record["channels"] == channels
        with Image.open(src / record["key"]) as image:
            pixels = np.asarray(image.convert(mode)).reshape(*source_size, channels)
        expected = tf.image.resize(pixels, target, method="bilinear", antialias=False).numpy()
        stored = decode(record)
        assert stored.shape == (*target, channels) and stored.dtype == np.uint8
        assert np.abs(stored.astype(np.float64) - expected).max() < 1.0


def test_raw_pixels_round_trip_exactly_without_resize(folder, tmp_path):
    out = tmp_path / "out"
    chute.convert(folder, out, encoding="raw", color_mode="grayscale", workers=1)
    records = all_records(out)
    assert len(records) == 24
    for record in records:
        with Image.open(folder / record["key"]) as image:
            expected = np.asarray(image)[..., None]
        np.testing.assert_array_equal(decode(record), expected)


def test_codelab_reader_reads_jpeg_shards_unchanged(tmp_path):
    import tensorflow as tf

    colour_jpegs(tmp_path / "src", per_class=5)
    out = tmp_path / "out"
    manifest = chute.convert(
        tmp_path / "src", out, image_size=16, encoding="jpeg", workers=1
    ).manifest
    assert manifest.image.encoding == "jpeg"

    read_tfrecord = codelab_read_tfrecord([16, 16])  # the "Keras on TPU" codelab's reader

    filenames = tf.io.gfile.glob(str(out / "*.tfrecord"))
    dataset = tf.data.TFRecordDataset(filenames, num_parallel_reads=tf.data.AUTOTUNE)
    dataset = dataset.map(read_tfrecord, num_parallel_calls=tf.data.AUTOTUNE)
    seen = collections.Counter()
    for image, label in dataset.as_numpy_iterator():
        assert image.shape == (16, 16, 3) and image.dtype == np.uint8
        color = np.asarray(COLOURS[manifest.class_names[label]])
        assert np.abs(np.median(image.reshape(-1, 3), axis=0) - color).max() < 12
        seen[int(label)] += 1
    assert seen == {0: 5, 1: 5, 2: 5}


def test_output_to_tf_ram_filesystem(folder):
    import tensorflow as tf

    out = f"ram://chute-test-{uuid.uuid4().hex}/out"
    result = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    assert result.output == out
    manifest = chute.load_manifest(out)
    assert manifest.location == out
    assert manifest == result.manifest
    assert all(p.startswith(out + "/") for p in manifest.shard_paths("train"))
    for split in ("train", "val"):
        paths = manifest.shard_paths(split)
        labels = [
            int(
                tf.io.parse_single_example(r, {"class": tf.io.FixedLenFeature([], tf.int64)})[
                    "class"
                ]
            )
            for r in tf.data.TFRecordDataset(paths)
        ]
        assert len(labels) == manifest.num_examples(split)
        counts = collections.Counter(labels)
        assert [counts[i] for i in range(3)] == manifest.splits[split]["class_counts"]
    assert not tf.io.gfile.exists(out + "/.chute-work")
    assert chute.verify(out).ok
    assert chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1).already_done


# -- duplicates -----------------------------------------------------------------------------


def test_duplicate_that_would_leak_into_val_stays_in_train_only(tmp_path):
    src = tmp_path / "src"
    write_image(src / "dup" / "000.png", seed=7)
    write_image(src / "dup" / "001.png", seed=7)  # the same bytes
    assert (src / "dup" / "000.png").read_bytes() == (src / "dup" / "001.png").read_bytes()
    make_folder(src, {"other": 4}, seed=3)
    out = tmp_path / "out"
    manifest = chute.convert(src, out, val_fraction=0.5, workers=1).manifest
    dup_keys = {"dup/000.png", "dup/001.png"}
    train, val = set(_keys(out, "train")), set(_keys(out, "val"))
    assert len(train & dup_keys) == 1
    assert not val & dup_keys
    assert manifest.splits["train"]["class_counts"][0] == 1
    assert manifest.splits["val"]["class_counts"][0] == 0
    assert len(manifest.duplicates) == 1
    group = manifest.duplicates[0]
    assert set(group["keys"]) == dup_keys
    assert group["dropped"] == sorted(dup_keys - train)
    assert group["sha256"] == hashlib.sha256((src / "dup" / "000.png").read_bytes()).hexdigest()


def test_duplicates_within_train_are_reported_and_kept(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3})
    (src / "b" / "copy.png").write_bytes((src / "a" / "000.png").read_bytes())
    out = tmp_path / "out"
    manifest = chute.convert(src, out, workers=1).manifest
    assert manifest.num_examples("train") == 7
    assert len(manifest.duplicates) == 1
    assert set(manifest.duplicates[0]["keys"]) == {"a/000.png", "b/copy.png"}
    assert manifest.duplicates[0]["dropped"] == []


# -- re-runs and the output folder ----------------------------------------------------------


def _stamp_old(out: Path) -> dict[str, tuple[int, bytes]]:
    """Sets every file's mtime to long ago; returns name -> (mtime_ns, bytes)."""
    old = 1_000_000_000
    for path in out.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(old, old))
    return _timed_files(out)


def _timed_files(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``out`` (the record indexes are in a folder): name -> (mtime, bytes)."""
    return {
        str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in out.rglob("*")
        if p.is_file()
    }


def test_rerunning_the_same_conversion_is_a_no_op(folder, tmp_path):
    out = tmp_path / "out"
    first = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    before = _stamp_old(out)
    again = chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    assert again.already_done and again.resumed_shards == 0
    assert again.manifest == first.manifest
    after = _timed_files(out)
    assert after == before


def test_other_options_on_existing_output_are_refused_unless_overwrite(folder, tmp_path):
    out = tmp_path / "out"
    chute.convert(folder, out, val_fraction=0.25, min_shards=2, workers=1)
    before = _stamp_old(out)
    with pytest.raises(ChuteError, match="val_fraction") as error:
        chute.convert(folder, out, val_fraction=0.5, min_shards=2, workers=1)
    assert "overwrite" in str(error.value)
    with pytest.raises(ChuteError, match="min_shards"):
        chute.convert(folder, out, val_fraction=0.25, min_shards=3, workers=1)
    after = _timed_files(out)
    assert after == before

    replaced = chute.convert(folder, out, val_fraction=0.5, min_shards=3, overwrite=True, workers=1)
    assert not replaced.already_done
    manifest = chute.load_manifest(out)
    assert manifest.options["val_fraction"] == 0.5 and manifest.num_examples("val") == 12
    files = {s["file"] for split in manifest.splits.values() for s in split["shards"]}
    assert {p.name for p in out.glob("*.tfrecord")} == files  # old shards are gone
    assert all("of-00003" in f for f in files)
    assert chute.verify(out).ok


def test_other_source_on_existing_output_is_refused(folder, tmp_path):
    out = tmp_path / "out"
    chute.convert(folder, out, workers=1)
    other = make_folder(tmp_path / "other", {"x": 3, "y": 3})
    with pytest.raises(ChuteError, match="source"):
        chute.convert(other, out, workers=1)
    assert chute.load_manifest(out).class_names == ["a", "b", "c"]


def test_output_holding_unrelated_files_is_refused(folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ChuteError, match="non-empty") as error:
        chute.convert(folder, out, workers=1)
    assert str(out) in str(error.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_existing_empty_output_folder_is_fine(folder, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert chute.convert(folder, out, workers=1).num_written == {"train": 24}


@pytest.mark.parametrize("inside", ["src/out", "src", "src/a/deeper"])
def test_output_inside_source_is_refused(folder, tmp_path, inside):
    out = tmp_path / inside
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    with pytest.raises(ChuteError, match="inside the source"):
        chute.convert(folder, out, workers=1)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


def test_unknown_option_keyword_is_refused(folder, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ChuteError, match="colour_mode"):
        chute.convert(folder, out, colour_mode="rgb", workers=1)
    assert not out.exists()


def test_options_and_option_keywords_together_are_refused(folder, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ChuteError, match="options"):
        chute.convert(folder, out, options=chute.ConvertOptions(), seed=3, workers=1)
    assert not out.exists()


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"image_size": "abc"}, "image_size"),
        ({"image_size": 0}, "image_size"),
        ({"image_size": (10,)}, "image_size"),
        ({"image_size": True}, "image_size"),
        ({"image_size": 70000}, "image_size"),
        ({"image_size": 8, "resize": "zoom"}, "resize"),
        ({"interpolation": "cubic"}, "interpolation"),
        ({"color_mode": "cmyk"}, "color_mode"),
        ({"encoding": "webp"}, "encoding"),
        ({"quality": 0}, "quality"),
        ({"quality": 101}, "quality"),
        ({"quality": 50.5}, "quality"),
        ({"val_fraction": 1.5}, "val_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": "0.1"}, "val_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "val_fraction + test_fraction"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"shard_size_mb": 0}, "shard_size_mb"),
        ({"shard_size_mb": -1.0}, "shard_size_mb"),
        ({"shard_size_mb": float("nan")}, "shard_size_mb"),
        ({"shard_size_mb": float("inf")}, "shard_size_mb"),
        ({"min_shards": 0}, "min_shards"),
        ({"min_shards": 2.5}, "min_shards"),
        ({"max_pixels": 0}, "max_pixels"),
        ({"keep_size": True, "image_size": 8}, "keep_size"),
        ({"keep_size": True, "encoding": "raw"}, "encoding"),
        ({"resize": "crop"}, "resize"),
        ({"workers": 0}, "workers"),
        ({"workers": True}, "workers"),
        ({"workers": 2.0}, "workers"),
    ],
)
def test_bad_option_raises_before_anything_is_written(folder, tmp_path, values, name):
    values = {"workers": 1, **values}
    out = tmp_path / "out"
    with pytest.raises(ChuteError) as error:
        chute.convert(folder, out, **values)
    message = str(error.value)
    assert f"`{name}`" in message and "Received" in message
    assert not out.exists()


def test_missing_source_raises_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ChuteError, match="does not exist") as error:
        chute.convert(tmp_path / "nowhere", out, workers=1)
    assert "nowhere" in str(error.value)
    assert not out.exists()


@pytest.mark.parametrize("damage", ["not-an-image", "zero-bytes", "truncated"])
@pytest.mark.parametrize(
    "options",
    [{}, {"image_size": 12, "color_mode": "grayscale", "encoding": "raw"}],
    ids=["auto", "all-options-given"],  # the second probes no headers: rejects come late
)
def test_class_whose_images_are_all_unreadable_is_an_error_or_a_warning(tmp_path, damage, options):
    src = make_folder(tmp_path / "src", {"fine": 4, "zzbroken": 2})
    for i, path in enumerate(sorted((src / "zzbroken").iterdir())):
        data = path.read_bytes()
        bad = {
            "not-an-image": b"hello, not a png %d" % i,
            "zero-bytes": b"",
            "truncated": data[: len(data) // 2],
        }[damage]
        path.write_bytes(bad)
    out = tmp_path / "out"
    if not options and damage != "truncated":  # known from the headers: before any work
        with pytest.raises(ChuteError, match="zzbroken"):
            chute.convert(src, out, workers=1, **options)
        assert not (out / "manifest.json").exists()
        # no shard, no work folder: only the list of what was refused, and why (kept)
        assert sorted(out.rglob("*")) == [out / "rejects.csv"]
        rejected = (out / "rejects.csv").read_text().splitlines()[1:]
        assert sorted(row.split(",")[0] for row in rejected) == [
            "zzbroken/000.png",
            "zzbroken/001.png",
        ]
        return
    # known only when decoding, after the split: the shards stay, the manifest warns
    result = chute.convert(src, out, workers=1, **options)
    assert len(result.manifest.warnings) == 1 and "zzbroken" in result.manifest.warnings[0]
    assert sorted(r["key"] for r in result.manifest.rejects) == [
        "zzbroken/000.png",
        "zzbroken/001.png",
    ]
    assert result.manifest.splits["train"]["class_counts"] == [4, 0]
    assert chute.verify(out).ok


def test_unreadable_files_in_a_class_that_has_good_ones_are_rejected_and_listed(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 4, "b": 4})
    (src / "a" / "junk.png").write_bytes(b"not an image at all")
    (src / "b" / "empty.jpg").write_bytes(b"")
    out = tmp_path / "out"
    result = chute.convert(src, out, workers=1)
    assert result.num_written == {"train": 8}
    assert result.num_rejected == 2
    assert [r["key"] for r in result.manifest.rejects] == ["a/junk.png", "b/empty.jpg"]
    rejects_csv = (out / "rejects.csv").read_text().splitlines()
    assert rejects_csv[0] == "key,reason" and len(rejects_csv) == 3
    assert rejects_csv[1].startswith("a/junk.png,") and rejects_csv[2].startswith("b/empty.jpg,")


# -- the command line -----------------------------------------------------------------------


def test_cli_convert_happy_path_and_rerun(folder, tmp_path):
    out = tmp_path / "out"
    args = ("convert", folder, out, "--val-fraction", "0.25", "--min-shards", "2",
            "--workers", "1", "--no-progress")  # fmt: skip
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "converted" in done.stdout and str(out) in done.stdout
    assert re.search(r"train\s+18 images in 2 shard", done.stdout), done.stdout
    assert re.search(r"val\s+6 images in 2 shard", done.stdout), done.stdout
    assert "3 classes" in done.stdout and "rejected 0" in done.stdout
    manifest = chute.load_manifest(out)
    assert manifest.num_examples("train") == 18 and manifest.options["min_shards"] == 2
    before = tree_bytes(out)

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert tree_bytes(out) == before


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--image-size", "abc"], ["image_size='abc'"]),
        (["--val-fraction", "1.5"], ["val_fraction=1.5"]),
        (["--quality", "0"], ["quality=0"]),
        (["--val-fraction", "abc"], ["--val-fraction", "'abc'"]),
        (["--workers", "0"], ["workers=0"]),
        (["--color-mode", "cmyk"], ["--color-mode", "'cmyk'"]),
        (["--shard-size-mb", "-5"], ["shard_size_mb=-5"]),
    ],
)
def test_cli_bad_flag_values_exit_non_zero_with_a_message(folder, tmp_path, flags, expected):
    out = tmp_path / "out"
    done = run_cli("convert", folder, out, "--no-progress", *flags)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    for fragment in expected:
        assert fragment in done.stderr, done.stderr
    assert not out.exists()


def test_cli_missing_source_argument(tmp_path):
    done = run_cli("convert")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "SRC" in done.stderr


def test_cli_source_that_does_not_exist(tmp_path):
    out = tmp_path / "out"
    done = run_cli("convert", tmp_path / "nowhere", out, "--no-progress")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "source" in done.stderr and "nowhere" in done.stderr
    assert not out.exists()


def test_a_local_conversion_never_imports_tensorflow(tmp_path):
    """TensorFlow costs seconds to import; a local conversion (API or CLI, with worker
    processes) needs none of it, only a TensorFlow filesystem path would."""
    src = make_folder(tmp_path / "src", {"a": 40, "b": 40})
    code = (
        "import sys\n"
        "from chute.cli import main\n"
        "code = main(['convert', sys.argv[1], sys.argv[2], '--val-fraction', '0.2', "
        "'--workers', '2'])\n"
        "print('IMPORTED', 'tensorflow' in sys.modules, 'keras' in sys.modules, code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "IMPORTED False False 0" in done.stdout
    assert chute.load_manifest(tmp_path / "out").num_examples("train") == 64


def test_a_class_that_loses_its_training_images_while_decoding_is_kept_and_reported(tmp_path):
    """Its file passes the header probe, then fails to decode: the shards stay and the
    manifest warns (before: every shard was deleted and the run failed)."""
    src = make_folder(tmp_path / "src", {"a": 6, "b": 6})
    whole = (src / "a" / "000.png").read_bytes()
    (src / "c").mkdir()
    (src / "c" / "broken.png").write_bytes(whole[: len(whole) // 2])  # header fine, data cut
    out = tmp_path / "out"
    result = chute.convert(src, out, workers=1)
    manifest = result.manifest
    assert manifest.class_names == ["a", "b", "c"]
    assert manifest.splits["train"]["class_counts"] == [6, 6, 0]
    assert [r["key"] for r in manifest.rejects] == ["c/broken.png"]
    assert len(manifest.warnings) == 1 and "['c']" in manifest.warnings[0]
    assert chute.verify(out).ok
    assert "warning:" in chute.inspect(out)


def test_a_val_fraction_that_leaves_classes_without_a_val_image_warns(tmp_path):
    """20 classes x 10 images at --val-fraction 0.03: 6 val images, so 14 classes have
    none; convert says so (a log warning, the manifest, the summary), not only inspect."""
    src = make_folder(tmp_path / "src", {f"c{i:02d}": 10 for i in range(20)}, size=(4, 4))
    out = tmp_path / "out"
    done = run_here(
        "convert", src, out, "--val-fraction", "0.03", "--workers", "1", "--no-progress"
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warning = "14 of 20 class(es) have no validation image at val_fraction=0.03"
    assert warning in done.stderr
    assert re.search(r"val\s+6 images in 1 shard\(s\); 14 of 20 classes have none", done.stdout)
    manifest = chute.load_manifest(out)
    assert sum(count == 0 for count in manifest.splits["val"].class_counts) == 14
    assert any(warning in text for text in manifest.warnings)
    assert warning in chute.inspect(out)


def test_classes_refused_before_any_shard_show_why_and_keep_rejects_csv(tmp_path):
    """'Check the rejects listed in the log', and nothing was listed: the error now gives
    each class's first reasons, and rejects.csv (kept) lists every refused input."""
    src = make_folder(tmp_path / "src", {"a": 6})
    for name in ("b", "c"):
        (src / name).mkdir()
        for i in range(4):
            (src / name / f"{i}.png").write_bytes(b"not an image at all " * (i + 1))
    out = tmp_path / "out"
    with pytest.raises(ChuteError) as caught:
        chute.convert(src, out, workers=1)
    message = str(caught.value)
    assert "2 class(es) have no usable training image: 'b', 'c'" in message
    assert "'b': 4 refused, b/0.png: " in message and "(and 1 more)" in message
    assert "'c': 4 refused, c/0.png: " in message
    assert f"All 8 refused inputs are listed in {out / 'rejects.csv'}" in message
    rows = (out / "rejects.csv").read_text().splitlines()
    assert rows[0] == "key,reason" and len(rows) == 9
    assert sorted(p.name for p in out.iterdir()) == ["rejects.csv"]  # no shard, no lock
    for name in ("b", "c"):  # fixed: the same command into the same folder now runs
        for i in range(4):
            write_image(src / name / f"{i}.png", seed=50 + i)
    assert chute.convert(src, out, workers=1).manifest.num_examples("train") == 14


def test_a_class_whose_archive_members_are_refused_names_their_reason(tmp_path):
    import zipfile

    src = make_folder(tmp_path / "src", {"a": 4})
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as archive:
        for path in sorted(src.rglob("*.png")):
            archive.write(path, f"data/{path.relative_to(src)}")
        archive.writestr("data/b/../../evil.png", b"x")  # refused while scanning
        archive.writestr("data/b/", b"")
    with pytest.raises(ChuteError) as caught:
        chute.convert(tmp_path / "data.zip", tmp_path / "out", workers=1)
    assert "'b'" in str(caught.value)
    assert "rejects.csv" in str(caught.value)


# -- credentials in a source's URL (#38 item 5) ---------------------------------------------

_SECRET = "TopSecretPw"


@pytest.fixture
def http_list(tmp_path):
    """A CSV list and its images served over HTTP from 127.0.0.1 (a server this test
    starts); yields the list's URL with a user and password in it."""
    pytest.importorskip("aiohttp")  # fsspec's http:// filesystem
    import functools
    import http.server
    import threading

    www = make_folder(tmp_path / "www", {"cat": 3, "dog": 3})
    rows = [f"{p.relative_to(www).as_posix()},{p.parent.name}" for p in sorted(www.rglob("*.png"))]
    (www / "list.csv").write_text("path,label\n" + "\n".join(rows) + "\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # a line per request on stderr otherwise
            pass

    handler = functools.partial(Quiet, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://user:{_SECRET}@127.0.0.1:{server.server_address[1]}/list.csv"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_source_urls_password_is_never_stored_logged_or_printed(http_list, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level("INFO", logger="chute"):
        result = chute.convert(http_list, out, workers=1)
    assert result.num_written == {"train": 6}
    # the manifest, and every other file written
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["location"] == http_list.replace(_SECRET, "***")
    assert not [p for p in out.rglob("*") if p.is_file() and _SECRET.encode() in p.read_bytes()]
    # the log records
    messages = [record.getMessage() for record in caplog.records]
    assert any("user:***@127.0.0.1" in m for m in messages), messages
    assert not [m for m in messages if _SECRET in m]
    # the CLI's summary and log lines; the same source (another spelling of its secret) is
    # still recognised as the conversion already there
    done = run_here("convert", http_list.replace(_SECRET, "Another"), out)
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stderr
    done = run_here("convert", http_list, tmp_path / "again", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "converted http://user:***@127.0.0.1" in done.stdout
    assert _SECRET not in done.stdout + done.stderr
    # inspect, even of a manifest written before chute redacted it
    (out / "manifest.json").write_text(
        (out / "manifest.json").read_text().replace("user:***@", f"user:{_SECRET}@")
    )
    for args in (("inspect", out), ("inspect", out, "--json")):
        done = run_here(*args)
        assert done.returncode == 0 and "user:***@127.0.0.1" in done.stdout, done.stderr
        assert _SECRET not in done.stdout


def test_a_source_urls_secrets_are_never_in_an_error(http_list, tmp_path):
    missing = http_list.replace("list.csv", f"missing.csv?sv=2024&sig={_SECRET}")
    with pytest.raises(ChuteError) as raised:
        chute.convert(missing, tmp_path / "out", workers=1)
    assert _SECRET not in str(raised.value) and "sig=***" in str(raised.value)
    assert "user:***@" in str(raised.value)
    for source in (missing, http_list.replace("list.csv", "missing.csv")):
        done = run_here("convert", source, tmp_path / "out")
        assert done.returncode == 2 and "chute convert: error:" in done.stderr
        assert _SECRET not in done.stdout + done.stderr and "user:***@" in done.stderr
