"""``chute inspect``: a readable summary of a converted dataset, from its manifest alone.

It reads no shard, so it is instant even for a dataset on a bucket; a multi-label
or weighted dataset's labels block (negatives, labels per image, labels seen
together, weights) is the exception: the manifest does not hold those, so the
records' labels are read (:mod:`chute.tools.labels`, no image decoded).
"""

from __future__ import annotations

import os
import statistics

from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.ingest import append as appending
from chute.tools import labels as label_lib

_LIST_CLASSES_UP_TO = 20
_SMALLEST_SHOWN = 3  # classes named on each split's imbalance line


def inspect(path: str | os.PathLike | manifest_lib.Manifest, *, max_rejects: int = 10) -> str:
    """Summarises a converted dataset: classes, counts, image spec, shards, rejects, and
    each split's class imbalance (largest / smallest class, and the smallest classes).
    A multi-label dataset's counts are the images carrying each label, with their share
    of the split, and a labels block follows (see :func:`chute.tools.labels.describe`).

    With many classes the per-class table is replaced by min/median/max and
    the smallest and largest classes.

    Example:
        >>> print(inspect("./kn-shards"))  # doctest: +SKIP
        ./kn-shards: 657 classes, 75x75x1 raw ...
    """
    manifest = manifest_lib.load(path)
    spec = manifest.image
    if spec.fixed_size:
        size = f"{spec.height}x{spec.width}"
    elif spec.shorter_side:
        size = f"shorter side <= {spec.shorter_side}"
    else:
        size = "original sizes"
    classes = f"{manifest.num_classes} classes"
    if manifest.multi_label:
        classes = f"{manifest.num_classes} labels (multi-label)"
    if manifest.weighted:
        classes += " with sample weights"
    # redacted: a manifest written by an older chute may hold a source URL's credentials
    source = storage.redact(str(manifest.source.get("location")))
    lines = [
        f"{storage.redact(manifest.location)}: {classes}, {size}, {spec.channels} "
        f"channel(s), {spec.encoding} ({manifest.created_by})",
        f"source: {source} ({manifest.source.get('kind')}, "
        f"{manifest.source.get('num_items')} items)",
        "",
        f"{'split':<6} {'images':>8} {'shards':>7} {'MB/shard (min-max)':>19} "
        f"{'per class (min/median/max)':>27}",
    ]
    for name, split in manifest.splits.items():
        sizes = [s.bytes / 1e6 for s in split.shards]
        counts = split.class_counts
        lines.append(
            f"{name:<6} {split.examples:>8} {len(sizes):>7} "
            f"{f'{min(sizes):.2f}-{max(sizes):.2f}':>19} "
            f"{f'{min(counts)}/{statistics.median(counts):g}/{max(counts)}':>27}"
        )
    lines.append("")
    lines.append(f"versions: {manifest.version} (chute.load(..., version=N) reads an earlier one)")
    lines += [f"  {line}" for line in appending.describe(manifest)]
    lines.append("")
    lines.append("imbalance (largest / smallest class):")
    lines += [f"  {imbalance(manifest, name)}" for name in manifest.splits]
    lines.append("")
    if manifest.num_classes <= _LIST_CLASSES_UP_TO:
        lines += _class_table(manifest)
    else:
        train = manifest.split("train").class_counts
        order = sorted(range(manifest.num_classes), key=lambda i: (train[i], i))
        show = lambda ids: ", ".join(f"{manifest.class_names[i]} ({train[i]})" for i in ids)  # noqa: E731
        lines.append(f"smallest classes in train: {show(order[:5])}")
        lines.append(f"largest classes in train:  {show(order[-5:][::-1])}")
    lines.append("")
    if manifest.multi_label or manifest.weighted:
        lines.append("labels (read from the records):")
        stats = label_lib.label_stats(manifest)
        lines += [f"  {line}" for line in label_lib.describe(manifest, stats)]
        lines.append("")
    lines += [f"warning: {text}" for text in manifest.warnings]
    lines.append(f"rejected inputs: {len(manifest.rejects)}")
    for reject in manifest.rejects[:max_rejects]:
        lines.append(f"  {reject['key']}: {reject['reason']}")
    if len(manifest.rejects) > max_rejects:
        lines.append(f"  ... see {manifest.location}/rejects.csv for all")
    dropped = sum(len(d["dropped"]) for d in manifest.duplicates)
    lines.append(
        f"duplicate groups: {len(manifest.duplicates)} ({dropped} copies dropped from val/test "
        "to keep them out of two splits)"
    )
    return "\n".join(lines)


def _class_table(manifest: manifest_lib.Manifest) -> list[str]:
    """Each class's count per split (multi-label: the images carrying it, and their share)."""
    split_names = list(manifest.splits)
    width = 15 if manifest.multi_label else 8

    def cell(split: str, label: int) -> str:
        found = manifest.split(split)
        count = found.class_counts[label]
        if not manifest.multi_label:
            return f"{count:>{width}}"
        share = f"{100 * count / found.examples:.0f}%" if found.examples else "-"
        return f"{f'{count} ({share})':>{width}}"

    lines = [f"{'label':>5}  {'class':<24}" + "".join(f"{n:>{width}}" for n in split_names)]
    if manifest.multi_label:  # a count is not the images of a class: the caption says so
        lines.insert(0, "images carrying each label (share of the split):")
    for label, name in enumerate(manifest.class_names):
        counts = "".join(cell(split, label) for split in split_names)
        lines.append(f"{label:>5}  {name:<24}{counts}")
    return lines


def imbalance(manifest: manifest_lib.Manifest, split: str) -> str:
    """One line on how unequal ``split``'s classes are: the largest class count over the
    smallest, and the smallest classes (``chute.load(..., sampling="balanced")`` draws
    every class equally).

    Example:
        >>> imbalance(manifest, "train")  # doctest: +SKIP
        'train  50x (500 / 10); smallest: a (10), b (500)'
    """
    counts = manifest.split(split).class_counts
    present = [count for count in counts if count]
    if not present:
        return f"{split:<6} no examples"
    largest, smallest = max(present), min(present)
    ratio = f"{largest / smallest:.3g}x ({largest} / {smallest})"
    if len(present) < len(counts):
        ratio = f"{len(counts) - len(present)} of {len(counts)} classes without examples; "
        ratio += f"the others {largest / smallest:.3g}x ({largest} / {smallest})"
    order = sorted(range(len(counts)), key=lambda label: (counts[label], label))
    shown = ", ".join(f"{manifest.class_names[i]} ({counts[i]})" for i in order[:_SMALLEST_SHOWN])
    return f"{split:<6} {ratio}; smallest: {shown}"
