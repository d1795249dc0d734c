"""Shared test helpers: tiny synthetic image folders, CLI runs, record readers.

A plain module (tests import it as ``helpers``); fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image


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


def convert_arrays(root: Path, count: int, classes: int, **options) -> Path:
    """``count`` random raw 8x8 grayscale images, ``classes`` classes in turn, saved as
    ``root/arrays.npz`` and converted (``options``: ``chute.convert``'s) to ``root/shards``."""
    import chute

    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (count, 8, 8, 1), dtype=np.uint8)
    np.savez(root / "arrays.npz", x=images, y=np.arange(count) % classes)
    chute.convert(root / "arrays.npz", root / "shards", **options)
    return root / "shards"


MIX_MARKS = {"a": 100, "b": 200, "c": 50}  # first pixel: the dataset's mark + the label
MIX_NAMES = {"a": ["cat", "dog", "eel"], "b": ["dog", "fox"], "c": ["ant", "cat"]}


def write_marked(root: Path, name: str, count: int, channels: int, labels=None) -> Path:
    """Dataset ``name`` of ``MIX_NAMES`` for mixing tests, converted into ``root/name``
    (val 0.25): ``count`` random 8x8 images whose first pixel is ``MIX_MARKS[name]`` plus
    the image's label (classes in turn, or ``labels``), so a batch says where each image
    came from."""
    import chute

    rng = np.random.default_rng(len(name) + MIX_MARKS[name])
    y = np.arange(count) % len(MIX_NAMES[name]) if labels is None else np.asarray(labels)
    x = rng.integers(0, 40, (count, 8, 8, channels), dtype=np.uint8)  # every image its own
    x[:, 0, 0, :] = (MIX_MARKS[name] + y)[:, None]
    np.savez(root / f"{name}.npz", x=x, y=y, class_names=np.array(MIX_NAMES[name]))
    chute.convert(root / f"{name}.npz", root / name, val_fraction=0.25, workers=1)
    return root / name


def write_banded(root: Path, per_class: int = 24, size: int = 16) -> None:
    """3 classes x ``per_class`` grayscale PNGs in ``root/a|b|c`` that a small CNN tells
    apart in a few epochs: a bright band whose row says the class."""
    rng = np.random.default_rng(0)
    for label, name in enumerate("abc"):
        for index in range(per_class):
            pixels = rng.integers(0, 80, (size, size), dtype=np.uint8)
            band = 5 * label
            pixels[band : band + 6, 2 : size - 2] = 255 - rng.integers(0, 60, (6, size - 4))
            write_image(root / name / f"{index:03d}.png", pixels)


def tf_example(features: dict) -> bytes:
    """``features`` (name -> list of bytes, floats or ints) serialised by TensorFlow."""
    import tensorflow as tf

    def feature(values):
        if isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    return tf.train.Example(
        features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
    ).SerializeToString(deterministic=True)


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


def jax_child_env(cache: Path, devices: int | None = None) -> dict[str, str]:
    """Environment variables for a JAX child process of the tests: ``devices`` CPU devices,
    and compiling fast. The children train tiny models for a few steps, so XLA's compiling
    is most of their time: LLVM's optimisations are off (about half the compile time;
    programs run slower, which these steps do not notice), and a program compiled once is
    kept in ``cache`` for a later run of the same one (a resumed run, another process)."""
    flags = ["--xla_backend_optimization_level=0"]
    if devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return {
        "XLA_FLAGS": " ".join(flags),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


FAST_TRAINING = dict(model="kannada-cnn", epochs=2, batch_size=8, strategy="cpu", verbose=0)
"""``chute.train``'s options for the smallest real run (the session's ``trained_run``)."""


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled, built once for the whole test run.

    Under pytest-xdist a session fixture is built once per worker; this builds it once
    for all of them: the first worker to ask builds it while the others wait on a lock
    file, then every worker reads the same finished folder (read it, never change it).
    Where there is no ``fcntl`` (Windows), each worker builds its own.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - POSIX test machines have it
        fcntl = None
    base = tmp_path_factory.getbasetemp()
    if fcntl is not None and os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def run_here(*args: str | Path) -> subprocess.CompletedProcess:
    """Runs ``chute ARGS`` in this process: ``cli.main``'s exit code, what it printed, and its
    log lines on stderr as the command shows them (``chute: ...``).

    Most CLI tests use this (no interpreter start-up, no second TensorFlow import); a few keep
    :func:`run_cli` to check what only a fresh process shows (no traceback, ``python -m``).
    """
    import contextlib
    import io
    import logging

    from chute import cli as cli_lib

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("chute: %(message)s"))
    root = logging.getLogger()
    quiet = "--quiet" in args or "-q" in args
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_lib.main([str(a) for a in args])
            except SystemExit as exit:  # argparse: --help, --version, usage errors
                code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 2)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


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

    from chute.format.records import parse_features

    features = parse_features()
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


class Killed(BaseException):
    """A simulated kill: not an Exception, so no ``except Exception`` in the code stops it."""


def dying_epoch_timer(training, die):
    """A stand-in for ``chute.fit.train._epoch_timer`` whose epoch end raises :class:`Killed`
    when ``die(epoch)`` is true (after the backup of that epoch: it runs last)."""
    real_timer = training._epoch_timer

    def make():
        timer = real_timer()
        original = timer.on_epoch_end

        def on_epoch_end(epoch, logs=None):
            original(epoch, logs)
            if die(epoch):
                raise Killed

        timer.on_epoch_end = on_epoch_end
        return timer

    return make


COLOURS = {"a": (220, 30, 30), "b": (30, 220, 30), "c": (30, 30, 220)}  # of colour_jpegs


def colour_jpegs(root: Path, per_class: int) -> Path:
    """A class-per-folder tree of 16x16 JPEGs, one flat colour per class (``a`` red, ``b``
    green, ``c`` blue), each file told apart by its first pixel: what the codelab reads."""
    for name, color in COLOURS.items():
        for i in range(per_class):
            pixels = np.full((16, 16, 3), color, np.uint8)
            pixels[0, 0] = (i * 40, i * 40, i * 40)  # distinct files
            write_image(root / name / f"{i}.jpg", pixels, quality=95)
    return root


def codelab_read_tfrecord(target_size: list[int]):
    """The "Keras on TPU" codelab's record reader, verbatim apart from the names: what a
    reader with no chute code does with a chute dataset's JPEG shards."""
    import tensorflow as tf

    def read_tfrecord(example):
        features = {
            "image": tf.io.FixedLenFeature([], tf.string),  # tf.string = bytestring
            "class": tf.io.FixedLenFeature([], tf.int64),  # shape [] means scalar
        }
        example = tf.io.parse_single_example(example, features)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.reshape(image, [*target_size, 3])
        class_label = example["class"]
        return image, class_label

    return read_tfrecord


MULTI_LABELS = ("red", "green", "blue", "stripes")


def write_multi_label_list(root: Path, count: int = 120, *, seed: int = 0) -> Path:
    """``root/list.csv`` (``path,labels,weight``) over ``count`` 16x16 RGB PNGs whose labels
    show: a bright channel per colour label, white rows for ``stripes``; about one in five
    carries no label (an empty cell: convert with ``allow_empty_labels=True``). Weights are
    1, 2, 3 in turn. Returns the list's path."""
    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = ["path,labels,weight"]
    for i in range(count):
        labels = [c for c in range(3) if rng.random() < 0.4]
        image = np.full((16, 16, 3), 30, np.int64)
        for c in labels:
            image[..., c] = 220
        if rng.random() < 0.25:
            image[::4] = 255
            labels.append(3)
        image += rng.integers(-10, 10, image.shape)
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(root / f"img/{i:03d}.png")
        names = "|".join(MULTI_LABELS[c] for c in labels)
        rows.append(f"img/{i:03d}.png,{names},{1 + i % 3}.0")
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    return root / "list.csv"


def kill_after(
    command: list[str],
    notes: Callable[[], int],
    finished: Callable[[], bool],
    seen: int,
    deadline_s: float = 120,
    poll_s: float = 0.002,
) -> int:
    """Starts ``command`` (a conversion's CLI) and kill -9s it once ``notes()`` (its
    finished shards) exceeds ``seen``; returns how many were done, 0 when it finished
    (``finished()``) before it could be killed."""
    import signal
    import time

    import pytest

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            done = notes()
            if done > seen:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return 0 if finished() else done
            if proc.poll() is not None:
                return 0
            time.sleep(poll_s)
        pytest.fail(f"no shard was finished within {deadline_s} s: {command}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return 0  # unreachable
