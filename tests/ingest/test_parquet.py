"""Hugging Face Parquet sources: files in the Hub's layout written here with pyarrow, each
converted and compared with the equivalent folder; bad rows, bad columns, hf: names."""

from __future__ import annotations

import collections
import io
import json
import re
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import all_records, decode, run_here, write_image
from PIL import Image

import chute
from chute import lazy
from chute.errors import ChuteError
from chute.ingest.sources import parquet

CLASSES = ["angular_leaf_spot", "bean_rust", "healthy"]


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _hf_metadata(image: str = "image", label: str = "label") -> dict:
    features = {image: {"_type": "Image"}, label: {"names": CLASSES, "_type": "ClassLabel"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def _write(path: Path, rows: list[tuple], *, metadata=None, image="image", label="label"):
    path.parent.mkdir(parents=True, exist_ok=True)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([None if b is None else {"bytes": b, "path": n} for n, b, _ in rows], struct)
    labels = pa.array([t for _, _, t in rows])
    table = pa.table({image: images, label: labels})
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path, row_group_size=4)


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> tuple[Path, Path]:
    """A dataset in the Hub's layout (two train files, one test file) and the same images as
    a pre-split folder tree."""
    root = tmp_path_factory.mktemp("hub")
    layout = {"train-00000-of-00002": 9, "train-00001-of-00002": 8, "test-00000-of-00001": 6}
    seed = 0
    for name, count in layout.items():
        rows = []
        for _ in range(count):
            label = seed % 3
            data = _png(seed)
            rows.append((f"{seed}.png", data, label))
            split = "train" if name.startswith("train") else "test"
            folder = root / "tree" / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{seed:03d}.png").write_bytes(data)
            seed += 1
        _write(root / "hub" / "data" / f"{name}.parquet", rows, metadata=_hf_metadata())
    return root / "hub", root / "tree"


def _by_split(out: Path) -> dict[str, collections.Counter]:
    manifest = chute.load_manifest(out)
    return {
        split: collections.Counter(
            (manifest.class_names[r["class"]], decode(r).tobytes()) for r in all_records(out, split)
        )
        for split in manifest.splits
    }


def test_hub_layout_converts_as_the_equivalent_folder(hub, tmp_path, monkeypatch):
    folder_of_parquet, tree = hub
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the images are copied
    # val_fraction=0: the splits the sources come with (by default each would carve a val
    # split from train, by keys that differ between the two)
    a = chute.convert(folder_of_parquet, tmp_path / "a", workers=1, image_size=(10, 12),
                      val_fraction=0)  # fmt: skip
    b = chute.convert(tree, tmp_path / "b", workers=1, image_size=(10, 12), val_fraction=0)
    assert a.manifest.class_names == b.manifest.class_names == CLASSES
    assert a.manifest.source["kind"] == "parquet"
    assert set(a.manifest.splits) == {"train", "test"}
    assert _by_split(tmp_path / "a") == _by_split(tmp_path / "b")
    assert chute.verify(tmp_path / "a").ok
    assert list(temp.glob("chute-*")) == []  # the copied images are deleted


def test_workers_read_the_copied_images_and_a_rerun_sees_a_changed_file(hub, tmp_path):
    folder_of_parquet, _ = hub
    out = tmp_path / "out"
    first = chute.convert(folder_of_parquet, out, workers=2, image_size=(10, 12))
    assert sum(first.num_written.values()) == 23
    assert chute.convert(folder_of_parquet, out, workers=2, image_size=(10, 12)).already_done


def test_other_column_names_and_string_labels_without_metadata(tmp_path):
    rows = [(f"{i}.png", _png(100 + i), ["cat", "dog"][i % 2]) for i in range(8)]
    _write(tmp_path / "pets.parquet", rows, image="img", label="target")
    with pytest.raises(ChuteError, match=r"`image_column`.*--image-column"):
        chute.convert(tmp_path / "pets.parquet", tmp_path / "nope", workers=1)
    result = chute.convert(
        tmp_path / "pets.parquet",
        tmp_path / "out",
        workers=1,
        image_column="img",
        label_column="target",
    )
    assert result.manifest.class_names == ["cat", "dog"]
    assert result.manifest.num_examples("train") == 8


def test_bad_rows_are_rejected_with_reasons(tmp_path):
    good = _png(7)
    rows = [
        ("ok.png", good, 0),
        ("none.png", None, 1),
        ("empty.png", b"", 1),
        ("cut.png", good[: len(good) // 2], 2),
        ("far.png", _png(8), 7),
        ("nolabel.png", _png(9), None),
        ("ok2.png", _png(10), 2),
        ("ok3.png", _png(11), 1),
    ]
    _write(tmp_path / "train.parquet", rows, metadata=_hf_metadata())
    result = chute.convert(tmp_path / "train.parquet", tmp_path / "out", workers=1)
    assert result.manifest.num_examples("train") == 3
    reasons = {
        row.split(",")[0]: row
        for row in (tmp_path / "out" / "rejects.csv").read_text().splitlines()[1:]
    }
    assert "no image bytes" in reasons["train.parquet#00000001"]
    assert "no image bytes" in reasons["train.parquet#00000002"]
    assert "train.parquet#00000003" in reasons  # the truncated PNG, rejected by the decoder
    assert "not a class index" in reasons["train.parquet#00000004"]
    assert "missing label" in reasons["train.parquet#00000005"]


def test_files_naming_and_not_naming_splits_are_not_mixed(tmp_path):
    _write(tmp_path / "d" / "train-0.parquet", [("a.png", _png(1), 0)], metadata=_hf_metadata())
    _write(tmp_path / "d" / "extra.parquet", [("b.png", _png(2), 1)], metadata=_hf_metadata())
    with pytest.raises(ChuteError, match="mixes Parquet files"):
        chute.convert(tmp_path / "d", tmp_path / "out", workers=1)


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    result = run_here("convert", tmp_path / "fake.parquet", tmp_path / "out")
    assert result.returncode == 2 and "not a readable Parquet file" in result.stderr
    assert "Traceback" not in result.stderr


def test_parquet_options_on_another_source_are_refused(tmp_path):
    write_image(tmp_path / "src" / "a" / "1.png")
    with pytest.raises(ChuteError, match="`label_column` applies to Parquet sources"):
        chute.convert(tmp_path / "src", tmp_path / "out", label_column="y", workers=1)


def test_split_names_from_files_and_folders():
    assert parquet.split_of("data/train-00000-of-00003.parquet") == "train"
    assert parquet.split_of("default/validation/0000.parquet") == "val"
    assert parquet.split_of("data/test_part1.parquet") == "test"
    assert parquet.split_of("data/part-0.parquet") is None


def test_hf_names_need_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(ChuteError, match=re.escape(lazy.extra("hf", instead="huggingface_hub"))):
        chute.convert("hf:beans", tmp_path / "out", workers=1)


def test_hf_names_download_through_huggingface_hub(monkeypatch, hub, tmp_path):
    folder_of_parquet, _ = hub
    asked = []

    def snapshot_download(repo, **kwargs):
        asked.append((repo, kwargs.get("repo_type"), kwargs.get("revision")))
        return str(folder_of_parquet)  # a stand-in for the Hub's cache: nothing downloads

    fake = types.ModuleType("huggingface_hub")
    fake.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    result = chute.convert("hf:AI-Lab-Makerere/beans", tmp_path / "out", workers=1)
    assert asked == [("AI-Lab-Makerere/beans", "dataset", None)]
    assert result.manifest.class_names == CLASSES and result.manifest.num_examples("test") == 6
    with pytest.raises(ChuteError, match=r"hf:OWNER/NAME\[:CONFIG\]"):
        chute.convert("hf:", tmp_path / "bad", workers=1)


def _write_two_image_columns(path: Path) -> None:
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": _png(i), "path": f"{i}.png"} for i in range(4)], struct)
    pq.write_table(pa.table({"image": images, "thumb": images, "label": [0, 1, 0, 1]}), path)


@pytest.mark.parametrize(
    ("options", "argument", "value"),
    [
        (["--label-column", "image"], "label_column", "'image'"),
        (["--image-column", "label", "--label-column", "label"], "label_column", "'label'"),
        (["--image-column", "label"], "image_column", "'label'"),
        (["--label-column", "thumb"], "label_column", "'thumb'"),
    ],
    ids=["image-as-label", "one-column-for-both", "numbers-as-images", "images-as-labels"],
)
def test_columns_that_cannot_hold_what_they_are_asked_are_one_line_errors(
    tmp_path, options, argument, value
):
    """No pyarrow IndexError, no row read: the option and the value it received."""
    _write_two_image_columns(tmp_path / "t.parquet")
    result = run_here("convert", tmp_path / "t.parquet", tmp_path / "out", *options)
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"`{argument}`" in line and f"{argument}={value}" in line
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_string_labels_beside_class_label_metadata_are_mapped_through_its_names(tmp_path):
    rows = [(f"{i}.png", _png(20 + i), CLASSES[i % 3]) for i in range(6)]
    rows.append(("odd.png", _png(30), "not_a_class"))
    _write(tmp_path / "train.parquet", rows, metadata=_hf_metadata())
    result = chute.convert(tmp_path / "train.parquet", tmp_path / "out", workers=1)
    assert result.manifest.class_names == CLASSES
    assert {r["key"]: r["class"] for r in all_records(tmp_path / "out")} == {
        f"train.parquet#{i:08d}": i % 3 for i in range(6)
    }
    (reject,) = result.manifest.rejects
    assert reject["key"] == "train.parquet#00000006"
    assert "'not_a_class' is not a class index from 0 to 2, nor a class name" in reject["reason"]


def test_a_parquet_source_without_usable_rows_says_so_in_parquet_terms(tmp_path):
    _write(tmp_path / "train.parquet", [("a.png", None, 0), ("b.png", _png(1), None)])
    with pytest.raises(ChuteError, match="holds no images") as raised:
        chute.convert(tmp_path / "train.parquet", tmp_path / "out", workers=1)
    message = str(raised.value)
    assert "rows with image bytes and a label in its Parquet files" in message
    assert "2 refused, first 'train.parquet#00000000': no image bytes" in message
    assert "class folders" not in message and "files ending in" not in message


def _card(folder: Path, yaml: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(f"---\n{yaml}---\n# A dataset\n\n![preview](assets/p.png)\n")
    (folder / "assets").mkdir()
    (folder / "assets" / "preview.png").write_bytes(_png(99))
    (folder / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")


def test_a_hub_dataset_repository_cloned_is_read_as_parquet(hub, tmp_path):
    """README.md (the card), assets/preview.png and data/*.parquet: the Hub's layout, not a
    tree of class folders named 'assets' and 'data'."""
    folder_of_parquet, tree = hub  # folder_of_parquet/data/{train,test}-*.parquet
    clone = tmp_path / "beans"
    _card(clone, "license: mit\n")
    (clone / "data").symlink_to(folder_of_parquet / "data", target_is_directory=True)
    result = chute.convert(clone, tmp_path / "a", workers=1, image_size=(10, 12))
    assert result.manifest.source["kind"] == "parquet"
    chute.convert(tree, tmp_path / "b", workers=1, image_size=(10, 12))
    assert _by_split(tmp_path / "a") == _by_split(tmp_path / "b")
    # configuration folders beside a dataset card (its YAML header declares them)
    configs = tmp_path / "configs"
    _card(configs, "configs:\n- config_name: default\n  data_files: default/*/*.parquet\n")
    rows = [(f"{i}.png", _png(i), i % 3) for i in range(6)]
    _write(configs / "default" / "train" / "0000.parquet", rows, metadata=_hf_metadata())
    found = chute.convert(configs, tmp_path / "c", workers=1)
    assert found.manifest.source["kind"] == "parquet" and found.num_written == {"train": 6}
    # a class tree with a README.md that is no dataset card stays a class tree
    plain = tmp_path / "plain"
    _card(plain, "title: notes\n")
    (plain / "notes").mkdir()
    _write(plain / "notes" / "extra.parquet", rows)
    assert parquet.is_parquet_source(str(configs)) and not parquet.is_parquet_source(str(plain))
