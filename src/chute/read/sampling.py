"""Class sampling: ``sampling`` (``"balanced"`` or ``{class: weight}``) resolved against a
dataset into the probability of drawing each class, for any reading engine.

A training epoch with sampling draws as many examples as one without: each draw
picks a class with its probability, then one of that class's examples (with
replacement: a small class is seen several times an epoch, a large one partly).
``"balanced"`` weighs every class that has examples the same. TensorFlow-free:
the ``tf.data`` engine (:mod:`chute.read.tf.pipeline`) and the Grain engine share it.

Example:
    >>> probabilities(["cat", "dog", "eel"], [10, 500, 0], "balanced")
    (0.5, 0.5, 0.0)
    >>> probabilities(["cat", "dog"], [10, 500], (("cat", 3.0), ("dog", 1.0)))
    (0.75, 0.25)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from chute.errors import ChuteError
from chute.format.manifest import Manifest

log = logging.getLogger(__name__)

_NAMES_SHOWN = 20  # class names an error lists


def class_probabilities(
    manifest: Manifest,
    split: str,
    sampling: str | tuple[tuple[str | int, float], ...] | None,
    *,
    counts: Sequence[int] | None = None,
) -> tuple[float, ...] | None:
    """The probability of drawing each class (by label) in an epoch of ``split``, or None
    without sampling.

    Args:
        manifest: the dataset (class names, and the split's per-class counts).
        split: the split read.
        sampling: a checked ``LoadOptions.sampling``: None, ``"balanced"``, or
            ``(class name or index, weight)`` pairs.
        counts: each class's examples in what this reader reads (one input
            pipeline's share); default: the split's.

    Raises:
        ChuteError: ``sampling`` names a class the dataset lacks, names one class
            twice, or weighs only classes without examples.
    """
    if sampling is None:
        return None
    if counts is None:
        # The split's own counts unless one pipeline's share is given: the engines read differently.
        counts = manifest.split(split).class_counts
    return probabilities(manifest.class_names, counts, sampling)


def probabilities(
    class_names: Sequence[str],
    counts: Sequence[int],
    sampling: str | tuple[tuple[str | int, float], ...],
) -> tuple[float, ...]:
    """Weights as per-class draw probabilities (summing to 1, by label); a class without
    examples gets 0 (logged).

    Example:
        >>> probabilities(["a", "b", "c"], [4, 2, 1], ((0, 1.0), ("c", 1.0)))
        (0.5, 0.0, 0.5)
        >>> probabilities(["a", "b"], [4, 2], (("z", 1.0),))
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: `sampling` names class 'z', which this dataset does not have. Allowed: class names ['a', 'b'] or indexes 0-1. Received: sampling=(('z', 1.0),)
    """  # noqa: E501
    weights = (
        [1.0] * len(class_names) if sampling == "balanced" else _weights(class_names, sampling)
    )
    empty = [label for label, weight in enumerate(weights) if weight > 0 and counts[label] == 0]
    if empty:
        log.warning(
            "sampling: %d class(es) with no examples here are never drawn: %s",
            len(empty),
            _some([class_names[label] for label in empty]),
        )
        # Zeroed, not refused: a share of the split may lack a class the sampling names.
        for label in empty:
            weights[label] = 0.0
    total = sum(weights)
    # Nothing left to draw would make the probabilities 0/0.
    if total == 0:
        raise ChuteError(
            "`sampling` weighs only classes with no examples here, so there is nothing to "
            f"draw. Received: sampling={sampling!r}"
        )
    return tuple(weight / total for weight in weights)


def _weights(class_names: Sequence[str], pairs: Any) -> list[float]:
    """Each class's weight (0 for those not named) from ``(class name or index, weight)``
    pairs; a digit string that is no class name is an index (a flag's ``"0=2"``)."""
    index = {name: label for label, name in enumerate(class_names)}
    weights = [0.0] * len(class_names)
    named: set[int] = set()
    for key, weight in pairs:
        # A class name first: a class may itself be named "3".
        label = index.get(key) if isinstance(key, str) else None
        if label is None and (isinstance(key, int) or (isinstance(key, str) and key.isdigit())):
            label = int(key) if 0 <= int(key) < len(class_names) else None
        if label is None:
            raise ChuteError(
                f"`sampling` names class {key!r}, which this dataset does not have. "
                f"Allowed: class names {_some(class_names)} or indexes "
                f"0-{len(class_names) - 1}. Received: sampling={pairs!r}"
            )
        # Twice would leave it unclear which weight holds.
        if label in named:
            raise ChuteError(
                f"`sampling` weighs class {class_names[label]!r} (label {label}) twice. "
                f"Received: sampling={pairs!r}"
            )
        named.add(label)
        weights[label] = float(weight)
    return weights


def share_counts(
    manifest: Manifest, split: str, pipelines: int = 1, index: int = 0, by_record: bool = False
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(each class's examples, the classes each shard holds)`` of what input pipeline
    ``index`` of ``pipelines`` reads: its own shards (every ``pipelines``-th, from
    ``index``), or with ``by_record`` all the shards, of which it keeps every
    ``pipelines``-th record of each class.

    Example:
        >>> share_counts(manifest, "train")  # doctest: +SKIP
        ((10, 500), ((0, 1), (1,)))
    """
    shards = manifest.split(split).shards
    if pipelines > 1 and not by_record:
        # The tf.data engine's own shards: every pipelines-th, from index.
        shards = shards[index::pipelines]
    held = [{label: n for label, n in shard.class_counts if n} for shard in shards]
    totals = [0] * manifest.num_classes
    for classes in held:
        for label, count in classes.items():
            totals[label] += count
    if by_record:
        # Every pipelines-th record of each class, counted without reading a record.
        totals = [len(range(index, total, pipelines)) for total in totals]
    return tuple(totals), tuple(tuple(sorted(classes)) for classes in held)


def describe(
    class_names: Sequence[str], probabilities: Sequence[float], counts: Sequence[int], draws: int
) -> str:
    """A line on what sampling does in an epoch of ``draws`` examples: classes drawn,
    the probabilities' range, and the class drawn most often per example.

    Example:
        >>> describe(["cat", "dog"], (0.5, 0.5), (10, 500), 480)
        "2 of 2 classes drawn, p = 0.5 each; 480 draws an epoch: 'cat' (10 examples) ~24 times each, 'dog' (500) ~0.48"
        >>> describe(["cat", "dog", "eel"], (0.75, 0.25, 0.0), (10, 500, 3), 480)
        "2 of 3 classes drawn, p = 0.25 ('dog') to 0.75 ('cat'); 480 draws an epoch: 'cat' (10 examples) ~36 times each, 'dog' (500) ~0.24"
    """  # noqa: E501
    drawn = [label for label, p in enumerate(probabilities) if p > 0]
    # Ties broken by label, so the line is the same from run to run.
    low = min(drawn, key=lambda label: (probabilities[label], label))
    high = max(drawn, key=lambda label: (probabilities[label], -label))
    ratio = {label: probabilities[label] * draws / counts[label] for label in drawn}
    most = max(drawn, key=lambda label: (ratio[label], -label))
    least = min(drawn, key=lambda label: (ratio[label], label))
    if probabilities[low] == probabilities[high]:
        spread = f"p = {probabilities[low]:.3g} each"
    else:
        spread = (
            f"p = {probabilities[low]:.3g} ({class_names[low]!r}) to "
            f"{probabilities[high]:.3g} ({class_names[high]!r})"
        )
    return (
        f"{len(drawn)} of {len(class_names)} classes drawn, {spread}; "
        f"{draws} draws an epoch: {class_names[most]!r} ({counts[most]} examples) "
        f"~{ratio[most]:.3g} times each, {class_names[least]!r} ({counts[least]}) "
        f"~{ratio[least]:.3g}"
    )


def _some(names: Sequence[str]) -> str:
    shown = list(names[:_NAMES_SHOWN])
    return f"{shown}" if len(names) <= _NAMES_SHOWN else f"{shown} ... ({len(names)} in all)"
