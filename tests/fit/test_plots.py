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


def test_heat_map_for_few_classes(tmp_path, monkeypatch):
    drawn = _calls(monkeypatch)
    path = plots.draw_confusion(_report(4), tmp_path / "c.png")
    width, height = Image.open(path).size
    xs, ys = _cells(drawn)
    # 4 x 4 cells of 22 pixels or more, every one in the picture
    assert len(xs) == len(ys) == 4 and min(np.diff(xs)) >= 22 and min(np.diff(ys)) >= 22
    assert np.ptp(np.diff(xs)) == np.ptp(np.diff(ys)) == 0 and np.diff(xs)[0] == np.diff(ys)[0]
    assert xs[-1] < width - 22 and ys[-1] < height - 11


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


def _calls(monkeypatch) -> list[tuple[tuple[float, float], str, dict]]:
    """Records every ``(position, text, keywords)`` the pictures draw."""
    drawn: list[tuple[tuple[float, float], str, dict]] = []
    original = ImageDraw.ImageDraw.text

    def text(self, xy, string, *args, **kwargs):
        drawn.append((tuple(xy), string, kwargs))
        return original(self, xy, string, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)
    return drawn


def _cells(drawn) -> tuple[list[float], list[float]]:
    """The centres of the heat map's columns and rows: where the counts are drawn (small,
    centred on their cells)."""
    centres = [xy for xy, _, kw in drawn if kw.get("anchor") == "mm" and kw["font"].size == 11]
    return sorted({x for x, _ in centres}), sorted({y for _, y in centres})


def _box(call) -> tuple[float, float, float, float]:
    xy, text, kw = call
    kw = {k: v for k, v in kw.items() if k in ("font", "anchor")}
    return ImageDraw.Draw(Image.new("L", (1, 1))).textbbox(xy, text, **kw)


def test_heat_map_shows_each_count_and_a_colour_scale(tmp_path, monkeypatch):
    drawn = _calls(monkeypatch)
    report = _report(4)
    path = plots.draw_confusion(report, tmp_path / "c.png")
    xs, ys = _cells(drawn)
    matrix = report.confusion_matrix()
    for i in range(4):
        for j in range(4):
            assert ((xs[j], ys[i]), str(matrix[i, j])) in [(xy, t) for xy, t, _ in drawn]
    picture = np.asarray(Image.open(path).convert("RGB")).astype(int)
    cell = xs[1] - xs[0]
    right, top = xs[-1] + cell / 2, ys[0] - cell / 2
    # one colour scale, right of the matrix, each count 0..5 marked beside it
    ticks = {t: xy for xy, t, _ in drawn if xy[0] > right}
    assert [t for t in ticks if t.isdigit()] == ["0", "1", "2", "3", "4", "5"]
    assert ticks["5"][1] == pytest.approx(top, abs=1) and ticks["0"][1] > ticks["5"][1]
    ys_of = [ticks[str(n)][1] for n in range(6)]
    assert np.ptp(np.diff(ys_of)) < 1  # evenly spaced
    # the bar: left of its ticks, from the darkest blue at 5 (top) to near white at 0
    bar = next(x for x in range(int(right), picture.shape[1]) if picture[int(ys_of[3]), x, 0] < 200)
    column = picture[int(ys_of[-1]) + 1 : int(ys_of[0]) - 1, bar + 4]
    assert (np.diff(column.sum(-1)) >= 0).all()  # lighter all the way down
    assert column[0].sum() < 3 * 100 and column[-1].sum() > 3 * 230
    assert (column[:, 2] >= column[:, 0]).all()  # blue, one hue: no second (red) scale
    reddish = (picture[..., 0] > picture[..., 2] + 40).sum()
    assert reddish == 0
    # the darkest cell (the diagonal's 5) has the scale's top colour
    assert tuple(picture[int(ys[0]) - 6, int(xs[0]) - 6]) == plots._shade(1.0) == (8, 48, 107)
    assert np.abs(column[0] - (8, 48, 107)).max() < 10


def test_heat_map_names_the_classes_along_both_axes(tmp_path, monkeypatch):
    drawn = _calls(monkeypatch)
    report = EvalReport(
        "val", 20, 0.5, 0.9, 1.0, [], [(0, 0, 5), (1, 1, 5), (2, 2, 5), (2, 0, 5)],
        ["cat", "dog", "2"],
    )  # fmt: skip
    path = plots.draw_confusion(report, tmp_path / "c.png")
    xs, ys = _cells(drawn)
    texts = [t for _, t, _ in drawn]
    # each name twice: a row's (left of the matrix, on the row's line) and a column's
    for i, name in enumerate(["0: cat", "1: dog", 'class 2: "2"']):
        assert texts.count(name) == 2, texts
        (row,) = [xy for xy, t, kw in drawn if t == name and kw.get("anchor") == "rm"]
        assert row[1] == ys[i] and row[0] < xs[0]
    assert "true class" in texts and "predicted class" in texts
    # the columns' names stand upright above their columns: ink right above each, nothing
    # between the columns
    picture = np.asarray(Image.open(path).convert("L")).astype(int)
    cell = xs[1] - xs[0]
    above = picture[int(ys[0] - cell / 2) - 60 : int(ys[0] - cell / 2) - 6]
    for x in xs:
        assert (above[:, int(x) - 3 : int(x) + 4] < 128).sum() > 20
    for x in np.array(xs[:-1]) + cell / 2:
        assert (above[:, int(x)] >= 128).all()


@pytest.mark.parametrize(
    ("name", "text"),
    [("cat", "0: cat"), ("2", 'class 0: "2"'), ("-1.5", 'class 0: "-1.5"'), ("k2", "0: k2"),
     (" 7 ", 'class 0: " 7 "')],
)  # fmt: skip
def test_a_name_that_reads_as_a_number_is_quoted(name, text):
    assert plots.caption(0, name)[0] == text


def test_names_in_detailed_scripts_are_drawn_larger(monkeypatch):
    sizes = []
    monkeypatch.setattr(plots, "_system_fonts", lambda: ("some-font.ttf",))
    monkeypatch.setattr(plots, "covers", lambda font, text: font is not None)
    monkeypatch.setattr(plots, "_font", lambda path, size=14: sizes.append(size) or path)
    shown = []
    for name in ("cat", "Ωμέγα", "Кириллица", "ಅ", "猫", "2"):
        assert plots.caption(0, name)[1] == "some-font.ttf"
        shown.append(sizes[-1])
    assert shown == [14, 14, 14, 21, 21, 14]
    plots.caption(0, "ಆ", 18)
    assert sizes[-1] == 27


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [(0.1, 0.955, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]), (0.2, 2.55, [0, 0.5, 1, 1.5, 2, 2.5, 3]),
     (0.25, 0.62, [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]), (0, 5, [0, 1, 2, 3, 4, 5]),
     (0.5, 0.5, [0.44, 0.46, 0.48, 0.5, 0.52, 0.54, 0.56])],  # one value: a tick either side
)  # fmt: skip
def test_axis_ticks_are_round_and_cover_the_values(low, high, ticks):
    assert plots.axis_ticks(low, high, most=7) == pytest.approx(ticks)
    assert plots.axis_ticks(0, 2, whole=True) == [0, 1, 2]  # counts: whole numbers only
    assert plots.tick_texts([0.0, 0.5, 1.0]) == ["0.0", "0.5", "1.0"]


def test_curves_name_each_metric_grid_their_values_and_mark_the_best_epoch(tmp_path, monkeypatch):
    drawn = _calls(monkeypatch)
    history = {"loss": [2.0, 1.0, 0.5], "val_loss": [2.2, 1.4, 0.9],
               "accuracy": [0.2, 0.6, 0.9], "val_accuracy": [0.3, 0.7, 0.65],
               "top5": [0.5, 0.8, 1.0], "val_top5": [0.5, 0.9, 0.9]}  # fmt: skip
    path = plots.draw_curves(history, tmp_path / "curves.png")
    texts = [t for _, t, _ in drawn]
    titles = ["loss per epoch", "accuracy per epoch", "top-5 accuracy per epoch"]
    assert all(title in texts for title in titles)
    # the y axis: round values, more than its ends, right-aligned left of each box
    for left in (0, 420, 840):
        values = [t for (x, _), t, kw in drawn if kw.get("anchor") == "rm" and left < x < left + 40]
        assert len(values) >= 4, values
    accuracy = [t for (x, _), t, kw in drawn if kw.get("anchor") == "rm" and 420 < x < 460]
    assert accuracy == ["0.2", "0.4", "0.6", "0.8", "1.0"]
    # the best model's epoch (val_accuracy picks it: epoch 2) marked and said
    assert texts.count("best model: epoch 2") == 2  # loss and top-5
    assert "best model: epoch 2, val_accuracy 0.7" in texts
    picture = np.asarray(Image.open(path).convert("RGB")).astype(int)
    best_x = 420 + 40 + (420 - 15 - 40) // 2  # epoch 2, half way along the accuracy box
    green = (picture[:, best_x - 1 : best_x + 2] == (0x2C, 0xA0, 0x2C)).all(-1).any(-1)
    assert green.sum() > 50  # a dashed line down the box
    # the grid: light lines across the box at each value
    assert (picture[49:260, 420 + 100] == (0xE5, 0xE5, 0xE5)).all(-1).sum() >= 3  # 0.4 to 0.8
    # no label collides with another (the lowest y value and the x axis's "1" first)
    boxes = [_box(call) for call in drawn if call[2].get("anchor") in ("rm", "mt")]
    for n, a in enumerate(boxes):
        for b in boxes[n + 1 :]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


def test_multi_label_curves_show_the_map_that_picks_the_best_model(tmp_path, monkeypatch):
    drawn = _calls(monkeypatch)
    history = {"loss": [0.6, 0.4, 0.3], "val_loss": [0.6, 0.5, 0.45], "map": [0.3, 0.5, 0.6],
               "val_map": [0.3, 0.5, 0.45], "auc": [0.6, 0.7, 0.8]}  # fmt: skip
    path = plots.draw_curves(history, tmp_path / "curves.png")
    assert Image.open(path).size == (2 * 420, 300)  # loss and mAP
    texts = [t for _, t, _ in drawn]
    assert "mAP (PR-AUC estimate) per epoch" in texts
    assert "best model: epoch 2, val_map 0.5" in texts
    assert plots.best_epoch(history) == ("val_map", 1)
    assert plots.best_epoch({"loss": [1.0], "map": [0.1, 0.4]}) == ("map", 1)
    assert plots.best_epoch({"loss": [1.0]}) is None


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
