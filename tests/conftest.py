"""Shared fixtures: tiny synthetic image folders made in temp dirs, and CLI runners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def write_image(
    path: Path,
    pixels: np.ndarray | None = None,
    *,
    size=(12, 10),
    mode="L",
    seed: int = 0,
    fmt: str | None = None,
    **save,
) -> Path:
    """Writes an image file (PNG unless the suffix says otherwise); returns its path.

    ``size`` is (height, width); random pixels unless ``pixels`` is given.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if pixels is None:
        rng = np.random.default_rng(seed)
        channels = {"L": (), "RGB": (3,), "RGBA": (4,)}.get(mode, ())
        pixels = rng.integers(0, 256, size=(*size, *channels), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if mode not in ("L", "RGB", "RGBA"):
        image = image.convert(mode)
    image.save(path, format=fmt, **save)
    return path


def make_folder(
    root: Path, classes: dict[str, int], *, size=(12, 10), mode="L", ext=".png", seed: int = 0
) -> Path:
    """``root/<class>/<i><ext>`` with distinct random images; returns ``root``."""
    for c, (name, count) in enumerate(sorted(classes.items())):
        for i in range(count):
            write_image(
                root / name / f"{i:03d}{ext}",
                size=size,
                mode=mode,
                seed=seed * 100003 + c * 1000 + i,
            )
    return root


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


def run_cli(
    *args: str, cwd: str | Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Runs ``python -m chute ARGS`` in a fresh process (exit codes, stderr, no traceback)."""
    return subprocess.run(
        [sys.executable, "-m", "chute", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def read_records(path: str | Path) -> list[dict]:
    """Every record of a shard, parsed with TensorFlow into plain Python values."""
    import tensorflow as tf

    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "class": tf.io.FixedLenFeature([], tf.int64),
        "size": tf.io.FixedLenFeature([2], tf.int64),
        "channels": tf.io.FixedLenFeature([], tf.int64),
        "encoding": tf.io.FixedLenFeature([], tf.string),
        "key": tf.io.FixedLenFeature([], tf.string),
    }
    out = []
    for raw in tf.data.TFRecordDataset(str(path)):
        example = tf.io.parse_single_example(raw, features)
        out.append(
            {
                "image": example["image"].numpy(),
                "class": int(example["class"]),
                "size": tuple(int(v) for v in example["size"].numpy()),
                "channels": int(example["channels"]),
                "encoding": example["encoding"].numpy().decode(),
                "key": example["key"].numpy().decode(),
            }
        )
    return out


def all_records(out: str | Path, split: str = "train") -> list[dict]:
    """Records of every shard of ``split`` in a converted directory, in shard order."""
    import chute

    manifest = chute.load_manifest(str(out))
    return [r for p in manifest.shard_paths(split) for r in read_records(p)]


def decode(record: dict) -> np.ndarray:
    """A record's pixels as (H, W, C) uint8, whatever its encoding."""
    import io

    if record["encoding"] == "raw":
        h, w = record["size"]
        return np.frombuffer(record["image"], np.uint8).reshape(h, w, record["channels"])
    image = np.asarray(Image.open(io.BytesIO(record["image"])))
    return image.reshape(*image.shape[:2], -1)


def tree_bytes(out: str | Path) -> dict[str, bytes]:
    """Every file under ``out`` (relative name -> bytes), to compare runs byte for byte."""
    out = Path(out)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
