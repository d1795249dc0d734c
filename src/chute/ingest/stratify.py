"""Iterative stratification: train/val/test splits of multi-label images.

A per-class split cannot serve images that carry several labels: giving an
image to val moves every label it carries. Iterative stratification
(Sechidis, Tsoumakas & Vlahavas, *On the Stratification of Multi-Label
Data*, ECML PKDD 2011) deals the images out label by label, the label with
the fewest images still to place first (rare labels are the ones a careless
deal would leave out of val), each image to the split that still wants that
label most. Every label then keeps close to its share of images in each
split.

What chute adds to the paper's algorithm: the split sizes are exact (rounded
once over all images, as the single-label split does), every label keeps a
training image, images without labels (negatives) fill what the splits still
lack, and the result depends on the seed and the images' keys, never on the
order the source listed them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

log = logging.getLogger(__name__)

_NAMES = ("train", "val", "test")
_TRAIN = 0


def stratified_multilabel(
    label_sets: Sequence[tuple[int, ...]],
    keys: Sequence[str],
    num_classes: int,
    *,
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> dict[str, list[int]]:
    """Splits multi-label images so that each label keeps its share in every split.

    Args:
        label_sets: each image's class indices (distinct, each below
            ``num_classes``); an empty tuple is a negative.
        keys: each image's key (unique); the deal depends on these and the
            seed, not on the order of the sequences.
        num_classes: how many classes there are.
        val_fraction: share of the images for val; the count is
            ``round(len(keys) * val_fraction)``.
        test_fraction: share for test, counted the same way.
        seed: seeds the deal (the order images are dealt in and its ties).

    Returns:
        Positions into ``label_sets`` for ``"train"``, ``"val"`` and
        ``"test"`` (each sorted). Val and test have their exact counts unless
        the images reserved for training (one per label, see below) leave
        fewer: then test is cut first, then val.

    Example:
        >>> sets = [(0,), (0,), (0, 1), (1,), (1,), ()]
        >>> split = stratified_multilabel(
        ...     sets, list("abcdef"), 2, val_fraction=0.34, test_fraction=0.0, seed=0
        ... )
        >>> [len(split[name]) for name in ("train", "val", "test")]
        [4, 2, 0]
    """
    n = len(keys)
    rng = random.Random(f"{seed}/stratify")
    # Key order first, then a seeded shuffle: images are dealt in an order that depends on
    # the seed alone, so no file name is always first in line for val.
    order = sorted(range(n), key=lambda i: (keys[i], label_sets[i]))
    rng.shuffle(order)
    counts = [0] * num_classes
    for i in order:
        for label in label_sets[i]:
            counts[label] += 1
    reserved = _reserve_for_training(order, label_sets, counts, rng)

    # Sizes rounded once over all images (like the single-label split), then capped so the
    # reserved images fit: test gives way first, as it does in the single-label split.
    val = min(round(n * val_fraction), n - len(reserved)) if val_fraction > 0 else 0
    test = min(round(n * test_fraction), n - len(reserved) - val) if test_fraction > 0 else 0
    sizes = [n - val - test, val, test]
    _say_cut(n, len(reserved), num_classes, val_fraction, val, test_fraction, test)
    # wanted[s][c]: how many more images with label c split s should get to match the whole.
    wanted = [[count * size / n for count in counts] for size in sizes] if n else [[], [], []]
    room = list(sizes)  # how many more images split s takes: the totals stay exact
    assigned = [-1] * n
    for i in reserved:
        _give(i, _TRAIN, label_sets, assigned, wanted, room)
    left = counts[:]
    for i in reserved:
        for label in label_sets[i]:
            left[label] -= 1
    _deal_by_label(order, label_sets, assigned, wanted, room, left, rng)
    # Only negatives are left: they fill the room the labelled images left.
    for i in order:
        if assigned[i] < 0:
            _give(i, _best(room, room, rng), label_sets, assigned, wanted, room)

    split: dict[str, list[int]] = {name: [] for name in _NAMES}
    for i in range(n):
        split[_NAMES[assigned[i]]].append(i)
    return split


def _say_cut(
    n: int, reserved: int, num_classes: int, val_fraction: float, val: int,
    test_fraction: float, test: int,
) -> None:  # fmt: skip
    """Warns when the images kept for training left val or test fewer than asked for."""
    for name, fraction, got in (("val", val_fraction, val), ("test", test_fraction, test)):
        asked = round(n * fraction) if fraction > 0 else 0
        if got < asked:
            log.warning(
                "the %s split holds %d image(s), not the %d that %s_fraction=%g asks: %d of the "
                "%d images stay in train so that each of the %d labels keeps a training image "
                "(an image per label, the rarest first)",
                name, got, asked, name, fraction, reserved, n, num_classes,
            )  # fmt: skip


def _reserve_for_training(
    order: list[int], label_sets: Sequence[tuple[int, ...]], counts: list[int], rng: random.Random
) -> list[int]:
    """One image per label for train, rarest label first, skipping labels an image
    already reserved carries: no label is left without a training image."""
    by_label: list[int | None] = [None] * len(counts)
    for i in order:  # the first image of each label in the seeded order: a seeded pick
        for label in label_sets[i]:
            if by_label[label] is None:
                by_label[label] = i
    tiebreak = list(range(len(counts)))
    rng.shuffle(tiebreak)  # equally rare labels: a seeded order, no label always first
    covered = [False] * len(counts)
    reserved = []
    for label in sorted(range(len(counts)), key=lambda c: (counts[c], tiebreak[c])):
        i = by_label[label]
        if i is None or covered[label]:
            continue
        reserved.append(i)
        for other in label_sets[i]:
            covered[other] = True
    return reserved


def _deal_by_label(
    order: list[int],
    label_sets: Sequence[tuple[int, ...]],
    assigned: list[int],
    wanted: list[list[float]],
    room: list[int],
    left: list[int],
    rng: random.Random,
) -> None:
    """The paper's loop: the label with the fewest images left deals all of them, each
    to the split that wants that label most (then the one with most room, then a draw)."""
    members: list[list[int]] = [[] for _ in left]
    for i in order:
        if assigned[i] < 0:
            for label in label_sets[i]:
                members[label].append(i)
    tiebreak = list(range(len(left)))
    rng.shuffle(tiebreak)
    pending = {c for c, count in enumerate(left) if count > 0}
    while pending:
        # A scan per label, not a heap: the counts change as co-occurring images go.
        label = min(pending, key=lambda c: (left[c], tiebreak[c]))
        pending.discard(label)
        for i in members[label]:
            if assigned[i] >= 0:
                continue
            target = _best([row[label] for row in wanted], room, rng)
            _give(i, target, label_sets, assigned, wanted, room)
            for other in label_sets[i]:
                left[other] -= 1
                if left[other] == 0:
                    pending.discard(other)


def _best(want: list[float], room: list[int], rng: random.Random) -> int:
    """The split with room that wants most; ties by most room, then a seeded draw."""
    draws = [rng.random() for _ in room]
    open_ = [s for s in range(len(room)) if room[s] > 0]
    return max(open_, key=lambda s: (want[s], room[s], draws[s]))


def _give(
    i: int,
    split: int,
    label_sets: Sequence[tuple[int, ...]],
    assigned: list[int],
    wanted: list[list[float]],
    room: list[int],
) -> None:
    assigned[i] = split
    room[split] -= 1
    for label in label_sets[i]:
        wanted[split][label] -= 1
