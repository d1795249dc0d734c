"""What every source kind shares: items, the :class:`Source` protocol, names and the
class-folder rule.

A scanned source is one of three small classes behind the protocol, by where its
images' bytes come from: :class:`FileSource` (files), :class:`ArraySource`
(pixel arrays), :class:`MemberSource` (members of archives or Parquet files).

A leaf: the kinds (:mod:`.folder`, :mod:`.lists`, :mod:`.arrays`,
:mod:`.archives`, :mod:`.tars`, :mod:`.webdataset`, :mod:`.parquet`) import it,
it imports none of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import text_key

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials

SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
LITTER = frozenset({"__MACOSX"})  # folders archivers leave behind: never data
LABEL_EXTENSIONS = ("cls", "json", "txt")  # WebDataset labels, in the order they are looked for
ProgressFn = Callable[[str, int, int], None]  # progress(stage, done, total)


class Item(NamedTuple):
    """One image to convert.

    ``path`` is set for files (folders, lists); ``index`` is the item's row in the
    arrays of an :class:`ArraySource` or the members of a :class:`MemberSource`
    (-1 for files). A multi-label item has ``label`` -1 and ``labels`` its class
    indices (sorted, distinct; empty for a negative); ``weight`` is its sample
    weight when the source has a weight column.
    """

    key: str
    label: int
    split: str | None
    path: str | None
    index: int = -1
    labels: tuple[int, ...] | None = None
    weight: float | None = None


LABEL_MODES = ("auto", "single", "multi")


@dataclasses.dataclass(frozen=True)
class LabelRules:
    """How a source's label field is read (what ``convert``'s label options ask).

    Attributes:
        mode: ``"single"`` (one class per image), ``"multi"`` (several), or ``"auto"``
            (multi when the source holds lists, or a field with ``separator``; logged).
        separator: between labels in one text field (CSV cells, WebDataset ``.txt``).
        allow_empty: an image with no label is a valid negative (else a reject).
        max_labels: more labels on one image is a reject naming the count (None: no limit).
        weight_column: the column (CSV header, JSONL key, Parquet column) of sample
            weights; None: no weights (a column named ``weight`` is not read unless named).
    """

    mode: str = "auto"
    separator: str = "|"
    allow_empty: bool = False
    max_labels: int | None = None
    weight_column: str | None = None

    @property
    def hinted(self) -> str | None:
        """In ``auto`` mode, the option that asks for multi-label data by itself (negatives
        or a label count only mean something there), else None."""
        if self.mode != "auto":
            return None
        if self.allow_empty:
            return "allow_empty_labels=True"
        return None if self.max_labels is None else f"max_labels={self.max_labels}"


ListingRow = tuple[str, int, int]  # (key, size, modification time in ns), -1 where unknown


class Source(Protocol):
    """A scanned source, whatever its kind: class names in label order and the items.

    ``kind`` names the source as the manifest records it (``folder``, ``csv``,
    ``zip``, ``webdataset``, ...); ``rejects`` are inputs refused while scanning,
    each ``{"key", "reason"}``. The kinds differ only in where an item's bytes come
    from (:meth:`payload`) and which files tell a re-run that the source changed
    (:meth:`listing`): :class:`FileSource`, :class:`ArraySource`,
    :class:`MemberSource`.
    """

    kind: str
    location: str
    class_names: list[str]
    items: list[Item]
    presplit: bool
    rejects: list[dict]
    multi_label: bool
    weighted: bool

    def payload(self, item: Item) -> Any:
        """What a worker needs to read the item: a path, an archive member, or its pixels."""

    def payloads(self, items: Sequence[Item]) -> Sequence[Any]:
        """The payloads of ``items``, in order: a list, or one array whose rows are the
        items' pixels (one object to send to a worker, not one per image)."""

    def listing(self) -> list[ListingRow]:
        """Each source file's ``(key, size, modification time in ns)``, sorted: what
        ``source-files.csv`` keeps for a re-run to compare with."""

    def close(self) -> None:
        """Deletes what the source was unpacked to, if anything."""

    def __enter__(self) -> Source: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclasses.dataclass
class _Scanned:
    """The fields and the context manager every kind shares (not frozen: the scan
    rewrites keys and names as text once the kind has listed them)."""

    kind: str
    location: str
    class_names: list[str]
    items: list[Item]
    presplit: bool = False
    rejects: list[dict] = dataclasses.field(default_factory=list)
    multi_label: bool = False  # items carry ``labels``, not one ``label``
    weighted: bool = False  # items carry a ``weight``

    def payloads(self, items: Sequence[Item]) -> Sequence[Any]:
        return [self.payload(item) for item in items]

    def close(self) -> None:
        """Nothing to delete: only a :class:`MemberSource` unpacks anything."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class FileSource(_Scanned):
    """Image files (a folder of classes, a CSV/JSONL list): each item is a path."""

    def payload(self, item: Item) -> Any:
        return item.path

    def listing(self) -> list[ListingRow]:
        # one row per image file: a resumed run rewrites only the shards holding a changed one
        return sorted((item.key, *stat_row(item.path)[1:]) for item in self.items)


@dataclasses.dataclass
class ArraySource(_Scanned):
    """Pixel arrays (a ``.npz`` file, ``keras:NAME``): each item is a row of its split's
    array. ``containers`` is the ``.npz`` file, none for ``keras:`` (a download)."""

    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    containers: list[str] = dataclasses.field(default_factory=list)

    def payload(self, item: Item) -> Any:
        # An unsplit array source holds everything under "train".
        return self.arrays[item.split or "train"][item.index]

    def payloads(self, items: Sequence[Item]) -> Sequence[Any]:
        names = {item.split or "train" for item in items}
        if len(names) != 1:
            return [self.payload(item) for item in items]
        # Rows of one array: taken as one array (a copy of just these rows).
        return self.arrays[names.pop()][[item.index for item in items]]

    def listing(self) -> list[ListingRow]:
        if self.containers:
            return sorted(stat_row(path) for path in self.containers)
        # keras.datasets: Keras's own cache, nothing to stat; the name stands for the data
        return [(text_key(self.location), -1, -1)]


@dataclasses.dataclass
class MemberSource(_Scanned):
    """Images inside container files (zip or tar archives, WebDataset shards, Parquet
    files): each item is an archive member. ``containers`` are the files read (what
    tells a re-run that the source changed); ``temp_dir``, if set, holds what a
    compressed tar or Parquet files were unpacked to: :meth:`close` (or the garbage
    collector) deletes it."""

    members: list[Any] = dataclasses.field(default_factory=list)  # archive Members
    containers: list[str] = dataclasses.field(default_factory=list)
    temp_dir: str | None = None

    def __post_init__(self) -> None:
        self._cleanup = None
        if self.temp_dir is not None:
            # a finalizer, not __del__: it runs once, even at exit with the source still alive
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.temp_dir, True)

    def payload(self, item: Item) -> Any:
        return self.members[item.index]

    def listing(self) -> list[ListingRow]:
        # the members are not files of their own: a changed container changes them all
        return sorted(stat_row(path) for path in self.containers)

    def close(self) -> None:
        """Deletes the temporary files of the source (a compressed tar's unpacked data)."""
        if self._cleanup is not None:
            self._cleanup()


def stat_row(path: str) -> ListingRow:
    """``(path, size, modification time in ns)`` of a file (-1 where not known cheaply:
    stat-ing every object of a bucket would cost a request each); the path as a key (a
    name that is not UTF-8 escaped, see :func:`~chute.image.files.text_key`)."""
    size, mtime = -1, -1
    # Local files only: stat-ing every object of a bucket costs a request each.
    if storage.is_local(path):
        with contextlib.suppress(OSError):
            stat = os.stat(storage.local_path(path))
            size, mtime = stat.st_size, stat.st_mtime_ns
    return text_key(path), size, mtime


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
        # Distinct splits only: val/ beside validation/ would be the same split twice.
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
        # Split folders with no class inside: read the top folders as the classes instead.
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


# A context variable, not a global: two conversions in threads each name their own scratch.
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
