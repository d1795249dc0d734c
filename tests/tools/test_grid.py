"""The sample grid of a dataset: one row per class, captioned with its name."""

from __future__ import annotations

import logging

from helpers import make_folder
from PIL import Image, ImageDraw

import chute
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
