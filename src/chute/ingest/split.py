"""Stratified, deterministic train/val/test splits without leaks.

Each class gives the same share of its images to val and test (the global
counts are exact: remainders go to the classes with the largest fractional
parts), and every class keeps at least one training image. Multi-label items
(``labels`` set) are dealt by iterative stratification instead
(:mod:`chute.ingest.stratify`): every label keeps its share, exact totals.

Identical images (same content hash) never sit on both sides of a split:
:class:`LeakGuard` sees every record as it is written, train first, and drops
a copy from val or test when a higher split already holds the content.
Hashing while encoding means each file is read only once.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Sequence

from chute.errors import ChuteError
from chute.ingest.sources.base import SPLITS, Item
from chute.ingest.stratify import stratified_multilabel

_RANK = {name: rank for rank, name in enumerate(SPLITS)}  # train outranks val outranks test
Label = int | tuple[int, ...]  # a record's class, or a multi-label record's classes


@dataclasses.dataclass
class Split:
    """Item indices per split, in record order (deduplication happens later, see LeakGuard)."""

    indices: dict[str, list[int]]


def _allocate(sizes: list[int], fraction: float, caps: list[int], rng: random.Random) -> list[int]:
    """How many items each class gives: exact global total, stratified, within caps."""
    if fraction <= 0:
        return [0] * len(sizes)
    # The global count is exact (rounded once), not the sum of each class's rounding.
    target = min(round(sum(sizes) * fraction), sum(caps))
    shares = [min(math.floor(n * fraction), cap) for n, cap in zip(sizes, caps, strict=True)]
    # Equal remainders are broken by a seeded draw, not by label: no class is always favoured.
    tiebreak = list(range(len(sizes)))
    rng.shuffle(tiebreak)
    order = sorted(
        range(len(sizes)),
        key=lambda c: (-(sizes[c] * fraction - math.floor(sizes[c] * fraction)), tiebreak[c]),
    )
    missing = target - sum(shares)
    # Round by round, one each, largest remainder first, until the target or every cap is met.
    while missing > 0:
        progressed = False
        for c in order:
            if missing and shares[c] < caps[c]:
                shares[c] += 1
                missing -= 1
                progressed = True
        if not progressed:
            break
    return shares


class NoTrainingImages(ChuteError):
    """Classes left without a usable training image (``classes``, sorted); the converter
    adds why their images were refused."""

    def __init__(self, classes: list[str], reasons: str = "") -> None:
        self.classes = classes
        shown = ", ".join(repr(c) for c in classes[:10]) + (" ..." if len(classes) > 10 else "")
        super().__init__(
            f"{len(classes)} class(es) have no usable training image: {shown}. Add images or "
            f"remove the class folder{reasons}"
        )


def split_items(
    items: Sequence[Item],
    usable: Sequence[bool],
    class_names: Sequence[str],
    *,
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> Split:
    """Assigns usable items to splits.

    Items that carry a split (a pre-split source) keep it; fractions carve
    the splits the source lacks out of its train split: per class for
    single-label items, by iterative stratification when items carry ``labels``.

    Raises:
        ChuteError: a fraction is asked for a split the source already has, or
            a class (a label, for multi-label items) is left with no training image.
    """
    present = {item.split for item in items if item.split}
    for name, fraction in (("val", val_fraction), ("test", test_fraction)):
        if fraction and name in present:
            raise ChuteError(
                f"`{name}_fraction` asks to carve a {name} split, but the source already has one. "
                f"Received: {name}_fraction={fraction}; pass 0 to keep the source's split"
            )
    by_split: dict[str, list[int]] = defaultdict(list)
    pool = []  # usable items of the source's train split (or of no split): carved up below
    for index, item in enumerate(items):
        if not usable[index]:
            continue
        split = item.split or "train"
        if split == "train":
            pool.append(index)
        else:
            by_split[split].append(index)
    if any(item.labels is not None for item in items):
        _carve_multi_label(items, pool, by_split, class_names, val_fraction, test_fraction, seed)
        # A label any image carries (usable or refused) needs a training image.
        wanted = {c for item in items for c in _label_set(item)}
        present = {c for i in by_split["train"] for c in _label_set(items[i])}
    else:
        _carve_per_class(items, pool, by_split, class_names, val_fraction, test_fraction, seed)
        wanted = set(range(len(class_names)))
        present = {items[i].label for i in by_split["train"]}
    missing = sorted({class_names[c] for c in wanted} - {class_names[c] for c in present})
    if missing:
        raise NoTrainingImages(missing)

    ordered: dict[str, list[int]] = {}
    for name in SPLITS:
        members = sorted(by_split.get(name, []), key=lambda i: items[i].key)
        if members:
            random.Random(f"{seed}/order/{name}").shuffle(members)  # class-mixed shards
            ordered[name] = members
    return Split(ordered)


def _label_set(item: Item) -> tuple[int, ...]:
    """The classes an item carries: its ``labels``, or its one ``label``."""
    if item.labels is not None:
        return item.labels
    return (item.label,) if item.label >= 0 else ()


def _carve_per_class(
    items: Sequence[Item],
    pool: list[int],
    by_split: dict[str, list[int]],
    class_names: Sequence[str],
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> None:
    """Single-label: each class gives its share of ``pool`` to val and test."""
    train_by_class: list[list[int]] = [[] for _ in class_names]
    for index in pool:
        train_by_class[items[index].label].append(index)
    sizes = [len(members) for members in train_by_class]
    rng = random.Random(f"{seed}/allocate")
    # Capped at n - 1: every class keeps at least one training image.
    val = _allocate(sizes, val_fraction, [max(0, n - 1) for n in sizes], rng)
    test = _allocate(
        sizes, test_fraction, [max(0, n - 1 - v) for n, v in zip(sizes, val, strict=True)], rng
    )
    for label, members in enumerate(train_by_class):
        # Sorted by key first: the split depends on the seed, not on the order the source listed.
        members = sorted(members, key=lambda i: items[i].key)
        # A generator per class, keyed by its name: adding a class does not reshuffle the others.
        random.Random(f"{seed}/split/{class_names[label]}").shuffle(members)
        by_split["val"] += members[: val[label]]
        by_split["test"] += members[val[label] : val[label] + test[label]]
        by_split["train"] += members[val[label] + test[label] :]


def _carve_multi_label(
    items: Sequence[Item],
    pool: list[int],
    by_split: dict[str, list[int]],
    class_names: Sequence[str],
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> None:
    """Multi-label: ``pool`` dealt by iterative stratification (every label keeps its
    share in val and test, and a training image)."""
    carved = stratified_multilabel(
        [_label_set(items[i]) for i in pool],
        [items[i].key for i in pool],
        len(class_names),
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
    )
    for name, positions in carved.items():
        by_split[name] += [pool[p] for p in positions]


class LeakGuard:
    """Keeps identical images out of two splits, and reports every duplicate.

    Feed it every record in writing order (all of train, then val, then
    test): a record whose content a higher-ranked split already holds is
    refused.

    Example:
        >>> guard = LeakGuard()
        >>> guard.admit(b"h", "a/1.png", 0, "train"), guard.admit(b"h", "a/2.png", 0, "val")
        (True, False)
    """

    def __init__(self) -> None:
        self._first: dict[bytes, tuple[str, str, Label]] = {}  # digest -> split, key, label
        self._copies: dict[bytes, list[tuple[str, str, Label, bool]]] = {}

    def admit(self, digest: bytes, key: str, label: int | Sequence[int], split: str) -> bool:
        """Whether the record may be written to ``split``; ``label`` is the class, or the
        classes of a multi-label record."""
        if isinstance(label, (list, tuple)):
            label = tuple(label)  # hashable, and a list (say, read back from JSON) too
        first = self._first.setdefault(digest, (split, key, label))
        if first == (split, key, label):
            return True
        # A copy within the same split is no leak: kept, and only reported.
        keep = _RANK[split] <= _RANK[first[0]]
        self._copies.setdefault(digest, [(*first, True)]).append((split, key, label, keep))
        return keep

    def report(self) -> list[dict]:
        """Each group of identical images: keys, splits, labels, and copies dropped."""
        groups = []
        for digest, copies in self._copies.items():
            groups.append(
                {
                    "sha256": digest.hex(),
                    "keys": [key for _, key, _, _ in copies],
                    "splits": [split for split, _, _, _ in copies],
                    # The distinct labels, or the distinct label sets (as lists).
                    "labels": [
                        list(label) if isinstance(label, tuple) else label
                        for label in sorted({label for _, _, label, _ in copies})
                    ],
                    "dropped": [key for _, key, _, keep in copies if not keep],
                }
            )
        return sorted(groups, key=lambda group: group["keys"][0])
