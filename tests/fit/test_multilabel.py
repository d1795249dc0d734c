"""Multi-label figures: average precision against a brute force and by hand (ties too),
thresholds tuned for F1, the report and its text, positive weights, the weighted loss
against Keras's own, and the training metrics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from chute.errors import ChuteError
from chute.fit import multilabel


def _brute_ap(positive: np.ndarray, score: np.ndarray) -> float:
    """AP straight from its definition: for each distinct score, highest first, predict
    positive at ``score >= s`` and add the recall gained times the precision there."""
    total = positive.sum()
    if total == 0:
        return math.nan
    ap, recall_before = 0.0, 0.0
    for s in sorted(set(score.tolist()), reverse=True):
        chosen = score >= s
        tp = (positive & chosen).sum()
        recall = tp / total
        ap += (recall - recall_before) * tp / chosen.sum()
        recall_before = recall
    return ap


def _brute_threshold(positive: np.ndarray, score: np.ndarray, default: float) -> float:
    """The docstring's rule, by trying every distinct score as the lowest positive."""
    if not positive.any():
        return default
    best, best_f1 = None, -1.0
    for s in sorted(set(score.tolist()), reverse=True):
        chosen = score >= s
        tp = (positive & chosen).sum()
        f1 = 2 * tp / (chosen.sum() + positive.sum())
        if f1 > best_f1:  # strictly better: equal F1 keeps the earlier, fewer positives
            best, best_f1 = s, f1
    lower = score[score < best]
    return (best / 2 + lower.max() / 2) if len(lower) else best


@pytest.mark.parametrize(
    ("positive", "score", "expected"),
    [
        ([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1], (1 + 2 / 3) / 2),
        ([0, 1], [0.9, 0.1], 0.5),
        ([1, 1], [0.3, 0.2], 1.0),
        # ties form one step: the two tied examples (one positive) enter together
        ([1, 0, 1], [0.9, 0.8, 0.8], 0.5 * 1 + 0.5 * 2 / 3),
        ([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5], 0.5),
        ([0, 0, 1], [0.4, 0.4, 0.4], 1 / 3),
    ],
)
def test_average_precision_by_hand(positive, score, expected):
    ap = multilabel.average_precision(np.array([positive]).T, np.array([score]).T)
    assert ap[0] == pytest.approx(expected)


def test_average_precision_matches_the_brute_force_with_ties_and_an_empty_label():
    rng = np.random.default_rng(3)
    positive = rng.random((200, 6)) < [0.05, 0.3, 0.5, 0.9, 0.0, 0.02]
    # few distinct values: many ties
    score = np.round(rng.random((200, 6)) * 0.7 + positive * 0.3, 1).astype(np.float32)
    ap = multilabel.average_precision(positive.astype(np.int64), score)
    expected = [_brute_ap(positive[:, j], score[:, j]) for j in range(6)]
    np.testing.assert_allclose(ap, expected, rtol=1e-12)
    assert np.isnan(ap[4])


def test_average_precision_refuses_mismatched_shapes():
    with pytest.raises(ChuteError, match=r"y_true of shape \(3, 2\), scores of shape \(3, 3\)"):
        multilabel.average_precision(np.zeros((3, 2)), np.zeros((3, 3)))


def test_precision_recall_curve_steps_at_distinct_scores():
    recall, precision = multilabel.precision_recall_curve([1, 0, 1, 1], [0.9, 0.8, 0.8, 0.1])
    np.testing.assert_allclose(recall, [1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(precision, [1, 2 / 3, 3 / 4])
    assert multilabel.precision_recall_curve([0, 0], [0.1, 0.2])[0].size == 0


@pytest.mark.parametrize(
    ("positive", "score", "expected"),
    [
        ([1, 0, 1, 0], [0.9, 0.7, 0.6, 0.2], 0.4),  # all positives in: midpoint of 0.6, 0.2
        ([1, 1, 0, 1], [0.9, 0.8, 0.7, 0.1], 0.1),  # F1 0.8 at 0.8 < 6/7 with all four in
        ([1, 1, 0, 0, 1], [0.9, 0.8, 0.7, 0.6, 0.1], 0.75),  # 0.8 at 0.8 > 0.75 with all in
        ([1, 0], [0.9, 0.1], 0.5),
        ([1, 1], [0.5, 0.5], 0.5),  # nothing lower: the lowest positive score itself
        ([1, 0], [0.3, 0.3], 0.3),  # tied with a negative: both in
        ([0, 0], [0.9, 0.1], 0.5),  # no positive: the default
    ],
)
def test_thresholds_by_hand(positive, score, expected):
    positive, score = np.array([positive]).T, np.array([score]).T
    brute = _brute_threshold(positive[:, 0] > 0, score[:, 0], 0.5)
    assert multilabel.tune_thresholds(positive, score)[0] == pytest.approx(brute)
    assert brute == pytest.approx(expected)


def test_equal_f1_prefers_fewer_positives():
    # F1 at 0.9 (1 of 2 found, 1 predicted) = 2/3; at 0.1 (2 found, 4 predicted) = 2/3
    thresholds = multilabel.tune_thresholds([[1], [0], [0], [1]], [[0.9], [0.5], [0.3], [0.1]])
    assert thresholds[0] == pytest.approx(0.7)


def test_thresholds_match_the_brute_force_and_keep_the_default():
    rng = np.random.default_rng(5)
    positive = rng.random((150, 5)) < [0.1, 0.4, 0.7, 0.0, 0.03]
    score = np.round(rng.random((150, 5)) * 0.6 + positive * 0.4, 2)
    thresholds = multilabel.tune_thresholds(positive, score, default=0.25)
    expected = [_brute_threshold(positive[:, j], score[:, j], 0.25) for j in range(5)]
    np.testing.assert_allclose(thresholds, expected)
    assert thresholds[3] == 0.25


def test_a_threshold_between_adjacent_float32_scores_keeps_the_lower_one_out():
    low = np.float32(0.5)
    below = np.nextafter(low, np.float32(0))
    scores = np.array([[low], [below]], np.float32)
    threshold = multilabel.tune_thresholds([[1], [0]], scores)[0]
    assert np.float32(threshold) > below and low >= np.float32(threshold)


def test_label_report_figures_and_json():
    y = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0]])
    s = np.array([[0.9, 0.1, 0.7], [0.4, 0.8, 0.1], [0.6, 0.7, 0.2], [0.1, 0.2, 0.1]])
    report = multilabel.label_report(y, s, [0.5, 0.5, 0.5], ["a", "b", "c"])
    json.dumps(report, allow_nan=False)
    a, b, c = report["labels"]
    # a: predicted rows 0 and 2, truly 0 and 1
    assert (a["precision"], a["recall"], a["f1"], a["support"]) == (0.5, 0.5, 0.5, 2)
    assert a["ap"] == pytest.approx((1 + 2 / 3) / 2)
    assert (b["precision"], b["recall"], b["f1"], b["ap"]) == (1.0, 1.0, 1.0, 1.0)
    # c: no positive, one false alarm: no AP, no recall; F1 0 counts nowhere
    assert (c["ap"], c["recall"], c["precision"], c["f1"], c["support"]) == (None, None, 0, 0, 0)
    assert report["map"] == pytest.approx((a["ap"] + 1) / 2)
    assert report["macro_f1"] == pytest.approx(0.75)
    # micro: tp 3, fp 2, positives 4
    assert report["micro_precision"] == pytest.approx(3 / 5)
    assert report["micro_recall"] == pytest.approx(3 / 4)
    assert report["micro_f1"] == pytest.approx(6 / 9)
    assert report["examples"] == 4 and c["threshold"] == 0.5


def test_label_report_with_nothing_predicted_and_no_positives_anywhere():
    report = multilabel.label_report(np.zeros((2, 2)), np.zeros((2, 2)), [0.5, 0.5], ["a", "b"])
    assert report["map"] is None and report["macro_f1"] is None and report["micro_f1"] is None
    assert report["labels"][0]["precision"] is None
    assert "mAP -" in multilabel.format_report(report)


def test_label_report_needs_a_threshold_and_a_name_per_label():
    with pytest.raises(ChuteError, match="Received: 1 thresholds, 2 class names"):
        multilabel.label_report(np.zeros((2, 2)), np.zeros((2, 2)), [0.5], ["a", "b"])


def test_format_report_rows_and_the_weakest_first():
    y = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]])
    s = np.array([[0.9, 0.6, 0.2], [0.3, 0.7, 0.9], [0.8, 0.1, 0.4]])
    report = multilabel.label_report(y, s, [0.5, 0.5, 0.5], ["cat", "dog", "outdoor"])
    text = multilabel.format_report(report, split="test")
    lines = text.splitlines()
    assert lines[0].startswith("test: 3 images, mAP ")
    assert "(macro, labels with a positive)" in lines[0]  # which mAP, named
    assert lines[1].split() == ["label", "AP", "F1", "precision", "recall", "support", "threshold"]
    assert lines[2].split() == ["cat", "1.000", "1.000", "1.000", "1.000", "2", "0.500"]
    weakest = multilabel.format_report(report, most=1).splitlines()
    assert len(weakest) == 3 and weakest[2].split()[0] == "dog"  # dog's AP is 0.583


def test_positive_weights():
    weights = multilabel.positive_weights([10, 50, 0, 1, 90], 100, cap=50)
    np.testing.assert_allclose(weights, [9, 1, 1, 50, 1])
    assert multilabel.positive_weights([1], 10**6)[0] == multilabel.DEFAULT_WEIGHT_CAP


@pytest.mark.parametrize(
    ("counts", "cap", "match"),
    [([5, 101], 10, "between 0 and num_examples"), ([-1], 10, "between 0"), ([1], 0.5, "cap")],
)
def test_positive_weights_refuse_bad_arguments(counts, cap, match):
    with pytest.raises(ChuteError, match=match):
        multilabel.positive_weights(counts, 100, cap=cap)


def _batch():
    rng = np.random.default_rng(0)
    y = (rng.random((8, 4)) < 0.4).astype(np.float32)
    p = rng.random((8, 4)).astype(np.float32) * 0.98 + 0.01
    return y, p


def test_the_loss_without_weights_is_keras_own():
    keras = pytest.importorskip("keras")
    assert type(multilabel.make_loss()) is keras.losses.BinaryCrossentropy


def test_weights_of_one_give_keras_binary_cross_entropy():
    keras = pytest.importorskip("keras")
    y, p = _batch()
    for reduction in ("sum_over_batch_size", "none"):
        ours = multilabel.make_loss([1.0] * 4, reduction=reduction)(y, p)
        theirs = keras.losses.BinaryCrossentropy(reduction=reduction)(y, p)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs), rtol=1e-5
        )


def test_a_weight_multiplies_the_positive_term():
    keras = pytest.importorskip("keras")
    y, p = _batch()
    w = np.array([1.0, 3.0, 0.5, 10.0], np.float32)
    got = keras.ops.convert_to_numpy(multilabel.make_loss(w, reduction="none")(y, p))
    positive, negative = -y * np.log(p), -(1 - y) * np.log(1 - p)
    np.testing.assert_allclose(got, (w * positive + negative).mean(-1), rtol=1e-5)
    # logits: the same figures from the stable form
    logits = np.log(p / (1 - p))
    from_logits = multilabel.make_loss(w, from_logits=True, reduction="none")(y, logits)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(from_logits), got, rtol=1e-4)


def test_the_weighted_loss_survives_save_and_load(tmp_path):
    keras = pytest.importorskip("keras")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="sigmoid")(inputs))
    model.compile(loss=multilabel.make_loss([2.0, 5.0]), optimizer="sgd")
    model.save(tmp_path / "m.keras")
    multilabel.register_serializables()
    loaded = keras.models.load_model(tmp_path / "m.keras", compile=True, safe_mode=True)
    assert loaded.loss.positive_weights == [2.0, 5.0]
    assert loaded.loss.get_config()["name"] == "weighted_binary_crossentropy"


def test_training_metrics_compile_and_update():
    keras = pytest.importorskip("keras")
    metrics = multilabel.training_metrics(3)
    assert [m.name for m in metrics] == ["map", "auc", "micro_f1", "macro_f1"]
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid")(inputs))
    model.compile(loss=multilabel.make_loss(), optimizer="sgd", metrics=metrics)
    rng = np.random.default_rng(1)
    x = rng.random((16, 4)).astype(np.float32)
    y = (rng.random((16, 3)) < 0.5).astype(np.float32)
    figures = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert {"map", "auc", "micro_f1", "macro_f1"} <= set(figures)
    assert all(0 <= figures[name] <= 1 for name in ("map", "auc", "micro_f1", "macro_f1"))


def test_the_training_map_averages_the_labels_with_a_positive_as_evaluate_does(multi_label_data):
    """Keras's PR-AUC of a label with no positive is 0: averaged in, it pulled the
    training summary's mAP far below evaluate's (0.0015 against 0.0145 on 10,000 labels).
    The training-time ``map`` averages the labels the monitored split has a positive of."""
    import chute
    from chute.fit import train as training
    from chute.fit.multilabel import training_metrics

    rng = np.random.default_rng(0)
    truth = (rng.random((64, 3)) < 0.4).astype("float32")
    truth[:, 2] = 0  # no positive of label 2
    scores = rng.random((64, 3)).astype("float32")
    masked = training_metrics(3, present=[True, True, False])[0]
    masked.update_state(truth, scores)
    alone = training_metrics(2)[0]  # labels 0 and 1 only
    alone.update_state(truth[:, :2], scores[:, :2])
    every = training_metrics(3)[0]
    every.update_state(truth, scores)
    assert float(masked.result()) == pytest.approx(float(alone.result()), abs=1e-6)
    assert float(every.result()) < float(alone.result()) - 0.1  # label 2 counted as 0
    manifest = chute.load_manifest(multi_label_data)
    present = training._labels_present(manifest, "val")
    assert present == [count > 0 for count in manifest.split("val").class_counts]
    assert training._labels_present(chute.load_manifest(str(multi_label_data)), "train")


def test_large_reports_pool_and_average_in_blocks_with_the_same_figures(monkeypatch):
    """10,000 images of 10,000 labels held GBs: the loss is summed a block of rows at a
    time and the micro-average curve counted in score bins; on arrays made "large" here
    both agree with the whole-array figures (the loss to float64 rounding, the pooled
    AP to the bins' width)."""
    from chute.fit import evaluate_labels

    rng = np.random.default_rng(0)
    truth = (rng.random((300, 40)) < 0.1).astype(np.float32)
    scores = np.clip(truth * 0.3 + rng.random((300, 40)) * 0.7, 0, 1).astype(np.float32)
    p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    whole = -(truth * np.log(p) + (1 - truth) * np.log(1 - p)).mean()
    monkeypatch.setattr(evaluate_labels, "_LOSS_ROWS", 7)
    assert evaluate_labels._binary_cross_entropy(truth, scores) == pytest.approx(whole, rel=1e-9)

    def pooled_ap(recall, precision):
        return float(np.sum(np.diff(recall, prepend=0.0) * precision))

    exact = pooled_ap(*multilabel.pooled_precision_recall(truth, scores))
    monkeypatch.setattr(multilabel, "_EXACT_CELLS", 100)
    monkeypatch.setattr(multilabel, "_BIN_ROWS", 64)
    binned = pooled_ap(*multilabel.pooled_precision_recall(truth, scores))
    assert binned == pytest.approx(exact, abs=2e-3) and 0.3 < exact < 1
