"""Images inside archives: the payload a worker reads, and the guards on its size.

A :class:`Member` names one file inside a zip or tar archive. It is a small
picklable tuple, so worker processes get it in their tasks and read the
member themselves: a zip member through :mod:`zipfile` (one open ``ZipFile``
per archive is kept in each process), a tar member by its offset and size
with plain file reads (tar stores members uncompressed, one after the other;
a compressed tar is unpacked once while scanning, see
:mod:`.archives`).

Nothing is read before its declared size passes two guards, so a
decompression bomb is rejected without filling memory: a member larger than
any image of ``max_pixels`` pixels could be (8 bytes a pixel, 16-bit RGBA
uncompressed, plus 1 MiB of headers), and a zip member over 16 MiB that
expands more than 100-fold (images are compressed already; a bomb is a run
of zeros).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import zipfile
from collections.abc import Iterator
from typing import IO, NamedTuple

from chute.format import storage
from chute.image.header import Rejected, describe_error

ZIP, TAR = "zip", "tar"
BYTES_PER_PIXEL = 8  # 16-bit RGBA, uncompressed: the most any supported image file needs
HEADER_SLACK = 1 << 20  # headers, palettes, metadata
BOMB_RATIO = 100  # a zip member expanding more than this much is no image ...
BOMB_FLOOR = 16 << 20  # ... once it is larger than this (a small blank BMP may compress well)
_OPEN_ZIPS = 4  # zip archives kept open per process


class Member(NamedTuple):
    """One file inside an archive, as workers read it.

    ``kind`` is ``"zip"`` (``offset`` is the member's local header offset,
    which tells members of the same name apart) or ``"tar"`` (``size`` bytes
    at ``offset`` in ``container``; -1 when the member was too large to be
    unpacked from a compressed tar).

    Example:
        >>> Member("data.tar", "tar", "cats/1.png", 1536, 912).size
        912
    """

    container: str
    kind: str
    name: str
    offset: int
    size: int


class MemberError(Rejected):
    """A member that cannot be read; the message is the reason (the reject).

    A :class:`~chute.image.header.Rejected`, so that a member failing while its
    image header is read rejects the item with this reason."""


def max_member_bytes(max_pixels: int) -> int:
    """The largest member read: what an image of ``max_pixels`` pixels can take.

    Example:
        >>> max_member_bytes(1000)
        1056576
    """
    return BYTES_PER_PIXEL * max_pixels + HEADER_SLACK


def check_size(size: int, packed: int | None, max_pixels: int) -> None:
    """Refuses a member whose declared size is no image's (``packed``: its compressed
    size in a zip, None for tar), before anything of it is read.

    Raises:
        MemberError: too large for ``max_pixels``, or a compression bomb.
    """
    limit = max_member_bytes(max_pixels)
    # Checked before anything is read: the sizes come from the archive's own headers.
    if size > limit:
        raise MemberError(
            f"archive member too large: {size} bytes > {limit}, the most an image within "
            f"max_pixels {max_pixels} can take"
        )
    if packed is not None and size > BOMB_FLOOR and size > BOMB_RATIO * max(packed, 1):
        raise MemberError(
            f"archive member expands {size // max(packed, 1)}-fold ({packed} -> {size} bytes): "
            "a compression bomb, not an image"
        )


def read_member(member: Member, max_pixels: int) -> bytes:
    """The whole content of ``member``, after the size guards.

    Raises:
        MemberError: the member is too large, truncated, corrupt or unreadable.

    Example:
        >>> read_member(Member("data.zip", "zip", "cats/1.png", 0, 912), 10**6)  # doctest: +SKIP
        b'\\x89PNG...'
    """
    if member.kind == TAR:
        _check_tar(member, max_pixels)
        try:
            with storage.open_file(member.container) as handle:
                handle.seek(member.offset)
                data = handle.read(member.size)
        except OSError as error:
            raise MemberError(f"cannot read archive member: {describe_error(error)}") from None
        if len(data) < member.size:
            raise _truncated(member, len(data))
        return data
    with open_member(member, max_pixels) as (handle, _):
        return handle.read()


@contextlib.contextmanager
def open_member(member: Member, max_pixels: int) -> Iterator[tuple[IO[bytes], int]]:
    """A file object over ``member`` (read lazily: a header costs a header) and its size.

    Raises:
        MemberError: the member fails a guard, or cannot be opened.
    """
    try:
        if member.kind == ZIP:
            archive, info = _zip_info(member)
            check_size(info.file_size, info.compress_size, max_pixels)
            # Bit 0 of the zip flags marks an encrypted member.
            if info.flag_bits & 0x1:
                raise MemberError("encrypted archive member: chute reads no passwords")
            handle: IO[bytes] = io.BufferedReader(_Checked(archive.open(info)))
            size = info.file_size
        else:
            _check_tar(member, max_pixels)
            raw = storage.open_file(member.container)
            end = raw.seek(0, os.SEEK_END)
            # The archive shrank or was cut since the scan: said now, not as a short image later.
            if member.offset + member.size > end:
                raw.close()
                raise _truncated(member, max(0, end - member.offset))
            handle, size = io.BufferedReader(_Window(raw, member.offset, member.size)), member.size
    except MemberError:
        raise
    except Exception as error:  # a bad local header, an unknown compression method, ...
        raise MemberError(f"cannot read archive member: {describe_error(error)}") from None
    try:
        yield handle, size
    finally:
        handle.close()


def _check_tar(member: Member, max_pixels: int) -> None:
    check_size(member.size, None, max_pixels)
    if member.offset < 0:  # too large to unpack, so too large for the guard above
        raise MemberError("archive member was not unpacked")


def _truncated(member: Member, got: int) -> MemberError:
    return MemberError(
        f"truncated archive member: the archive ends {got} bytes into its {member.size}"
    )


# Per process: container -> (its size and mtime when opened, the ZipFile, its file object,
# the members by local header offset), the most recently used last.
_zips: collections.OrderedDict[str, tuple] = collections.OrderedDict()


def _zip_info(member: Member) -> tuple[zipfile.ZipFile, zipfile.ZipInfo]:
    """The open archive holding ``member`` (opened once per process) and its entry."""
    stamp = None
    if storage.is_local(member.container):
        stat = os.stat(storage.local_path(member.container))
        # A changed file on disk is opened again: the cached ZipFile would read stale offsets.
        stamp = (stat.st_size, stat.st_mtime_ns)
    cached = _zips.get(member.container)
    if cached is None or cached[0] != stamp:
        if cached is not None:
            _close(_zips.pop(member.container))
        handle = storage.open_file(member.container)
        try:
            archive = zipfile.ZipFile(handle)
        except Exception:
            handle.close()
            raise
        infos = {info.header_offset: info for info in archive.infolist()}
        cached = _zips[member.container] = (stamp, archive, handle, infos)
        # Least recently used closed first: a worker keeps few archives open, however many it reads.
        while len(_zips) > _OPEN_ZIPS:
            _close(_zips.popitem(last=False)[1])
    _zips.move_to_end(member.container)
    info = cached[3].get(member.offset)
    if info is None or info.filename != member.name:
        raise MemberError(f"the archive changed since it was scanned: no member {member.name!r}")
    return cached[1], info


def _close(cached: tuple) -> None:
    cached[1].close()
    cached[2].close()


class _Checked(io.RawIOBase):
    """A zip member's stream whose decompression errors (bad CRC, damaged deflate data,
    data ending early) are :class:`MemberError`: the archive's fault, not the image's."""

    def __init__(self, inner: IO[bytes]):
        super().__init__()
        self._inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._inner.tell()

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        try:
            return self._inner.seek(position, whence)
        except Exception as error:  # seeking back decompresses again
            raise MemberError(f"corrupt archive member: {describe_error(error)}") from None

    def readinto(self, buffer: bytearray | memoryview) -> int:
        try:
            data = self._inner.read(len(buffer))
        except Exception as error:  # zipfile: bad CRC, zlib errors, data ending early
            raise MemberError(f"corrupt archive member: {describe_error(error)}") from None
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()


class _Window(io.RawIOBase):
    """``size`` bytes at ``offset`` of ``raw``, as a file of their own (seekable)."""

    def __init__(self, raw: IO[bytes], offset: int, size: int):
        super().__init__()
        self._raw, self._start, self._size, self._position = raw, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(0, base + position)
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:
        count = min(len(buffer), self._size - self._position)
        if count <= 0:
            return 0
        # Seeked before every read: seek() above moves only the window's own position.
        self._raw.seek(self._start + self._position)
        data = self._raw.read(count)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
