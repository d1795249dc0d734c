"""The one storage layer: every file chute reads or writes goes through here.

Local paths (and ``file://`` URLs) use plain Python, so writing shards or a
manifest to a local folder never imports TensorFlow; ``gs://``, ``ram://``
and every other TensorFlow filesystem go through ``tf.io.gfile``. Callers
never ask which kind a path is, except to choose what to show.

Example:
    >>> write_atomic("ram://out/notes.txt", b"hello")  # doctest: +SKIP
    >>> read_bytes("ram://out/notes.txt")  # doctest: +SKIP
    b'hello'
"""

from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from chute.errors import ChuteError
from chute.lazy import tf


def is_local(path: str) -> bool:
    """True for plain filesystem paths (and ``file://`` URLs)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """``path`` without a ``file://`` prefix."""
    return path[len("file://") :] if path.startswith("file://") else path


def join(base: str, *parts: str) -> str:
    """Joins path parts: ``os.path.join`` locally, ``/`` for URLs."""
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return posixpath.join(base, *parts)


def basename(path: str) -> str:
    """The last part of ``path`` (either separator)."""
    return path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]


def dirname(path: str) -> str:
    """The folder holding ``path``: absolute for local paths."""
    if is_local(path):
        return os.path.dirname(os.path.abspath(local_path(path)))
    return posixpath.dirname(path.rstrip("/"))


def exists(path: str) -> bool:
    """Whether ``path`` exists."""
    return os.path.exists(local_path(path)) if is_local(path) else tf.io.gfile.exists(path)


def isdir(path: str) -> bool:
    """Whether ``path`` is a folder."""
    return os.path.isdir(local_path(path)) if is_local(path) else tf.io.gfile.isdir(path)


def listdir(path: str) -> list[str]:
    """Names in folder ``path``, sorted (no trailing ``/`` on folders)."""
    names = os.listdir(local_path(path)) if is_local(path) else tf.io.gfile.listdir(path)
    return sorted(name.rstrip("/") for name in names)


def makedirs(path: str) -> None:
    """Creates folder ``path`` and its parents; nothing if it exists."""
    if is_local(path):
        os.makedirs(local_path(path), exist_ok=True)
    else:
        tf.io.gfile.makedirs(path)


def remove(path: str) -> None:
    """Deletes file ``path``."""
    if is_local(path):
        os.remove(local_path(path))
    else:
        tf.io.gfile.remove(path)


def rmtree(path: str) -> None:
    """Deletes folder ``path`` and everything in it."""
    if is_local(path):
        shutil.rmtree(local_path(path))
    else:
        tf.io.gfile.rmtree(path)


def remove_if_exists(path: str) -> None:
    """Deletes a file or folder if it is there."""
    if isdir(path):
        rmtree(path)
    elif exists(path):
        remove(path)


def rename(source: str, target: str) -> None:
    """Moves ``source`` to ``target``, replacing it (atomic on one local filesystem)."""
    if is_local(source):
        os.replace(local_path(source), local_path(target))
    else:
        tf.io.gfile.rename(source, target, overwrite=True)


def copy(source: str, target: str) -> None:
    """Copies file ``source`` to ``target``, replacing it."""
    if is_local(source) and is_local(target):
        shutil.copyfile(local_path(source), local_path(target))
    else:
        tf.io.gfile.copy(source, target, overwrite=True)


def size(path: str) -> int:
    """The size of file ``path`` in bytes."""
    return os.path.getsize(local_path(path)) if is_local(path) else tf.io.gfile.stat(path).length


def open_file(path: str, mode: str = "rb") -> IO[Any]:
    """A binary file object: the builtin ``open`` locally, ``tf.io.gfile.GFile`` otherwise."""
    if is_local(path):
        return open(local_path(path), mode)
    return tf.io.gfile.GFile(path, mode)


def read_bytes(path: str) -> bytes:
    """The whole content of file ``path``."""
    if is_local(path):
        with open(local_path(path), "rb", buffering=0) as handle:
            return handle.readall()
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read()


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` under a temporary name, then renames it to ``path``.

    A reader sees the old file or the whole new one, never a part; locally the
    data reach the disk (fsync) before the rename.
    """
    tmp = path + ".tmp"
    with open_file(tmp, "wb") as handle:
        handle.write(data)
        sync(handle)
    rename(tmp, path)


def sync(handle: IO[Any]) -> None:
    """Flushes a local file's data to the disk (remote filesystems commit on close)."""
    if hasattr(handle, "fileno"):
        handle.flush()
        os.fsync(handle.fileno())


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` for a remote folder (``tf.io.gfile.walk``); local walks stay with callers,
    who decide how to follow symlinks."""
    yield from tf.io.gfile.walk(top)


def glob(pattern: str) -> list[str]:
    """Paths matching ``pattern``, sorted."""
    if is_local(pattern):
        import glob as glob_lib

        return sorted(glob_lib.glob(local_path(pattern), recursive=True))
    return sorted(tf.io.gfile.glob(pattern))


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

    def problem(path: str) -> str | None:
        try:
            with open_file(path, "rb") as handle:
                handle.read(1)
        except Exception as error:  # OSError locally, tf.errors.OpError remotely
            if exists(path):
                return getattr(error, "message", None) or str(error)
        return None

    if all(is_local(path) for path in paths):
        found = [problem(path) for path in paths]
    else:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(paths)))) as pool:
            found = list(pool.map(problem, paths))
    return {path: error for path, error in zip(paths, found, strict=True) if error is not None}


def check_output(path: str, name: str) -> bool:
    """Whether output folder ``path`` exists (and is a folder: a file there is an error
    naming argument ``name``)."""
    if not exists(path):
        return False
    if not isdir(path):
        raise ChuteError(f"`{name}` exists and is not a folder. Received: {name}={path!r}")
    return True


def replace_or_refuse(
    path: str, name: str, *, holds: str, overwrite: bool, entries: Sequence[str]
) -> None:
    """The one rule for an output folder that already holds a result of chute's (``holds``
    says what): refused unless ``overwrite``, and then only chute's own ``entries``
    (names in ``path``) are deleted, whatever else the folder holds."""
    if not overwrite:
        raise ChuteError(
            f"`{name}` {path!r} holds {holds}. Pass overwrite=True (--overwrite) to replace "
            "it, or choose another folder"
        )
    for entry in entries:
        remove_if_exists(join(path, entry))
