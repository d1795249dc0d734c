"""The manifest's stored form: sparse per-shard class counts, older versions, round trip."""

from __future__ import annotations

import json
import re

import pytest

from chute import ChuteError, ImageSpec
from chute.format import manifest as manifest_lib
from chute.format import records
from chute.format.splits import Shard
from chute.ingest.writer import ShardWriter

NUM_CLASSES = 10_000


def test_sparse_and_dense_counts_round_trip():
    stored = manifest_lib.sparse_counts({9_999: 3, 0: 1, 42: 0})
    assert stored == {"classes": [0, 9_999], "counts": [1, 3]}
    dense = _shard(stored).dense_counts(NUM_CLASSES)
    assert len(dense) == NUM_CLASSES and dense[0] == 1 and dense[9_999] == 3 and sum(dense) == 4
    assert _shard([1, 0, 3]).dense_counts(3) == [1, 0, 3]  # version 2: a list per shard


def _shard(class_counts) -> Shard:
    """A shard entry holding ``class_counts`` as stored."""
    stored = {"file": "train-00000-of-00001.tfrecord", "num_records": 4, "bytes": 100}
    return Shard.from_dict({**stored, "sha256": "0" * 64, "class_counts": class_counts})


def _ten_thousand_classes(tmp_path) -> manifest_lib.Manifest:
    """100 shards of 50 records each, every shard holding 50 of the 10,000 classes."""
    shards = []
    for index in range(100):
        with ShardWriter(str(tmp_path / f"train-{index:05d}")) as writer:
            labels = [(index * 50 + i) % NUM_CLASSES for i in range(50)]
            writer.write(b"".join(records.frame(b"r") for _ in labels), labels)
        shards.append(writer.info)
    totals = [0] * NUM_CLASSES
    for shard in shards:
        for label, count in zip(*shard["class_counts"].values(), strict=True):
            totals[label] += count
    return manifest_lib.Manifest(
        class_names=[f"c{i:05d}" for i in range(NUM_CLASSES)],
        image=ImageSpec(height=8, width=8, channels=3),
        splits={"train": {"num_examples": 5_000, "class_counts": totals, "shards": shards}},
        options={},
        source={},
    )


def test_per_shard_counts_grow_with_records_not_classes(tmp_path):
    manifest = _ten_thousand_classes(tmp_path)
    body = json.loads(manifest.to_json())
    stored = [len(s["class_counts"]["counts"]) for s in body["splits"]["train"]["shards"]]
    assert stored == [50] * 100  # a list per shard would hold 10,000 numbers each
    # the class names and the split's totals dominate; the shards add ~ their records
    assert len(manifest.to_json()) < 400_000
    again = manifest_lib.Manifest.from_json(manifest.to_json())
    assert again == manifest
    shard = again.splits["train"]["shards"][3]
    dense = again.shard_class_counts(shard)
    assert sum(dense) == shard["num_records"] == 50 and dense[150] == 1 and dense[149] == 0


def test_older_manifests_are_read_and_newer_ones_refused():
    body = {
        "format": "chute.manifest",
        "version": 1,  # resize and quality lived in the options
        "class_names": ["a", "b"],
        "image": {"height": 8, "width": 8, "channels": 3, "encoding": "jpeg"},
        "splits": {"train": {"num_examples": 3, "class_counts": [2, 1], "shards": []}},
        "options": {"resize": "pad", "quality": 90},
        "source": {},
    }
    old = manifest_lib.Manifest.from_json(json.dumps(body))
    assert old.image.resize == "pad" and old.image.quality == 90
    body["version"] = manifest_lib.VERSION + 1
    with pytest.raises(ChuteError, match="newer chute"):
        manifest_lib.Manifest.from_json(json.dumps(body), location="ram://x")


def _tampered(shared_dataset, tmp_path, change) -> str:
    """A copy of the shared dataset whose manifest ``change(body)`` edited."""
    import shutil

    out = tmp_path / "tampered"
    shutil.copytree(shared_dataset, out)
    body = json.loads((out / "manifest.json").read_text())
    change(body)
    (out / "manifest.json").write_text(json.dumps(body))
    return str(out)


def _set_file(name):
    def change(body):
        body["splits"]["train"]["shards"][0]["file"] = name

    return change


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../other/train-00000-of-00002.tfrecord", "..", "a\\b", "C:x", ""]
)
def test_a_shard_name_that_leaves_the_folder_is_refused_wherever_a_manifest_is_read(
    shared_dataset, tmp_path, name
):
    from helpers import run_here

    import chute

    out = _tampered(shared_dataset, tmp_path, _set_file(name))
    with pytest.raises(ChuteError, match=r"splits\.train\.shards\[0\]\.file` must be a file name"):
        chute.load(out, "train")
    with pytest.raises(ChuteError, match="inside the dataset's folder"):
        chute.verify(out)
    for command in (["verify", out], ["inspect", out]):
        result = run_here(*command)
        assert result.returncode == 2, result.stderr
        assert "must be a file name inside the dataset's folder" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b["splits"]["train"].__setitem__("shards", None), "splits.train.shards"),
        (lambda b: b["splits"]["train"].pop("shards"), "splits.train.shards"),
        (lambda b: b["splits"]["val"].pop("num_examples"), "splits.val.num_examples"),
        (lambda b: b["splits"].__setitem__("val", []), "splits.val"),
        (lambda b: b["splits"]["train"]["shards"].__setitem__(0, "x"), "splits.train.shards[0]"),
        (lambda b: b["splits"]["train"]["shards"][1].pop("num_records"), "shards[1].num_records"),
        (lambda b: b.__setitem__("splits", None), "splits"),
        (lambda b: b.__setitem__("class_names", "abc"), "class_names"),
    ],
)
def test_a_malformed_manifest_is_one_error_naming_the_field(
    shared_dataset, tmp_path, change, field
):
    from helpers import run_here

    out = _tampered(shared_dataset, tmp_path, change)
    with pytest.raises(ChuteError, match=re.escape(field) + "` must be"):
        manifest_lib.load(out)
    for command in (["verify", out], ["inspect", out], ["train", out, "--epochs", "1"]):
        result = run_here(*command)
        assert result.returncode == 2, (command, result.stderr)
        assert f"{field}` must be" in result.stderr and "Traceback" not in result.stderr


def _shard0(body: dict) -> dict:
    return body["splits"]["train"]["shards"][0]


def _readers(out: str):
    """Every way a user reads a manifest: the Python API (both engines' readers, verify,
    index) and the commands that take a dataset."""
    import chute

    return [
        manifest_lib.load,
        chute.verify,
        chute.index,
        lambda o: chute.grain_source(o, "train"),
        lambda o: chute.load(o, "train", batch_size=4, engine="grain"),
    ]


def _refused_everywhere(out: str, message: str) -> None:
    from helpers import run_here

    for read in _readers(out):
        with pytest.raises(ChuteError, match=re.escape(message)):
            read(out)
    commands = (["verify", out, "--no-progress"], ["index", out, "--no-progress"], ["inspect", out])
    for command in commands:
        result = run_here(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: _shard0(b).pop("bytes"), "splits.train.shards[0].bytes"),
        (lambda b: _shard0(b).pop("sha256"), "splits.train.shards[0].sha256"),
        (lambda b: _shard0(b).__setitem__("sha256", "abc"), "splits.train.shards[0].sha256"),
        (lambda b: _shard0(b).__setitem__("bytes", -1), "splits.train.shards[0].bytes"),
        (lambda b: _shard0(b).__setitem__("class_counts", "x"), "shards[0].class_counts"),
        (lambda b: _shard0(b).pop("class_counts"), "splits.train.shards[0].class_counts"),
        (lambda b: _shard0(b)["class_counts"].__setitem__("counts", [1]), "class_counts.counts"),
        (lambda b: _shard0(b)["index"].pop("sha256"), "splits.train.shards[0].index"),
        (lambda b: b["splits"]["train"].__setitem__("class_counts", "x"), "train.class_counts"),
        (lambda b: b["splits"]["val"].pop("class_counts"), "splits.val.class_counts"),
        (lambda b: b.__setitem__("image", "x"), "image"),
        (lambda b: b.__setitem__("rejects", "x"), "rejects"),
        (lambda b: b.__setitem__("duplicates", [{"keys": []}]), "duplicates"),
        (lambda b: b.__setitem__("options", []), "options"),
        (lambda b: b.__setitem__("version", "3"), "version"),
    ],
)
def test_a_hand_edited_manifest_is_one_error_naming_the_field_everywhere(
    shared_dataset, tmp_path, change, field
):
    out = _tampered(shared_dataset, tmp_path, change)
    message = f"{out}/manifest.json is not a valid chute manifest: "
    with pytest.raises(ChuteError, match=re.escape(message) + ".*" + re.escape(f"{field}` must")):
        manifest_lib.load(out)
    _refused_everywhere(out, f"{field}` must be")


def test_a_missing_field_is_named_as_missing(shared_dataset, tmp_path):
    out = _tampered(
        shared_dataset, tmp_path, lambda b: b["splits"]["train"]["shards"][1].pop("sha256")
    )
    with pytest.raises(ChuteError) as error:
        manifest_lib.load(out)
    assert str(error.value) == (
        f"{out}/manifest.json is not a valid chute manifest: `splits.train.shards[1].sha256` "
        "must be the shard's sha256 (64 lowercase hex digits). Received: "
        "splits.train.shards[1].sha256 is missing. Correct it, or convert the dataset again"
    )


def test_an_image_spec_out_of_range_is_named(shared_dataset, tmp_path):
    out = _tampered(shared_dataset, tmp_path, lambda b: b["image"].__setitem__("height", 0))
    _refused_everywhere(out, "in `image`, `height` must be an integer from 1 to 65535")


def _drop_last_class(body: dict) -> None:
    """One class name fewer than the labels the records (and the counts) hold."""
    body["class_names"].pop()


def _drop_last_class_and_its_counts(body: dict) -> None:
    """As above, with the splits' dense counts cut to the names: the shards' sparse counts
    still hold the last label."""
    body["class_names"].pop()
    for split in body["splits"].values():
        split["class_counts"].pop()


def test_labels_beyond_the_class_names_are_refused(shared_dataset, tmp_path):
    out = _tampered(shared_dataset, tmp_path, _drop_last_class)
    _refused_everywhere(
        out,
        "`splits.train.class_counts` must be one count per class name: class_names has 2 names, "
        "this 3 counts (the class names and the records' labels disagree)",
    )
    out = _tampered(shared_dataset, tmp_path / "2", _drop_last_class_and_its_counts)
    _refused_everywhere(
        out,
        "class_counts.classes` must be labels from 0 to 1: class_names has 2 names, "
        "so label 2 has none (the class names and the records' labels disagree)",
    )


def test_every_manifest_chute_writes_passes_the_checks(shared_dataset, tmp_path):
    """The checks refuse nothing chute writes: a local conversion, the ShardWriter's entries,
    version 1 and 2 manifests (dense per-shard counts), optional report fields left out."""
    manifest_lib.load(shared_dataset)
    manifest_lib.Manifest.from_json(_ten_thousand_classes(tmp_path).to_json())

    def older(body):
        body["version"] = 2
        for split in body["splits"].values():
            for shard in split["shards"]:
                dense = [0] * len(body["class_names"])
                stored = shard.pop("class_counts")
                for label, count in zip(stored["classes"], stored["counts"], strict=True):
                    dense[label] = count
                shard["class_counts"] = dense
                del shard["index"]
        for key in ("rejects", "duplicates", "warnings", "created_by"):
            body.pop(key)

    assert manifest_lib.load(_tampered(shared_dataset, tmp_path, older)).num_examples("val") == 6


def test_multi_label_and_weighted_manifests_say_so_and_plain_ones_stay_version_3(tmp_path):
    import json

    from chute.format.manifest import Manifest
    from chute.format.spec import ImageSpec

    def made(**fields):
        return Manifest(
            class_names=["a", "b"], image=ImageSpec(8, 8, 1), options={},
            splits={"train": {"num_examples": 0, "class_counts": [0, 0], "shards": []}},
            source={}, location=str(tmp_path), **fields,
        )  # fmt: skip

    plain = json.loads(made().to_json())
    assert plain["version"] == 3 and "label_mode" not in plain and "weighted" not in plain
    multi = made(label_mode="multi", weighted=True)
    body = json.loads(multi.to_json())
    assert body["version"] == 4 and body["label_mode"] == "multi" and body["weighted"] is True
    assert Manifest.from_json(multi.to_json()).multi_label
    with pytest.raises(ChuteError, match=r"`label_mode`.*'single', 'multi'.*Received.*'tags'"):
        made(label_mode="tags")
