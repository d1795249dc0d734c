"""chute.image_dataset_from_directory against keras.utils.image_dataset_from_directory.

Both read the same tiny folders; with ``shuffle=False`` every batch must be
identical (pixels, labels, order), and both must reject the same misuse with
the same exception type.
"""

from __future__ import annotations

import collections
import inspect
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import make_folder, write_image

import chute
from chute.read import dropin

SIZES = [(12, 10), (9, 16), (20, 14), (10, 10)]  # mixed sizes and aspect ratios
SMALL = (8, 8)


def _mixed_folder(root: Path) -> Path:
    """3 classes (cats 5, dogs 4, fish 3) of RGB PNGs of mixed sizes, plus a JPEG, a
    grayscale PNG, a file in a nested folder and a non-image file that must be ignored."""
    counts = {"cats": 5, "dogs": 4, "fish": 3}
    for c, (name, count) in enumerate(counts.items()):
        for i in range(count):
            size = SIZES[(c + i) % len(SIZES)]
            write_image(root / name / f"{i:03d}.png", size=size, mode="RGB", seed=10 * c + i)
    write_image(root / "cats" / "grey.png", size=(11, 13), mode="L", seed=99)
    write_image(root / "dogs" / "photo.jpg", size=(14, 12), mode="RGB", seed=98, quality=90)
    write_image(root / "fish" / "deep" / "nested.png", size=(9, 9), mode="RGB", seed=97)
    (root / "fish" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return _mixed_folder(tmp_path_factory.mktemp("mixed") / "images")


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("binary") / "images"
    return make_folder(root, {"no": 4, "yes": 5}, size=(9, 7), mode="RGB", seed=3)


NUM_MIXED = 5 + 4 + 3 + 3  # images of the mixed folder


def _both(directory, **kwargs):
    kwargs.setdefault("verbose", False)
    ours = chute.image_dataset_from_directory(directory, **kwargs)
    theirs = keras.utils.image_dataset_from_directory(directory, **kwargs)
    return ours, theirs


def _elements(ds) -> list[tuple[np.ndarray, ...]]:
    out = []
    for element in ds:
        parts = element if isinstance(element, tuple) else (element,)
        out.append(tuple(np.asarray(p) for p in parts))
    return out


def _assert_same(ours, theirs) -> None:
    """Same element spec and identical elements, in the same order."""
    assert ours.element_spec == theirs.element_spec
    a, b = _elements(ours), _elements(theirs)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)


def _contents(ds) -> collections.Counter:
    """Multiset of (image bytes, label bytes) over all examples of a batched dataset."""
    counter = collections.Counter()
    for images, labels in ds:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            counter[(image.tobytes(), np.asarray(label).tobytes())] += 1
    return counter


def _ordered(ds) -> list[tuple[bytes, bytes]]:
    return [
        (image.tobytes(), np.asarray(label).tobytes())
        for images, labels in ds
        for image, label in zip(images.numpy(), labels.numpy(), strict=True)
    ]


# -- same results -------------------------------------------------------------------------------


def test_same_class_names_file_paths_order_and_pixels(mixed):
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=4, shuffle=False)
    assert ours.class_names == theirs.class_names == ["cats", "dogs", "fish"]
    assert ours.file_paths == theirs.file_paths
    assert len(ours.file_paths) == NUM_MIXED
    assert not any(p.endswith(".txt") for p in ours.file_paths)
    _assert_same(ours, theirs)
    assert sum(x.shape[0] for x, _ in _elements(ours)) == NUM_MIXED


@pytest.mark.parametrize(
    "options",
    [
        {"color_mode": "rgb"},
        {"color_mode": "grayscale"},
        {"image_size": (5, 9)},
        {"image_size": 6},
        {"image_size": (7, 11), "crop_to_aspect_ratio": True},
        {"image_size": (7, 11), "pad_to_aspect_ratio": True},
        {"interpolation": "nearest"},
        {"interpolation": "area"},
        {"interpolation": "bicubic"},
        {"interpolation": "BILINEAR"},
        {"label_mode": "int"},
        {"label_mode": "categorical"},
        {"label_mode": None},
        {"labels": None},
        {"batch_size": None},
        {"batch_size": 5},
        {"batch_size": 64},
        {"data_format": "channels_first"},
        {"data_format": "channels_first", "crop_to_aspect_ratio": True, "image_size": (5, 7)},
        {"data_format": "channels_first", "pad_to_aspect_ratio": True, "image_size": (5, 7)},
        {"class_names": ["fish", "cats", "dogs"]},
        {"class_names": ["dogs", "fish"]},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_same_batches_as_keras(mixed, options):
    kwargs = {"image_size": SMALL, "batch_size": 4, "shuffle": False, **options}
    ours, theirs = _both(mixed, **kwargs)
    assert ours.class_names == theirs.class_names
    assert ours.file_paths == theirs.file_paths
    _assert_same(ours, theirs)


def test_channels_first_shape(mixed):
    ours, theirs = _both(
        mixed, image_size=(5, 7), batch_size=4, shuffle=False, data_format="channels_first"
    )
    images, _ = next(iter(ours))
    assert images.shape == (4, 3, 5, 7)
    assert tuple(ours.element_spec[0].shape) == (None, 3, 5, 7)
    _assert_same(ours, theirs)


def test_batch_size_none_yields_single_images(mixed):
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=None, shuffle=False)
    image, label = next(iter(ours))
    assert image.shape == (*SMALL, 3) and label.shape == ()
    assert len(_elements(ours)) == NUM_MIXED
    _assert_same(ours, theirs)


def test_images_only_when_labels_none(mixed):
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=4, shuffle=False, labels=None)
    assert not isinstance(ours.element_spec, tuple)
    _assert_same(ours, theirs)


def test_rgba(two_classes):
    # (not on the mixed folder: a JPEG cannot be decoded to 4 channels, by Keras either)
    ours, theirs = _both(
        two_classes, image_size=SMALL, batch_size=4, shuffle=False, color_mode="rgba"
    )
    assert tuple(ours.element_spec[0].shape) == (None, *SMALL, 4)
    _assert_same(ours, theirs)


def test_binary_labels(two_classes):
    ours, theirs = _both(
        two_classes, image_size=SMALL, batch_size=4, shuffle=False, label_mode="binary"
    )
    assert tuple(ours.element_spec[1].shape) == (None, 1)
    _assert_same(ours, theirs)


def test_explicit_labels_list(mixed):
    labels = [(3 * i) % 4 for i in range(NUM_MIXED)]  # files in alphanumeric order
    for label_mode in ("int", "categorical"):
        ours, theirs = _both(
            mixed,
            labels=labels,
            label_mode=label_mode,
            image_size=SMALL,
            batch_size=4,
            shuffle=False,
        )
        assert ours.class_names == theirs.class_names
        assert ours.file_paths == theirs.file_paths
        _assert_same(ours, theirs)
    got = np.concatenate([y for _, y in _elements(ours)]).argmax(axis=1)
    assert got.tolist() == labels


@pytest.mark.parametrize("subset", ["training", "validation"])
def test_validation_split_subsets(mixed, subset):
    kwargs = {"image_size": SMALL, "batch_size": 4, "validation_split": 0.3, "subset": subset}
    ours, theirs = _both(mixed, shuffle=True, seed=7, **kwargs)
    assert ours.class_names == theirs.class_names
    assert ours.file_paths == theirs.file_paths
    assert len(ours.file_paths) == {"training": 11, "validation": 4}[subset]
    assert _contents(ours) == _contents(theirs)
    # without shuffling the order is fixed and must match, too
    ours, theirs = _both(mixed, shuffle=False, **kwargs)
    assert ours.file_paths == theirs.file_paths
    _assert_same(ours, theirs)


def test_validation_split_both(mixed):
    ours, theirs = _both(
        mixed, image_size=SMALL, batch_size=4, validation_split=0.3, subset="both", seed=7
    )
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs, strict=True):
        assert a.class_names == b.class_names == ["cats", "dogs", "fish"]
        assert a.file_paths == b.file_paths
        assert _contents(a) == _contents(b)
    assert not set(ours[0].file_paths) & set(ours[1].file_paths)
    assert len(ours[0].file_paths) + len(ours[1].file_paths) == NUM_MIXED
    # the validation part is never shuffled: the same order as Keras's
    _assert_same(ours[1], theirs[1])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [4, None])
def test_images_decoded_in_groups_keep_order_and_pixels(mixed, monkeypatch, shuffle, batch_size):
    # Groups of 4 over 15 files: three full groups and a partial one.
    monkeypatch.setattr(dropin, "_GROUP", 4)
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=batch_size, shuffle=shuffle, seed=3)
    if shuffle:
        assert _contents(ours.batch(4) if batch_size is None else ours) == _contents(
            theirs.batch(4) if batch_size is None else theirs
        )
    else:
        _assert_same(ours, theirs)


def test_groups_shrink_on_many_cores_to_bound_the_images_in_flight():
    assert dropin._group_size(2) == dropin._GROUP == 32
    assert dropin._group_size(64) == 8
    assert dropin._group_size(4096) == 1
    assert all(n * dropin._group_size(n) <= 512 for n in (16, 17, 64, 100, 512))


def test_one_image_per_group_gives_the_same_batches(mixed, monkeypatch):
    monkeypatch.setattr(dropin, "available_cores", lambda: 4096)  # groups of one
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=4, shuffle=False)
    _assert_same(ours, theirs)


def test_shuffle_with_seed_gives_kerass_order(mixed):
    for seed in (3, 4):
        ours, theirs = _both(mixed, image_size=SMALL, batch_size=4, shuffle=True, seed=seed)
        assert ours.file_paths == theirs.file_paths
        _assert_same(ours, theirs)  # batches equal, in the same order
    # epoch after epoch: shuffled anew, as Keras's is, and the same way
    ours_epochs = [_ordered(ours) for _ in range(2)]
    theirs_epochs = [_ordered(theirs) for _ in range(2)]
    assert ours_epochs == theirs_epochs and ours_epochs[0] != ours_epochs[1]


def test_shuffle_with_seed_gives_the_same_files_and_contents(mixed):
    ours, theirs = _both(mixed, image_size=SMALL, batch_size=4, shuffle=True, seed=3)
    assert ours.file_paths == theirs.file_paths
    assert _contents(ours) == _contents(theirs)
    assert len(_ordered(ours)) == NUM_MIXED


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"batch_size": None},
        {"batch_size": 5},
        {"batch_size": 64},
        {"shuffle": False},
        {"labels": None},
        {"label_mode": "categorical"},
        {"validation_split": 0.3, "subset": "training", "seed": 1},
        {"validation_split": 0.3, "subset": "validation", "seed": 1},
        {"validation_split": 0.3, "subset": "both", "seed": 1},
        {"validation_split": 0.3, "subset": "both", "seed": 1, "batch_size": None},
        {"validation_split": 0.2, "subset": "both", "seed": 1, "shuffle": False},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "defaults",
)
@pytest.mark.parametrize("cache", [None, "memory"])
def test_len_is_kerass_number_of_batches(mixed, options, cache):
    """``len()`` works as on Keras's dataset (``len(train)`` in a training loop, ``fit``'s
    progress bar): the number of batches, or of images with ``batch_size=None``."""
    kwargs = {"image_size": SMALL, "batch_size": 4, "verbose": False, **options}
    ours = chute.image_dataset_from_directory(mixed, cache=cache, **kwargs)
    theirs = keras.utils.image_dataset_from_directory(mixed, **kwargs)
    ours, theirs = (x if isinstance(x, list) else [x] for x in (ours, theirs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert len(a) == len(b) == len(list(b)) == len(list(a)) > 0


def test_len_with_drop_remainder_counts_full_batches_only(mixed):
    kwargs = {"image_size": SMALL, "batch_size": 4, "verbose": False}
    for options in ({}, {"validation_split": 0.3, "subset": "training", "seed": 1}):
        ours = chute.image_dataset_from_directory(mixed, drop_remainder=True, **kwargs, **options)
        assert len(ours) == len(ours.file_paths) // 4 == len(list(ours))


def test_verbose_prints_what_keras_prints(mixed, capsys):
    chute.image_dataset_from_directory(mixed, image_size=SMALL, verbose=True)
    ours = capsys.readouterr().out
    keras.utils.image_dataset_from_directory(mixed, image_size=SMALL, verbose=True)
    theirs = capsys.readouterr().out
    assert ours == theirs
    assert f"Found {NUM_MIXED} files" in ours


def test_accepts_every_keras_argument_with_the_same_default():
    ours = inspect.signature(chute.image_dataset_from_directory).parameters
    theirs = inspect.signature(keras.utils.image_dataset_from_directory).parameters
    missing = [name for name in theirs if name not in ours]
    assert not missing, f"Keras arguments chute does not accept: {missing}"
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name


# -- same errors ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("empty") / "images"
    (root / "nothing").mkdir(parents=True)
    return root


@pytest.mark.parametrize(
    ("kwargs", "mention"),
    [
        ({"color_mode": "cmyk"}, "color_mode"),
        ({"label_mode": "sparse"}, "label_mode"),
        ({"interpolation": "cubic"}, "interpolation"),
        ({"crop_to_aspect_ratio": True, "pad_to_aspect_ratio": True}, "crop_to_aspect_ratio"),
        ({"labels": "folders"}, "labels"),
        ({"labels": [0] * NUM_MIXED, "class_names": ["x"]}, "class_names"),
        ({"labels": [0, 1]}, "labels"),
        ({"validation_split": 0.2}, "subset"),
        ({"validation_split": 0.2, "subset": "training"}, "seed"),
        ({"validation_split": 1.5, "subset": "training", "seed": 1}, "validation_split"),
        ({"validation_split": 0.2, "subset": "test", "seed": 1}, "subset"),
        ({"label_mode": "binary"}, "binary"),
        ({"image_size": (1, 2, 3)}, "image_size"),
        ({"class_names": ["cats", "cows"]}, "class_names"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else "-".join(map(str, v)),
)
def test_same_error_for_the_same_misuse(mixed, kwargs, mention):
    kwargs = {"image_size": SMALL, "verbose": False, **kwargs}
    with pytest.raises(ValueError) as theirs:
        keras.utils.image_dataset_from_directory(mixed, **kwargs)
    with pytest.raises(ValueError) as ours:
        chute.image_dataset_from_directory(mixed, **kwargs)
    assert type(ours.value) is type(theirs.value)
    assert mention in str(theirs.value)
    assert mention in str(ours.value)


def test_same_error_for_an_empty_directory(empty):
    with pytest.raises(ValueError, match="No images found") as theirs:
        keras.utils.image_dataset_from_directory(empty, verbose=False)
    with pytest.raises(ValueError, match="No images found") as ours:
        chute.image_dataset_from_directory(empty, verbose=False)
    assert type(ours.value) is type(theirs.value)


# -- extras ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_skip_corrupt_skips_a_bad_file(mixed, tmp_path, damage):
    import tensorflow as tf

    clean = tmp_path / "clean"
    shutil.copytree(mixed, clean)
    bad = tmp_path / "bad"
    shutil.copytree(mixed, bad)
    victim = bad / "dogs" / "001.png"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"garbage" * 20)
    (clean / "dogs" / "001.png").unlink()

    kwargs = {"image_size": SMALL, "batch_size": 4, "shuffle": False, "verbose": False}
    with pytest.raises(tf.errors.InvalidArgumentError):
        _elements(keras.utils.image_dataset_from_directory(bad, **kwargs))
    with pytest.raises(tf.errors.InvalidArgumentError):
        _elements(chute.image_dataset_from_directory(bad, **kwargs))

    skipping = chute.image_dataset_from_directory(bad, skip_corrupt=True, **kwargs)
    reference = keras.utils.image_dataset_from_directory(clean, **kwargs)
    assert skipping.class_names == reference.class_names
    got, want = _ordered(skipping), _ordered(reference)
    assert len(got) == NUM_MIXED - 1
    # no len(): the count the file list gives would be one too many
    assert int(skipping.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    assert got == want  # labels stay with their images


def test_drop_remainder_gives_static_shapes_and_drops_the_tail(mixed):
    kwargs = {"image_size": SMALL, "batch_size": 4, "shuffle": False, "verbose": False}
    ours = chute.image_dataset_from_directory(mixed, drop_remainder=True, **kwargs)
    theirs = keras.utils.image_dataset_from_directory(mixed, **kwargs)
    assert tuple(ours.element_spec[0].shape) == (4, *SMALL, 3)
    assert tuple(ours.element_spec[1].shape) == (4,)
    a, b = _elements(ours), _elements(theirs)
    assert len(a) == NUM_MIXED // 4 == len(b) - 1
    for x, y in zip(a, b[:-1], strict=True):
        np.testing.assert_array_equal(x[0], y[0])
        np.testing.assert_array_equal(x[1], y[1])


def test_default_keeps_the_final_partial_batch(mixed):
    ds = chute.image_dataset_from_directory(
        mixed, image_size=SMALL, batch_size=4, shuffle=False, verbose=False
    )
    assert [x.shape[0] for x, _ in _elements(ds)] == [4, 4, 4, 3]


def test_cache_memory_gives_the_same_content_every_epoch(mixed):
    kwargs = {"image_size": SMALL, "batch_size": 4, "verbose": False}
    unshuffled = chute.image_dataset_from_directory(mixed, shuffle=False, cache="memory", **kwargs)
    first = _elements(unshuffled)
    for x, y in zip(first, _elements(unshuffled), strict=True):
        np.testing.assert_array_equal(x[0], y[0])
        np.testing.assert_array_equal(x[1], y[1])
    _assert_same(
        unshuffled, keras.utils.image_dataset_from_directory(mixed, shuffle=False, **kwargs)
    )

    shuffled = chute.image_dataset_from_directory(
        mixed, shuffle=True, seed=5, cache="memory", **kwargs
    )
    assert _contents(shuffled) == _contents(shuffled) == _contents(unshuffled)


def test_cache_memory_still_reshuffles_every_epoch(mixed):
    """Keras reshuffles every epoch; caching decoded images must not freeze the order."""
    kwargs = {"image_size": SMALL, "batch_size": 4, "verbose": False, "shuffle": True, "seed": 5}
    theirs = keras.utils.image_dataset_from_directory(mixed, **kwargs)
    assert _ordered(theirs) != _ordered(theirs)
    ours = chute.image_dataset_from_directory(mixed, cache="memory", **kwargs)
    first, second = _ordered(ours), _ordered(ours)
    assert sorted(first) == sorted(second)
    assert first != second


def test_cache_to_a_file(mixed, tmp_path):
    kwargs = {"image_size": SMALL, "batch_size": 4, "shuffle": False, "verbose": False}
    ours = chute.image_dataset_from_directory(mixed, cache=str(tmp_path / "cache"), **kwargs)
    theirs = keras.utils.image_dataset_from_directory(mixed, **kwargs)
    _assert_same(ours, theirs)
    assert any(p.name.startswith("cache") for p in tmp_path.iterdir())
    _assert_same(ours, theirs)  # second epoch from the file
