"""The one storage layer: every file chute reads or writes goes through here.

Local paths (and ``file://`` URLs) use plain Python, so writing shards or a
manifest to a local folder never imports TensorFlow. ``s3://``, ``gs://``,
``az://`` and every other URL fsspec knows (``memory://``, ...) go through fsspec
(:mod:`chute.format.remote`: one filesystem per scheme, a store's refusals as one
ChuteError), also without TensorFlow. TensorFlow's own filesystems (``ram://``,
and ``gs://`` when gcsfs is missing and TensorFlow is installed) go through
``tf.io.gfile``. Callers never ask which kind a path is, except to choose what to show.

Example:
    >>> write_atomic("ram://out/notes.txt", b"hello")  # doctest: +SKIP
    >>> read_bytes("ram://out/notes.txt")  # doctest: +SKIP
    b'hello'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from chute.errors import ChuteError
from chute.format import remote
from chute.format.redaction import (  # noqa: F401 (re-exported: the storage layer's word)
    LOG_FILTER,
    redact,
    redact_error,
    redact_text,
    redacting_errors,
)
from chute.lazy import tf

_COPY_BLOCK = 8 << 20  # a file copied between two kinds of storage goes through in these
_READ_AHEAD = 1 << 20  # what an fsspec file opened for reading fetches past each read


def is_local(path: str) -> bool:
    """True for plain filesystem paths (and ``file://`` URLs)."""
    return "://" not in path or path.startswith("file://")


def _fsspec(path: str) -> bool:
    return not is_local(path) and remote.handles(path)


def tensorflow_opens(path: str) -> bool:
    """Whether TensorFlow's own file functions (tf.data's readers) can open ``path``:
    local paths and TensorFlow's filesystems (``gs://`` while TensorFlow is installed,
    even when chute itself reaches it through gcsfs), not the ones only fsspec reaches
    (``s3://``, ``az://``)."""
    return is_local(path) or remote.tensorflow_knows(path) or not remote.handles(path)


def local_path(path: str) -> str:
    """``path`` without a ``file://`` prefix."""
    return path[len("file://") :] if path.startswith("file://") else path


# A bucket or TensorFlow URL whose "//" went missing is a local path to Python ("s3:/b/x"
# would make a folder "s3:"); these schemes are never the start of a sensible local name.
_SLASHES_MISSING = re.compile(r"(s3a?|gs|gcs|az|abfss?|ram|memory|file|https?):(?!//)", re.I)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def check_location(path: str | os.PathLike, name: str) -> str:
    """``path`` as a string, once it names a place: a local path, or a URL with its
    scheme and, in a bucket, the bucket (``s3://BUCKET/...``), elsewhere a path after
    ``SCHEME://``. Called where a location enters chute, before anything is read or
    written (``s3://`` alone would otherwise become a local folder ``s3:``).

    Raises:
        ChuteError: naming argument ``name`` and the value received (redacted).

    Example:
        >>> check_location("gs://my-bucket/shards", "output")
        'gs://my-bucket/shards'
    """
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if not isinstance(text, str) or not text.strip():
        raise ChuteError(f"`{name}` must be a path or a URL. Received: {name}={path!r}")
    shown = f"Received: {name}={redact(text)!r}"
    if "://" not in text:
        missing = _SLASHES_MISSING.match(text)
        if missing:
            scheme = missing.group(1).lower()
            raise ChuteError(
                f"`{name}` reads as a URL without its '//' (a local folder {scheme + ':'!r} "
                f"would be made). {shown}; write {scheme}://..."
            )
        return text
    scheme, rest = text.split("://", 1)
    if not _SCHEME.fullmatch(scheme):
        raise ChuteError(f"`{name}` must be a local path or a URL (SCHEME://...). {shown}")
    if remote.object_store(text):
        # abfs://container@account.dfs.core.windows.net/...: the container names the place
        bucket = rest.split("/", 1)[0].split("@", 1)[0]
        if not bucket:
            word = "container" if scheme.lower() in ("az", "abfs", "abfss") else "bucket"
            raise ChuteError(
                f"`{name}` must name a {word}: {scheme}://{word.upper()}/PATH. {shown}"
            )
    # a user and password alone ("http://u:pw@") name no place either
    elif not re.sub(r"^[^/?#]*@", "", rest).strip("/"):
        raise ChuteError(f"`{name}` must name a path after '{scheme}://'. {shown}")
    return text


def check_locations(**named: Any) -> None:
    """:func:`check_location` for each keyword argument that is a path, or a list or
    tuple of paths (a loaded object or None is someone else's to check)."""
    for name, value in named.items():
        for path in value if isinstance(value, list | tuple) else [value]:
            if isinstance(path, str | os.PathLike):
                check_location(path, name)


def same_or_inside(path: str, folder: str) -> bool:
    """Whether ``path`` is folder ``folder`` or lies inside it, compared as normalised
    locations: local paths resolved (symlinks, ``..``), URLs by scheme (``gcs`` is
    ``gs``, ``s3a`` is ``s3``) and path without repeated or trailing ``/``. A local path
    and a URL never nest."""
    if is_local(path) != is_local(folder):
        return False
    if is_local(path):
        inner, outer = (os.path.realpath(local_path(p)) for p in (path, folder))
        return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)
    inner, outer = _normal_url(path), _normal_url(folder)
    return inner == outer or inner.startswith(outer + "/")


def _normal_url(url: str) -> str:
    scheme = {"gcs": "gs", "s3a": "s3"}.get(remote.scheme(url), remote.scheme(url))
    rest = re.sub("/{2,}", "/", url.split("://", 1)[1]).strip("/")
    return f"{scheme}://{rest}"


def join(base: str, *parts: str) -> str:
    """Joins path parts: ``os.path.join`` locally, ``/`` for URLs."""
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return posixpath.join(base, *parts)


def basename(path: str) -> str:
    """The last part of ``path`` (either separator)."""
    # Both separators: a Windows path and a URL alike; a trailing "/" names the folder itself.
    return path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]


def dirname(path: str) -> str:
    """The folder holding ``path``: absolute for local paths."""
    if is_local(path):
        # Absolute: the dirname of a bare name would be "", which no function takes as a folder.
        return os.path.dirname(os.path.abspath(local_path(path)))
    return posixpath.dirname(path.rstrip("/"))


def exists(path: str) -> bool:
    """Whether ``path`` exists (in a bucket: an object, or a prefix of one)."""
    if is_local(path):
        return os.path.exists(local_path(path))
    if not _fsspec(path):
        return tf.io.gfile.exists(path)
    return _found_remote(path, "exists")


def isdir(path: str) -> bool:
    """Whether ``path`` is a folder (in a bucket: a prefix of some object)."""
    if is_local(path):
        return os.path.isdir(local_path(path))
    if not _fsspec(path):
        return tf.io.gfile.isdir(path)
    return _found_remote(path, "isdir")


def _found_remote(path: str, ask: str) -> bool:
    """fsspec's ``exists`` or ``isdir`` of ``path``; when False, a missing bucket is said."""
    fs, key = remote.filesystem(path)
    with remote.errors(path):
        found = bool(getattr(fs, ask)(key))
    if not found:
        remote.check_bucket(path)  # "no such bucket" rather than "no such dataset"
    return found


def listdir(path: str) -> list[str]:
    """Names in folder ``path``, sorted (no trailing ``/`` on folders)."""
    if is_local(path):
        names = os.listdir(local_path(path))
    elif not _fsspec(path):
        names = tf.io.gfile.listdir(path)
    else:
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            names = [posixpath.basename(name.rstrip("/")) for name in fs.ls(key, detail=False)]
    # gfile lists folders with a trailing "/"; sorted, so every caller sees one order.
    return sorted(name.rstrip("/") for name in names)


def makedirs(path: str) -> None:
    """Creates folder ``path`` and its parents; nothing if it exists (nor in a bucket,
    where folders are only the prefixes of the objects written into them)."""
    if is_local(path):
        os.makedirs(local_path(path), exist_ok=True)
    elif not _fsspec(path):
        tf.io.gfile.makedirs(path)
    # An object store has no folders to make: writing a key makes its prefix.
    elif not remote.object_store(path):
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            fs.makedirs(key, exist_ok=True)


def remove(path: str) -> None:
    """Deletes file ``path``."""
    if is_local(path):
        os.remove(local_path(path))
    elif not _fsspec(path):
        tf.io.gfile.remove(path)
    else:
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            fs.rm_file(key)


def rmtree(path: str) -> None:
    """Deletes folder ``path`` and everything in it."""
    if is_local(path):
        shutil.rmtree(local_path(path))
    elif not _fsspec(path):
        tf.io.gfile.rmtree(path)
    else:
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            fs.rm(key, recursive=True)


def remove_if_exists(path: str) -> None:
    """Deletes a file or folder if it is there."""
    if isdir(path):
        rmtree(path)
    elif exists(path):
        remove(path)


def rename(source: str, target: str) -> None:
    """Moves ``source`` to ``target``, replacing it (atomic on one local filesystem; a
    copy, then a delete, in a bucket)."""
    if is_local(source) and is_local(target):
        os.replace(local_path(source), local_path(target))
    elif not (_fsspec(source) or _fsspec(target)):
        # overwrite=True, as os.replace: the target of an atomic write already exists.
        tf.io.gfile.rename(source, target, overwrite=True)
    elif isdir(source):
        for name in listdir(source):
            rename(join(source, name), join(target, name))
        remove_if_exists(source)  # the folder itself, where folders are real (memory://)
    else:
        copy(source, target)
        remove(source)


def copy(source: str, target: str) -> None:
    """Copies file ``source`` to ``target``, replacing it."""
    if is_local(source) and is_local(target):
        shutil.copyfile(local_path(source), local_path(target))
    elif not (_fsspec(source) or _fsspec(target)):
        tf.io.gfile.copy(source, target, overwrite=True)
    elif _fsspec(source) and remote.scheme(source) == remote.scheme(target):
        fs, key = remote.filesystem(source)
        with remote.errors(source):
            fs.copy(key, remote.filesystem(target)[1])
    else:  # between two kinds of storage: streamed through this process
        with open_file(source, "rb") as reader, open_file(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, _COPY_BLOCK)


def size(path: str) -> int:
    """The size of file ``path`` in bytes."""
    if is_local(path):
        return os.path.getsize(local_path(path))
    if not _fsspec(path):
        return tf.io.gfile.stat(path).length
    fs, key = remote.filesystem(path)
    with remote.errors(path):
        return fs.size(key)


def open_file(path: str, mode: str = "rb") -> IO[Any]:
    """A binary file object: the builtin ``open`` locally, an fsspec file for ``s3://``,
    ``gs://`` and the like (written on ``close``), ``tf.io.gfile.GFile`` for TensorFlow's
    filesystems."""
    if is_local(path):
        return open(local_path(path), mode)
    if not _fsspec(path):
        return tf.io.gfile.GFile(path, mode)
    fs, key = remote.filesystem(path)
    # s3fs reads ahead 50 MB by default (gcsfs 5 MB): per record of a random-access reader
    # (Grain), that much downloaded; 1 MB keeps sequential scans to few requests and random
    # reads small
    options = {"block_size": _READ_AHEAD} if "r" in mode else {}
    with remote.errors(path):
        return fs.open(key, mode, **options)


def read_bytes(path: str) -> bytes:
    """The whole content of file ``path``."""
    if is_local(path):
        # Unbuffered, then readall(): one read of the whole file, no copy through a buffer.
        with open(local_path(path), "rb", buffering=0) as handle:
            return handle.readall()
    if _fsspec(path):
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            return fs.cat_file(key)
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read()


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` under a temporary name, then renames it to ``path``.

    A reader sees the old file or the whole new one, never a part; locally the
    data reach the disk (fsync) before the rename. Through fsspec the whole body
    goes in one put, which an object store makes visible at once.
    """
    if _fsspec(path):
        fs, key = remote.filesystem(path)
        with remote.errors(path):
            # No temporary name: an object store shows a put whole or not at all.
            fs.pipe_file(key, data)
        return
    tmp = path + ".tmp"
    with open_file(tmp, "wb") as handle:
        handle.write(data)
        sync(handle)
    rename(tmp, path)


@contextlib.contextmanager
def staged_write(path: str) -> Iterator[str]:
    """A local file name for a writer that writes only local files (Keras's ``save``,
    h5py), whose content lands at ``path`` when the block ends without an error.

    ``path`` itself where it is local; otherwise a file of the same name in a temporary
    folder, copied to ``path`` afterwards (an object store shows the upload whole or not
    at all) and deleted.

    Example:
        >>> with staged_write("s3://bkt/runs/r1/checkpoints/last.keras") as local:  # doctest: +SKIP
        ...     model.save(local)
    """
    if is_local(path):
        yield local_path(path)
        return
    with tempfile.TemporaryDirectory(prefix="chute-staged-") as tmp:
        # The same name: Keras chooses the format by the name's ending (.keras, .weights.h5).
        local = os.path.join(tmp, basename(path))
        yield local
        copy(local, path)


@contextlib.contextmanager
def staged_read(path: str) -> Iterator[str]:
    """A local file name holding the content of file ``path``, for a reader that opens
    only local files: ``path`` itself where it is local, else a temporary copy (deleted
    when the block ends)."""
    if is_local(path):
        yield local_path(path)
        return
    with tempfile.TemporaryDirectory(prefix="chute-staged-") as tmp:
        local = os.path.join(tmp, basename(path))
        copy(path, local)
        yield local


def create(path: str, data: bytes) -> bool:
    """Writes ``data`` to ``path`` only if nothing is there; False if something is.

    Atomic locally (``O_EXCL``) and on object stores that take a conditional put (S3's
    ``If-None-Match``, GCS's ``ifGenerationMatch=0``: fsspec's ``mode="create"``); on other
    filesystems a check, then a write (two writers may both see nothing).
    """
    if is_local(path):
        try:
            handle = os.open(local_path(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        return True
    if _fsspec(path):
        fs, key = remote.filesystem(path)
        try:
            with remote.errors(path):
                fs.pipe_file(key, data, mode="create")
            return True
        except FileExistsError:
            return False
        except TypeError:  # an fsspec older than pipe_file's `mode`: check, then write
            pass
    if exists(path):
        return False
    write_atomic(path, data)
    return True


def version(path: str) -> str | None:
    """What names the current content of file ``path`` (S3's ETag, elsewhere a hash of
    the bytes): it changes whenever the file is written anew with other bytes; None if
    there is no such file."""
    try:
        if _fsspec(path) and remote.scheme(path) == "s3":
            fs, key = remote.filesystem(path)
            with remote.errors(path):
                return str(fs.info(key)["ETag"])
        return hashlib.sha256(read_bytes(path)).hexdigest()
    except FileNotFoundError:
        return None


def replace(path: str, data: bytes, seen: str) -> bool:
    """Writes ``data`` over file ``path`` only if its :func:`version` is still ``seen``;
    False if it is not (or the file is gone).

    Atomic on S3 (a put with ``If-Match``: of two writers that saw one version, one wins);
    elsewhere a check, then a write (two writers may both see ``seen``).
    """
    if _fsspec(path) and remote.scheme(path) == "s3":
        fs, key = remote.filesystem(path)
        try:
            fs.pipe_file(key, data, IfMatch=seen)
            return True
        except FileNotFoundError:
            return False
        except OSError as error:
            if _condition_failed(error):
                return False
            with remote.errors(path):
                raise
    if version(path) != seen:
        return False
    write_atomic(path, data)
    return True


def _condition_failed(error: BaseException) -> bool:
    """Whether S3 refused a conditional put: 412, another version is there; 409, another
    conditional put of the same object is under way (s3fs keeps the code in the cause)."""
    for cause in (error, error.__cause__, error.__context__):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in (
            "PreconditionFailed", "ConditionalRequestConflict",
        ):  # fmt: skip
            return True
    return False


def sync(handle: IO[Any]) -> None:
    """Flushes a local file's data to the disk (remote filesystems commit on close)."""
    try:
        fd = handle.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: an fsspec file
        return
    handle.flush()
    os.fsync(fd)


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` for a remote folder, top down (a caller may prune ``dirnames`` in
    place); local walks stay with callers, who decide how to follow symlinks."""
    if not _fsspec(top):
        yield from tf.io.gfile.walk(top)
        return
    fs, key = remote.filesystem(top)
    with remote.errors(top):
        for dirpath, dirnames, filenames in fs.walk(key, topdown=True):
            yield remote.url(fs, top, key, dirpath), dirnames, filenames


def find(top: str) -> list[str]:
    """Every file under remote folder ``top``, at any depth, as URLs, sorted: one flat
    listing, which (unlike :func:`walk`) also reaches keys with an empty path segment
    (``a//b.png``)."""
    if not _fsspec(top):
        return sorted(
            join(dirpath, name) for dirpath, _, names in walk(top) for name in names if name
        )
    fs, key = remote.filesystem(top)
    with remote.errors(top):
        return sorted(remote.url(fs, top, key, found) for found in fs.find(key))


def glob(pattern: str) -> list[str]:
    """Paths matching ``pattern``, sorted."""
    if is_local(pattern):
        import glob as glob_lib

        # recursive=True: "**" matches folders at any depth.
        return sorted(glob_lib.glob(local_path(pattern), recursive=True))
    if not _fsspec(pattern):
        return sorted(tf.io.gfile.glob(pattern))
    fs, key = remote.filesystem(pattern)
    base = remote.glob_base(pattern)
    base_key = remote.filesystem(base)[1]
    with remote.errors(pattern):
        return sorted(remote.url(fs, base, base_key, found) for found in fs.glob(key))


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
                # TensorFlow's errors keep their bare text in .message.
                return getattr(error, "message", None) or str(error)
        return None

    # Local opens are fast: threads would only add overhead.
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
    # Only chute's own entries: whatever else the user keeps in the folder stays.
    for entry in entries:
        remove_if_exists(join(path, entry))
