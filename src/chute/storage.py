"""Paths and file access that work the same locally and on TF filesystems.

Output (shards, manifests) always goes through ``tf.io.gfile``, so ``gs://``
and ``ram://`` paths work. Reading a local source file uses the builtin
``open`` (the hot loop of worker processes, which must not import
TensorFlow); a non-local one goes through ``tf.io.gfile`` there too.
"""

from __future__ import annotations

import os
import posixpath


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
