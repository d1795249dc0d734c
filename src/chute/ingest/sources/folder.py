"""Folders as a source: one sub-folder per class, or a pre-split tree of them.

Nested folders belong to their top-level class; hidden entries are skipped;
symlinks are followed, loops cut. Local folders are walked with ``os.scandir``,
others (``gs://``, ``ram://``) through the storage layer.
"""

from __future__ import annotations

import logging
import os

from chute.format import storage
from chute.image.files import image_files
from chute.ingest.sources.base import FileSource, Item, Source, class_layout, visible_folders

log = logging.getLogger(__name__)
_EMPTY = (
    "an object key with an empty folder name ('//'), which a folder source cannot read: "
    "rename it without the '//'"
)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials


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
    rejects: list[dict] = []
    for split, split_name, split_root, names in layout.groups:
        outer = frozenset()
        if storage.is_local(root):
            outer = frozenset(os.path.realpath(storage.local_path(p)) for p in (root, split_root))
        for class_name in names:
            prefix = f"{split_name}/{class_name}" if split else class_name
            class_root = storage.join(split_root, class_name)
            unreachable: list[str] = []
            for rel in image_files(class_root, outer, unreachable=unreachable):
                items.append(
                    Item(
                        key=f"{prefix}/{rel}",
                        label=label_of[class_name],
                        split=split,
                        path=storage.join(class_root, *rel.split("/")),
                    )
                )
            # Rejected, not read: a path made of folder names would lose the empty segment.
            rejects += [
                {"key": f"{prefix}/{url[len(class_root.rstrip('/')) + 1 :]}", "reason": _EMPTY}
                for url in unreachable
            ]
    kind = "split-folder" if layout.presplit else "folder"
    return FileSource(kind, root, layout.classes, items, presplit=layout.presplit, rejects=rejects)
