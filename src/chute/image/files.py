"""Image files: which names are images, the images under a folder, and names as text.

Shared by ``chute convert`` (a class folder's images, the keys of its
records) and ``chute predict`` (a folder's images, the paths it reports), so
that both find the same files and write the same name for each. No
TensorFlow.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re

from chute.format import storage

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def is_image(name: str) -> bool:
    """Whether ``name`` ends in an image extension, in any letter case.

    Example:
        >>> is_image("scans/IMG_01.JPG"), is_image("notes.txt")
        (True, False)
    """
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode and tarfile hold it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"  # a lone surrogate from elsewhere: no byte behind it


def text_key(name: str) -> str:
    """``name`` as text that can be written anywhere (UTF-8 records, CSV, JSON, a terminal).

    A file or member name that is not UTF-8 reaches Python with its undecodable
    bytes held as surrogates (``os.fsdecode``, ``tarfile``); each becomes ``\\xNN``,
    as ``bytes.decode("utf-8", "backslashreplace")`` writes it. Other names are
    returned unchanged. Only keys and messages are escaped: the file is still read
    through its real path.

    Example:
        >>> text_key(os.fsdecode(b"cats/caf\\xe9.png")), text_key("cats/café.png")
        ('cats/caf\\\\xe9.png', 'cats/café.png')
    """
    return _SURROGATE.sub(_escape_surrogate, name)


def image_files(
    top: str, outer: frozenset[str] = frozenset(), *, unreachable: list[str] | None = None
) -> list[str]:
    """Image paths under ``top`` relative to it (``/``-separated), sorted.

    Hidden files and folders are skipped; symlinked folders are followed
    unless they lead back to a folder already on the current path, or to one of
    the ``outer`` folders (real paths of the dataset and split roots): a loop.
    Local folders are walked with ``os.scandir``, others (``gs://``, ``ram://``)
    through the storage layer. In a bucket, the image keys with an empty path
    segment (``a//b.png``: no folder walk reaches them) are added to
    ``unreachable`` (full URLs) when it is given.
    """
    found: list[str] = []
    if not storage.is_local(top):
        for dirpath, dirnames, filenames in storage.walk(top):
            # A key "dirpath//name" shows as a folder or a file named "": list it whole.
            if unreachable is not None and "" in (*dirnames, *filenames):
                below = dirpath.rstrip("/") + "//"
                unreachable += [
                    url for url in storage.find(dirpath) if url.startswith(below) and is_image(url)
                ]
            dirnames[:] = sorted(d for d in dirnames if d and not d.startswith("."))
            rel = posixpath.relpath(dirpath.rstrip("/"), top.rstrip("/"))
            for name in filenames:
                if not name.startswith(".") and is_image(name):
                    found.append(name if rel == "." else posixpath.join(rel, name))
        return sorted(found)

    def visit(path: str, rel: str, ancestors: frozenset[str]) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as error:
            log.warning("cannot list %s: %s", path, error)
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue
            if is_dir:
                real = os.path.realpath(entry.path)
                # Only a folder on the current path makes a loop; one linked twice is read twice.
                if real in ancestors:
                    log.warning("skipping symlink loop at %s", entry.path)
                    continue
                visit(entry.path, child_rel, ancestors | {real})
            elif is_image(entry.name):
                found.append(child_rel)

    top = storage.local_path(top)
    visit(top, "", outer | {os.path.realpath(top)})
    return sorted(found)
