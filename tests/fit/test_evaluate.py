"""Evaluation's arithmetic: top-k labels, and the running tally at 10,000 classes."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from chute.fit.evaluate import Tally, top_labels


def _reference(probs: np.ndarray, labels: np.ndarray) -> dict:
    """The figures as a full stable sort and a dense confusion give them."""
    k = probs.shape[1]
    order = np.argsort(-probs, axis=1, kind="stable")
    predicted = order[:, 0]
    confusion = np.zeros((k, k), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    chosen = probs[np.arange(len(labels)), labels].astype(np.float64)
    return {
        "loss": float(-np.log(np.clip(chosen, 1e-12, 1.0)).mean()),
        "accuracy": float((predicted == labels).mean()),
        "top5": float((order[:, :5] == labels[:, None]).any(1).mean()),
        "confusion": confusion,
    }


@pytest.mark.parametrize("k", [1, 3, 5, 6, 50])
def test_top_labels_match_a_stable_sort_ties_included(k):
    rng = np.random.default_rng(k)
    probs = rng.random((200, 50)).astype(np.float32)
    probs[:50] = np.round(probs[:50], 1)  # many equal scores, at the k-th place too
    probs[50:60] = 0.0  # every score equal
    expected = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(top_labels(probs, k), expected)


def test_the_tally_gives_the_figures_of_a_full_sort_batch_by_batch():
    rng = np.random.default_rng(0)
    k, n = 12, 300
    logits = rng.normal(size=(n, k)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    probs[:40] = np.round(probs[:40], 1)  # ties
    labels = rng.integers(0, k, n)
    labels[:5] = 0  # class 11 may be absent: its accuracy is None
    tally = Tally(k)
    for start in range(0, n, 64):
        tally.add(probs[start : start + 64], labels[start : start + 64])
    names = [f"c{i}" for i in range(k)]
    report = tally.report("val", names)
    expected = _reference(probs, labels)
    assert report.examples == n
    assert report.loss == pytest.approx(expected["loss"], rel=1e-6)
    assert report.accuracy == expected["accuracy"] and report.top5 == expected["top5"]
    np.testing.assert_array_equal(report.confusion_matrix(), expected["confusion"])
    assert all(n > 0 for _, _, n in report.confusion)  # only pairs seen are stored
    for label, row in enumerate(report.per_class):
        total = int(expected["confusion"][label].sum())
        assert row["class"] == names[label] and row["examples"] == total
        right = expected["confusion"][label, label]
        assert row["accuracy"] == (right / total if total else None)


def test_ten_thousand_classes_stay_within_the_batch_and_the_pairs_seen():
    """No classes² matrix, no examples × classes scores kept: 2,000 examples over
    10,000 classes peak far below the 800 MB a dense int64 confusion would take."""
    k, n, batch = 10_000, 2_000, 250
    rng = np.random.default_rng(1)
    tally = Tally(k)
    tracemalloc.start()
    try:
        for _ in range(n // batch):
            probs = rng.random((batch, k), dtype=np.float32)
            tally.add(probs, rng.integers(0, k, batch))
        report = tally.report("val", [f"c{i}" for i in range(k)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.examples == n and len(report.confusion) <= n
    assert len(report.per_class) == k
    assert peak < 60 * 2**20, f"peak {peak / 2**20:.0f} MB"


def test_the_weakest_classes_are_those_below_perfect_or_none():
    """``chute evaluate`` listed classes that scored 1.00 among the weakest; now only those
    below 1 (rounded down, so none reads 1.00), or a line saying there are none."""
    from chute import cli

    per_class = [
        {"class": "a", "accuracy": 1.0},
        {"class": "b", "accuracy": 0.5},
        {"class": "c", "accuracy": 0.999},
        {"class": "d", "accuracy": None},  # no image in the split
        {"class": "e", "accuracy": 1.0},
    ]
    assert cli._weakest_classes(per_class) == "weakest classes: b 0.50, c 0.99"
    perfect = [c for c in per_class if c["class"] in "ade"]
    assert cli._weakest_classes(perfect) == (
        "weakest classes: none (every class with images scored 1.00)"
    )
