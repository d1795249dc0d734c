"""The dataset tools on a multi-label, weighted dataset: verify (labels in range, the
images carrying each label recounted, weights), inspect's labels block, the grid's row
per label, and convert's summary line; single-label output stays as it was."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import make_folder, run_here, write_image
from PIL import Image, ImageDraw

import chute
from chute.format import manifest as manifest_lib
from chute.format import records
from chute.tools import grid, labels
from chute.tools import verify as verify_lib

NAMES = ["cat", "dog", "night", "outdoor"]  # sorted: the class indices are these positions
COUNT = 30


def _labels_of(i: int) -> list[int]:
    """Image i carries the labels of the bits of i % 16: every subset, 2 negatives."""
    return [c for c in range(len(NAMES)) if (i % 16) >> c & 1]


def _weight_of(i: int) -> float:
    return 1.0 + i % 3


@pytest.fixture(scope="module")
def tags(tmp_path_factory) -> Path:
    """A CSV of 30 8x8 images with 0 to 4 labels each and a weight, converted (raw,
    val 20%): the dataset tests copy before they damage it."""
    root = tmp_path_factory.mktemp("tags")
    rows = ["path,labels,weight"]
    for i in range(COUNT):
        write_image(root / "img" / f"{i:02d}.png", size=(8, 8), mode="RGB", seed=i)
        names = "|".join(NAMES[c] for c in _labels_of(i))
        rows.append(f"img/{i:02d}.png,{names},{_weight_of(i)}")
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    out = root / "out"
    chute.convert(
        root / "list.csv", out, val_fraction=0.2, allow_empty_labels=True, weight_column="weight"
    )
    manifest = chute.load_manifest(out)
    assert manifest.multi_label and manifest.weighted and manifest.class_names == NAMES
    return out


@pytest.fixture
def damaged(tags, tmp_path) -> Path:
    """A copy of the dataset, to damage."""
    return Path(shutil.copytree(tags, tmp_path / "out"))


@pytest.fixture(params=["tensorflow", "python"])
def engine(request, monkeypatch) -> str:
    """Verify's record check with TensorFlow, then in plain Python (no TensorFlow)."""
    if request.param == "python":
        monkeypatch.setattr(verify_lib, "installed", lambda name: name != "tensorflow")
        monkeypatch.setattr(verify_lib, "tf", None)
    return request.param


# -- verify -------------------------------------------------------------------------------


def test_verify_passes_a_multi_label_weighted_dataset(tags, engine):
    report = chute.verify(tags)
    assert report.ok, report.problems
    assert report.num_records == COUNT


def _edit_manifest(out: Path, edit) -> None:
    path = out / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    edit(body)
    path.write_text(json.dumps(body, indent=1), encoding="utf-8")


def _val_shard(out: Path) -> str:
    return chute.load_manifest(out).split("val").shards[0].name


def test_verify_names_a_shard_whose_label_counts_were_tampered(damaged, engine):
    shard = _val_shard(damaged)

    def edit(body):
        counts = body["splits"]["val"]["shards"][0]["class_counts"]["counts"]
        counts[0] += 1  # one more image carrying a label: the sum of images need not change

    _edit_manifest(damaged, edit)
    report = chute.verify(damaged)
    assert [(name, problem) for name, problem in report.problems] == [
        (shard, "per-class counts differ from the manifest")
    ]


def test_verify_names_a_split_whose_label_counts_were_tampered(damaged, engine):
    _edit_manifest(damaged, lambda body: body["splits"]["train"]["class_counts"].__setitem__(1, 0))
    report = chute.verify(damaged)
    assert report.problems == [("train split", "per-class counts differ from what its shards hold")]


def _record(target: records.Target | int, key: str = "bad") -> bytes:
    return records.image_example(
        image=bytes(8 * 8 * 3), label=target, height=8, width=8, channels=3, encoding="raw", key=key
    )


def _with_last_record(out: Path, framed: bytes, split: str = "val") -> tuple[str, int]:
    """Puts ``framed`` in place of the split's first shard's last record (bytes and sha256
    updated, counts not); returns the shard's name and the record's number."""
    from chute.format import parse

    shard = chute.load_manifest(out).split(split).shards[0]
    path = out / shard.name
    with open(path, "rb") as handle:
        kept = [records.frame(record) for record in parse.read_records(handle)][:-1]
    data = b"".join(kept) + framed
    path.write_bytes(data)

    def edit(body):
        entry = body["splits"][split]["shards"][0]
        entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        entry.pop("index", None)  # offsets changed: the index is another test's matter

    _edit_manifest(out, edit)
    return shard.name, len(kept)


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (records.Target((1, 9), 1.0), "has label 9, outside 0..3"),
        (records.Target((-2,), 1.0), "has label -2, outside 0..3"),
        (records.Target((0,), float("nan")), "has weight nan, not a finite number >= 0"),
        (records.Target((0,), -1.0), "has weight -1, not a finite number >= 0"),
        (records.Target(2, 1.0), "does not parse or decode"),  # `class`, no `labels`
    ],
)
def test_verify_names_a_bad_record_of_a_multi_label_dataset(damaged, engine, target, says):
    shard, number = _with_last_record(damaged, _record(target))
    report = chute.verify(damaged)
    assert len(report.problems) == 1, report.problems
    name, problem = report.problems[0]
    assert name == shard and problem.startswith(f"record {number} {says}"), problem


def test_verify_names_a_record_without_labels(damaged, engine):
    """A record with no `labels` is not a negative (that is an empty list): it is named."""
    framed = records.frame(
        records.encode_example(
            {"image": [bytes(8 * 8 * 3)], "size": [8, 8], "channels": [3], "weight": [1.0]}
        )
    )
    shard, number = _with_last_record(damaged, framed)
    report = chute.verify(damaged)
    assert report.problems == [
        (shard, f"record {number} does not parse or decode: it has no `labels` feature")
    ]


def test_verify_names_a_record_without_its_weight(damaged, engine):
    shard, number = _with_last_record(damaged, _record(records.Target((0, 1), None)))
    (name, problem), *_ = chute.verify(damaged).problems
    assert name == shard and problem.startswith(f"record {number} does not parse or decode")
    assert "weight" in problem


def test_a_weighted_single_label_dataset_has_its_weights_checked_and_shown(tmp_path, engine):
    rows = ["path,label,weight"]
    for i in range(6):
        write_image(tmp_path / f"{i}.png", size=(8, 8), mode="RGB", seed=i)
        rows.append(f"{i}.png,{'ab'[i % 2]},{_weight_of(i)}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    chute.convert(tmp_path / "list.csv", out, val_fraction=0.0, weight_column="weight")
    manifest = chute.load_manifest(out)
    assert manifest.weighted and not manifest.multi_label
    assert chute.verify(out).ok
    text = chute.inspect(out)
    assert ": 2 classes with sample weights, 8x8," in text and "weights 1..3" in text
    assert "negatives" not in text
    shard, number = _with_last_record(out, _record(records.Target(1, float("inf"))), "train")
    assert chute.verify(out).problems == [
        (shard, f"record {number} has weight inf, not a finite number >= 0")
    ]


# -- label figures --------------------------------------------------------------------------


def test_label_stats_count_negatives_pairs_and_weights_from_the_records(tags):
    stats = labels.label_stats(tags)
    manifest = chute.load_manifest(tags)
    assert list(stats) == list(manifest.splits)
    assert sum(split.images for split in stats.values()) == COUNT
    assert sum(split.negatives for split in stats.values()) == 2  # images 0 and 16
    for name, split in stats.items():  # the records agree with the manifest's counts
        assert list(split.carrying) == list(manifest.split(name).class_counts)
    truth = Counter(itertools.chain.from_iterable(
        itertools.combinations(_labels_of(i), 2) for i in range(COUNT)
    ))  # fmt: skip
    found = Counter()
    for split in stats.values():  # 4 labels: 6 pairs, all kept (up to 10)
        found.update({(a, b): n for a, b, n in split.pairs})
        counts = [n for _, _, n in split.pairs]
        assert counts == sorted(counts, reverse=True)
    assert found == truth
    weights = [_weight_of(i) for i in range(COUNT)]
    assert min(s.weights[0] for s in stats.values()) == min(weights)
    assert max(s.weights[2] for s in stats.values()) == max(weights)
    total = sum(s.weights[1] * s.images for s in stats.values())
    assert total == pytest.approx(sum(weights))
    body = stats["train"].to_dict(manifest.class_names)
    assert set(body["carrying"]) == set(NAMES) and set(body["weights"]) == {"min", "mean", "max"}
    json.dumps(body)  # JSON-ready


def test_the_labels_per_image_are_the_labels_given_over_the_images():
    split = labels.SplitLabels("train", 4, (2, 3, 1), 1, ())
    assert split.labels_per_image == 1.5
    assert labels.SplitLabels("val", 0, (0, 0), 0, ()).labels_per_image == 0.0


def test_headline_of_a_multi_label_dataset(tags):
    manifest = chute.load_manifest(tags)
    given = sum(len(_labels_of(i)) for i in range(COUNT))
    per_image = f"{given / COUNT:.1f} per image"
    assert labels.headline(manifest) == (f"4 labels (multi-label: {per_image}) with sample weights")
    assert labels.headline(manifest, labels.label_stats(manifest)) == (
        f"4 labels (multi-label: {per_image}, 2 negatives) with sample weights"
    )


# -- inspect, grid, convert's summary ---------------------------------------------------------


def test_inspect_shows_shares_negatives_and_labels_seen_together(tags):
    text = chute.inspect(tags)
    manifest = chute.load_manifest(tags)
    assert text.splitlines()[0].startswith(
        f"{tags}: 4 labels (multi-label) with sample weights, 8x8,"
    )
    train = manifest.split("train")
    share = f"{100 * train.class_counts[0] / train.examples:.0f}%"
    assert f"{train.class_counts[0]} ({share})" in text.split("\n    0  cat")[1].splitlines()[0]
    assert "labels (read from the records):" in text
    stats = labels.label_stats(tags)
    for name, split in stats.items():
        assert f"{split.negatives} negatives" in next(
            line
            for line in text.splitlines()
            if line.strip().startswith(f"{name} ") and "labels per image" in line
        )
    a, b, n = stats["train"].pairs[0]
    assert f"labels seen together most in train: {NAMES[a]} + {NAMES[b]} ({n})" in text
    assert "weights 1..3" in text


def test_grid_has_a_row_per_label_under_a_title_saying_so(tags, tmp_path, monkeypatch):
    drawn = []
    original = ImageDraw.ImageDraw.text
    monkeypatch.setattr(
        ImageDraw.ImageDraw,
        "text",
        lambda self, xy, text, *a, **k: drawn.append(text) or original(self, xy, text, *a, **k),
    )
    path = grid.draw_grid(tags, tmp_path / "grid.png", per_class=2)
    assert drawn == ["train: images carrying each label (multi-label)"] + [
        f"{i}: {name}" for i, name in enumerate(NAMES)
    ]
    assert Image.open(path).size[1] == grid._TITLE_HEIGHT + 4 * (64 + 2)


def test_grid_rows_hold_images_carrying_their_label(tags):
    manifest = chute.load_manifest(tags)
    samples = grid._samples(manifest, "train", [0, 3], 3)
    pixels = {
        np.asarray(Image.open(path)).tobytes(): _labels_of(int(path.stem))
        for path in (tags.parent / "img").iterdir()
    }
    for label, images in samples.items():
        assert len(images) == 3
        assert all(label in pixels[np.asarray(image).tobytes()] for image in images)


def test_convert_says_labels_per_image_negatives_and_weights(tags, tmp_path):
    done = run_here(
        "convert", tags.parent / "list.csv", tmp_path / "again", "--val-fraction", "0.2",
        "--allow-empty-labels", "--weight-column", "weight", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    given = sum(len(_labels_of(i)) for i in range(COUNT))
    assert (
        f"  4 labels (multi-label: {given / COUNT:.1f} per image, 2 negatives) "
        "with sample weights, 8x8x3 raw"
    ) in done.stdout.splitlines()


def test_single_label_inspect_and_convert_say_classes_as_before(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3}, size=(8, 8))
    done = run_here("convert", src, tmp_path / "out", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "  2 classes, 8x8x1 raw" in done.stdout.splitlines()
    text = chute.inspect(tmp_path / "out")
    assert f"{tmp_path / 'out'}: 2 classes, 8x8," in text
    assert "labels (read from the records)" not in text
    assert f"{0:>5}  {'a':<24}{3:>8}" in text.splitlines()  # the table's columns as before
    assert manifest_lib.load(tmp_path / "out").label_mode == "single"
