"""Training pictures: curves, confusion as a heat map or as the most confused pairs, and
class captions in a font that can draw them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

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


def _texts(monkeypatch) -> list[tuple[tuple[float, float], str]]:
    """Records every ``(position, text)`` the pictures draw (Pillow draws them still)."""
    drawn: list[tuple[tuple[float, float], str]] = []
    original = ImageDraw.ImageDraw.text

    def text(self, xy, string, *args, **kwargs):
        drawn.append((tuple(xy), string))
        return original(self, xy, string, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)
    return drawn


@pytest.mark.parametrize(
    ("epochs", "ticks"),
    [(1, [1]), (3, [1, 2, 3]), (10, list(range(1, 11))), (12, [1, 2, 4, 6, 8, 10, 12]),
     (40, [1, 5, 10, 15, 20, 25, 30, 35, 40]), (230, [1, 50, 100, 150, 200])],
)  # fmt: skip
def test_epoch_ticks_are_whole_epochs_about_ten_at_most(epochs, ticks):
    assert plots.epoch_ticks(epochs) == ticks


def test_curves_mark_the_epochs_on_the_x_axis(tmp_path, monkeypatch):
    drawn = _texts(monkeypatch)
    history = {"loss": [2.0, 1.0, 0.5], "val_loss": [2.2, 1.4, 0.9], "accuracy": [0.2, 0.6, 0.9]}
    path = plots.draw_curves(history, tmp_path / "curves.png")
    for left in (0, 420):  # each panel: epochs 1, 2, 3 from the box's left to its right
        ticks = {text: x for (x, y), text in drawn if text in "123" and left <= x < left + 420}
        assert list(ticks) == ["1", "2", "3"]
        assert ticks["1"] == left + 40 and ticks["3"] == left + 420 - 15
        assert ticks["2"] == (ticks["1"] + ticks["3"]) / 2
    assert [text for _, text in drawn].count("epoch") == 2
    picture = np.asarray(Image.open(path).convert("L"))
    assert picture[300 - 40 + 2, 40 + (420 - 15 - 40) // 2] < 128  # epoch 2's tick mark


def test_heat_map_shows_each_count_and_a_colour_scale(tmp_path, monkeypatch):
    drawn = _texts(monkeypatch)
    report = _report(4)
    path = plots.draw_confusion(report, tmp_path / "c.png")
    cell, left, top = 22, 170, 30
    matrix = report.confusion_matrix()
    for i in range(4):
        for j in range(4):
            centre = (left + j * cell + cell / 2, top + i * cell + cell / 2)
            assert (centre, str(matrix[i, j])) in drawn
    picture = np.asarray(Image.open(path).convert("RGB")).astype(int)
    # the colour scale, right of the matrix: blue (right) and red (wrong) bars from the
    # largest count (5, at the top) down to 0 (white, at the bottom)
    right = left + 4 * cell
    columns = [x for x in range(right, picture.shape[1]) if tuple(picture[top, x]) == (0, 0, 255)]
    assert columns, "no blue bar"
    bar = columns[0]
    assert tuple(picture[top + 4 * cell - 1, bar]) == (255, 255, 255)
    reds = [x for x in range(bar, picture.shape[1]) if tuple(picture[top, x]) == (255, 0, 0)]
    assert reds and tuple(picture[top + 4 * cell - 1, reds[0]]) == (255, 255, 255)
    shades = picture[top : top + 4 * cell, bar, 0]
    assert (np.diff(shades) >= 0).all()  # lighter all the way down
    labels = [text for (x, _), text in drawn if x > bar]
    assert "5" in labels and "0" in labels  # its ends, labelled


def test_precision_recall_draws_the_most_frequent_labels_and_the_micro_average(
    tmp_path, monkeypatch
):
    drawn = _texts(monkeypatch)
    rng = np.random.default_rng(0)
    y = rng.random((60, 4)) < [0.5, 0.2, 0.0, 0.1]
    scores = np.where(y, 0.6, 0.4) + rng.random((60, 4)) * [0.0, 0.3, 0.3, 0.5]
    names = ["cat", "dog", "never", "a-very-long-label-name-that-cannot-fit-in-the-legend"]
    path = plots.draw_precision_recall(y, scores, names, tmp_path / "pr.png", max_labels=2)
    picture = np.asarray(Image.open(path).convert("RGB"))
    assert picture.shape[1] == 760
    texts = [text for _, text in drawn]
    title = next(text for text in texts if text.startswith("precision-recall (val): mAP "))
    assert title.endswith(", curves of the 2 most frequent of 3 labels")
    # the one mAP chute reports, named: not the micro-average's pooled figure
    assert " (macro, labels with a positive), curves" in title
    assert "0: cat" in texts and "1: dog" in texts and "micro-average" in texts
    assert "2: never" not in texts  # no positive: no curve
    # cat is separated perfectly: precision 1 all the way, along the box's top edge
    assert "AP 1.000" in texts
    top_edge = picture[50:55, 50 : 50 + 380]
    assert (top_edge == (0x1F, 0x77, 0xB4)).all(-1).any()


def test_precision_recall_cuts_a_long_name_and_takes_the_labels_ap(tmp_path, monkeypatch):
    drawn = _texts(monkeypatch)
    y = np.array([[1, 0], [0, 1], [1, 1]])
    scores = np.array([[0.9, 0.2], [0.4, 0.7], [0.6, 0.1]])
    names = ["cat", "a-very-long-label-name-that-cannot-fit-in-the-legend-at-all"]
    plots.draw_precision_recall(y, scores, names, tmp_path / "pr.png", ap=[0.25, 0.5])
    texts = [text for _, text in drawn]
    assert "AP 0.250" in texts and "AP 0.500" in texts
    assert any(t.startswith("1: a-very") and t.endswith("...") for t in texts)
    assert any(t.startswith("precision-recall (val): mAP 0.375") for t in texts)
