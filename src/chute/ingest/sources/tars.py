"""Tar archives, plain or compressed, listed for :mod:`.archives`.

A plain tar is read in place: each member's data offset and size are listed,
and workers read them with plain file reads. A compressed tar (gzip, bzip2,
xz: detected from its first bytes, whatever its name) has no random access,
so it is read once as a stream: its image members are copied into one
temporary file (their :class:`~chute.ingest.members.Member` points there) and
small label members kept in memory. That costs one pass of decompression and
the images' size on disk, never a pass per member. Unpacking refuses an
archive whose data expands more than 1000-fold (beyond 256 MiB), counted on
the bytes decompressed, whether kept or skipped, not on what headers claim: a
header claiming more than the archive holds rejects only its member, as in a
plain tar. It checks free disk space before each member, and does not copy a
member larger than an image within ``max_pixels`` can be (the worker rejects it
from its size).
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
from collections.abc import Callable
from typing import IO

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import is_image
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.archives import (
    SMALL_MEMBER,
    Entry,
    Listing,
    clean_name,
    link_target,
    refuse,
    remove,
    resolve,
)
from chute.ingest.sources.base import LABEL_EXTENSIONS, ProgressFn, make_scratch_dir
from chute.ingest.sources.members import TAR, Member

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials

UNPACK_RATIO = 1000  # a compressed tar expanding more than this much is a bomb ...
UNPACK_FLOOR = 256 << 20  # ... once it expands beyond this
DISK_RESERVE = 256 << 20  # free space left on the temporary folder's disk
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz magic numbers


def list_tar(
    path: str,
    *,
    max_pixels: int,
    progress: ProgressFn | None = None,
    temp_dir: str | None = None,
) -> Listing:
    """The files and folders of a tar archive; a compressed one is unpacked first.

    Args:
        path: the archive.
        max_pixels: members too large for it are not unpacked.
        progress: ``progress("unpack", bytes_read, bytes_total)`` while unpacking.
        temp_dir: where to unpack (default: a new folder in the system's temp folder).

    Raises:
        ChuteError: not a readable tar archive, a compression bomb, or a full disk.
    """
    with storage.open_file(path) as handle:
        magic = handle.read(8)
        handle.seek(0)
        # By content, not by suffix: a .tar may be gzipped, and a .tgz may be plain.
        compressed = magic.startswith(_COMPRESSED)
        if not compressed:
            return _list_plain_tar(path, handle)
        # Removed on failure only if made here: a caller's folder is the caller's to clean.
        made = temp_dir is None
        temp_dir = make_scratch_dir() if made else temp_dir
        try:
            return _unpack_tar(path, handle, max_pixels, progress, temp_dir)
        except BaseException:
            if made:
                remove(temp_dir)
            raise


def _not_a_tar(path: str, error: BaseException) -> ChuteError:
    return ChuteError(
        f"`source` is not a readable tar archive. Received: source={path!r} "
        f"({members_lib.describe_error(error)})"
    )


def _add_tar_member(
    info: tarfile.TarInfo,
    path: str,
    files: dict[str, Entry],
    folders: set[str],
    rejects: list[dict],
    member: Callable[[str], Entry],
) -> None:
    """Files one tar member: a folder, a file (``member(name)`` makes its entry), a link,
    or a reject."""
    name, unsafe = clean_name(info.name)
    if name is None:
        refuse(rejects, info.name, unsafe, path)
        return
    if not name:
        return
    if info.isdir():
        folders.add(name)
    elif info.issym() or info.islnk():
        inside, written = link_target(name, info.linkname, relative=info.issym())
        if inside is None:
            files[name] = Entry(name, reject=f"a link to {written!r}, outside the archive")
        else:
            files[name] = Entry(name, link=inside)
    elif info.issparse():
        files[name] = Entry(name, reject="a sparse file inside the archive: not supported")
    elif info.isreg():
        files[name] = member(name)
    else:
        files[name] = Entry(name, reject="not a regular file inside the archive")


def _list_plain_tar(path: str, handle: IO[bytes]) -> Listing:
    """An uncompressed tar: each member's data offset and size, read in place later."""
    files: dict[str, Entry] = {}
    folders: set[str] = set()
    rejects: list[dict] = []
    try:
        # Plain tar: members are read in place by offset later, nothing is copied.
        archive = tarfile.open(fileobj=handle, mode="r:")  # noqa: SIM115 (the handle is closed)
    except (tarfile.TarError, OSError, EOFError) as error:
        raise _not_a_tar(path, error) from None
    while True:
        try:
            info = archive.next()
        except (tarfile.TarError, OSError, EOFError) as error:
            log.warning("%s ends early or is damaged (%s): members after it are missing",
                        path, error)  # fmt: skip
            break
        if info is None:  # the end blocks, or (tarfile says nothing) a header cut short
            handle.seek(archive.offset)
            if handle.read(tarfile.BLOCKSIZE).strip(b"\0"):
                log.warning("%s ends inside a member header: members after it are missing", path)
            break
        archive.members = []  # the listing is all we keep: bounded memory for huge archives
        _add_tar_member(
            info,
            path,
            files,
            folders,
            rejects,
            lambda name, i=info: Entry(name, Member(path, TAR, i.name, i.offset_data, i.size)),
        )
    return Listing(resolve(files, folders), folders, rejects, None)


class _Counting:
    """A file object that reports how much of it was read."""

    def __init__(self, raw: IO[bytes], total: int, progress: ProgressFn | None):
        self._raw, self._total, self._progress = raw, total, progress
        self.done = self._shown = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.done += len(data)
        if self._progress and self.done - self._shown >= 1 << 20:  # every MiB
            self._shown = self.done
            self._progress("unpack", self.done, self._total)
        return data

    def finish(self) -> None:
        if self._progress:
            self._progress("unpack", self._total, self._total)


def _unpack_tar(
    path: str,
    handle: IO[bytes],
    max_pixels: int,
    progress: ProgressFn | None,
    temp_dir: str,
) -> Listing:
    """A compressed tar, read once as a stream: image members are copied into one plain
    file in ``temp_dir`` (their Members point there), small label members kept in memory."""
    packed = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    # The floor: a small archive is no bomb, however well it compressed.
    budget = max(UNPACK_FLOOR, UNPACK_RATIO * packed)
    limit = members_lib.max_member_bytes(max_pixels)
    files: dict[str, Entry] = {}
    folders: set[str] = set()
    rejects: list[dict] = []
    # Numbered: several shards of a WebDataset pattern share one scratch folder.
    data_path = os.path.join(temp_dir, f"{len(os.listdir(temp_dir)):06d}.data")
    counting = _Counting(handle, packed, progress)
    try:
        # "r|*": a stream, read once front to back; a compressed tar has no cheap seeking.
        archive = tarfile.open(fileobj=counting, mode="r|*")  # noqa: SIM115 (as above)
    except (tarfile.TarError, OSError, EOFError) as error:
        raise _not_a_tar(path, error) from None

    with open(data_path, "wb") as out:
        read: list[tarfile.TarInfo] = []  # the current member, once its data is read

        def member(name: str, info: tarfile.TarInfo) -> Entry:
            if not is_image(name) and name.lower().rsplit(".", 1)[-1] not in LABEL_EXTENSIONS:
                return Entry(name, reject="not unpacked")  # neither an image nor a label
            if not is_image(name):  # a label: small, kept in memory
                if info.size > SMALL_MEMBER:
                    return Entry(name, reject=f"too large for a label ({info.size} bytes)")
                read.append(info)
                return Entry(name, data=_read_all(archive, info))
            if info.size > limit:  # rejected by the worker's size guard, never unpacked
                return Entry(name, Member(data_path, TAR, info.name, -1, info.size))
            if shutil.disk_usage(temp_dir).free < info.size + DISK_RESERVE:
                raise ChuteError(
                    f"Not enough free disk space in {temp_dir} to unpack `source`. Received: "
                    f"source={path!r}; set TMPDIR to a folder on a larger disk, or extract "
                    "the archive and convert the folder"
                )
            offset = out.tell()
            read.append(info)
            copied = _copy(archive, info, out, budget)
            if copied < info.size:  # the archive ended inside it: the worker says truncated
                raise _Truncated(Entry(name, Member(data_path, TAR, info.name, offset, info.size)))
            return Entry(name, Member(data_path, TAR, info.name, offset, info.size))

        while True:
            try:
                info = archive.next()
                if info is None:
                    break
                archive.members = []
                read.clear()
                _add_tar_member(
                    info, path, files, folders, rejects, lambda name, i=info: member(name, i)
                )
                if not read and (info.isreg() or info.type not in tarfile.SUPPORTED_TYPES):
                    _skip(archive, info, budget)  # data left unread: decompressed, counted
            except _Truncated as cut:
                files[cut.entry.name] = cut.entry
                log.warning("%s ends inside member %s: members after it are missing",
                            path, cut.entry.member.name)  # fmt: skip
                break
            except _Bomb as bomb:
                raise ChuteError(
                    f"`source` expands more than {UNPACK_RATIO}-fold ({packed} bytes packed, "
                    f"its data reaches byte {bomb.end}): a compression bomb? Received: "
                    f"source={path!r}"
                ) from None
            except ChuteError:
                raise
            except (tarfile.TarError, OSError, EOFError, ValueError) as error:
                log.warning("%s is damaged or ends early (%s): members after it are missing",
                            path, members_lib.describe_error(error))  # fmt: skip
                break
    counting.finish()
    return Listing(resolve(files, folders), folders, rejects, temp_dir)


class _Truncated(Exception):
    def __init__(self, entry: Entry):
        super().__init__(entry.name)
        self.entry = entry


def _read_all(archive: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    source = archive.extractfile(info)
    return source.read() if source is not None else b""


class _Bomb(Exception):
    """The data read reaches past the budget: the byte it reached."""

    def __init__(self, end: int):
        super().__init__(end)
        self.end = end


def _copy(archive: tarfile.TarFile, info: tarfile.TarInfo, out: IO[bytes], budget: int) -> int:
    """Copies a member's data to ``out``; returns how much there was (less: truncated).

    Raises:
        _Bomb: the data reaches past byte ``budget`` of the unpacked stream.
    """
    source = archive.extractfile(info)
    copied = 0
    if source is None:
        return 0
    try:
        while block := source.read(1 << 20):
            copied += len(block)
            if info.offset_data + copied > budget:
                raise _Bomb(info.offset_data + copied)
            out.write(block)
    except (tarfile.TarError, OSError, EOFError) as error:
        log.warning("reading %s: %s", info.name, members_lib.describe_error(error))
    return copied


def _skip(archive: tarfile.TarFile, info: tarfile.TarInfo, budget: int) -> None:
    """Reads past a member's data, unkept (what tarfile would skip unseen): a member whose
    header claims more than is there costs nothing; one whose data is really there counts
    toward the budget.

    Raises:
        _Bomb: the data reaches past byte ``budget`` of the unpacked stream.
        tarfile.TarError: the archive ends inside the member.
    """
    source = archive.extractfile(info)
    done = 0
    while source is not None and (block := source.read(1 << 20)):
        done += len(block)
        if info.offset_data + done > budget:
            raise _Bomb(info.offset_data + done)
