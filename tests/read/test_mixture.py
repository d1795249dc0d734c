"""The engine-free part of mixing datasets (chute.read.mixture): one label space by class
name, per-batch counts exact where the batch allows and within about an image of each
share otherwise, an epoch's steps, and each batch's draws as a function of its number."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chute.errors import ChuteError
from chute.read import mixture


@dataclasses.dataclass
class _Manifest:  # what label_space reads of a manifest
    class_names: list[str]
    multi_label: bool = False
    location: str = ""


def test_one_label_space_by_class_name_the_first_datasets_classes_first():
    names, maps = mixture.label_space(
        [_Manifest(["cat", "dog"]), _Manifest(["ant", "dog", "eel"]), _Manifest(["eel"])]
    )
    assert names == ["cat", "dog", "ant", "eel"]
    assert [m.tolist() for m in maps] == [[0, 1], [2, 1, 3], [3]]
    multi = _Manifest(["cat"], multi_label=True, location="tags")
    with pytest.raises(ChuteError, match="tags: multi-label"):
        mixture.label_space([_Manifest(["cat"], location="pets"), multi])
    with pytest.raises(ChuteError, match="at least one dataset"):
        mixture.label_space([])


def test_whole_shares_are_exact_in_every_batch():
    counts = mixture.batch_counts([0.6, 0.3, 0.1], 10, 50)
    assert (counts == [6, 3, 1]).all()
    counts = mixture.batch_counts([3, 1], 8, 7)  # weights need not sum to 1
    assert (counts == [6, 2]).all()


def test_other_shares_stay_within_about_an_image_and_hold_over_many_batches():
    rng = np.random.default_rng(0)
    for _ in range(200):
        weights = rng.random(int(rng.integers(1, 7))) ** 3 + 1e-3
        batch, steps = int(rng.integers(1, 300)), 60
        counts = mixture.batch_counts(weights, batch, steps)
        assert (counts >= 0).all() and (counts.sum(axis=1) == batch).all()
        share = weights / weights.sum() * batch
        running = np.cumsum(counts, axis=0) - np.outer(np.arange(1, steps + 1), share)
        assert np.abs(running).max() < 1.0
    # The measure: proportions over many batches within 1% of the weights.
    counts = mixture.batch_counts([0.6, 0.3, 0.1], 32, 1000)  # 3.2 images of the last a batch
    np.testing.assert_allclose(counts.sum(axis=0) / counts.sum(), [0.6, 0.3, 0.1], rtol=0.01)
    assert set(counts[:, 2].tolist()) == {3, 4}  # never further from 3.2 than a batch allows


def test_an_epoch_and_each_batchs_draws_follow_from_the_counts():
    assert mixture.epoch_steps([1000, 50], [0.75, 0.25], 100) == 14
    assert mixture.epoch_steps([1000, 50], [0.75, 0.25], 100, steps=3) == 3
    counts = mixture.batch_counts([0.9, 0.1], 4, 10)
    taken = [mixture.draws(counts, step) for step in range(10)]
    for dataset in range(2):  # each dataset's draws in order, none skipped or repeated
        positions = [p for batch in taken for p in batch[dataset]]
        assert positions == list(range(int(counts[:, dataset].sum())))


@pytest.mark.parametrize(
    ("weights", "batch", "match"),
    [
        ([0.5, 0], 8, r"`weights` must be positive numbers, one per dataset. Received: "),
        ([], 8, "`weights` must be positive"),
        (["a"], 8, r"weights=\['a'\]"),
        ([1.0, float("nan")], 8, "`weights` must be positive"),
        ([1.0], 0, "`batch_size` must be a positive integer. Received: batch_size=0"),
    ],
)
def test_bad_weights_and_batch_sizes_are_named(weights, batch, match):
    with pytest.raises(ChuteError, match=match):
        mixture.batch_counts(weights, batch, 1)


def test_bad_steps_are_named():
    with pytest.raises(ChuteError, match=r"`steps` must be a positive integer\. Received: steps=0"):
        mixture.epoch_steps([10], [1.0], 4, steps=0)
