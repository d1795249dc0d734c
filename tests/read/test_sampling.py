"""Class sampling on the tf.data engine: ``chute.load(..., sampling=...)``, ``chute train
--sampling``, and ``chute inspect``'s imbalance line.

One tiny 1:50 imbalanced set (10 images of ``a``, 500 of ``b``, 8x8 raw, 3 shards),
converted once per module from a ``.npz``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import run_here

import chute
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.read.sampling import class_probabilities, probabilities
from chute.read.tf.plan import make_plan

BATCH = 32  # 510 training examples: 15 full batches an epoch


@pytest.fixture(scope="module")
def imbalanced(tmp_path_factory) -> Path:
    """``a``: 10 + 1 val, ``b``: 500 + 9 val (a val split of 10 read without sampling)."""
    root = tmp_path_factory.mktemp("imbalanced")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(520, 8, 8), dtype=np.uint8)
    y = np.array([0] * 10 + [1] * 500 + [0] + [1] * 9)
    np.savez(
        root / "src.npz",
        x_train=x[:510], y_train=y[:510], x_val=x[510:], y_val=y[510:],
        class_names=np.array(["a", "b"]),
    )  # fmt: skip
    chute.convert(root / "src.npz", root / "out", min_shards=3, workers=1)
    manifest = chute.load_manifest(root / "out")
    assert manifest.splits["train"]["class_counts"] == [10, 500], manifest.splits
    return root / "out"


def _labels(dataset, epochs: int = 1) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for _ in range(epochs):
        for images, labels in dataset:
            assert images.shape[0] == BATCH  # full batches
            counts.update(labels.numpy().tolist())
    return counts


def test_balanced_draws_each_class_equally_in_an_epoch_as_long_as_before(imbalanced, caplog):
    plain = chute.load(imbalanced, "train", batch_size=BATCH, seed=3)
    with caplog.at_level(logging.INFO, logger="chute.read"):
        sampled = chute.load(imbalanced, "train", batch_size=BATCH, sampling="balanced", seed=3)
    assert len(sampled) == len(plain) == sampled.chute.steps == 510 // BATCH
    assert sampled.chute.options.sampling == "balanced"
    counts = _labels(sampled, epochs=2)
    assert sum(counts.values()) == 2 * 15 * BATCH
    assert abs(counts[0] / sum(counts.values()) - 0.5) < 0.05, counts
    # what sampling does, and its cost, are logged
    assert "2 of 2 classes drawn, p = 0.5 each" in caplog.text
    assert "'a' (10 examples) ~24 times each" in caplog.text
    assert "class sampling (tf engine): 2 class streams" in caplog.text


def test_weights_by_name_or_index_set_each_class_share(imbalanced):
    by_name = chute.load(imbalanced, batch_size=BATCH, sampling={"a": 3, "b": 1}, seed=5)
    counts = _labels(by_name, epochs=2)
    assert abs(counts[0] / sum(counts.values()) - 0.75) < 0.05, counts
    # the same probabilities by index (a flag's "0=3,1=1"): the same draws
    by_index = chute.load(imbalanced, batch_size=BATCH, sampling="0=3,1=1", seed=5)
    assert _labels(by_index, epochs=2) == counts


def test_the_same_seed_draws_the_same_batches_and_epochs_differ(imbalanced):
    def batches(dataset):
        return [(images.numpy().tobytes(), labels.numpy().tobytes()) for images, labels in dataset]

    options = dict(batch_size=BATCH, sampling="balanced", seed=11, augment="crop,flip")
    first = chute.load(imbalanced, "train", **options)
    epoch_1, epoch_2 = batches(first), batches(first)
    assert batches(chute.load(imbalanced, "train", **options)) == epoch_1
    assert epoch_1 != epoch_2


def test_sampled_batches_are_finished_like_any_other(imbalanced):
    dataset = chute.load(
        imbalanced,
        batch_size=BATCH,
        sampling="balanced",
        seed=1,
        image_size=6,
        dtype="float32",
        label_mode="categorical",
        cache=None,
    )
    images, labels = next(iter(dataset))
    assert images.shape == (BATCH, 6, 6, 1) and images.dtype.name == "float32"
    assert labels.shape == (BATCH, 2) and float(np.max(images)) <= 1.0


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"zebra": 1}, "`sampling` names class 'zebra', which this dataset does not have. "
                       "Allowed: class names ['a', 'b'] or indexes 0-1"),
        ({7: 1}, "`sampling` names class 7"),
        ({"a": 1, 0: 2}, "`sampling` weighs class 'a' (label 0) twice"),
        ({"a": -1}, "`sampling` must be None, 'balanced', or a mapping"),
        ({"a": float("nan")}, "`sampling` must be None, 'balanced', or a mapping"),
        ({"a": 0, "b": 0}, "`sampling` must be weights with at least one above 0"),
        ("a=many", "`sampling` must be None, 'balanced'"),
        ("uniform", "`sampling` must be None, 'balanced'"),
    ],
)  # fmt: skip
def test_bad_sampling_is_an_error_naming_it(imbalanced, sampling, message):
    with pytest.raises(ChuteError) as error:
        chute.load(imbalanced, "train", sampling=sampling)
    assert message in str(error.value)


def test_sampling_is_for_training_only(imbalanced):
    with pytest.raises(ChuteError, match="`sampling` chooses training draws; it needs training"):
        chute.load(imbalanced, "train", sampling="balanced", training=False)
    with pytest.raises(ChuteError, match="split 'val' is read for evaluation unless training"):
        chute.load(imbalanced, "val", sampling="balanced")
    with pytest.raises(ChuteError, match=r"`sampling` draws from a stream per class.*data_service"):
        chute.load(imbalanced, sampling="balanced", data_service="grpc://localhost:5050")


def test_a_class_without_examples_is_never_drawn(imbalanced, caplog):
    manifest = chute.load_manifest(imbalanced)
    with caplog.at_level(logging.WARNING, logger="chute.read.sampling"):
        assert class_probabilities(manifest, "val", "balanced") == (0.5, 0.5)
        assert class_probabilities(manifest, "val", "balanced", counts=[0, 9]) == (0.0, 1.0)
    assert "1 class(es) with no examples here are never drawn: ['a']" in caplog.text
    assert class_probabilities(manifest, "train", None) is None
    with pytest.raises(ChuteError, match="`sampling` weighs only classes with no examples"):
        probabilities(["a", "b"], [0, 5], (("a", 1.0),))


@pytest.mark.parametrize("cache", [None, "memory"])
def test_skip_corrupt_counts_a_damaged_shard_once_an_epoch_whatever_reads_it(
    imbalanced, tmp_path, cache
):
    """Both class streams read the damaged shard, the large class's several times over
    without a cache: corrupt_count() is still the records the shard lost, each epoch."""
    out = Path(shutil.copytree(imbalanced, tmp_path / "out"))
    shard = Path(chute.load_manifest(out).shard_paths("train")[1])
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record in the middle fails its CRC: the rest is lost
    shard.write_bytes(bytes(data))
    plain = chute.load(out, "train", batch_size=BATCH, training=False, skip_corrupt=True)
    lost = 510 - sum(int(labels.shape[0]) for _, labels in plain)
    assert plain.chute.corrupt_count() == lost > 0
    sampled = chute.load(out, "train", batch_size=BATCH, sampling="balanced", seed=3,
                         skip_corrupt=True, cache=cache)  # fmt: skip
    counts = []
    for _ in range(2):
        assert sum(_labels(sampled).values()) == 510 // BATCH * BATCH
        counts.append(sampled.chute.corrupt_count())
    assert counts == [lost, lost]


def test_each_input_pipeline_samples_the_classes_of_its_own_shards(imbalanced):
    class Context:  # a tf.distribute.InputContext of two input pipelines
        num_input_pipelines, num_replicas_in_sync = 2, 2

        def __init__(self, index):
            self.input_pipeline_id = index

    manifest = manifest_lib.load(imbalanced)
    options = chute.LoadOptions(sampling="balanced", batch_size=8)
    plans = [make_plan(manifest, "train", options, input_context=Context(i)) for i in (0, 1)]
    shards = manifest.splits["train"]["shards"]
    for index, plan in enumerate(plans):
        mine = shards[index::2]
        assert plan.shard_classes == tuple(tuple(s["class_counts"]["classes"]) for s in mine)
        assert sum(plan.class_counts) == plan.num_examples == sum(s["num_records"] for s in mine)
        assert plan.sampling == (0.5, 0.5) and plan.per_image
    assert [sum(c) for c in zip(*(p.class_counts for p in plans), strict=True)] == [10, 500]


def test_train_flag_samples_the_training_data_only_and_is_in_the_run_config(
    imbalanced, tmp_path, monkeypatch
):
    # Stopped once both splits are built: what fit would read, without the fit.
    from helpers import Killed

    from chute.fit import train as train_module
    from chute.read.load import info_of

    seen = {}
    real_inputs = train_module._inputs

    def inputs(manifest, config, strategy, *rest):
        seen["config"] = config
        built = real_inputs(manifest, config, strategy, *rest)
        seen["train"], seen["val"] = (info_of(d).options.sampling for d in (built.train, built.val))
        raise Killed

    monkeypatch.setattr(train_module, "_inputs", inputs)
    with pytest.raises(Killed):
        run_here(
            "train", imbalanced, "--run-dir", tmp_path / "run", "--sampling", "balanced",
            "--batch-size", str(BATCH), "--strategy", "cpu",
        )  # fmt: skip
    assert (seen["train"], seen["val"]) == ("balanced", None)
    # config.json holds the config as a dict: the sampling read with is recorded
    assert dataclasses.asdict(seen["config"])["load"]["sampling"] == "balanced"


def test_inspect_shows_each_split_imbalance(imbalanced):
    result = run_here("inspect", imbalanced)
    assert result.returncode == 0, result.stderr
    assert "imbalance (largest / smallest class):" in result.stdout
    assert "train  50x (500 / 10); smallest: a (10), b (500)" in result.stdout
    assert "val    9x (9 / 1); smallest: a (1), b (9)" in result.stdout
