"""Training pictures: curves, confusion as a heat map or as the most confused pairs, and
class captions in a font that can draw them."""

from __future__ import annotations

import numpy as np
from PIL import Image

from chute.fit import plots
from chute.fit.evaluate import EvalReport


def _report(k: int) -> EvalReport:
    confusion = sorted([(i, i, 5) for i in range(k)] + [(1, 2, 4), (3, 0, 2)])
    return EvalReport("val", 5 * k + 6, 0.5, 0.9, 1.0, [], confusion, [f"c{i}" for i in range(k)])


def test_most_confused_pairs_are_ranked():
    assert _report(4).most_confused(2) == [("c1", "c2", 4), ("c3", "c0", 2)]


def test_the_sparse_confusion_makes_the_dense_matrix():
    expected = np.eye(4, dtype=np.int64) * 5
    expected[1, 2], expected[3, 0] = 4, 2
    np.testing.assert_array_equal(_report(4).confusion_matrix(), expected)


def test_thumbnails_are_what_the_pairs_picture_shows():
    gray = np.arange(100 * 80, dtype=np.uint32).reshape(100, 80, 1).astype(np.uint8)
    assert plots.thumbnail(gray).shape == (48, 48, 1)
    assert plots.thumbnail(np.zeros((30, 20, 3), np.uint8)).shape == (48, 48, 3)


def test_heat_map_for_few_classes(tmp_path):
    path = plots.draw_confusion(_report(4), tmp_path / "c.png")
    width, height = Image.open(path).size
    assert height == 30 + 22 * 4 + 10 and width > 22 * 4


def test_many_classes_show_pairs_with_sample_images(tmp_path):
    samples = {i: np.full((8, 8, 1), 6 * i, np.uint8) for i in range(40)}
    path = plots.draw_confusion(_report(40), tmp_path / "c.png", samples=samples)
    picture = np.asarray(Image.open(path).convert("L"))
    assert picture.shape[0] == 40 + 52 * 2  # two confused pairs
    assert picture[34 + 20, 10 + 20] == 6  # class c1's sample, top left of the first row


def test_curves(tmp_path):
    history = {"loss": [2.0, 1.0, 0.5], "val_loss": [2.2, 1.4, 0.9], "accuracy": [0.2, 0.6, 0.9]}
    path = plots.draw_curves(history, tmp_path / "curves.png")
    assert Image.open(path).size == (2 * 420, 300)  # loss and accuracy panels


def test_caption_falls_back_to_label_index_without_a_font(monkeypatch):
    plots._system_fonts.cache_clear()
    monkeypatch.setattr(plots, "_system_fonts", lambda: ())
    assert plots.caption(3, "cat")[0] == "3: cat"
    assert plots.caption(4, "ಕನ್ನಡ")[0] == "4"  # Pillow's own font has no Kannada


def test_caption_uses_a_font_that_covers_the_name():
    text, font = plots.caption(5, "ಕ")
    # Either a font on this machine draws Kannada, or the caption is the index alone.
    assert text == "5" or (text == "5: ಕ" and plots.covers(font, "ಕ"))
