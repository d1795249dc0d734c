"""What a dataset's labels look like, read from its records: per split, the images
carrying each label, the negatives (images with no label), labels per image, the
label pairs seen together most, and the sample weights' range.

A multi-label manifest counts the images carrying each label, but not the
negatives nor which labels come together: those are read from the records (the
labels and weights only, in plain Python: no image is decoded, no TensorFlow).
:func:`shard_records` is the one loop over a split's records that the grid shares.

Example:
    >>> stats = label_stats("./tags-shards")  # doctest: +SKIP
    >>> stats["train"].negatives, round(stats["train"].labels_per_image, 2)  # doctest: +SKIP
    (12, 1.42)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import math
import os
from collections.abc import Iterator

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import parse, records, remote, storage

TOP_PAIRS = 10  # co-occurring pairs kept per split


@dataclasses.dataclass(frozen=True)
class SplitLabels:
    """The labels of one split, as its records hold them.

    Attributes:
        split: the split's name.
        images: its records.
        carrying: per class, the images carrying that label (single-label: its images).
        negatives: images with no label (always 0 for a single-label dataset).
        pairs: the label pairs carried together most, ``(first, second, images)``, most
            frequent first (ties: by label), at most :data:`TOP_PAIRS`.
        weights: ``(min, mean, max)`` of the sample weights; None without weights.
    """

    split: str
    images: int
    carrying: tuple[int, ...]
    negatives: int
    pairs: tuple[tuple[int, int, int], ...]
    weights: tuple[float, float, float] | None = None

    @property
    def labels_per_image(self) -> float:
        """The mean number of labels an image carries (0.0 for an empty split)."""
        return sum(self.carrying) / self.images if self.images else 0.0

    def to_dict(self, class_names: list[str]) -> dict:
        """The figures as JSON-ready values, labels by name.

        Example:
            >>> SplitLabels("val", 2, (1, 2), 0, ((0, 1, 1),)).to_dict(["a", "b"])["pairs"]
            [{'labels': ['a', 'b'], 'images': 1}]
        """
        body = {
            "split": self.split,
            "images": self.images,
            "carrying": dict(zip(class_names, self.carrying, strict=True)),
            "negatives": self.negatives,
            "labels_per_image": self.labels_per_image,
            "pairs": [
                {"labels": [class_names[a], class_names[b]], "images": n} for a, b, n in self.pairs
            ],
        }
        if self.weights is not None:
            body["weights"] = dict(zip(("min", "mean", "max"), self.weights, strict=True))
        return body


def label_stats(
    path: str | os.PathLike | manifest_lib.Manifest, *, top_pairs: int = TOP_PAIRS
) -> dict[str, SplitLabels]:
    """Reads every record's labels (and weight) and sums them up per split.

    Args:
        path: the converted directory, its ``manifest.json``, or the ``Manifest``.
        top_pairs: how many co-occurring label pairs to keep per split.

    Returns:
        ``{split name: SplitLabels}``, in the manifest's split order.

    Raises:
        ChuteError: a damaged shard (named, with ``chute verify`` to run) or a store's
            refusal (one line).
    """
    manifest = manifest_lib.load(path)
    return {name: _split_labels(manifest, name, top_pairs) for name in manifest.splits}


def _split_labels(manifest: manifest_lib.Manifest, split: str, top_pairs: int) -> SplitLabels:
    carrying = [0] * manifest.num_classes
    pairs: collections.Counter[tuple[int, int]] = collections.Counter()
    images = negatives = 0
    low, total, high = math.inf, 0.0, -math.inf
    target = records.LABELS if manifest.multi_label else records.CLASS
    for record in shard_records(manifest, split):
        # decode_example, not record_values: the image bytes are not turned into anything.
        values = parse.decode_example(record)
        labels = sorted(set(values.get(target, ())))
        images += 1
        negatives += not labels
        for label in labels:
            if 0 <= label < manifest.num_classes:  # out of range: `chute verify` names it
                carrying[label] += 1
        pairs.update(itertools.combinations(labels, 2))
        if manifest.weighted:
            weight = values.get(records.WEIGHT, [1.0])[0]
            low, total, high = min(low, weight), total + weight, max(high, weight)
    order = sorted(pairs.items(), key=lambda pair: (-pair[1], pair[0]))[:top_pairs]
    weights = (low, total / images, high) if manifest.weighted and images else None
    return SplitLabels(
        split,
        images,
        tuple(carrying),
        negatives,
        tuple((a, b, n) for (a, b), n in order),
        weights,
    )


def shard_records(manifest: manifest_lib.Manifest, split: str) -> Iterator[bytes]:
    """Each record of ``split``, shard by shard, in plain Python (no TensorFlow: a
    dataset in any bucket fsspec reaches works too), its frame's CRCs checked.

    Raises:
        ChuteError: a damaged record (naming its shard and the dataset), or a store's
            refusal part-way (one line, as when the shard is opened).
    """
    for path in manifest.shard_paths(split):
        errors = contextlib.nullcontext() if storage.is_local(path) else remote.errors(path)
        with errors, storage.open_file(path, "rb") as handle, _naming(manifest.location, path):
            yield from parse.read_records(handle)


@contextlib.contextmanager
def _naming(location: str, path: str) -> Iterator[None]:
    """A damaged record's error ("the file ends inside a record's header") names the
    shard and the dataset it is in."""
    try:
        yield
    except ChuteError as error:
        raise ChuteError(
            f"{storage.basename(path)} of {location!r} is damaged: {error}. Check the "
            f"dataset with `chute verify {location}`"
        ) from None


def describe(manifest: manifest_lib.Manifest, stats: dict[str, SplitLabels]) -> list[str]:
    """The lines ``chute inspect`` prints of :func:`label_stats`: per split, negatives,
    labels per image and weights; then the label pairs seen together most in the first
    split (each split's are in :meth:`SplitLabels.to_dict`).

    Example:
        >>> print("\\n".join(describe(manifest, label_stats(manifest))))  # doctest: +SKIP
        train     48 images: 7 negatives (14.6%), 1.42 labels per image
        ...
    """
    lines = []
    for name, split in stats.items():
        line = f"{name:<6} {split.images:>6} images"
        if manifest.multi_label:
            line += (
                f": {split.negatives} negatives ({_share(split.negatives, split.images)}), "
                f"{split.labels_per_image:.2f} labels per image"
            )
        if split.weights is not None:
            low, mean, high = split.weights
            line += f"; weights {low:g}..{high:g} (mean {mean:.3g})"
        lines.append(line)
    first = next(iter(stats.values()), None)
    if manifest.multi_label and first is not None:
        names = manifest.class_names
        shown = ", ".join(f"{names[a]} + {names[b]} ({n})" for a, b, n in first.pairs)
        lines.append(f"labels seen together most in {first.split}: {shown or 'none'}")
    return lines


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f}%" if total else "-"


def headline(manifest: manifest_lib.Manifest, stats: dict[str, SplitLabels] | None = None) -> str:
    """What a dataset's labels are, in a few words (``chute convert`` prints it): its
    classes, or for a multi-label dataset its labels, labels per image and (from
    ``stats``, where given) negatives; and whether it has sample weights.

    Example:
        >>> headline(manifest, label_stats(manifest))  # doctest: +SKIP
        '4 labels (multi-label: 1.4 per image, 12 negatives) with sample weights'
    """
    text = f"{manifest.num_classes} classes"
    if manifest.multi_label:
        images = sum(split.examples for split in manifest.splits.values())
        # The manifest counts the images carrying each label: their sum is the labels given.
        given = sum(sum(split.class_counts) for split in manifest.splits.values())
        about = f"{given / images:.1f} per image" if images else "no images"
        if stats is not None:
            about += f", {sum(split.negatives for split in stats.values())} negatives"
        text = f"{manifest.num_classes} labels (multi-label: {about})"
    if manifest.weighted:
        text += " with sample weights"
    return text
