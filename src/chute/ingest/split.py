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

import array
import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence

import numpy as np

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
    needs_training: Collection[int] | None = None,
) -> Split:
    """Assigns usable items to splits.

    Items that carry a split (a pre-split source) keep it; fractions carve
    the splits the source lacks out of its train split: per class for
    single-label items, by iterative stratification when items carry ``labels``.

    ``needs_training``: the classes that must get a training image (default: every
    class; an append: only the classes it adds, the others have theirs already).

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
    if needs_training is not None:
        wanted = set(wanted) & set(needs_training)
    missing = sorted({class_names[c] for c in wanted} - {class_names[c] for c in present})
    if missing:
        raise NoTrainingImages(missing)

    keys = [item.key for item in items]
    ordered: dict[str, list[int]] = {}
    for name in SPLITS:
        members = sorted(by_split.get(name, []), key=keys.__getitem__)
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
        if not val[label] + test[label]:
            # All of it trains; its order is decided with the whole split's (split_items).
            by_split["train"] += members
            continue
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
    refused. Each record is named by ``ref``, an integer of the caller's (the
    converter's item index); the report asks ``describe(ref)`` for the key and
    label of the few records that have copies.

    What it keeps is 41 bytes a record in arrays (the sha256, the split and the
    ref), not Python objects: 55 MB for ImageNet's 1.33 million images.

    Example:
        >>> import hashlib
        >>> guard, same = LeakGuard(), hashlib.sha256(b"h").digest()
        >>> guard.admit(same, "train", 0), guard.admit(same, "val", 1)
        (True, False)
        >>> guard.report({0: ("a/1.png", 0), 1: ("a/2.png", 0)}.get)[0]["dropped"]
        ['a/2.png']
    """

    def __init__(self, known: np.ndarray | None = None) -> None:
        # Content the dataset holds already (an append): every copy of it is refused.
        self._known = np.empty(0, "S32") if known is None else known  # sorted
        self.known_copies = 0  # records refused as copies of ``known`` content
        self._digests = bytearray()  # 32 bytes a record, in admission order
        self._ranks = bytearray()  # the split's rank, a byte a record
        self._refs = array.array("q")  # the caller's name for each record
        self._dropped: list[int] = []  # positions (in admission order) of records refused
        self._rank = 0  # the rank being admitted now
        self._above = np.empty(0, "S32")  # sorted digests of every higher-ranked split

    def admit(self, digest: bytes, split: str, ref: int) -> bool:
        """Whether the record ``ref`` with content ``digest`` (a sha256) may be written
        to ``split`` (False: a higher split holds the same content)."""
        if len(digest) != 32:
            raise ValueError(f"a sha256 digest has 32 bytes, not {len(digest)}")
        rank = _RANK[split]
        if rank != self._rank:
            if rank < self._rank:
                raise ValueError(f"records of {split} came after those of a lower split")
            # Everything admitted so far is of a higher split than this one and what follows.
            self._above = np.sort(np.frombuffer(bytes(self._digests), "S32"))
            self._rank = rank
        keep = not _holds(self._known, digest)
        if not keep:
            self.known_copies += 1
        elif len(self._above):
            keep = not _holds(self._above, digest)
        if not keep:
            self._dropped.append(len(self._ranks))
        self._digests += digest
        self._ranks.append(rank)
        self._refs.append(ref)
        return keep

    def admit_many(
        self, digests: Sequence[bytes | None], split: str, refs: Sequence[int]
    ) -> list[bool]:
        """:meth:`admit` for many records of one split at once (a None digest: a record
        not to weigh, passed over and answered True).

        Example:
            >>> import hashlib
            >>> guard, same = LeakGuard(), hashlib.sha256(b"h").digest()
            >>> guard.admit_many([same, None], "train", [0, 1]), guard.admit(same, "val", 2)
            ([True, True], False)
        """
        rank = _RANK[split]
        if rank or len(self._above) or len(self._known) or None in digests:  # one by one
            return [
                True if digest is None else self.admit(digest, split, ref)
                for digest, ref in zip(digests, refs, strict=True)
            ]
        # The top split, nothing above it: every record stays; each is only noted.
        joined = b"".join(digests)
        if len(joined) != 32 * len(digests):
            raise ValueError("a sha256 digest has 32 bytes")
        self._digests += joined
        self._ranks += bytes(len(digests))  # rank 0
        self._refs.extend(refs)
        return [True] * len(digests)

    def kept(self) -> bytes:
        """The digests of every record admitted and not refused, 32 bytes each, in
        admission order (what :func:`chute.format.contents.write` keeps)."""
        if not self._dropped:
            return bytes(self._digests)
        rows = np.frombuffer(bytes(self._digests), "V32")
        keep = np.ones(len(rows), bool)
        keep[self._dropped] = False
        return rows[keep].tobytes()

    def report(self, describe: Callable[[int], tuple[str, Label]]) -> list[dict]:
        """Each group of identical images: keys, splits, labels, and copies dropped;
        ``describe(ref)`` gives a record's key and label (its class, or its classes)."""
        count = len(self._ranks)
        if count < 2:
            return []
        stored = bytes(self._digests)  # one copy, two views
        digests = np.frombuffer(stored, "S32")
        # Records whose first 8 bytes some other record shares: the candidates, few.
        prefixes = np.frombuffer(stored, "<u8").reshape(count, 4)[:, 0]
        order = np.argsort(prefixes, kind="stable")
        ordered = prefixes[order]
        same = ordered[1:] == ordered[:-1]
        shared = np.zeros(count, bool)
        shared[1:] |= same
        shared[:-1] |= same
        groups: dict[bytes, list[int]] = {}
        for position in sorted(order[shared].tolist()):  # admission order within a group
            groups.setdefault(bytes(digests[position]).ljust(32, b"\0"), []).append(position)
        dropped = set(self._dropped)
        names = {_RANK[name]: name for name in SPLITS}
        report = []
        for digest, positions in groups.items():
            if len(positions) < 2:
                continue
            described = [describe(self._refs[p]) for p in positions]
            labels = {_hashable(label) for _, label in described}
            report.append(
                {
                    "sha256": digest.hex(),
                    "keys": [key for key, _ in described],
                    "splits": [names[self._ranks[p]] for p in positions],
                    # The distinct labels, or the distinct label sets (as lists).
                    "labels": [_listed(label) for label in sorted(labels)],
                    "dropped": [
                        key
                        for (key, _), p in zip(described, positions, strict=True)
                        if p in dropped
                    ],
                }
            )
        return sorted(report, key=lambda group: group["keys"][0])


def _holds(digests: np.ndarray, digest: bytes) -> bool:
    """Whether sorted ``S32`` values hold ``digest``."""
    if not len(digests):
        return False
    at = int(np.searchsorted(digests, digest))
    # NumPy's fixed-width bytes drop trailing NULs: compared without them.
    return at < len(digests) and digests[at] == digest.rstrip(b"\0")


def _hashable(label: Label | list[int]) -> Label:
    """A label set as a tuple (a list read back from JSON too), a class as itself."""
    return tuple(label) if isinstance(label, list | tuple) else label


def _listed(label: Label) -> int | list[int]:
    """A label as the report writes it: a class, or a label set as a list."""
    return list(label) if isinstance(label, tuple) else label
