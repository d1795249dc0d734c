"""Sources: turn a dataset as people have it into a list of labelled items.

Recognised sources (see :func:`scan`):

* a folder with one sub-folder per class (nested folders belong to their
  top-level class; hidden entries skipped; symlinks followed, loops cut);
* a pre-split folder: ``train/<class>/…``, ``val/<class>/…`` (or
  ``validation``), optional ``test/<class>/…``;
* a CSV or JSONL list of ``path,label`` (optional ``split`` column), paths
  relative to the list's folder;
* a ``.npz`` file with ``x``/``y`` (or ``x_train``/``y_train`` and
  ``x_test``/``y_test``) uint8 arrays, optional ``class_names``;
* ``keras:cifar10``, ``keras:cifar100``, ``keras:mnist``,
  ``keras:fashion_mnist`` through ``keras.datasets``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
from typing import NamedTuple

import numpy as np

from chute.errors import ChuteError
from chute.format import storage

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
LITTER = frozenset({"__MACOSX"})  # folders archivers leave behind: never data


class Item(NamedTuple):
    """One image to convert.

    ``path`` is set for file sources; ``index`` is the row of
    ``Source.arrays[split]`` for array sources (-1 for files).
    """

    key: str
    label: int
    split: str | None
    path: str | None
    index: int = -1


@dataclasses.dataclass
class Source:
    """A scanned source: class names in label order and the items."""

    kind: str
    location: str
    class_names: list[str]
    items: list[Item]
    presplit: bool = False
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    repeats: list[dict] = dataclasses.field(default_factory=list)  # rows naming a file again

    def payload(self, item: Item) -> str | np.ndarray:
        """What a worker needs to read the item: a path, or its pixel array."""
        if item.path is not None:
            return item.path
        return self.arrays[item.split or "train"][item.index]


def scan(source: str, *, allow_outside: bool = False) -> Source:
    """Lists a source's items and class names, sorted and deterministic.

    Args:
        source: a folder, a ``.csv``/``.jsonl``/``.npz`` file, or ``keras:NAME``.
        allow_outside: let a list name files outside its own folder.

    Returns:
        The :class:`Source`.

    Raises:
        ChuteError: the source is missing, of an unknown kind, malformed, or empty.

    Example:
        >>> scan("keras:mnist").class_names[:3]  # doctest: +SKIP
        ['0', '1', '2']
    """
    if not isinstance(source, str | os.PathLike) or not str(source):
        raise ChuteError(f"`source` must be a path or 'keras:NAME'. Received: source={source!r}")
    from chute.ingest import arrays, lists

    source = os.fspath(source)
    if source.startswith("keras:"):
        found = arrays.scan_keras(source)
    else:
        if not storage.exists(source):
            raise ChuteError(f"`source` does not exist. Received: source={source!r}")
        lower = source.lower()
        if storage.isdir(source):
            found = _scan_folder(source)
        elif lower.endswith((".csv", ".jsonl")):
            found = lists.scan_list(source, allow_outside=allow_outside)
        elif lower.endswith(".npz"):
            found = arrays.scan_npz(source)
        else:
            raise ChuteError(
                "`source` must be a folder, a .csv, .jsonl or .npz file, or one of "
                f"{sorted('keras:' + k for k in arrays.KERAS_CLASS_NAMES)}. "
                f"Received: source={source!r}"
            )
    if not found.items:
        raise ChuteError(
            f"`source` holds no images. Received: source={source!r} (looked for files ending in "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}, in any letter case, inside class folders)"
        )
    return found


# -- folders ------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


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
                if not name.startswith(".") and _is_image(name):
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
            elif _is_image(entry.name):
                found.append(child_rel)

    top = storage.local_path(top)
    visit(top, "", outer | {os.path.realpath(top)})
    return sorted(found)


def _subfolders(path: str) -> list[str]:
    """Sub-folders of ``path``, sorted: not hidden, not archivers' litter (``__MACOSX``)."""
    if storage.is_local(path):
        local = storage.local_path(path)
        names = sorted(
            e.name for e in os.scandir(local) if not e.name.startswith(".") and e.is_dir()
        )
    else:
        names = [
            name
            for name in storage.listdir(path)
            if not name.startswith(".") and storage.isdir(storage.join(path, name))
        ]
    for name in LITTER.intersection(names):
        log.warning("skipping %s in %s: archivers' litter, not a class", name, path)
    return [name for name in names if name not in LITTER]


def _scan_folder(root: str) -> Source:
    top = _subfolders(root)
    split_dirs = {name: SPLIT_ALIASES.get(name.lower()) for name in top}
    named = [name for name, split in split_dirs.items() if split]
    others = [name for name, split in split_dirs.items() if not split]
    if "train" in split_dirs.values() and len(named) >= 2 and others:
        # train/ and val/ (or test/) beside other folders: not class folders named "train"
        raise ChuteError(
            f"`source` looks pre-split ({', '.join(sorted(named))}) but also holds "
            f"{', '.join(repr(o) for o in sorted(others))}, which is not a split. Received: "
            f"source={root!r}; move it out of the source, or its classes into the splits"
        )
    presplit = (
        len(top) >= 2
        and all(split_dirs.values())
        and "train" in split_dirs.values()
        and len(set(split_dirs.values())) == len(top)
    )
    if not presplit:
        classes = top
        paths = {"": (root, classes)}
    else:
        paths = {}
        for name, split in split_dirs.items():
            split_root = storage.join(root, name)
            paths[split] = (split_root, _subfolders(split_root))
        classes = sorted({c for _, names in paths.values() for c in names})
        if not classes:
            presplit = False
            classes, paths = top, {"": (root, top)}
    if not classes:
        raise ChuteError(
            f"`source` has no class sub-folders. Received: source={root!r} (expected "
            "SOURCE/<class>/<image> or SOURCE/train/<class>/<image>)"
        )
    label_of = {name: i for i, name in enumerate(classes)}
    items: list[Item] = []
    for split, (split_root, names) in sorted(paths.items()):
        split_name = next(k for k, v in split_dirs.items() if v == split) if split else ""
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
                        split=split or None,
                        path=storage.join(class_root, *rel.split("/")),
                    )
                )
    kind = "split-folder" if presplit else "folder"
    return Source(kind, root, list(classes), items, presplit=presplit)
