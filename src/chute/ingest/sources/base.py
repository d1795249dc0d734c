"""What every source kind shares: items, the scanned source, names and the class-folder rule.

A leaf: the kinds (:mod:`.folder`, :mod:`.lists`, :mod:`.arrays`,
:mod:`.archives`, :mod:`.tars`, :mod:`.webdataset`, :mod:`.parquet`) import it,
it imports none of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from chute.errors import ChuteError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
LITTER = frozenset({"__MACOSX"})  # folders archivers leave behind: never data
LABEL_EXTENSIONS = ("cls", "json", "txt")  # WebDataset labels, in the order they are looked for
ProgressFn = Callable[[str, int, int], None]  # progress(stage, done, total)


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


def visible_folders(names: Iterable[str], where: str) -> list[str]:
    """``names`` of sub-folders that can be classes, sorted: not hidden, not archivers'
    litter (``__MACOSX``, logged)."""
    names = sorted(name for name in names if not name.startswith("."))
    for name in LITTER.intersection(names):
        log.warning("skipping %s in %s: archivers' litter, not a class", name, where)
    return [name for name in names if name not in LITTER]


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


def class_names_of(labels: list[str]) -> list[str]:
    """The class names of string labels, sorted: numerically when all are integers.

    Example:
        >>> class_names_of(["10", "2", "2", "01"])
        ['01', '2', '10']
    """
    unique = set(labels)
    if all(label.lstrip("-").isdigit() for label in unique):
        return sorted(unique, key=lambda label: (int(label), label))  # "1" and "01" stay apart
    return sorted(unique)


_scratch_prefix = contextvars.ContextVar("chute_scratch_prefix", default="chute-unpack-")


@contextlib.contextmanager
def scratch_named(prefix: str) -> Iterator[None]:
    """Names the temporary folders made meanwhile (see :func:`make_scratch_dir`): a
    conversion names them after its output, so a later one can remove what a killed
    one left."""
    token = _scratch_prefix.set(prefix)
    try:
        yield
    finally:
        _scratch_prefix.reset(token)


def make_scratch_dir() -> str:
    """A new temporary folder (in ``TMPDIR``) for what a source is unpacked to.

    Example:
        >>> import os
        >>> with scratch_named("chute-unpack-doc-"):
        ...     folder = make_scratch_dir()
        >>> os.path.basename(folder).startswith("chute-unpack-doc-"), os.rmdir(folder)
        (True, None)
    """
    return tempfile.mkdtemp(prefix=_scratch_prefix.get())
