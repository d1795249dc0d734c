"""The sample grid of a dataset: one row per class, captioned with its name."""

from __future__ import annotations

import logging

import pytest
from helpers import make_folder
from object_stores import new_s3_bucket
from PIL import Image, ImageDraw

import chute
from chute.errors import ChuteError
from chute.format import storage
from chute.tools import grid


def test_grid_with_kannada_class_names(tmp_path):
    src = make_folder(tmp_path / "src", {"ಕ": 3, "ಖ": 3}, size=(8, 8))
    chute.convert(src, tmp_path / "out", workers=1)
    path = grid.draw_grid(tmp_path / "out", tmp_path / "grid.png", per_class=3)
    assert Image.open(path).size[1] == 2 * (64 + 2)


def test_a_grid_of_some_classes_says_how_many_it_shows(tmp_path, caplog, monkeypatch):
    src = make_folder(tmp_path / "src", {f"k{i}": 1 for i in range(5)}, size=(8, 8))
    chute.convert(src, tmp_path / "out", workers=1)
    drawn = []
    original = ImageDraw.ImageDraw.text
    monkeypatch.setattr(
        ImageDraw.ImageDraw,
        "text",
        lambda self, xy, text, *a, **k: drawn.append(text) or original(self, xy, text, *a, **k),
    )
    with caplog.at_level(logging.INFO, logger="chute.tools.grid"):
        path = grid.draw_grid(tmp_path / "out", tmp_path / "grid.png", per_class=1, max_classes=3)
    assert drawn[0] == "train: 3 of 5 classes (labels spread evenly)"  # the title, first
    assert drawn[1:] == ["0: k0", "2: k2", "4: k4"]
    assert "shows 3 of the 5 classes of train" in caplog.text
    assert Image.open(path).size[1] == grid._TITLE_HEIGHT + 3 * (64 + 2)


def test_a_damaged_shard_is_named_with_its_dataset(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3}, size=(8, 8))
    chute.convert(src, tmp_path / "out", workers=1, val_fraction=0.0)
    shard = chute.load_manifest(tmp_path / "out").split("train").shards[0]
    path = tmp_path / "out" / shard.name
    path.write_bytes(path.read_bytes()[: -(shard.bytes - 5)])  # ends inside the first header
    with pytest.raises(ChuteError) as caught:
        grid.draw_grid(tmp_path / "out", tmp_path / "grid.png", per_class=3)
    message = str(caught.value)
    assert "ends inside a record's header" in message and shard.name in message
    assert repr(str(tmp_path / "out")) in message and "chute verify" in message


def test_a_refusal_part_way_through_a_bucket_shard_is_one_line(s3_endpoint, tmp_path, monkeypatch):
    src = make_folder(tmp_path / "src", {"a": 3, "b": 3}, size=(8, 8))
    location = new_s3_bucket(s3_endpoint) + "/shards"
    chute.convert(src, location, workers=1, val_fraction=0.0)
    real = storage.open_file

    class Refused:  # what s3fs raises on a 403 once the credentials expire mid-read
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, size=-1):
            raise PermissionError(13, "Access Denied")

    monkeypatch.setattr(storage, "open_file", lambda path, mode="rb": Refused(real(path, mode)))
    with pytest.raises(ChuteError, match=r"^No access to 's3://.*/shards/train-") as caught:
        grid.draw_grid(location, tmp_path / "grid.png", per_class=1)
    assert "\n" not in str(caught.value)


def test_grid_captions_are_large_and_quote_names_that_are_numbers(tmp_path, monkeypatch):
    src = make_folder(tmp_path / "src", {"11": 1, "2": 1, "cat": 1}, size=(8, 8))
    chute.convert(src, tmp_path / "out", workers=1, val_fraction=0.0)
    drawn = []
    original = ImageDraw.ImageDraw.text

    def text(self, xy, string, *args, **kwargs):
        drawn.append((string, kwargs["font"].size))
        return original(self, xy, string, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)
    grid.draw_grid(tmp_path / "out", tmp_path / "grid.png", per_class=1)
    # folders "11" and "2" sort as text: class 0 is "11", class 1 is "2"
    assert drawn == [('class 0: "11"', 18), ('class 1: "2"', 18), ("2: cat", 18)]
    grid.draw_grid(tmp_path / "out", tmp_path / "small.png", per_class=1, cell=32)
    assert drawn[-1] == ("2: cat", 10)  # a smaller cell, a smaller caption (10 at least)
