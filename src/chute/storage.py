"""Paths and file access that work the same locally and on TF filesystems.

Output (shards, manifests) always goes through ``tf.io.gfile``, so ``gs://``
and ``ram://`` paths work. Reading a local source file uses the builtin
``open`` (the hot loop of worker processes, which must not import
TensorFlow); a non-local one goes through ``tf.io.gfile`` there too.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor


def is_local(path: str) -> bool:
    """True for plain filesystem paths (and ``file://`` URLs)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """Strips ``file://`` from a local path."""
    return path[len("file://") :] if path.startswith("file://") else path


def join(base: str, *parts: str) -> str:
    """Joins path parts with ``/`` for URLs and ``os.path.join`` otherwise."""
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return posixpath.join(base, *parts)


def gfile():
    """``tf.io.gfile``, imported on first use (TensorFlow is slow to import)."""
    import tensorflow as tf

    return tf.io.gfile


def read_bytes(path: str) -> bytes:
    """Reads a whole file: builtin ``open`` for local paths, ``tf.io.gfile`` otherwise."""
    if is_local(path):
        with open(local_path(path), "rb", buffering=0) as handle:
            return handle.readall()
    with gfile().GFile(path, "rb") as handle:
        return handle.read()


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` under a temporary name, then renames it to ``path``."""
    fs = gfile()
    tmp = path + ".tmp"
    with fs.GFile(tmp, "wb") as handle:
        handle.write(data)
    fs.rename(tmp, path, overwrite=True)


def unreadable(paths: Sequence[str]) -> dict[str, str]:
    """Those of ``paths`` that exist but cannot be read (no permission, not a
    regular file), each with its error; missing ones are left out.

    Each is opened and its first byte read (remote ones in parallel, a small
    request each). TensorFlow's record reader, told to skip errors, would try
    to open such a file forever.

    Example:
        >>> unreadable(["/data/shards/train-00000-of-00002.tfrecord"])  # doctest: +SKIP
        {}
    """
    import tensorflow as tf

    def problem(path: str) -> str | None:
        try:
            with tf.io.gfile.GFile(path, "rb") as handle:
                handle.read(1)
        except (tf.errors.OpError, OSError) as error:
            if tf.io.gfile.exists(path):
                return getattr(error, "message", None) or str(error)
        return None

    if all(is_local(path) for path in paths):
        found = [problem(path) for path in paths]
    else:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(paths)))) as pool:
            found = list(pool.map(problem, paths))
    return {path: error for path, error in zip(paths, found, strict=True) if error is not None}
