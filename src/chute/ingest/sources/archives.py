"""Archives as a source: a ``.zip`` or ``.tar`` of class folders, read without extracting.

The scan lists the members; worker processes later read each image member
themselves (see :mod:`.members`). A tar holding WebDataset
samples is handed to :mod:`.webdataset`.

The rules are the folder scanner's, applied to the members' paths, so an
archive converts as its extracted folder does (same keys, labels, pixels and
rejects):

* the class root is the top of the archive, or the single folder there when
  nothing else is (``Images_with_noise/<class>/…``, beside ``__MACOSX/`` and
  hidden files), descending while a level holds one folder, no image, and
  that folder has sub-folders of its own;
* ``train/``, ``val/`` (``validation/``), ``test/`` under it make a pre-split
  tree; hidden files and folders are skipped, ``__MACOSX`` is never a class;
* a member stored twice counts once, with its last copy (what extracting
  leaves); backslashes in zip names are folder separators (Windows tools);
* links are followed inside the archive only: a symbolic or hard link to a
  member is read as that member; links to folders are not followed.

Unsafe names are refused, never read: a member whose name leaves the
archive (``..``), is absolute (``/etc/…``) or starts with a drive letter
(``C:``), or a link pointing outside the archive or to nothing, is rejected
with its reason (an image or label member) or skipped with a warning (any
other file).

Zips and plain tars are read in place; a compressed tar is unpacked once into
one temporary file, deleted when the conversion ends (see
:mod:`.tars`). Workers guard every read against bombs (see
:mod:`.members`).
"""

from __future__ import annotations

import logging
import posixpath
import re
import shutil
import stat
import zipfile
from typing import NamedTuple

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import is_image
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.base import (
    LABEL_EXTENSIONS,
    LITTER,
    Item,
    MemberSource,
    Source,
    class_layout,
    visible_folders,
)
from chute.ingest.sources.members import ZIP, Member

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials

ZIP_SUFFIXES = (".zip",)
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
SUFFIXES = ZIP_SUFFIXES + TAR_SUFFIXES
SMALL_MEMBER = 64 << 10  # label members and link targets are read while scanning, up to this
# A bound on chains of links, so that a loop (a -> b -> a) ends.
_LINK_HOPS = 8


class Entry(NamedTuple):
    """A file inside an archive: its ``member`` to read, or why it cannot be read.

    ``link`` is the path (inside the archive) a link member points to, resolved
    by :func:`resolve`; ``data`` the content of a small member read while
    unpacking a compressed tar (WebDataset labels).
    """

    name: str
    member: Member | None = None
    reject: str | None = None
    link: str | None = None
    data: bytes | None = None


class Listing(NamedTuple):
    """What a scan of one archive found: files by path (links resolved), folders,
    refused members (``{"key", "reason"}``), and the temporary folder it unpacked to."""

    files: dict[str, Entry]
    folders: set[str]
    rejects: list[dict]
    temp_dir: str | None


def is_archive(path: str) -> bool:
    """Whether ``path`` is named like an archive this module reads.

    Example:
        >>> is_archive("flowers.TAR.GZ"), is_archive("labels.csv")
        (True, False)
    """
    return path.lower().endswith(SUFFIXES)


def is_tar(path: str) -> bool:
    """Whether ``path`` is named like a (possibly compressed) tar archive."""
    return path.lower().endswith(TAR_SUFFIXES)


# -- the tree -----------------------------------------------------------------------------


class _Tree:
    """Folders and files of an archive, as the folder scanner sees a folder."""

    def __init__(self, location: str, listing: Listing):
        self.location = location
        self.folders: dict[str, set[str]] = {"": set()}
        self.files: dict[str, dict[str, Entry]] = {"": {}}
        for folder in listing.folders:
            self._add_folder(folder)
        for name, entry in listing.files.items():
            parent, _, base = name.rpartition("/")
            self._add_folder(parent)
            self.files[parent][base] = entry
        self._logged: set[str] = set()

    def _add_folder(self, path: str) -> None:
        while path not in self.folders:
            self.folders[path], self.files[path] = set(), {}
            parent, _, base = path.rpartition("/")
            self._add_folder(parent)
            self.folders[parent].add(base)

    def subfolders(self, path: str) -> list[str]:
        names = self.folders.get(path, set())
        if path in self._logged:  # the litter warning once per folder
            return [n for n in sorted(names) if not n.startswith(".") and n not in LITTER]
        self._logged.add(path)
        return visible_folders(names, f"{self.location}:{path or '/'}")

    def images(self, top: str) -> list[tuple[str, Entry]]:
        """``(path relative to top, entry)`` of the images under ``top``, sorted; hidden
        files and folders skipped at every depth."""
        found = []
        pending = [(top, "")]
        while pending:
            path, rel = pending.pop()
            for name, entry in self.files.get(path, {}).items():
                if not name.startswith(".") and is_image(name):
                    found.append((f"{rel}/{name}" if rel else name, entry))
            for name in self.folders.get(path, ()):
                if not name.startswith("."):
                    pending.append((_join(path, name), f"{rel}/{name}" if rel else name))
        return sorted(found, key=lambda pair: pair[0])

    def class_root(self) -> str:
        """The folder of the classes (or splits): see the module's rules."""
        root = ""
        while True:
            below = self.subfolders(root)
            loose = any(not n.startswith(".") and is_image(n) for n in self.files[root])
            # A lone wrapper folder (flowers/ in flowers.zip) is stepped into; else: the root.
            if len(below) != 1 or loose or not self.subfolders(_join(root, below[0])):
                return root
            root = _join(root, below[0])


def tree_source(kind: str, path: str, listing: Listing) -> Source:
    """A class tree inside an archive as a :class:`Source` (items read as members)."""
    tree = _Tree(path, listing)
    root = tree.class_root()
    if root:
        log.info("%s: classes under %s/", path, root)
    layout = class_layout(root, tree.subfolders, _join, shown=path)
    label_of = {name: i for i, name in enumerate(layout.classes)}
    items: list[Item] = []
    found_members: list[Member] = []
    rejects = list(listing.rejects)
    for split, split_name, split_root, names in layout.groups:
        for class_name in names:
            prefix = f"{split_name}/{class_name}" if split else class_name
            for rel, entry in tree.images(_join(split_root, class_name)):
                key = f"{prefix}/{rel}"
                if entry.member is None:
                    rejects.append({"key": key, "reason": entry.reject or "not a file"})
                    continue
                items.append(Item(key, label_of[class_name], split, None, len(found_members)))
                found_members.append(entry.member)
    return MemberSource(
        kind,
        path,
        layout.classes,
        items,
        presplit=layout.presplit,
        rejects=rejects,
        members=found_members,
        containers=[path],
        temp_dir=listing.temp_dir,
    )


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


# -- names and links ----------------------------------------------------------------------

_DRIVE = re.compile(r"^[A-Za-z]:")


def clean_name(name: str) -> tuple[str | None, str | None]:
    """A member name as a ``/``-separated path inside the archive (``./`` and empty parts
    dropped), or None and why it is unsafe.

    Example:
        >>> clean_name("./cats//1.png"), clean_name("../../etc/passwd")[1]
        (('cats/1.png', None), 'unsafe name: it leaves the archive (..)')
    """
    # Refused, not stripped: extracting such a name is how archives write outside their folder.
    if name.startswith(("/", "\\")):
        return None, "unsafe name: an absolute path"
    if _DRIVE.match(name):
        return None, "unsafe name: it starts with a drive letter"
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if any(".." in part.split("\\") for part in parts):  # "..\\" too, for Windows tools
        return None, "unsafe name: it leaves the archive (..)"
    return "/".join(parts), None


def link_target(link_name: str, target: str, *, relative: bool) -> tuple[str | None, str]:
    """Where a link points inside the archive (``relative``: to the link's folder, as a
    symbolic link is), or None when it leads outside; and the target as written."""
    if target.startswith(("/", "\\")) or _DRIVE.match(target):
        return None, target
    base = posixpath.dirname(link_name) if relative else ""
    joined = posixpath.normpath(posixpath.join(base, target))
    if joined == ".." or joined.startswith("../"):
        return None, target
    return ("" if joined == "." else joined), target


def refuse(rejects: list[dict], raw: str, reason: str, location: str) -> None:
    """An unsafe member: rejected when named like an image or label, else only logged."""
    # Only what would have been data is a reject; other unsafe members are just skipped.
    if is_image(raw) or raw.lower().rsplit(".", 1)[-1] in LABEL_EXTENSIONS:
        rejects.append({"key": raw, "reason": reason})
    else:
        log.warning("%s: skipping member %r: %s", location, raw, reason)


def resolve(files: dict[str, Entry], folders: set[str]) -> dict[str, Entry]:
    """``files`` with every link replaced by the member it leads to, or a reject."""
    out = {}
    for name, entry in files.items():
        target, hops = entry, 0
        while target is not None and target.link is not None and hops < _LINK_HOPS:
            # Links to folders are not followed: they could make the tree endless.
            if target.link in folders:
                break
            target, hops = files.get(target.link), hops + 1
        if entry.link is None:
            out[name] = entry
        elif target is None:
            out[name] = Entry(name, reject=f"a link to {entry.link!r}, which the archive lacks")
        elif target.link is not None:
            why = "a folder (not followed)" if target.link in folders else "a chain of links"
            out[name] = Entry(name, reject=f"a link to {entry.link!r}: {why}")
        else:
            out[name] = entry._replace(member=target.member, reject=target.reject, link=None,
                                       data=target.data)  # fmt: skip
    return out


# -- zip ----------------------------------------------------------------------------------


def list_zip(path: str) -> Listing:
    """The files and folders of a zip archive (nothing is decompressed but link targets).

    Raises:
        ChuteError: not a readable zip archive.
    """
    files: dict[str, Entry] = {}
    folders: set[str] = set()
    rejects: list[dict] = []
    try:
        with storage.open_file(path) as handle, zipfile.ZipFile(handle) as archive:
            for info in archive.infolist():
                name, unsafe = clean_name(info.filename.replace("\\", "/"))
                if name is None:
                    refuse(rejects, info.filename, unsafe, path)
                    continue
                # "./" alone: the archive's own top, nothing to list.
                if not name:
                    continue
                if info.is_dir():
                    folders.add(name)
                    continue
                member = Member(path, ZIP, info.filename, info.header_offset, info.file_size)
                # A zip keeps Unix mode bits in external_attr's upper half: a link is marked there.
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    files[name] = _zip_link(archive, info, name)
                else:
                    files[name] = Entry(name, member)
    except ChuteError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile, ValueError) as error:
        raise ChuteError(
            f"`source` is not a readable zip archive. Received: source={path!r} "
            f"({members_lib.describe_error(error)})"
        ) from None
    return Listing(resolve(files, folders), folders, rejects, None)


def _zip_link(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> Entry:
    # A link's data is its target path: an overlong one is no real link.
    if info.file_size > SMALL_MEMBER:
        return Entry(name, reject="a symbolic link with an overlong target")
    try:
        target = archive.read(info).decode("utf-8")
    except Exception as error:  # untrusted bytes
        return Entry(name, reject=f"unreadable symbolic link: {members_lib.describe_error(error)}")
    inside, written = link_target(name, target, relative=True)
    if inside is None:
        return Entry(name, reject=f"a link to {written!r}, outside the archive")
    return Entry(name, link=inside)


def remove(folder: str | None) -> None:
    """Deletes a temporary folder an unpacked tar left (None: nothing)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
