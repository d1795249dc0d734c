"""The sample grid of a dataset: one row per class, captioned with its name."""

from __future__ import annotations

from helpers import make_folder
from PIL import Image

import chute
from chute.tools import grid


def test_grid_with_kannada_class_names(tmp_path):
    src = make_folder(tmp_path / "src", {"ಕ": 3, "ಖ": 3}, size=(8, 8))
    chute.convert(src, tmp_path / "out", workers=1)
    path = grid.draw_grid(tmp_path / "out", tmp_path / "grid.png", per_class=3)
    assert Image.open(path).size[1] == 2 * (64 + 2)
