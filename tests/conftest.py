"""Fixtures shared by the tests: tiny synthetic datasets made in temp dirs.

Helpers the tests call directly live in the plain module ``helpers``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from helpers import make_folder

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Keras reads KERAS_HOME once, when it is imported: tests get a cache folder of their own
# (seeded by the tests that need weights in it), never the user's ~/.keras.
os.environ["KERAS_HOME"] = tempfile.mkdtemp(prefix="chute-test-keras-")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three classes (a: 10, b: 8, c: 6 images), 12x10 grayscale PNGs."""
    return make_folder(tmp_path / "src", {"a": 10, "b": 8, "c": 6})


@pytest.fixture(scope="session")
def shared_dataset(tmp_path_factory) -> Path:
    """A converted dataset shared by read-only tests: 3 classes, train/val, raw 12x10."""
    import chute

    root = tmp_path_factory.mktemp("shared")
    src = make_folder(root / "src", {"a": 10, "b": 8, "c": 6})
    chute.convert(src, root / "out", val_fraction=0.25, min_shards=2, workers=1)
    return root / "out"
