"""Fixtures shared by the tests: tiny synthetic datasets made in temp dirs.

Helpers the tests call directly live in the plain module ``helpers``.
"""

from __future__ import annotations

import collections
import os
import pickle
import tempfile
from pathlib import Path

import pytest
from helpers import (
    FAST_TRAINING,
    convert_arrays,
    make_folder,
    once_per_run,
    write_marked,
    write_multi_label_list,
)

# Object-store servers on 127.0.0.1 (s3_endpoint, gcs_endpoint): tests/object_stores.py
pytest_plugins = ("object_stores",)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Keras reads KERAS_HOME once, when it is imported: tests get a cache folder of their own
# (seeded by the tests that need weights in it), never the user's ~/.keras.
os.environ["KERAS_HOME"] = tempfile.mkdtemp(prefix="chute-test-keras-")
# The shard cache of data in a bucket defaults to $XDG_CACHE_HOME/chute/shards: never the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="chute-test-cache-")


def pytest_collection_modifyitems(config, items) -> None:
    """Modules with the most slow tests first, each module's tests in their order.

    pytest-xdist hands out whole modules (``--dist loadfile``) in this order
    (``--no-loadscope-reorder``): the long multi-process runs start at once, on different
    workers, rather than one of them ending the run on one worker while the other idles.
    """
    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    first: dict = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
    items.sort(key=lambda item: (-slow[item.path], first[item.path]))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three classes (a: 10, b: 8, c: 6 images), 12x10 grayscale PNGs."""
    return make_folder(tmp_path / "src", {"a": 10, "b": 8, "c": 6})


# The session fixtures below are built once for the whole run (every pytest-xdist worker
# reads the same folder, see helpers.once_per_run): tests only read them; one that needs to
# change them copies them into its tmp_path first.


@pytest.fixture(scope="session")
def shared_dataset(tmp_path_factory) -> Path:
    """A converted dataset shared by read-only tests: 3 classes, train/val, raw 12x10."""

    def build(root: Path) -> None:
        import chute

        src = make_folder(root / "src", {"a": 10, "b": 8, "c": 6})
        chute.convert(src, root / "out", val_fraction=0.25, min_shards=2, workers=1)

    return once_per_run(tmp_path_factory, "shared", build) / "out"


@pytest.fixture(scope="session")
def many_shards(tmp_path_factory) -> Path:
    """A split of more shards than a low ``RLIMIT_NOFILE`` allows open: 4 classes x 60
    raw 8x8 grayscale images from arrays, train 192 in 96 shards of 2, val 48 in 48."""

    def build(root: Path) -> None:
        convert_arrays(root, 240, 4, val_fraction=0.2, min_shards=96)

    return once_per_run(tmp_path_factory, "many-shards", build) / "shards"


@pytest.fixture(scope="session")
def train_data(tmp_path_factory) -> Path:
    """Converted data to train on: 3 classes x 16 random grayscale 16x16 PNGs at
    ``image_size=16``, ``val_fraction=0.25``: train 36, val 12, one raw shard each. Its
    source images are ``manifest.source["location"]``."""

    def build(root: Path) -> None:
        import chute

        src = make_folder(root / "src", {"a": 16, "b": 16, "c": 16}, size=(16, 16))
        chute.convert(src, root / "shards", image_size=16, val_fraction=0.25, workers=1)

    return once_per_run(tmp_path_factory, "train-data", build) / "shards"


@pytest.fixture(scope="session")
def multi_label_data(tmp_path_factory) -> Path:
    """A converted multi-label dataset with sample weights, for read-only tests: 120
    16x16 RGB PNGs labelled from ``helpers.MULTI_LABELS`` (about one in five a negative),
    val_fraction 0.2 (train 96, val 24), from ``helpers.write_multi_label_list``."""

    def build(root: Path) -> None:
        import chute

        listed = write_multi_label_list(root / "src")
        chute.convert(
            listed,
            root / "out",
            val_fraction=0.2,
            allow_empty_labels=True,
            weight_column="weight",
            workers=1,
        )

    return once_per_run(tmp_path_factory, "multi-label", build) / "out"


@pytest.fixture(scope="session")
def mixable(tmp_path_factory) -> dict[str, Path]:
    """Three small datasets to mix (``helpers.write_marked``): ``a`` grayscale (3 classes,
    120 images), ``b`` colour (2 classes, 48), ``c`` grayscale with one class much larger
    (48 and 8 images)."""

    def build(root: Path) -> None:
        write_marked(root, "a", 120, 1)
        write_marked(root, "b", 48, 3)
        write_marked(root, "c", 56, 1, labels=[0] * 48 + [1] * 8)

    root = once_per_run(tmp_path_factory, "mixable", build)
    return {name: root / name for name in ("a", "b", "c")}


@pytest.fixture(scope="session")
def trained_run(train_data, tmp_path_factory):
    """``(run_dir, TrainResult)`` of a finished ``chute.train(train_data, run_dir,
    **helpers.FAST_TRAINING)`` (2 epochs), for tests that need a trained run and only
    read it: the result is the one ``train`` returned, pickled beside the run."""

    def build(root: Path) -> None:
        import chute

        result = chute.train(train_data, root / "run", **FAST_TRAINING)
        (root / "result.pickle").write_bytes(pickle.dumps(result))

    root = once_per_run(tmp_path_factory, "trained-run", build)
    return root / "run", pickle.loads((root / "result.pickle").read_bytes())
