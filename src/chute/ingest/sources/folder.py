"""Folders as a source: one sub-folder per class, or a pre-split tree of them.

Nested folders belong to their top-level class; hidden entries are skipped;
symlinks are followed, loops cut. Local folders are walked with ``os.scandir``,
others (``gs://``, ``ram://``) through the storage layer.
"""

from __future__ import annotations

import logging
import os
import posixpath

from chute.format import storage
from chute.ingest.sources.base import Item, Source, class_layout, is_image, visible_folders

log = logging.getLogger(__name__)


def image_files(top: str, outer: frozenset[str] = frozenset()) -> list[str]:
    """Image paths under ``top`` relative to it (``/``-separated), sorted.

    Hidden files and folders are skipped; symlinked folders are followed
    unless they lead back to a folder already on the current path, or to one of
    the ``outer`` folders (real paths of the dataset and split roots): a loop.
    """
    found: list[str] = []
    if not storage.is_local(top):
        for dirpath, dirnames, filenames in storage.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
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
                if real in ancestors:
                    log.warning("skipping symlink loop at %s", entry.path)
                    continue
                visit(entry.path, child_rel, ancestors | {real})
            elif is_image(entry.name):
                found.append(child_rel)

    top = storage.local_path(top)
    visit(top, "", outer | {os.path.realpath(top)})
    return sorted(found)


def _subfolders(path: str) -> list[str]:
    """Sub-folders of ``path`` that can be classes (see :func:`visible_folders`)."""
    if storage.is_local(path):
        local = storage.local_path(path)
        names = [e.name for e in os.scandir(local) if not e.name.startswith(".") and e.is_dir()]
    else:
        names = [
            name
            for name in storage.listdir(path)
            if not name.startswith(".") and storage.isdir(storage.join(path, name))
        ]
    return visible_folders(names, path)


def scan_folder(root: str) -> Source:
    """The items of a class-per-folder tree (pre-split or not), sorted by key."""
    layout = class_layout(root, _subfolders, storage.join)
    label_of = {name: i for i, name in enumerate(layout.classes)}
    items: list[Item] = []
    for split, split_name, split_root, names in layout.groups:
        outer = frozenset()
        if storage.is_local(root):
            outer = frozenset(os.path.realpath(storage.local_path(p)) for p in (root, split_root))
        for class_name in names:
            prefix = f"{split_name}/{class_name}" if split else class_name
            class_root = storage.join(split_root, class_name)
            for rel in image_files(class_root, outer):
                items.append(
                    Item(
                        key=f"{prefix}/{rel}",
                        label=label_of[class_name],
                        split=split,
                        path=storage.join(class_root, *rel.split("/")),
                    )
                )
    kind = "split-folder" if layout.presplit else "folder"
    return Source(kind, root, layout.classes, items, presplit=layout.presplit)
