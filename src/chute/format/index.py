"""The record index: where each record of a shard starts, for random access.

TFRecord has no index, so a reader can only go through a shard from its
start. For each shard, conversion (and ``chute index``, for a dataset
converted before) writes its index into the dataset's ``index/`` folder:
``OUT/index/train-00000-of-00016.index`` for ``OUT/train-00000-of-00016.tfrecord``.
A dataset folder is a public format: readers with no chute code glob its
shards (``train-*``, ``*-of-*``, ``*.tfrecord``, ``list_files(OUT + "/train*")``,
``**/*.tfrecord``), and an index beside the shards, under the shard's own
prefix, would be opened as a TFRecord (``DataLossError: corrupted record at
0``). Inside ``index/`` no such glob reaches it. :func:`index_path` is the one
place that says where an index is written, :func:`find` where one is read.

Datasets written by chute before this layout hold each index beside its shard
(``OUT/train-00000-of-00016.index``): :func:`find` reads it there, and
``chute index`` moves it into ``index/``. The name is the shard's with
``.index`` for ``.tfrecord`` (not ``...tfrecord.index``: a name that starts with
another file's whole name confuses prefix-matching filesystems such as
TensorFlow's ``ram://``). The manifest's shard entry names it with its sha256
(``"index": {"file": ..., "sha256": ...}``, ``file`` the plain name, in either
layout; an entry without ``index`` is a shard that has none). The shard itself
stays a standard TFRecord file, byte for byte.

The index is a fixed little-endian binary layout (32 + 16 × N bytes)::

    offset  size  field
    0       8     magic b"CHUTEIDX"
    8       4     version (uint32, 1)
    12      4     reserved (uint32, 0)
    16      8     N, the shard's record count (uint64)
    24      8     the shard's size in bytes (uint64)
    32      16 N  per record, in order: offset (uint64) of its frame, length (uint64)
                  of the record (the frame's length field: the frame is length + 16
                  bytes, with the length, its CRC and the data's CRC)

Records are contiguous, so record ``i + 1`` starts at ``offset + length + 16`` of
record ``i``, the first at 0, and the last ends at the shard's size;
:meth:`RecordIndex.from_bytes` checks it. The same shard always gives the same
index bytes.

Example:
    >>> from chute.format import records
    >>> shard = records.frame(b"first") + records.frame(b"second record")
    >>> index = RecordIndex.from_lengths([5, 13])
    >>> index.offsets.tolist(), index.lengths.tolist(), index.shard_bytes == len(shard)
    ([0, 21], [5, 13], True)
    >>> RecordIndex.from_bytes(index.to_bytes()) == index
    True
    >>> len(index.to_bytes())
    64
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from chute.errors import ChuteError
from chute.format import records, storage

if TYPE_CHECKING:
    from chute.format.splits import Shard

SUFFIX = ".index"
SHARD_SUFFIX = ".tfrecord"
FOLDER = "index"  # the folder of a dataset's record indexes, where no shard glob reaches
MAGIC = b"CHUTEIDX"
VERSION = 1
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, reserved, records, shard bytes
HEADER_BYTES = _HEADER.size  # 32
ENTRY_BYTES = 16
_BLOCK = 8 << 20  # bytes read at a time while scanning a shard
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def index_name(shard_file: str) -> str:
    """The index file's name for shard ``shard_file`` (a name), as the manifest holds it.

    Example:
        >>> index_name("train-00000-of-00016.tfrecord")
        'train-00000-of-00016.index'
    """
    # Not name + ".index": a name starting with another file's whole name confuses ram://.
    return shard_file.removesuffix(SHARD_SUFFIX) + SUFFIX


def folder(location: str) -> str:
    """The folder of dataset folder ``location``'s record indexes.

    Example:
        >>> folder("gs://b/d")
        'gs://b/d/index'
    """
    return storage.join(location, FOLDER)


def index_path(location: str, name: str) -> str:
    """Where record index ``name`` (see :func:`index_name`) of dataset folder ``location``
    is written: the one place every writer and reader takes it from.

    Example:
        >>> index_path("gs://b/d", "val-00000-of-00001.index")
        'gs://b/d/index/val-00000-of-00001.index'
    """
    return storage.join(folder(location), name)


def old_path(location: str, name: str) -> str:
    """Where chute wrote record index ``name`` before :func:`index_path`: beside the
    shards, where their globs read it (``chute index`` moves it).

    Example:
        >>> old_path("gs://b/d", "val-00000-of-00001.index")
        'gs://b/d/val-00000-of-00001.index'
    """
    return storage.join(location, name)


def find(location: str, name: str) -> str | None:
    """The path record index ``name`` of dataset ``location`` is read from:
    :func:`index_path`, else, where only that exists, the older layout's
    :func:`old_path` (a dataset written before); None when neither exists.
    """
    # The new layout first: after `chute index` an old copy may linger beside the shards.
    for path in (index_path(location, name), old_path(location, name)):
        if storage.exists(path):
            return path
    return None


def in_old_layout(location: str, name: str) -> bool:
    """Whether record index ``name`` of dataset ``location`` is read from beside the shards
    (:func:`old_path`), where shard globs read it: ``chute index`` moves it."""
    path = find(location, name)
    return path is not None and path == old_path(location, name)


def shown(location: str, name: str, path: str | None = None) -> str:
    """Record index ``name`` as messages name it: relative to dataset ``location``, where
    it is (``path``, from :func:`find`) or else where it belongs.

    Example:
        >>> shown("d", "val.index"), shown("d", "val.index", old_path("d", "val.index"))
        ('index/val.index', 'val.index')
    """
    return name if path is not None and path == old_path(location, name) else f"{FOLDER}/{name}"


def size_for(num_records: int) -> int:
    """The size in bytes of the index of a shard of ``num_records`` records.

    Example:
        >>> size_for(0), size_for(1000)
        (32, 16032)
    """
    return HEADER_BYTES + ENTRY_BYTES * num_records


def sha256(data: bytes) -> str:
    """The hex sha256 of index bytes, as the manifest holds it."""
    return hashlib.sha256(data).hexdigest()


# eq=False: the generated __eq__ would compare arrays elementwise and fail on truth value.
@dataclasses.dataclass(frozen=True, eq=False)
class RecordIndex:
    """One shard's record offsets and lengths (uint64 arrays) and its size in bytes."""

    offsets: np.ndarray
    lengths: np.ndarray
    shard_bytes: int

    def __len__(self) -> int:
        return len(self.lengths)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RecordIndex)
            and self.shard_bytes == other.shard_bytes
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.lengths, other.lengths)
        )

    @classmethod
    def from_lengths(cls, lengths: Sequence[int] | np.ndarray) -> RecordIndex:
        """The index of contiguous records of these lengths (the frame's length fields)."""
        lengths = np.asarray(lengths, dtype=np.uint64)
        # uint64 throughout: uint64 mixed with int64 gives float64, which loses large offsets.
        ends = np.cumsum(lengths + np.uint64(records.FRAME_OVERHEAD), dtype=np.uint64)
        offsets = np.concatenate([np.zeros(1, np.uint64), ends[:-1]])
        return cls(offsets, lengths, int(ends[-1]) if len(ends) else 0)

    def to_bytes(self) -> bytes:
        """The index file's bytes (see the module docstring)."""
        header = _HEADER.pack(MAGIC, VERSION, 0, len(self), self.shard_bytes)
        # Little-endian whatever this machine is: the file has one byte order.
        entries = np.empty((len(self), 2), "<u8")
        entries[:, 0], entries[:, 1] = self.offsets, self.lengths
        return header + entries.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "the record index") -> RecordIndex:
        """Parses index bytes, checking the layout and that the records are contiguous.

        Raises:
            ChuteError: not a chute record index (``where`` names the file), or one
                written by a newer chute.
        """

        def bad(what: str) -> ChuteError:
            return ChuteError(f"{where} is not a valid chute record index: {what}")

        if len(data) < HEADER_BYTES:
            raise bad(f"it has {len(data)} bytes, fewer than its {HEADER_BYTES}-byte header")
        magic, version, _, count, shard_bytes = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise bad(f"it starts with {magic!r}, not {MAGIC!r}")
        # A newer version may change the layout: refused rather than misread.
        if version > VERSION:
            raise ChuteError(
                f"{where} was written by a newer chute (index version {version}, this chute "
                f"reads up to {VERSION}); upgrade chute"
            )
        if len(data) != size_for(count):
            raise bad(f"it has {len(data)} bytes, a {count}-record index has {size_for(count)}")
        entries = np.frombuffer(data, "<u8", offset=HEADER_BYTES).reshape(count, 2)
        index = cls(entries[:, 0].astype(np.uint64), entries[:, 1].astype(np.uint64), shard_bytes)
        # Offsets are redundant with the lengths: recomputing them catches a damaged entry.
        expected = cls.from_lengths(index.lengths)
        if expected != index:
            wrong = np.flatnonzero(expected.offsets != index.offsets)
            if len(wrong):
                raise bad(f"record {wrong[0]} does not start where record {wrong[0] - 1} ends")
            raise bad(f"its records end at byte {expected.shard_bytes}, not {shard_bytes}")
        return index


def frame_lengths(framed: bytes) -> list[int]:
    """The record lengths of whole TFRecord frames laid end to end (no CRC checked: the
    writer framed them itself).

    Raises:
        ValueError: the bytes do not end at a frame's end.

    Example:
        >>> frame_lengths(records.frame(b"ab") + records.frame(b""))
        [2, 0]
    """
    lengths, pos, end = [], 0, len(framed)
    while pos < end:
        (length,) = _U64.unpack_from(framed, pos)
        lengths.append(length)
        pos += length + records.FRAME_OVERHEAD
    if pos != end:
        raise ValueError(f"the framed bytes end inside a frame (at {end} of {pos})")
    return lengths


class _Blocks:
    """Exactly ``n`` bytes at a time from a file read in large blocks (local or gfile),
    each block also fed to ``digest``."""

    def __init__(self, handle: IO[bytes], digest: Any = None):
        self.handle, self.digest = handle, digest
        self.buffer, self.pos = b"", 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes, or fewer at the end of the file."""
        if len(self.buffer) - self.pos >= n:
            self.pos += n
            return self.buffer[self.pos - n : self.pos]
        parts, have = [self.buffer[self.pos :]], len(self.buffer) - self.pos
        self.buffer, self.pos = b"", 0
        while have < n:
            block = self.handle.read(max(_BLOCK, n - have))
            if not block:
                return b"".join(parts)
            if self.digest is not None:
                self.digest.update(block)
            parts.append(block)
            have += len(block)
        data = b"".join(parts)
        self.buffer, self.pos = data, n
        return data[:n]


def scan(handle: IO[bytes], *, where: str = "the shard", digest: Any = None) -> RecordIndex:
    """Reads a TFRecord file from its start to its end, checking every record's CRCs, and
    returns its index (one sequential pass).

    Args:
        handle: the shard, open for reading in binary (``storage.open_file``).
        where: the shard's name, for errors.
        digest: a ``hashlib`` object fed every byte read (the shard's sha256 in the
            same pass), or None.

    Raises:
        ChuteError: a record is cut short or a CRC is wrong (naming record and byte).
    """
    reader = _Blocks(handle, digest)
    lengths, offset = [], 0
    while True:
        # 12 bytes: the length (uint64) and its CRC; the data and its CRC follow.
        head = reader.take(12)
        if not head:
            break
        number = len(lengths)
        if len(head) < 12:
            raise ChuteError(f"{where} is truncated: record {number} at byte {offset} is cut short")
        (length,) = _U64.unpack_from(head)
        if _U32.unpack_from(head, 8)[0] != records.masked_crc(head[:8]):
            raise ChuteError(
                f"{where} is corrupt: the length CRC of record {number} at byte {offset} is wrong"
            )
        body = reader.take(length + 4)
        if len(body) < length + 4:
            raise ChuteError(f"{where} is truncated: record {number} at byte {offset} is cut short")
        if _U32.unpack_from(body, length)[0] != records.masked_crc(body[:length]):
            raise ChuteError(
                f"{where} is corrupt: the CRC of record {number} at byte {offset} is wrong"
            )
        lengths.append(length)
        offset += length + records.FRAME_OVERHEAD
    return RecordIndex.from_lengths(lengths)


def load(location: str, shard: Shard) -> RecordIndex:
    """The index of a manifest's shard entry, read from dataset folder ``location`` and
    checked against the entry (sha256, record count, shard size).

    Raises:
        ChuteError: the shard has no index (the message says to run ``chute index``),
            its file is missing or differs from the manifest, or it is not an index.
    """
    fix = f"run `chute index {location}` to write it"
    if shard.index is None:
        raise ChuteError(
            f"{shard.name} in {location!r} has no record index (the dataset was converted "
            f"before chute wrote them): {fix}"
        )
    name = shard.index.file
    path = find(location, name)
    where = f"{shown(location, name, path)} in {location!r}"
    if path is None:
        raise ChuteError(f"The record index {where} is missing: {fix} again")
    data = storage.read_bytes(path)
    # Checked against the manifest before parsing: an index of another conversion is refused.
    if sha256(data) != shard.index.sha256:
        raise ChuteError(
            f"The record index {where} differs from the manifest (sha256): "
            f"check the dataset with `chute verify {location}`, then {fix} again"
        )
    index = RecordIndex.from_bytes(data, where)
    if len(index) != shard.records or index.shard_bytes != shard.bytes:
        raise ChuteError(
            f"The record index {where} describes {len(index)} records in "
            f"{index.shard_bytes} bytes, the manifest {shard.records} in {shard.bytes}"
        )
    return index
