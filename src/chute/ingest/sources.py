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
  ``keras:fashion_mnist`` through ``keras.datasets``;
* a ``.zip`` or ``.tar`` (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``)
  archive of such a tree, read member by member (see :mod:`chute.ingest.archives`);
* WebDataset tar shards, ``{key}.jpg`` beside ``{key}.cls`` (or ``.txt``,
  ``.json``), one ``.tar`` or a pattern such as ``shard-{000000..000099}.tar``
  (see :mod:`chute.ingest.webdataset`);
* Hugging Face Parquet files (a folder in the Hub's layout, or one ``.parquet``
  file), or ``hf:OWNER/NAME[:CONFIG]`` downloaded from the Hub (see
  :mod:`chute.ingest.parquet`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import shutil
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.options import DEFAULT_MAX_PIXELS

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
LITTER = frozenset({"__MACOSX"})  # folders archivers leave behind: never data


class Item(NamedTuple):
    """One image to convert.

    ``path`` is set for file sources; ``index`` is the row of
    ``Source.arrays[split]`` for array sources, or of ``Source.members`` for
    archives (-1 for files).
    """

    key: str
    label: int
    split: str | None
    path: str | None
    index: int = -1


@dataclasses.dataclass
class Source:
    """A scanned source: class names in label order and the items.

    ``rejects`` are inputs refused while scanning, each ``{"key", "reason"}``: a
    list row naming a file again, an archive member with an unsafe name, a
    WebDataset sample without a label. ``containers`` are the archive files an
    archive source reads (what tells a re-run that it changed). ``temp_dir``, if
    set, holds what a compressed tar was unpacked to: :meth:`close` (or the
    garbage collector) deletes it.
    """

    kind: str
    location: str
    class_names: list[str]
    items: list[Item]
    presplit: bool = False
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    rejects: list[dict] = dataclasses.field(default_factory=list)
    members: list[Any] = dataclasses.field(default_factory=list)  # archive Members
    containers: list[str] = dataclasses.field(default_factory=list)
    temp_dir: str | None = None

    def __post_init__(self) -> None:
        self._cleanup = None
        if self.temp_dir is not None:
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.temp_dir, True)

    def payload(self, item: Item) -> Any:
        """What a worker needs to read the item: a path, an archive member, or its pixels."""
        if item.path is not None:
            return item.path
        if self.members:
            return self.members[item.index]
        return self.arrays[item.split or "train"][item.index]

    def close(self) -> None:
        """Deletes the temporary files of the source (a compressed tar's unpacked data)."""
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan(
    source: str,
    *,
    allow_outside: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    progress: Callable[[str, int, int], None] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> Source:
    """Lists a source's items and class names, sorted and deterministic.

    Args:
        source: a folder, a ``.csv``/``.jsonl``/``.npz`` file, a ``.zip`` or
            ``.tar`` (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``) archive,
            a pattern of WebDataset ``.tar`` shards, Parquet files (a folder or a
            ``.parquet`` file), ``hf:OWNER/NAME[:CONFIG]``, or ``keras:NAME``.
        allow_outside: let a list name files outside its own folder.
        max_pixels: the conversion's pixel limit; a compressed tar's members too
            large for it are not unpacked (they are rejected).
        progress: called as ``progress("unpack", bytes_done, bytes_total)``
            while a compressed tar or Parquet files are unpacked.
        image_column: Parquet: the column of images (default: found from the schema).
        label_column: Parquet: the column of labels (default: found from the schema).

    Returns:
        The :class:`Source`; close it (or use it as a context manager) to delete
        what a compressed tar was unpacked to.

    Raises:
        ChuteError: the source is missing, of an unknown kind, malformed, or empty.

    Example:
        >>> scan("keras:mnist").class_names[:3]  # doctest: +SKIP
        ['0', '1', '2']
        >>> scan("data/shard-{000000..000003}.tar").kind  # doctest: +SKIP
        'webdataset'
    """
    if not isinstance(source, str | os.PathLike) or not str(source):
        raise ChuteError(f"`source` must be a path or 'keras:NAME'. Received: source={source!r}")
    from chute.ingest import archives, arrays, lists, parquet, webdataset

    source = os.fspath(source)
    columns = {"image_column": image_column, "label_column": label_column}
    if source.startswith("hf:"):
        folder = parquet.download(source)
        found = parquet.scan_parquet(folder, max_pixels=max_pixels, progress=progress, **columns)
    elif source.startswith("keras:"):
        found = arrays.scan_keras(source)
    elif webdataset.is_pattern(source) and not storage.exists(source):
        found = webdataset.scan_pattern(source, max_pixels=max_pixels, progress=progress)
    else:
        if not storage.exists(source):
            raise ChuteError(f"`source` does not exist. Received: source={source!r}")
        lower = source.lower()
        if parquet.is_parquet_source(source):
            found = parquet.scan_parquet(
                source, max_pixels=max_pixels, progress=progress, **columns
            )
        elif storage.isdir(source):
            found = _scan_folder(source)
        elif lower.endswith((".csv", ".jsonl")):
            found = lists.scan_list(source, allow_outside=allow_outside)
        elif lower.endswith(".npz"):
            found = arrays.scan_npz(source)
        elif archives.is_archive(source):
            found = archives.scan_archive(source, max_pixels=max_pixels, progress=progress)
        else:
            raise ChuteError(
                "`source` must be a folder, a .csv, .jsonl, .npz or .parquet file, a "
                f"{', '.join(archives.SUFFIXES)} archive, a pattern of WebDataset .tar shards "
                f"or one of {sorted('keras:' + k for k in arrays.KERAS_CLASS_NAMES)}. "
                f"Received: source={source!r}"
            )
    given = [f"{name}={value!r}" for name, value in columns.items() if value is not None]
    if given and found.kind != "parquet":
        found.close()
        raise ChuteError(
            f"`{given[0].split('=')[0]}` applies to Parquet sources; `source` is a "
            f"{found.kind} source. Received: {', '.join(given)}"
        )
    if not found.items:
        found.close()
        where = (
            "in WebDataset samples ({key}.<image> beside {key}.cls, .txt or .json)"
            if found.kind == "webdataset"
            else "inside class folders"
        )
        refused = ""
        if found.rejects:
            first = found.rejects[0]
            refused = f"; {len(found.rejects)} refused, first {first['key']!r}: {first['reason']}"
        raise ChuteError(
            f"`source` holds no images. Received: source={source!r} (looked for files ending in "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}, in any letter case, {where}{refused})"
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


def visible_folders(names: Iterable[str], where: str) -> list[str]:
    """``names`` of sub-folders that can be classes, sorted: not hidden, not archivers'
    litter (``__MACOSX``, logged)."""
    names = sorted(name for name in names if not name.startswith("."))
    for name in LITTER.intersection(names):
        log.warning("skipping %s in %s: archivers' litter, not a class", name, where)
    return [name for name in names if name not in LITTER]


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


class Layout(NamedTuple):
    """Where a tree's classes are: ``groups`` holds, sorted by split, ``(split or None,
    the split's folder name or "", the split's folder, its class folders)``."""

    presplit: bool
    classes: list[str]
    groups: list[tuple[str | None, str, str, list[str]]]


def class_layout(
    root: str,
    subfolders: Callable[[str], list[str]],
    join: Callable[[str, str], str],
    *,
    shown: str | None = None,
) -> Layout:
    """The classes of a tree and whether it is pre-split, from its folders alone.

    Shared by folders and archives, so both follow the same rules. ``subfolders``
    lists a folder's candidate class folders (sorted), ``join`` makes a child's
    path, ``shown`` is how messages name the source (default ``root``).

    Raises:
        ChuteError: split folders beside other folders, or no class folder.

    Example:
        >>> tree = {"": ["train", "val"], "train": ["a", "b"], "val": ["a"]}
        >>> class_layout("", tree.get, lambda a, b: b).classes
        ['a', 'b']
    """
    shown = root if shown is None else shown
    top = subfolders(root)
    split_dirs = {name: SPLIT_ALIASES.get(name.lower()) for name in top}
    named = [name for name, split in split_dirs.items() if split]
    others = [name for name, split in split_dirs.items() if not split]
    if "train" in split_dirs.values() and len(named) >= 2 and others:
        # train/ and val/ (or test/) beside other folders: not class folders named "train"
        raise ChuteError(
            f"`source` looks pre-split ({', '.join(sorted(named))}) but also holds "
            f"{', '.join(repr(o) for o in sorted(others))}, which is not a split. Received: "
            f"source={shown!r}; move it out of the source, or its classes into the splits"
        )
    presplit = (
        len(top) >= 2
        and all(split_dirs.values())
        and "train" in split_dirs.values()
        and len(set(split_dirs.values())) == len(top)
    )
    groups: list[tuple[str | None, str, str, list[str]]] = [(None, "", root, top)]
    classes = top
    if presplit:
        groups = []
        for name, split in sorted(split_dirs.items(), key=lambda pair: pair[1] or ""):
            split_root = join(root, name)
            groups.append((split, name, split_root, subfolders(split_root)))
        classes = sorted({c for *_, names in groups for c in names})
        if not classes:
            presplit, classes, groups = False, top, [(None, "", root, top)]
    if not classes:
        raise ChuteError(
            f"`source` has no class sub-folders. Received: source={shown!r} (expected "
            "SOURCE/<class>/<image> or SOURCE/train/<class>/<image>)"
        )
    return Layout(presplit, list(classes), groups)


def _scan_folder(root: str) -> Source:
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
