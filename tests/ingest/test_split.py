"""Stratified, deterministic splits; no class without training data; no leaks."""

from __future__ import annotations

import hashlib

import pytest

from chute import ChuteError
from chute.ingest.sources.base import Item
from chute.ingest.split import LeakGuard, split_items


def _items(counts: list[int]) -> tuple[list[Item], list[bool]]:
    items = []
    for label, count in enumerate(counts):
        for i in range(count):
            items.append(Item(f"c{label}/{i:03d}.png", label, None, f"/x/c{label}/{i}.png"))
    return items, [True] * len(items)


def _names(n: int) -> list[str]:
    return [f"c{i}" for i in range(n)]


def test_exact_global_counts_and_stratified():
    items, usable = _items([40, 40, 20])
    split = split_items(items, usable, _names(3), val_fraction=0.1, test_fraction=0.2, seed=1)
    assert {k: len(v) for k, v in split.indices.items()} == {"train": 70, "val": 10, "test": 20}
    per_class_val = [sum(items[i].label == c for i in split.indices["val"]) for c in range(3)]
    assert per_class_val == [4, 4, 2]


def test_small_fraction_over_many_classes_still_gives_validation():
    # 0.01 of 40 images is 0.4 per class: rounding per class would give no val at all.
    items, usable = _items([40] * 50)
    split = split_items(items, usable, _names(50), val_fraction=0.01, test_fraction=0.0, seed=0)
    assert len(split.indices["val"]) == 20
    assert len({items[i].label for i in split.indices["val"]}) == 20


def test_every_class_keeps_a_training_image():
    items, usable = _items([1, 2, 10])
    split = split_items(items, usable, _names(3), val_fraction=0.5, test_fraction=0.4, seed=3)
    train_labels = {items[i].label for i in split.indices["train"]}
    assert train_labels == {0, 1, 2}


def test_deterministic_per_seed_and_covers_everything_once():
    items, usable = _items([30, 30])
    a = split_items(items, usable, _names(2), val_fraction=0.2, test_fraction=0.0, seed=5)
    b = split_items(items, usable, _names(2), val_fraction=0.2, test_fraction=0.0, seed=5)
    c = split_items(items, usable, _names(2), val_fraction=0.2, test_fraction=0.0, seed=6)
    assert a.indices == b.indices
    assert set(a.indices["val"]) != set(c.indices["val"])
    every = sorted(i for members in a.indices.values() for i in members)
    assert every == list(range(len(items)))


def test_rejected_items_are_left_out():
    items, usable = _items([5, 5])
    usable[0] = False
    split = split_items(items, usable, _names(2), val_fraction=0.0, test_fraction=0.0, seed=0)
    assert 0 not in split.indices["train"] and len(split.indices["train"]) == 9


def test_class_without_training_image_is_an_error():
    items, usable = _items([3, 2])
    usable[3] = usable[4] = False  # both images of class c1 unusable
    with pytest.raises(ChuteError, match="1 class\\(es\\) have no usable training image: 'c1'"):
        split_items(items, usable, _names(2), val_fraction=0.0, test_fraction=0.0, seed=0)


def test_leak_guard_keeps_copies_out_of_lower_splits_and_reports_them():
    guard = LeakGuard()
    same, other = hashlib.sha256(b"x").digest(), hashlib.sha256(b"y").digest()
    records = [("a/1.png", 0), ("a/2.png", 0), ("a/3.png", 0), ("a/4.png", 0), ("b/5.png", 1)]
    records.append(("a/6.png", 0))
    assert guard.admit(same, "train", 0)
    assert guard.admit(same, "train", 1)  # a duplicate inside train stays
    assert guard.admit(other, "val", 2)
    assert not guard.admit(same, "val", 3)  # would leak train into val
    assert not guard.admit(other, "test", 4)  # would leak val into test
    assert guard.admit(hashlib.sha256(b"z").digest(), "test", 5)
    report = guard.report(records.__getitem__)
    assert [g["keys"] for g in report] == [
        ["a/1.png", "a/2.png", "a/4.png"],
        ["a/3.png", "b/5.png"],
    ]
    assert report[0]["dropped"] == ["a/4.png"] and report[0]["splits"] == ["train", "train", "val"]
    assert report[1]["labels"] == [0, 1] and report[1]["dropped"] == ["b/5.png"]


def test_leak_guard_finds_copies_whose_digests_share_a_prefix_or_end_in_zeros():
    # Digests alike in their first 8 bytes are no copies; ones ending in NULs still match.
    guard = LeakGuard()
    first, second = bytes(8) + b"\x01" * 24, bytes(8) + b"\x02" * 24
    ending = b"\x03" * 30 + bytes(2)
    assert guard.admit(first, "train", 0) and guard.admit(second, "train", 1)
    assert guard.admit(ending, "train", 2)
    assert guard.admit(bytes(32), "train", 3)
    assert not guard.admit(ending, "val", 4)
    assert guard.admit(second[:31] + b"\x09", "val", 5)
    assert not guard.admit(bytes(32), "test", 6)
    report = guard.report(lambda ref: (f"k{ref}", 0))
    assert [group["keys"] for group in report] == [["k2", "k4"], ["k3", "k6"]]
    assert [group["dropped"] for group in report] == [["k4"], ["k6"]]
    assert report[1]["sha256"] == "00" * 32


def test_leak_guard_refuses_records_out_of_split_order():
    guard = LeakGuard()
    guard.admit(hashlib.sha256(b"x").digest(), "val", 0)
    with pytest.raises(ValueError, match="train came after"):
        guard.admit(hashlib.sha256(b"y").digest(), "train", 1)


def test_presplit_items_keep_their_split_and_fraction_conflict():
    items, usable = _items([4, 4])
    items = [it._replace(split="val" if i % 4 == 0 else "train") for i, it in enumerate(items)]
    split = split_items(items, usable, _names(2), val_fraction=0.0, test_fraction=0.0, seed=0)
    assert sorted(split.indices["val"]) == [0, 4]
    with pytest.raises(ChuteError, match="`val_fraction` asks to carve a val split"):
        split_items(items, usable, _names(2), val_fraction=0.1, test_fraction=0.0, seed=0)
