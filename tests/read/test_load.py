"""chute.load: the tf.data reader of converted shards.

Every test reads tiny synthetic datasets converted once per module. Images are
smooth and pairwise distinct, so an example is identified by its label and
pixels (for JPEG: by the nearest source image, which is unambiguous).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, decode, make_folder, read_records, write_image
from PIL import Image

import chute
from chute.errors import ChuteError

CLASSES = {"a": 10, "b": 8, "c": 6}  # 24 images: train 18, val 6 with val_fraction=0.25
HEIGHT, WIDTH = 12, 10
BATCH = 4


def _pixels(k: int, *, size=(HEIGHT, WIDTH), channels: int = 3) -> np.ndarray:
    """Image number ``k``: a smooth gradient with a small texture, distinct for each k < 24."""
    h, w = size
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(channels), indexing="ij")
    value = 8 * k + 2 * y + 2 * x + 10 * c + (x * y + k) % 3
    image = np.clip(value, 0, 255).astype(np.uint8)
    return image[..., 0] if channels == 1 else image


def _write_source(root: Path) -> Path:
    k = 0
    for name, count in sorted(CLASSES.items()):
        for i in range(count):
            write_image(root / name / f"{i:03d}.png", _pixels(k))
            k += 1
    return root


def _source_image(src: Path, key: str) -> np.ndarray:
    image = np.asarray(Image.open(src / key))
    return image.reshape(*image.shape[:2], -1)


def _expected(src: Path, out, split: str) -> list[tuple[int, np.ndarray]]:
    """(label, source pixels) of every example of ``split``: the keys tell which files."""
    return [(r["class"], _source_image(src, r["key"])) for r in all_records(out, split)]


def _examples(ds) -> list[tuple[int, np.ndarray]]:
    """(int label, uint8 pixels) of every example a dataset yields, in order."""
    out = []
    for batch in ds:
        images, labels = batch[0].numpy(), batch[1].numpy()
        assert images.dtype == np.uint8
        out.extend(zip(labels.reshape(-1).astype(int).tolist(), images, strict=True))
    return out


def _key(example) -> tuple[int, bytes]:
    label, image = example
    return int(label), np.ascontiguousarray(image).tobytes()


def _multiset(examples) -> collections.Counter:
    return collections.Counter(_key(e) for e in examples)


def _match(got, expected, *, tolerance: float) -> None:
    """Each yielded example is the nearest same-label source image, within ``tolerance``
    (mean absolute difference), and no source image is matched twice."""
    used = []
    for label, image in got:
        candidates = [i for i, (lab, _) in enumerate(expected) if lab == label]
        assert candidates, f"label {label} is not in the split"
        errors = [
            np.abs(image.astype(float) - expected[i][1].astype(float)).mean() for i in candidates
        ]
        best = candidates[int(np.argmin(errors))]
        assert min(errors) <= tolerance, f"nearest source image differs by {min(errors):.2f}"
        used.append(best)
    assert len(set(used)) == len(used) == len(got)


class Data:
    """Converted copies of the module's source folder, made once per encoding/option."""

    def __init__(self, root: Path):
        self.root = root
        self.src = _write_source(root / "src")
        self._outs: dict[tuple, Path] = {}

    def out(self, encoding: str = "raw", **options) -> Path:
        key = (encoding, *sorted(options.items()))
        if key not in self._outs:
            path = self.root / f"out-{len(self._outs)}"
            options = {"val_fraction": 0.25, "min_shards": 3, **options}
            chute.convert(self.src, path, workers=1, encoding=encoding, **options)
            self._outs[key] = path
        return self._outs[key]

    def expected(self, split: str = "train", encoding: str = "raw", **options):
        return _expected(self.src, self.out(encoding, **options), split)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Data:
    return Data(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("binary")
    src = make_folder(root / "src", {"cat": 5, "dog": 7})
    chute.convert(src, root / "out", min_shards=2, workers=1, encoding="raw")
    return root / "out"


# -- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_pixels_and_labels_round_trip_exactly(data, encoding, split):
    out = data.out(encoding)
    expected = data.expected(split, encoding)
    assert len(expected) == {"train": 18, "val": 6}[split]
    ds = chute.load(out, split, batch_size=BATCH, training=False)
    got = _examples(ds)
    assert _multiset(got) == _multiset(expected)
    assert all(image.shape == (HEIGHT, WIDTH, 3) for _, image in got)


def test_jpeg_round_trips_within_a_tolerance(data):
    out = data.out("jpeg")
    expected = data.expected("train", "jpeg")
    got = _examples(chute.load(out, batch_size=BATCH, training=False))
    assert len(got) == len(expected) == 18
    _match(got, expected, tolerance=3.0)


def test_training_batches_hold_source_examples(data):
    """Training mode (shuffled) yields source examples, too, not something re-encoded."""
    expected = _multiset(data.expected())
    got = _examples(chute.load(data.out(), batch_size=BATCH, training=True, seed=1))
    assert got and all(_key(e) in expected for e in got)


def test_path_may_be_the_manifest_file_or_a_loaded_manifest(data):
    out = data.out()
    got = _examples(chute.load(out / "manifest.json", batch_size=BATCH, training=False))
    assert _multiset(got) == _multiset(data.expected())
    manifest = chute.load_manifest(out)
    got = _examples(chute.load(manifest, batch_size=BATCH, training=False))
    assert _multiset(got) == _multiset(data.expected())


def test_datasets_built_one_after_another_read_their_own_records(data):
    for out in (data.out(), data.out(val_fraction=0.5)):
        expected = _multiset(_expected(data.src, out, "train"))
        evaluation = chute.load(out, batch_size=BATCH, training=False)
        assert _multiset(_examples(evaluation)) == expected
        training = _multiset(_examples(chute.load(out, batch_size=BATCH, seed=3)))
        assert training and all(k in expected for k in training)


@pytest.mark.parametrize("cache", [None, "memory"])
def test_a_dataset_built_again_gives_the_same_batches(data, cache):
    """With a seed (or in evaluation) a dataset built again with the same options gives
    the same batches, epoch by epoch; one of other shards reads its own records."""

    def epochs(out, **options):
        ds = chute.load(out, batch_size=BATCH, cache=cache, **options)
        return [[_key(e) for e in _examples(ds)] for _ in range(2)]

    for options in ({"training": False}, {"seed": 3}):
        first = epochs(data.out(), **options)
        assert epochs(data.out(), **options) == first
        assert epochs(data.out(), **options) == first
        other = data.out(val_fraction=0.5)  # the same options, other shards
        expected = _multiset(_expected(data.src, other, "train"))
        for epoch in epochs(other, **options):
            if options.get("training", True):
                assert len(epoch) == len(set(epoch)) == 12 // BATCH * BATCH
                assert all(k in expected for k in epoch)
            else:
                assert collections.Counter(epoch) == expected


def test_a_global_seed_still_gives_each_dataset_its_own_order(data):
    """Under tf.random.set_seed TensorFlow gives each dataset built without a seed
    new op seeds, so built again it still gets its own order; with a seed, a build
    of the same options gives the same batches, under whichever global seed."""
    import tensorflow as tf

    def order(**options):
        ds = chute.load(data.out(), batch_size=BATCH, cache=None, **options)
        return tuple(_key(e) for e in _examples(ds))

    try:
        for global_seed in (7, 8):
            tf.random.set_seed(global_seed)
            assert len({order() for _ in range(3)}) == 3
            assert len({order(seed=3) for _ in range(3)}) == 1
            assert len({order(seed=np.int64(3)) for _ in range(2)}) == 1
    finally:
        tf.random.set_seed(None)


def test_class_names(data, two_classes):
    assert chute.load(data.out(), batch_size=BATCH).chute.class_names == ("a", "b", "c")
    assert chute.load(two_classes, batch_size=BATCH).chute.class_names == ("cat", "dog")


# -- shapes, dtypes, labels ---------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg"])
@pytest.mark.parametrize("cache", [None, "memory"])
def test_training_batches_have_static_shapes(data, encoding, cache):
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=True, cache=cache, seed=0)
    images_spec, labels_spec = ds.element_spec
    assert tuple(images_spec.shape) == (BATCH, HEIGHT, WIDTH, 3)
    assert images_spec.dtype.name == "uint8"
    assert tuple(labels_spec.shape) == (BATCH,)
    for images, labels in ds:
        assert images.shape == (BATCH, HEIGHT, WIDTH, 3)
        assert labels.shape == (BATCH,)


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_evaluation_images_have_static_image_shape(data, encoding):
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=False)
    images_spec, _ = ds.element_spec
    assert tuple(images_spec.shape[1:]) == (HEIGHT, WIDTH, 3)
    assert images_spec.dtype.name == "uint8"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float_dtypes_are_scaled_to_unit_range(data, dtype):
    import tensorflow as tf

    out = data.out()
    reference = np.concatenate(
        [x.numpy() for x, _ in chute.load(out, batch_size=BATCH, training=False)]
    )
    ds = chute.load(out, batch_size=BATCH, training=False, dtype=dtype)
    assert ds.element_spec[0].dtype == getattr(tf, dtype)
    images = np.concatenate([tf.cast(x, tf.float32).numpy() for x, _ in ds])
    assert images.shape == reference.shape
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert images.max() > 0.5  # scaled, not all zero
    atol = 1e-6 if dtype == "float32" else 1 / 128
    np.testing.assert_allclose(images, reference / 255.0, atol=atol)


def test_label_modes(data):
    out = data.out()
    ints = np.concatenate([y.numpy() for _, y in chute.load(out, batch_size=BATCH, training=False)])
    assert ints.dtype == np.int32
    assert collections.Counter(ints.tolist()) == collections.Counter(
        label for label, _ in data.expected()
    )

    categorical = chute.load(out, batch_size=BATCH, training=False, label_mode="categorical")
    assert tuple(categorical.element_spec[1].shape) == (None, 3)
    onehot = np.concatenate([y.numpy() for _, y in categorical])
    assert onehot.dtype == np.float32
    np.testing.assert_array_equal(onehot, np.eye(3, dtype=np.float32)[ints])

    images_only = chute.load(out, batch_size=BATCH, training=False, label_mode=None)
    assert not isinstance(images_only.element_spec, tuple)
    assert sum(int(x.shape[0]) for x in images_only) == 18


def test_binary_labels_on_two_classes(two_classes):
    ints = np.concatenate(
        [y.numpy() for _, y in chute.load(two_classes, batch_size=BATCH, training=False)]
    )
    ds = chute.load(two_classes, batch_size=BATCH, training=False, label_mode="binary")
    assert tuple(ds.element_spec[1].shape) == (None, 1)
    binary = np.concatenate([y.numpy() for _, y in ds])
    assert binary.dtype == np.float32 and binary.shape == (12, 1)
    np.testing.assert_array_equal(binary[:, 0], ints.astype(np.float32))
    assert set(binary[:, 0].tolist()) == {0.0, 1.0}


def test_binary_on_three_classes_is_an_error(data):
    with pytest.raises(ChuteError, match="binary"):
        chute.load(data.out(), batch_size=BATCH, label_mode="binary")


# -- epochs, evaluation, cardinality --------------------------------------------------------------


@pytest.mark.parametrize("cache", [None, "memory", "auto"])
def test_len_is_exact(data, cache):
    out = data.out()
    train = chute.load(out, batch_size=BATCH, training=True, cache=cache)
    evaluation = chute.load(out, batch_size=BATCH, training=False, cache=cache)
    val = chute.load(out, "val", batch_size=BATCH, cache=cache)
    assert len(train) == 18 // BATCH == sum(1 for _ in train)
    assert len(evaluation) == math.ceil(18 / BATCH) == sum(1 for _ in evaluation)
    assert len(val) == math.ceil(6 / BATCH) == sum(1 for _ in val)
    assert train.chute.num_examples == 18 and val.chute.num_examples == 6
    assert (train.chute.steps, evaluation.chute.steps, val.chute.steps) == (
        len(train),
        len(evaluation),
        len(val),
    )


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_evaluation_yields_every_example_once_with_a_final_partial_batch(data, encoding):
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=False)
    sizes = [int(x.shape[0]) for x, _ in ds]
    assert sizes == [4, 4, 4, 4, 2]
    got = _examples(ds)
    assert len(got) == 18
    assert _multiset(got) == _multiset(data.expected("train", encoding))
    assert max(_multiset(got).values()) == 1


def test_evaluation_of_val_split_is_the_default_mode(data):
    ds = chute.load(data.out(), "val", batch_size=BATCH)
    assert [int(x.shape[0]) for x, _ in ds] == [4, 2]
    assert _multiset(_examples(ds)) == _multiset(data.expected("val"))


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_pad_final_batch_gives_full_batches_and_weights(data, encoding):
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=False, pad_final_batch=True)
    assert len(ds.element_spec) == 3
    assert tuple(ds.element_spec[0].shape) == (BATCH, HEIGHT, WIDTH, 3)
    real, total_weight, batches = [], 0.0, 0
    for images, labels, weights in ds:
        batches += 1
        assert images.shape[0] == labels.shape[0] == weights.shape[0] == BATCH
        w = weights.numpy()
        assert set(w.tolist()) <= {0.0, 1.0}
        total_weight += float(w.sum())
        for label, image, weight in zip(labels.numpy(), images.numpy(), w, strict=True):
            if weight == 1.0:
                real.append((int(label), image))
            else:
                assert not image.any()  # padding is zeros
    assert batches == math.ceil(18 / BATCH)
    assert total_weight == 18
    assert _multiset(real) == _multiset(data.expected("train", encoding))


def test_pad_final_batch_in_training_is_an_error(data):
    with pytest.raises(ChuteError, match="pad_final_batch"):
        chute.load(data.out(), batch_size=BATCH, training=True, pad_final_batch=True)


@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("cache", [None, "memory"])
def test_a_training_epoch_covers_each_example_at_most_once(data, encoding, cache):
    expected = _multiset(data.expected("train", encoding))
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=True, cache=cache, seed=5)
    for _ in range(2):  # a second epoch from the cache, too
        got = _multiset(_examples(ds))
        assert sum(got.values()) == 18 // BATCH * BATCH
        assert max(got.values()) == 1
        assert all(k in expected for k in got)


@pytest.mark.parametrize("cache", [None, "memory"])
def test_repeat_covers_every_example_once_per_epoch(data, cache):
    expected = _multiset(data.expected())
    batch = 6  # divides the 18 training examples: an epoch is exactly 3 batches
    ds = chute.load(data.out(), batch_size=batch, training=True, repeat=True, cache=cache, seed=2)
    batches = list(ds.take(6))
    for epoch in (batches[:3], batches[3:]):
        assert _multiset(_examples(epoch)) == expected


@pytest.mark.parametrize("cache", [None, "memory"])
def test_training_order_is_reshuffled_every_epoch(data, cache):
    ds = chute.load(data.out(), batch_size=BATCH, training=True, cache=cache, seed=9)
    first = [_key(e) for e in _examples(ds)]
    second = [_key(e) for e in _examples(ds)]
    assert first != second


def _shard_of(out) -> dict[tuple[int, bytes], int]:
    """Which training shard each example (label, pixels) was written to."""
    manifest = chute.load_manifest(str(out))
    return {
        (r["class"], decode(r).tobytes()): number
        for number, path in enumerate(manifest.shard_paths("train"))
        for r in read_records(path)
    }


def test_training_batches_mix_records_of_several_shards(data):
    shard_of = _shard_of(data.out())
    assert len(set(shard_of.values())) == 3
    ds = chute.load(data.out(), batch_size=6, training=True, seed=4)
    mixed = [len({shard_of[_key(e)] for e in _examples([batch])}) for batch in ds]
    assert len(mixed) == 3
    assert max(mixed) > 1  # a batch is not a run of one shard's records


@pytest.mark.parametrize("shuffle_buffer", [1, 5, 100])
def test_any_shuffle_window_gives_full_batches_each_example_at_most_once(data, shuffle_buffer):
    expected = _multiset(data.expected())
    ds = chute.load(data.out(), batch_size=BATCH, training=True, shuffle_buffer=shuffle_buffer)
    batches = list(ds)
    assert [int(b[0].shape[0]) for b in batches] == [BATCH] * (18 // BATCH)
    got = _multiset(_examples(batches))
    assert max(got.values()) == 1 and all(k in expected for k in got)


def test_shuffle_window_is_capped_by_memory(data, monkeypatch, caplog):
    from chute.read.tf import plan

    monkeypatch.setattr(plan, "WINDOW_BYTES", 2 * HEIGHT * WIDTH * 3)  # two images
    with caplog.at_level("INFO", logger="chute.read.tf.plan"):
        ds = chute.load(data.out(), batch_size=BATCH, training=True, seed=1)
    assert "shuffle window: 4 records" in caplog.text  # never less than one batch
    got = _multiset(_examples(ds))
    assert sum(got.values()) == 18 // BATCH * BATCH and max(got.values()) == 1


@pytest.mark.parametrize("cache", [None, "memory"])
def test_shuffle_windows_hold_different_records_each_epoch(data, cache):
    # Windows of 4 records (2 batches of 2): a cache replays blocks in one order,
    # which must not give every epoch the same windows.
    ds = chute.load(data.out(), batch_size=2, training=True, cache=cache, shuffle_buffer=4, seed=3)
    partitions = []
    for _ in range(4):
        batches = [[_key(e) for e in _examples([b])] for b in ds]
        windows = [frozenset(batches[i] + batches[i + 1]) for i in range(0, len(batches) - 1, 2)]
        partitions.append(frozenset(windows))
    assert len(set(partitions)) > 1


# -- determinism, cache ---------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("cache", [None, "memory"])
def test_same_seed_same_batches_different_seed_different(data, encoding, cache):
    out = data.out(encoding)

    def run(seed):
        ds = chute.load(out, batch_size=BATCH, training=True, cache=cache, seed=seed)
        return [_key(e) for e in _examples(ds)]

    first = run(11)
    assert run(11) == first
    assert run(12) != first


def test_cache_modes_give_the_same_examples(data, tmp_path):
    out = data.out()
    expected = _multiset(data.expected())
    disk = tmp_path / "cache" / "train"
    disk.parent.mkdir()
    for cache in (None, "memory", f"disk:{disk}", "auto"):
        ds = chute.load(out, batch_size=BATCH, training=False, cache=cache)
        for _ in range(2):  # the second epoch reads the cache
            assert _multiset(_examples(ds)) == expected, cache
    assert any(p.name.startswith("train") for p in disk.parent.iterdir())


def test_png_disk_cache_gives_the_same_examples(data, tmp_path):
    out = data.out("png")
    expected = _multiset(data.expected("train", "png"))
    ds = chute.load(out, batch_size=BATCH, training=False, cache=f"disk:{tmp_path / 'c'}")
    for _ in range(2):
        assert _multiset(_examples(ds)) == expected


# -- resize, augmentation, variable sizes ---------------------------------------------------------


def _resized(image: np.ndarray, size) -> np.ndarray:
    import tensorflow as tf

    return np.round(tf.image.resize(image, size).numpy()).astype(np.uint8)


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_image_size_resizes(data, encoding):
    size = (6, 5)
    ds = chute.load(data.out(encoding), batch_size=BATCH, training=False, image_size=size)
    assert tuple(ds.element_spec[0].shape[1:]) == (*size, 3)
    got = _examples(ds)
    assert all(image.shape == (*size, 3) for _, image in got)
    expected = [(label, _resized(image, size)) for label, image in data.expected("train", encoding)]
    _match(got, expected, tolerance=2.0)
    train = chute.load(data.out(encoding), batch_size=BATCH, training=True, image_size=(7, 7))
    assert next(iter(train))[0].shape == (BATCH, 7, 7, 3)


def test_augment_changes_training_pixels_only(data):
    out = data.out()
    expected = _multiset(data.expected())
    ds = chute.load(out, batch_size=BATCH, training=True, augment=["flip", "contrast"], seed=3)
    got = _examples(ds)
    assert len(got) == 16
    assert all(image.shape == (HEIGHT, WIDTH, 3) for _, image in got)
    changed = sum(_key(e) not in expected for e in got)
    assert changed > 0
    # labels are untouched by augmentation
    assert collections.Counter(label for label, _ in got) <= collections.Counter(
        label for label, _ in data.expected()
    )

    evaluation = chute.load(out, batch_size=BATCH, training=False, augment=["flip", "contrast"])
    assert _multiset(_examples(evaluation)) == expected


def test_seeded_augmentation_is_reproducible(data):
    def run(seed):
        ds = chute.load(
            data.out(), batch_size=BATCH, training=True, augment=["flip", "brightness"], seed=seed
        )
        return [b[0].numpy().tobytes() for b in ds]

    first = run(21)
    assert run(21) == first
    assert run(22) != first


@pytest.mark.parametrize("training", [True, False])
def test_unknown_augment_name_is_an_error(data, training):
    with pytest.raises(ChuteError, match="augment"):
        chute.load(data.out(), batch_size=BATCH, training=training, augment=["flip", "swirl"])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": -3}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"dtype": "float16"}, "dtype"),
        ({"dtype": "int32"}, "dtype"),
        ({"label_mode": "sparse"}, "label_mode"),
        ({"cache": "ram"}, "cache"),
        ({"cache": "disk:"}, "cache"),
        ({"cache": True}, "cache"),
        ({"image_size": (0, 4)}, "image_size"),
        ({"seed": "1"}, "seed"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments_name_the_argument(data, kwargs, name):
    args = {"batch_size": BATCH, **kwargs}
    with pytest.raises(ChuteError, match=name):
        chute.load(data.out(), **args)


def test_options_and_keyword_overrides(data):
    out = data.out()
    options = chute.LoadOptions(batch_size=2, training=False, label_mode=None)
    ds = chute.load(out, "train", options, batch_size=BATCH)
    assert ds.chute.options == dataclasses.replace(options, batch_size=BATCH)
    assert options.batch_size == 2  # the options given are not changed
    assert ds.element_spec.shape.as_list() == [None, HEIGHT, WIDTH, 3]  # images only, kept
    assert len(ds) == math.ceil(18 / BATCH) == sum(1 for _ in ds)
    assert len(chute.load(out, "train", options)) == 18 // 2
    as_mapping = chute.load(out, "train", {"batch_size": BATCH, "training": False}, label_mode=None)
    assert as_mapping.chute.options == ds.chute.options


def test_keyword_calls_read_as_the_same_options(data):
    out = data.out()
    by_text = chute.load(out, "train", batch_size=BATCH, augment="flip,contrast", seed=3)
    by_list = chute.load(out, "train", batch_size=BATCH, augment=["flip", "contrast"], seed=3)
    options = chute.LoadOptions(batch_size=BATCH, augment=("flip", "contrast"), seed=3)
    assert by_text.chute.options == by_list.chute.options == options
    assert [_key(e) for e in _examples(by_text)] == [_key(e) for e in _examples(by_list)]


def test_unknown_keywords_and_options_are_named(data):
    with pytest.raises(ChuteError, match=r"Unknown load option\(s\) \['batchsize'\]"):
        chute.load(data.out(), batch_size=BATCH, batchsize=4)
    with pytest.raises(ChuteError, match=r"Unknown load option\(s\) \['augmnet'\]"):
        chute.load(data.out(), "train", chute.LoadOptions(), augmnet=["flip"])
    with pytest.raises(ChuteError, match=r"`options` must be a LoadOptions.*Received: options=32"):
        chute.load(data.out(), "train", 32)


def test_the_dataset_tells_what_it_reads_in_one_info_object(data):
    import tensorflow as tf

    from chute.read.load import LoadInfo, info_of

    ds = chute.load(
        data.out(), batch_size=BATCH, augment=["flip", "zoom"], augment_on="device", cache="memory"
    )
    info = info_of(ds)
    assert isinstance(info, LoadInfo) and info is ds.chute
    assert info.class_names == ("a", "b", "c") and info.num_examples == 18 and info.training
    assert info.steps == len(ds) == 18 // BATCH
    assert info.per_replica_batch_size == info.global_batch_size == BATCH
    assert info.device_augmentation.names == ["flip", "zoom"]  # blocks: the flip too
    assert info.cached_in == "memory" and info.corrupt_count() == 0
    assert info.options.augment == ("flip", "zoom") and info.options.augment_on == "device"
    for old in ("class_names", "num_examples", "global_batch_size", "corrupt_count"):
        assert not hasattr(ds, old)  # one typed object, not loose attributes
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.steps = 1
    evaluation = chute.load(data.out(), "val", batch_size=BATCH).chute
    assert (evaluation.training, evaluation.steps, evaluation.device_augmentation) == (
        False,
        math.ceil(6 / BATCH),
        None,
    )
    with pytest.raises(ChuteError, match=r"not returned by chute\.load"):
        info_of(ds.map(lambda images, labels: (images, labels)))
    with pytest.raises(ChuteError, match=r"not returned by chute\.load"):
        info_of(tf.data.Dataset.range(3))


def test_not_a_dataset_is_a_chute_error(tmp_path):
    with pytest.raises(ChuteError):
        chute.load(tmp_path, batch_size=BATCH)


@pytest.fixture(scope="module")
def keep_size(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keep")
    sizes = [(12, 10), (9, 14), (16, 16), (7, 8)]
    for c, name in enumerate(["x", "y"]):
        for i, size in enumerate(sizes):
            write_image(root / "src" / name / f"{i}.png", _pixels(4 * c + i, size=size))
    chute.convert(root / "src", root / "out", keep_size=True, encoding="png", workers=1)
    return root


def test_variable_size_dataset_needs_image_size(keep_size):
    with pytest.raises(ChuteError, match="image_size"):
        chute.load(keep_size / "out", batch_size=BATCH)


def _centre_cropped(image: np.ndarray, size, fraction: float) -> np.ndarray:
    """The documented evaluation crop: the centred window of ``size``'s aspect ratio over
    ``fraction`` of the shorter side, resized to ``size``."""
    height, width = image.shape[:2]
    aspect = size[1] / size[0]
    crop_h = max(1, round(min(height, width / aspect) * fraction))
    crop_w = max(1, round(min(width, height * aspect) * fraction))
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    window = image[top : top + crop_h, left : left + crop_w]
    return window if window.shape[:2] == tuple(size) else _resized(window, size)


@pytest.mark.parametrize("fraction", [None, 1.0, 0.5])
def test_variable_size_dataset_works_with_image_size(keep_size, fraction):
    out = keep_size / "out"
    ds = chute.load(
        out, batch_size=BATCH, training=False, image_size=(8, 8), crop_fraction=fraction
    )
    assert tuple(ds.element_spec[0].shape[1:]) == (8, 8, 3)
    got = _examples(ds)
    assert len(got) == 8
    expected = [
        (label, _centre_cropped(image, (8, 8), 0.875 if fraction is None else fraction))
        for label, image in _expected(keep_size / "src", out, "train")
    ]
    _match(got, expected, tolerance=2.0)
    train = chute.load(out, batch_size=BATCH, training=True, image_size=(8, 8))
    assert tuple(train.element_spec[0].shape) == (BATCH, 8, 8, 3)
    assert sum(int(x.shape[0]) for x, _ in train) == 8


# -- distribution ---------------------------------------------------------------------------------


def _context(index: int):
    import tensorflow as tf

    return tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=2
    )


@pytest.mark.parametrize("min_shards", [3, 1], ids=["by-file", "by-record"])
def test_input_contexts_cover_every_record_once(data, min_shards):
    out = data.out("raw", min_shards=min_shards)
    manifest = chute.load_manifest(out)
    assert len(manifest.shard_paths("train")) == min_shards
    parts = []
    for index in range(2):
        ds = chute.load(out, batch_size=BATCH, training=False, input_context=_context(index))
        info = ds.chute
        assert info.per_replica_batch_size == BATCH and info.global_batch_size == 2 * BATCH
        got = _examples(ds)
        assert got, "every input pipeline reads something"
        assert len(got) == info.num_examples
        parts.append(got)
    union = _multiset(parts[0] + parts[1])
    assert union == _multiset(data.expected("train", "raw", min_shards=min_shards))
    assert max(union.values()) == 1


@pytest.mark.parametrize("min_shards", [3, 1], ids=["by-file", "by-record"])
def test_input_contexts_split_a_training_epoch(data, min_shards):
    out = data.out("raw", min_shards=min_shards)
    expected = _multiset(data.expected("train", "raw", min_shards=min_shards))
    seen = collections.Counter()
    for index in range(2):
        ds = chute.load(out, batch_size=2, training=True, seed=4, input_context=_context(index))
        seen.update(_multiset(_examples(ds)))
    assert seen and max(seen.values()) == 1
    assert all(k in expected for k in seen)


def test_strategy_gives_a_distributed_dataset(data):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    out = data.out()
    ds = chute.load(out, "val", batch_size=BATCH, training=False, strategy=strategy)
    assert isinstance(ds, tf.distribute.DistributedDataset)
    assert ds.chute.global_batch_size == BATCH * strategy.num_replicas_in_sync == BATCH
    assert ds.chute.class_names == ("a", "b", "c")
    assert ds.chute.steps == math.ceil(6 / BATCH) and ds.chute.num_examples == 6
    assert len(ds) == ds.chute.steps  # what the README promises of every loaded dataset

    @tf.function
    def step(images):
        return strategy.run(lambda x: tf.reduce_sum(tf.cast(x, tf.int64)), args=(images,))

    got, total = [], 0
    for images, labels in ds:
        total += int(strategy.reduce("SUM", step(images), axis=None))
        for x, y in zip(
            strategy.experimental_local_results(images),
            strategy.experimental_local_results(labels),
            strict=True,
        ):
            got.extend(zip(y.numpy().tolist(), x.numpy(), strict=True))
    expected = data.expected("val")
    assert _multiset(got) == _multiset(expected)
    assert total == sum(int(image.astype(np.int64).sum()) for _, image in expected)


TWO_REPLICAS_SCRIPT = """
import json, os, sys, warnings
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import chute

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
train = chute.load(sys.argv[1], "train", batch_size=6, strategy=strategy, seed=1)
val = chute.load(sys.argv[1], "val", batch_size=6, training=False, strategy=strategy)
with strategy.scope():
    model = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Rescaling(1 / 255),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
counted = []
steps = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: counted.append(1))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.fit(train, validation_data=val, epochs=1, verbose=0, callbacks=[steps])
print("CHUTE_RESULT " + json.dumps({
    "len": [len(train), len(val)], "steps": [train.chute.steps, val.chute.steps],
    "cardinality": [int(train.cardinality), int(val.cardinality)],
    "distributed": isinstance(train, tf.distribute.DistributedDataset),
    "batches": sum(1 for _ in train), "fit_steps": len(counted),
    "warnings": [str(w.message) for w in caught if "ran out of data" in str(w.message)],
}), flush=True)
os._exit(0)  # the result is out: skip TensorFlow's teardown
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_len_of_a_dataset_distributed_over_two_replicas_is_its_global_steps(train_data, tmp_path):
    """MirroredStrategy over 2 logical CPUs: 36 images at 6 per replica are 3 global steps.
    ``len()`` says 3 (it raised TypeError), and so does ``cardinality``, which Keras's fit
    reads: it counted the input pipeline's 6 batches and warned "Your input ran out of
    data" after 3."""
    import json
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "two_replicas.py"
    script.write_text(textwrap.dedent(TWO_REPLICAS_SCRIPT))
    src = str(Path(chute.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p),
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    done = subprocess.run(
        [sys.executable, str(script), str(train_data)],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHUTE_RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("CHUTE_RESULT "))
    assert result["distributed"]
    assert result["steps"] == [3, 1]  # train 36 / (2 x 6); val 12 / (2 x 6)
    assert result["len"] == result["steps"] == result["cardinality"]
    assert result["batches"] == 3
    assert result["fit_steps"] == 3 and result["warnings"] == []


# -- tf.function, Keras ---------------------------------------------------------------------------


def test_iterating_inside_a_tf_function(data):
    import tensorflow as tf

    ds = chute.load(data.out("png"), batch_size=BATCH, training=False)

    @tf.function
    def totals(dataset):
        count = tf.constant(0, tf.int64)
        pixels = tf.constant(0, tf.int64)
        labels = tf.constant(0, tf.int64)
        for x, y in dataset:
            count += tf.shape(x, out_type=tf.int64)[0]
            pixels += tf.reduce_sum(tf.cast(x, tf.int64))
            labels += tf.reduce_sum(tf.cast(y, tf.int64))
        return count, pixels, labels

    count, pixels, labels = (int(v) for v in totals(ds))
    expected = data.expected("train", "png")
    assert count == 18
    assert pixels == sum(int(image.astype(np.int64).sum()) for _, image in expected)
    assert labels == sum(label for label, _ in expected)


def _tiny_model(input_shape, classes: int):
    import keras

    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
    )
    return model


class _CountBatches:
    def __init__(self):
        import keras

        counter = self

        class Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                counter.steps = self.params.get("steps")

            def on_train_batch_end(self, batch, logs=None):
                counter.batches += 1

        self.batches = 0
        self.steps = None
        self.callback = Callback()


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_model_fit_sees_the_real_number_of_steps(data, encoding):
    out = data.out(encoding)
    train = chute.load(out, batch_size=BATCH, seed=0)
    val = chute.load(out, "val", batch_size=BATCH, pad_final_batch=True)
    model = _tiny_model((HEIGHT, WIDTH, 3), 3)
    counter = _CountBatches()
    history = model.fit(
        train, validation_data=val, epochs=2, verbose=0, callbacks=[counter.callback]
    )
    assert counter.steps == len(train) == 18 // BATCH
    assert counter.batches == 2 * (18 // BATCH)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["val_loss"]))
    assert np.isfinite(model.evaluate(val, verbose=0))


# -- corrupt data ---------------------------------------------------------------------------------


def _damage(path: str, how: str) -> None:
    path = Path(path)
    if how == "missing":
        path.unlink()
        return
    data = bytearray(path.read_bytes())
    if how == "flip":  # a byte in the middle: a record fails its CRC
        data[len(data) // 2] ^= 0xFF
    else:  # cut in the middle of a record
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


def _spoil_image(path: str, index: int) -> None:
    """Rewrites a shard with valid framing but record ``index``'s image bytes replaced."""
    import tensorflow as tf

    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    feature = examples[index].features.feature["image"].bytes_list
    feature.value[0] = b"not an image" * 3
    with tf.io.TFRecordWriter(path) as writer:
        for example in examples:
            writer.write(example.SerializeToString())


@pytest.fixture
def fresh(tmp_path):
    """A fresh, damageable conversion per test: 24 training examples in 3 shards."""

    def make(encoding: str = "raw") -> Path:
        src = _write_source(tmp_path / "src")
        out = tmp_path / f"out-{encoding}"
        chute.convert(src, out, min_shards=3, workers=1, encoding=encoding)
        return out

    return make


def _count_examples(ds) -> int:
    return sum(int(batch[0].shape[0]) for batch in ds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("how", ["flip", "truncate", "missing"])
@pytest.mark.parametrize("training", [False, True])
def test_corrupt_shard_raises_naming_the_shard(fresh, encoding, how, training):
    import tensorflow as tf

    out = fresh(encoding)
    shard = chute.load_manifest(out).shard_paths("train")[1]
    _damage(shard, how)
    ds = chute.load(out, batch_size=BATCH, training=training, cache=None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=Path(shard).name):
        _count_examples(ds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", ["raw", "png"])
@pytest.mark.parametrize("training", [False, True])
def test_skip_corrupt_completes_and_counts(fresh, encoding, training):
    import tensorflow as tf

    out = fresh(encoding)
    shards = chute.load_manifest(out).shard_paths("train")
    _damage(shards[0], "flip")
    _damage(shards[1], "missing")  # TensorFlow's reader alone would retry it forever
    _damage(shards[2], "truncate")
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        _count_examples(chute.load(out, batch_size=BATCH, training=training, cache=None))
    assert any(Path(shard).name in str(raised.value) for shard in shards)

    ds = chute.load(out, batch_size=BATCH, training=training, skip_corrupt=True)
    yielded = _count_examples(ds)
    assert ds.chute.corrupt_count() > 0
    assert 0 < yielded < 24
    if not training:  # evaluation yields what survived; together with the lost, all 24
        assert yielded + ds.chute.corrupt_count() == 24


def _make_unopenable(path: str) -> None:
    """Puts a Unix socket where the shard was: it exists, but opening it fails,
    as for a shard without read permission (which root, running tests, can read)."""
    import socket

    Path(path).unlink()
    here = os.getcwd()
    os.chdir(os.path.dirname(path))  # bound by its short name: a socket's path has ~100 bytes
    try:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(os.path.basename(path))
    finally:
        os.chdir(here)


@pytest.mark.timeout(120)
def test_a_shard_that_exists_but_cannot_be_read_is_named_or_skipped(fresh):
    """TensorFlow's reader, told to skip errors, would retry opening it forever."""
    out = fresh()
    manifest = chute.load_manifest(out)
    shard = manifest.shard_paths("train")[1]
    lost = manifest.splits["train"]["shards"][1]["num_records"]
    _make_unopenable(shard)
    with pytest.raises(ChuteError, match=rf"{Path(shard).name} cannot be read"):
        chute.load(out, batch_size=BATCH, training=False)
    ds = chute.load(out, batch_size=BATCH, training=False, skip_corrupt=True)
    assert _count_examples(ds) == 24 - lost
    assert ds.chute.corrupt_count() == lost > 0
    training = chute.load(out, batch_size=BATCH, skip_corrupt=True, seed=1)
    assert 0 < _count_examples(training) <= 24 - lost


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_undecodable_record_raises_naming_the_shard(fresh, encoding):
    import tensorflow as tf

    out = fresh(encoding)
    shard = chute.load_manifest(out).shard_paths("train")[1]
    _spoil_image(shard, 2)
    ds = chute.load(out, batch_size=BATCH, training=False, cache=None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=Path(shard).name):
        _count_examples(ds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_undecodable_record_is_skipped_and_counted(fresh, encoding):
    out = fresh(encoding)
    shard = chute.load_manifest(out).shard_paths("train")[1]
    _spoil_image(shard, 2)
    ds = chute.load(out, batch_size=BATCH, training=False, skip_corrupt=True, cache=None)
    assert _count_examples(ds) == 23
    assert ds.chute.corrupt_count() == 1


@pytest.mark.timeout(120)
def test_corrupt_shard_inside_model_fit(fresh):
    import tensorflow as tf

    out = fresh("raw")
    shard = chute.load_manifest(out).shard_paths("train")[0]
    _damage(shard, "flip")
    model = _tiny_model((HEIGHT, WIDTH, 3), 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=Path(shard).name):
        model.fit(chute.load(out, batch_size=BATCH, cache=None), epochs=1, verbose=0)

    skipping = chute.load(out, batch_size=BATCH, skip_corrupt=True, cache=None)
    history = model.fit(skipping, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert skipping.chute.corrupt_count() > 0


@pytest.mark.timeout(120)
def test_corrupt_shard_inside_a_tf_function(fresh):
    import tensorflow as tf

    out = fresh("raw")
    shard = chute.load_manifest(out).shard_paths("train")[2]
    _damage(shard, "truncate")

    @tf.function
    def count(dataset):
        n = tf.constant(0, tf.int64)
        for x, _ in dataset:
            n += tf.shape(x, out_type=tf.int64)[0]
        return n

    with pytest.raises(tf.errors.InvalidArgumentError, match=Path(shard).name):
        count(chute.load(out, batch_size=BATCH, training=False, cache=None))
    skipping = chute.load(out, batch_size=BATCH, training=False, skip_corrupt=True, cache=None)
    assert 0 < int(count(skipping)) < 24


# -- other filesystems ----------------------------------------------------------------------------


def test_a_folder_name_with_glob_characters_is_read_as_a_name(data, tmp_path):
    out = tmp_path / "set[1]*?"  # shards are checked for existence with a pattern match
    chute.convert(data.src, out, workers=1, val_fraction=0.25, min_shards=3)
    got = _examples(chute.load(out, batch_size=BATCH, training=False))
    assert _multiset(got) == _multiset(data.expected())


def test_ram_filesystem(data):
    out = f"ram://chute-load-test-{uuid.uuid4().hex}/out"
    chute.convert(data.src, out, val_fraction=0.25, min_shards=2, workers=1, encoding="png")
    ds = chute.load(out, batch_size=BATCH, training=False)
    assert ds.chute.class_names == ("a", "b", "c")
    assert _multiset(_examples(ds)) == _multiset(_expected(data.src, out, "train"))
    train = chute.load(out, batch_size=BATCH, seed=1)
    assert len(train) == 18 // BATCH == sum(1 for _ in train)


def test_the_block_shuffle_is_capped_by_bytes_like_the_window(data):
    """Cached 224x224x3 blocks are ~38 MB each: the block shuffle holds a window's
    worth (<= 128 MB), not shuffle_buffer // 256 of them (32 blocks, ~1.2 GB)."""
    from chute.read.tf import plan as plan_lib

    manifest = chute.load_manifest(data.out())
    large = dataclasses.replace(manifest.image, height=224, width=224)
    big = dataclasses.replace(manifest, image=large)
    options = chute.LoadOptions(batch_size=BATCH, cache="memory", seed=1)
    read = plan_lib.make_plan(big, "train", options)
    block_bytes = plan_lib.BLOCK * 224 * 224 * 3
    assert read.shuffled_blocks * block_bytes <= plan_lib.WINDOW_BYTES
    small = plan_lib.make_plan(manifest, "train", options)
    assert small.shuffled_blocks == 8192 // plan_lib.BLOCK  # small images: as before


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_corrupt_count_is_per_epoch(fresh, encoding):
    out = fresh(encoding)
    shards = chute.load_manifest(out).shard_paths("train")
    _damage(shards[0], "flip")
    ds = chute.load(out, batch_size=BATCH, training=False, skip_corrupt=True, cache=None)
    counts = []
    for _ in range(3):
        yielded = _count_examples(ds)
        counts.append(ds.chute.corrupt_count())
        assert yielded + counts[-1] == 24
    assert counts[0] > 0 and counts == [counts[0]] * 3  # not 1x, 2x, 3x


def test_every_input_pipeline_yields_as_many_batches(tmp_path_factory):
    """16 shards over 3 input pipelines: 6, 5 and 5 shards of unequal sizes. Training: the
    smallest share's steps everywhere. Evaluation with padding: the largest's, the others
    adding batches of weight 0. (A multi-host loop hangs when one host runs out first.)"""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("shares")
    src = make_folder(root / "src", {"a": 30, "b": 27, "c": 20})
    out = root / "out"
    chute.convert(src, out, min_shards=16, workers=1)
    manifest = chute.load_manifest(out)
    from chute.read.tf.plan import pipeline_sizes

    sizes = pipeline_sizes(manifest, "train", 3)
    assert len(set(sizes)) > 1  # the shares differ, or the test proves nothing

    def context(index):
        return tf.distribute.InputContext(
            num_input_pipelines=3, input_pipeline_id=index, num_replicas_in_sync=3
        )

    train = [chute.load(out, batch_size=4, input_context=context(i), seed=1) for i in range(3)]
    steps = min(size // 4 for size in sizes)
    assert [len(ds) for ds in train] == [steps] * 3
    assert [sum(1 for _ in ds) for ds in train] == [steps] * 3
    evaluation = [
        chute.load(out, batch_size=4, training=False, pad_final_batch=True,
                   input_context=context(i))
        for i in range(3)
    ]  # fmt: skip
    most = max(-(-size // 4) for size in sizes)
    assert [len(ds) for ds in evaluation] == [most] * 3
    for ds, size in zip(evaluation, sizes, strict=True):
        weights = np.concatenate([w.numpy() for _, _, w in ds])
        assert len(weights) == most * 4 and weights.sum() == size  # every example once


def test_the_memory_limit_is_the_containers_when_lower(tmp_path):
    from chute.machine import memory_limit, physical_memory

    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{1 << 30}\n")
    assert memory_limit((str(v2), str(v1))) == min(1 << 30, physical_memory())
    v2.write_text(f"{512 << 20}\n")
    assert memory_limit((str(v2),)) == 512 << 20
    assert memory_limit((str(tmp_path / "absent"),)) == physical_memory()


def test_cache_auto_shares_one_budget_in_the_process(data, monkeypatch, caplog):
    import gc

    from chute.read.tf import engine as load_lib

    out = data.out()
    size = 18 * HEIGHT * WIDTH * 3  # the train split, decoded
    monkeypatch.setattr(load_lib, "CACHE_BUDGET", load_lib.CacheBudget(size + size // 2))
    with caplog.at_level("INFO", logger="chute.read.tf.plan"):
        first = chute.load(out, batch_size=BATCH)
        second = chute.load(out, batch_size=BATCH)
    assert first.chute.cached_in == "memory" and second.chute.cached_in is None
    assert "kept in memory" in caplog.text and "read from the shards each epoch" in caplog.text
    assert load_lib.CACHE_BUDGET.used == size
    del first
    gc.collect()
    assert load_lib.CACHE_BUDGET.used == 0  # dropping the dataset gave its share back
    third = chute.load(out, batch_size=BATCH)  # and the next dataset takes it
    assert third.chute.cached_in == "memory"
    assert _multiset(_examples(third)) and load_lib.CACHE_BUDGET.used == size
    del third
    gc.collect()
    assert load_lib.CACHE_BUDGET.used == 0


def test_making_a_plan_reserves_nothing(data, monkeypatch):
    """make_plan is pure: what cache="auto" may take is an input, and the reservation is
    load's, given back when the dataset is gone."""
    from chute.read.tf import engine as load_lib
    from chute.read.tf import plan as plan_lib

    size = 18 * HEIGHT * WIDTH * 3
    budget = load_lib.CacheBudget(10 * size)
    monkeypatch.setattr(load_lib, "CACHE_BUDGET", budget)
    manifest = chute.load_manifest(data.out())
    options = chute.LoadOptions(batch_size=BATCH)
    fits = plan_lib.make_plan(manifest, "train", options, cache_room=size)
    assert (fits.cache, fits.cache_bytes) == ("", size) and budget.used == 0
    short = plan_lib.make_plan(manifest, "train", options, cache_room=size - 1)
    assert (short.cache, short.cache_bytes) == (None, 0)


def test_a_failed_build_gives_the_cache_reservation_back(data, monkeypatch):
    from chute.read.tf import engine as load_lib

    budget = load_lib.CacheBudget(1 << 30)
    monkeypatch.setattr(load_lib, "CACHE_BUDGET", budget)
    reserved = []
    real_reserve = budget.reserve

    def reserve(size):
        reserved.append(size)
        return real_reserve(size)

    def broken(*args, **kwargs):
        raise RuntimeError("build failed")

    monkeypatch.setattr(budget, "reserve", reserve)
    monkeypatch.setattr(load_lib, "build", broken)
    with pytest.raises(RuntimeError, match="build failed"):
        chute.load(data.out(), batch_size=BATCH)
    assert reserved == [18 * HEIGHT * WIDTH * 3]  # taken for the split, then given back
    assert budget.used == 0


def test_disk_caches_of_splits_and_versions_never_mix(data, tmp_path):
    folder = tmp_path / "cache"
    out = data.out()
    spec = f"disk:{folder}"
    train = chute.load(out, "train", batch_size=BATCH, training=False, cache=spec)
    val = chute.load(out, "val", batch_size=BATCH, training=False, cache=spec)
    for _ in range(2):  # the second epoch reads the cache files
        assert _multiset(_examples(train)) == _multiset(_expected(data.src, out, "train"))
        assert _multiset(_examples(val)) == _multiset(_expected(data.src, out, "val"))
    names = {p.name.split(".")[0] for p in folder.iterdir()}
    assert len(names) == 2 and {n.split("-")[0] for n in names} == {"train", "val"}
    other = data.out(min_shards=1)  # another conversion of the same images: other shards
    again = chute.load(other, "train", batch_size=BATCH, training=False, cache=spec)
    assert _multiset(_examples(again)) == _multiset(_expected(data.src, other, "train"))
    assert len({p.name.split(".")[0] for p in folder.iterdir()}) == 3
