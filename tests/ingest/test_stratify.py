"""Multi-label splits: iterative stratification keeps each label's share, exact totals,
a training image per label; split_items and LeakGuard take label sets."""

from __future__ import annotations

import hashlib
import random

import pytest

from chute import ChuteError
from chute.ingest.sources.base import Item
from chute.ingest.split import LeakGuard, split_items
from chute.ingest.stratify import stratified_multilabel


def _skewed(n: int = 400, num_classes: int = 10, seed: int = 7) -> list[tuple[int, ...]]:
    """Label c on about 0.5/(c+1) of the images, the last label on half of label 0's
    (co-occurrence), and some images with no label."""
    rng = random.Random(seed)
    sets = []
    for _ in range(n):
        labels = {c for c in range(num_classes) if rng.random() < 0.5 / (c + 1)}
        if 0 in labels and rng.random() < 0.5:
            labels.add(num_classes - 1)
        sets.append(tuple(sorted(labels)))
    return sets


def _keys(n: int) -> list[str]:
    return [f"img/{i:05d}.png" for i in range(n)]


def _split(sets, val=0.2, test=0.1, seed=0, keys=None, num_classes=10):
    keys = keys or _keys(len(sets))
    return stratified_multilabel(
        sets, keys, num_classes, val_fraction=val, test_fraction=test, seed=seed
    )


def _label_counts(sets, positions, num_classes=10) -> list[int]:
    return [sum(c in sets[i] for i in positions) for c in range(num_classes)]


@pytest.mark.parametrize(
    ("n", "val", "test"),
    [(400, 0.2, 0.1), (101, 0.15, 0.15), (57, 0.1, 0.0), (33, 0.0, 0.25), (250, 0.01, 0.01)],
)
def test_totals_are_exact_and_every_image_is_placed_once(n, val, test):
    split = _split(_skewed(n), val=val, test=test)
    assert [len(split[s]) for s in ("val", "test")] == [round(n * val), round(n * test)]
    assert sorted(split["train"] + split["val"] + split["test"]) == list(range(n))


@pytest.mark.parametrize(
    ("sets", "val", "test", "sizes"),
    [
        # A label with a single image stays in train; the rest still gives its share.
        ([(0,)] * 9 + [(1,)], 0.2, 0.1, [7, 2, 1]),
        ([(0, 1)] + [(0,)] * 9, 0.5, 0.0, [5, 5, 0]),
        # Four labels of one image each need four training images: test gives way first.
        ([(0,), (1,), (2,), (3,), (), ()], 0.5, 0.5, [4, 2, 0]),
        ([(0,), (1,), (2,), (3,)], 0.3, 0.3, [4, 0, 0]),
    ],
)
def test_every_label_keeps_a_training_image(sets, val, test, sizes):
    split = _split(sets, val=val, test=test, num_classes=4)
    assert [len(split[s]) for s in ("train", "val", "test")] == sizes
    carried = {c for labels in sets for c in labels}
    assert {c for i in split["train"] for c in sets[i]} == carried


def test_every_label_keeps_a_training_image_for_any_seed():
    sets = _skewed(60, num_classes=10)
    carried = {c for labels in sets for c in labels}
    for seed in range(20):
        split = _split(sets, val=0.4, test=0.3, seed=seed)
        assert {c for i in split["train"] for c in sets[i]} == carried


def test_the_input_order_does_not_matter_the_seed_does():
    sets, keys = _skewed(120), _keys(120)
    first = _split(sets, keys=keys, seed=3)
    order = list(range(120))
    random.Random(1).shuffle(order)
    again = _split([sets[i] for i in order], keys=[keys[i] for i in order], seed=3)
    for name in ("train", "val", "test"):
        assert sorted(keys[i] for i in first[name]) == sorted(keys[order[i]] for i in again[name])
    assert _split(sets, keys=keys, seed=3) == first
    assert set(_split(sets, keys=keys, seed=4)["val"]) != set(first["val"])


def _within(sets, positions, share) -> bool:
    """Each label's count in ``positions`` is within max(1, 15%) + 1 of its share."""
    expected = [count * share for count in _label_counts(sets, range(len(sets)))]
    got = _label_counts(sets, positions)
    return all(abs(g - e) <= max(1, 0.15 * e) + 1 for g, e in zip(got, expected, strict=True))


def test_each_label_keeps_its_share_where_a_random_split_does_not():
    sets = _skewed(400)
    for seed in range(5):
        split = _split(sets, val=0.2, test=0.1, seed=seed)
        assert _within(sets, split["val"], 0.2), seed
        assert _within(sets, split["test"], 0.1), seed
    # The bound is tight enough to fail: plain random splits of the same images break it.
    broken = 0
    for seed in range(5):
        order = list(range(400))
        random.Random(seed).shuffle(order)
        broken += not _within(sets, order[:80], 0.2)
    assert broken >= 4


def test_negatives_fill_the_exact_totals():
    only = [()] * 10
    split = _split(only, val=0.2, test=0.3, num_classes=1)
    assert [len(split[s]) for s in ("train", "val", "test")] == [5, 2, 3]
    sets = [(0,)] * 20 + [()] * 20
    split = _split(sets, val=0.25, test=0.25, num_classes=1)
    assert [len(split[s]) for s in ("train", "val", "test")] == [20, 10, 10]
    # Spread like the labelled images: val holds 5 of each.
    assert sum(bool(sets[i]) for i in split["val"]) == 5


def test_empty_input():
    assert _split([], val=0.2, test=0.1) == {"train": [], "val": [], "test": []}


# -- split_items and LeakGuard with label sets --------------------------------------------


def _multi(sets, split=None) -> tuple[list[Item], list[bool]]:
    items = [
        Item(f"i/{i:03d}.png", -1, split, f"/x/{i}.png", labels=labels)
        for i, labels in enumerate(sets)
    ]
    return items, [True] * len(items)


_NAMES = [f"l{c}" for c in range(10)]


def test_split_items_stratifies_multi_label_items():
    sets = _skewed(200)
    items, usable = _multi(sets)
    split = split_items(items, usable, _NAMES, val_fraction=0.2, test_fraction=0.1, seed=2)
    assert {k: len(v) for k, v in split.indices.items()} == {"train": 140, "val": 40, "test": 20}
    assert _within(sets, split.indices["val"], 0.2)
    # The same deal as the function on its own, in split_items's seeded record order.
    alone = _split(sets, seed=2)
    assert {k: sorted(v) for k, v in split.indices.items()} == alone
    again = split_items(items, usable, _NAMES, val_fraction=0.2, test_fraction=0.1, seed=2)
    assert again.indices == split.indices


def test_split_items_keeps_presplit_multi_label_items_and_leaves_out_refused_ones():
    items, usable = _multi([(0,), (0, 1), (1,), (0,), (1,), ()])
    items[0] = items[0]._replace(split="val")
    usable[3] = False
    split = split_items(items, usable, _NAMES[:2], val_fraction=0.0, test_fraction=0.5, seed=0)
    assert split.indices["val"] == [0]
    assert sorted(split.indices["train"] + split.indices["test"]) == [1, 2, 4, 5]
    assert len(split.indices["test"]) == 2


@pytest.mark.parametrize(
    ("sets", "presplit", "unusable", "named"),
    [
        # A label only a pre-split val image carries.
        ([(0,), (0, 1), (0,)], {1: "val"}, set(), "'l1'"),
        # A label whose only image was refused.
        ([(0,), (0, 1), (0,)], {}, {1}, "'l1'"),
    ],
)
def test_a_label_without_a_training_image_is_named(sets, presplit, unusable, named):
    items, usable = _multi(sets)
    for i, name in presplit.items():
        items[i] = items[i]._replace(split=name)
    for i in unusable:
        usable[i] = False
    with pytest.raises(ChuteError, match=f"1 class\\(es\\) have no usable training image: {named}"):
        split_items(items, usable, _NAMES[:2], val_fraction=0.0, test_fraction=0.0, seed=0)


def test_a_label_no_image_carries_is_no_error():
    items, usable = _multi([(0,), (0,), ()])
    split = split_items(items, usable, _NAMES[:3], val_fraction=0.0, test_fraction=0.0, seed=0)
    assert sorted(split.indices["train"]) == [0, 1, 2]


def test_leak_guard_reports_label_sets():
    guard = LeakGuard()
    same = hashlib.sha256(b"x").digest()
    # a list (from JSON) is the same set as the tuple
    records = [("a/1.png", (0, 2)), ("a/2.png", [0, 2]), ("a/3.png", (1,)), ("a/4.png", ())]
    assert guard.admit(same, "train", 0)
    assert guard.admit(same, "train", 1)
    assert not guard.admit(same, "val", 2)
    assert not guard.admit(same, "test", 3)
    [group] = guard.report(records.__getitem__)
    assert group["labels"] == [[], [0, 2], [1]]
    assert group["dropped"] == ["a/3.png", "a/4.png"]


def test_a_val_split_cut_short_by_the_training_reserve_is_warned_of(caplog):
    """9 images with a label of their own and one negative: each label keeps its one image
    in train, so val_fraction=0.3 gets 1 image, not 3; that was silent (445 val images
    instead of 600 on a list with many rare labels), and is now a warning with the reason."""
    sets = [(c,) for c in range(9)] + [()]
    with caplog.at_level("WARNING", logger="chute.ingest.stratify"):
        split = stratified_multilabel(
            sets, _keys(10), 9, val_fraction=0.3, test_fraction=0.0, seed=0
        )
    assert len(split["val"]) == 1
    assert (
        "the val split holds 1 image(s), not the 3 that val_fraction=0.3 asks: 9 of the 10 "
        "images stay in train so that each of the 9 labels keeps a training image"
    ) in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="chute.ingest.stratify"):
        stratified_multilabel(
            _skewed(), _keys(400), 10, val_fraction=0.2, test_fraction=0.1, seed=0
        )
    assert caplog.text == ""  # exact counts: nothing to say
