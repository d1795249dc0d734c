"""The one shard-writing core of a conversion, for the local converter and Beam alike.

A shard is written from its encoded records in plan order, with its record
index (:mod:`chute.format.index`) in the output's ``index/`` folder. Each
record's :func:`fate` is to be kept, dropped as a leak (a higher split already
holds its content) or rejected (the reason the encoder gave). The shard goes to
a temporary name of this attempt's own and is renamed into place when complete
(its index just before it, the same way); then its note, the shard's manifest entry plus each
record's content hash and fate, goes to ``OUT/.chute-work/NAME.json`` (see
:func:`note_path`) the same way. A re-run keeps the shards that have a note
(:func:`load_note`) and rebuilds what they hold from it; two attempts at one
shard (a Beam bundle retried beside the first) write the same bytes under
names of their own, so either may finish first.

Example:
    >>> chunk = ([0, 1], [b"\\x01" * 32, b"\\x02" * 32], [b"framed", None], [None, "truncated"])
    >>> note = write_shard("out", "train-00000-of-00001.tfrecord", [chunk],
    ...                    admit=lambda start, digests: [True] * len(digests))  # doctest: +SKIP
    >>> note["num_records"], [fate for _, fate in outcomes(note)]  # doctest: +SKIP
    (1, ['', 'truncated'])
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chute.errors import ChuteError
from chute.format import index as record_index
from chute.format import manifest, records, storage
from chute.format.splits import IndexEntry
from chute.ingest.layout import split_of

log = logging.getLogger(__name__)

# A record's fate besides a reject reason: written, or dropped because its content is
# already in a higher split (see chute.ingest.split.LeakGuard).
KEPT, LEAK = "", "leak"
NO_DIGEST = bytes(32)  # in a note's digests, where a record has no content hash
# Encoded records, by column: their targets (a class, or a records.Target), content
# sha256s, framed records and reject reasons (None where encoded).
Chunk = tuple[list[int | records.Target], list[bytes | None], list[bytes | None], list[str | None]]


def fate(reject: str | None, admit: Callable[[], bool]) -> str:
    """What becomes of an encoded record: its ``reject`` reason; else :data:`KEPT`, or
    :data:`LEAK` when ``admit()`` says a higher split already holds its content
    (asked only of a record that was encoded).

    Example:
        >>> fate("truncated", lambda: True), fate(None, lambda: True), fate(None, lambda: False)
        ('truncated', '', 'leak')
    """
    # A rejected record was never encoded: there is nothing to weigh against the other splits.
    if reject is not None:
        return reject
    return KEPT if admit() else LEAK


def rejected(outcome: str) -> bool:
    """Whether a fate in a note is a reject reason (the record is in no shard, and was
    never weighed against the other splits).

    Example:
        >>> rejected(KEPT), rejected(LEAK), rejected("not an image")
        (False, False, True)
    """
    return outcome not in (KEPT, LEAK)


def write_shard(
    output: str,
    name: str,
    chunks: Iterable[Chunk],
    *,
    admit: Callable[[int, list[bytes | None]], list[bool]],
) -> dict:
    """Writes shard ``name`` into ``output`` (whose work folder exists), then its note.

    Args:
        output: the output folder.
        name: the shard's file name (``train-00000-of-00016.tfrecord``).
        chunks: the shard's encoded records in record order, in chunks: each chunk is
            four lists (targets, content sha256s, framed records, reject reasons: see
            :data:`Chunk`), written as one piece.
        admit: ``admit(start, sha256s)``: for the chunk's records from position
            ``start`` in the shard (None for a rejected record), whether each stays in
            its split (False: a higher split holds its content).

    Returns:
        The note: the shard's manifest entry, its ``split`` and what :func:`outcomes`
        reads back: each record's content sha256 (``digests``, base64, 32 bytes each;
        ``missing``: positions with none) and the fate of each record not kept (``fates``).
    """
    attempt = uuid.uuid4().hex  # a retried Beam bundle may run beside the first attempt
    digests: list[bytes] = []  # of each record, kept or not (NO_DIGEST where none)
    fates: dict[str, str] = {}  # position -> fate, for every record not kept
    missing: list[int] = []  # positions of records with no content hash
    with ShardWriter(
        storage.join(output, name),
        tmp_dir=storage.join(output, manifest.WORK_DIR),
        tmp_name=f"{name}.{attempt}.partial",
    ) as writer:
        for targets, hashes, framed, rejects in chunks:
            start = len(digests)  # the chunk's first position in the shard
            if any(reject is not None for reject in rejects):
                weighed = [None if reject else h for h, reject in zip(hashes, rejects, strict=True)]
            else:
                weighed = hashes
            keep = admit(start, weighed)
            if all(keep) and weighed is hashes:  # every record encoded and kept: in one piece
                digests += hashes
                writer.write(b"".join(framed), targets, lengths=[len(r) for r in framed])
                continue
            kept, labels = [], []
            for offset, (target, digest, record, reject) in enumerate(
                zip(targets, hashes, framed, rejects, strict=True)
            ):
                if digest is None:
                    missing.append(start + offset)
                digests.append(digest or NO_DIGEST)
                outcome = fate(reject, lambda offset=offset, keep=keep: keep[offset])
                if outcome == KEPT:
                    kept.append(record)
                    labels.append(target)
                else:
                    fates[str(start + offset)] = outcome
            writer.write(b"".join(kept), labels)
    note = dict(
        writer.info,
        split=split_of(name),
        digests=base64.b64encode(b"".join(digests)).decode(),
        missing=missing,
        fates=fates,
    )
    # The note last: its presence is what a re-run takes as proof of a finished shard.
    # Not synced: lost or cut short in a crash, it only has its shard written again.
    _write_atomic(note_path(output, name), json.dumps(note).encode(), attempt)
    return note


def outcomes(note: dict) -> Iterator[tuple[bytes | None, str]]:
    """Each record's content sha256 (None where it has none) and fate, in shard order,
    from a shard's note.

    Example:
        >>> note = {"digests": base64.b64encode(bytes(64)).decode(), "missing": [1],
        ...         "fates": {"1": "truncated"}}
        >>> [(digest is not None, fate) for digest, fate in outcomes(note)]
        [(True, ''), (False, 'truncated')]
    """
    digests = base64.b64decode(note["digests"])
    missing = set(note["missing"])
    fates = note["fates"]
    for position in range(len(digests) // len(NO_DIGEST)):
        digest = digests[position * 32 : position * 32 + 32]
        yield (None if position in missing else digest), fates.get(str(position), KEPT)


def hex_digests(note: dict) -> list[str]:
    """Each record's content sha256 in hex (``"None"`` where it has none), in shard
    order, from a shard's note: the converter's fingerprint writes them so.

    Example:
        >>> note = {"digests": base64.b64encode(bytes(64)).decode(), "missing": [1]}
        >>> [len(shown) for shown in hex_digests(note)]
        [64, 4]
    """
    text = base64.b64decode(note["digests"]).hex()
    shown = [text[start : start + 64] for start in range(0, len(text), 64)]
    for position in note["missing"]:
        shown[position] = "None"
    return shown


def note_path(output: str, name: str) -> str:
    """Where the note of shard ``name`` is kept while a conversion runs.

    Example:
        >>> note_path("gs://b/out", "val-00000-of-00004.tfrecord")
        'gs://b/out/.chute-work/val-00000-of-00004.tfrecord.json'
    """
    return storage.join(output, manifest.WORK_DIR, name + ".json")


def read_note(output: str, name: str) -> dict:
    """The note of shard ``name``, as written."""
    return json.loads(storage.read_bytes(note_path(output, name)))


def load_note(output: str, name: str, *, check_sha256: bool = True) -> dict | None:
    """The note of a shard finished by an earlier run, if the shard and its record index
    are really there, with the sizes and (unless not ``check_sha256``: a shard renamed
    into place before its note was written, on a bucket) the sha256s the note recorded;
    else None (a note of a chute that wrote no index too: the shard is written again)."""
    shard = storage.join(output, name)
    if not (storage.exists(note_path(output, name)) and storage.exists(shard)):
        return None
    try:
        info = read_note(output, name)
    except ValueError:  # cut short by a crash (notes are not synced): the shard is redone
        log.warning("the note of %s is damaged: writing the shard again", name)
        return None
    index_path = record_index.index_path(output, record_index.index_name(name))
    # "digests": a note in the form this chute writes (an older one is written again)
    if "index" not in info or "digests" not in info or not storage.exists(index_path):
        return None
    try:
        entry = manifest.Shard.from_dict(info, note_path(output, name))
    except ChuteError:  # a note not as written is no proof of the shard: write it again
        return None
    # Sizes first: cheap, and they catch a shard cut short without reading it.
    if entry.index is None or storage.size(shard) != entry.bytes:
        return None
    if storage.size(index_path) != record_index.size_for(entry.records):
        return None
    if not check_sha256:
        return info
    if record_index.sha256(storage.read_bytes(index_path)) != entry.index.sha256:
        log.warning("%s differs from what was written (sha256): writing it again", index_path)
        return None
    digest = hashlib.sha256()
    with storage.open_file(shard, "rb") as handle:
        # 8 MiB at a time: the shard is hashed without holding it in memory.
        while block := handle.read(8 << 20):
            digest.update(block)
    if digest.hexdigest() != entry.sha256:
        log.warning("%s differs from what was written (sha256): writing it again", name)
        return None
    return info


def _write_atomic(path: str, data: bytes, attempt: str) -> None:
    """Writes ``data`` under this attempt's temporary name, then renames it to ``path``
    (not synced: a note cut short by a crash only has its shard written again)."""
    tmp = f"{path}.{attempt}.tmp"
    with storage.open_file(tmp, "wb") as handle:
        handle.write(data)
    storage.rename(tmp, path)


class ShardWriter:
    """Writes one shard under a temporary name and renames it when complete.

    Records arrive already framed (see :mod:`chute.format.records`). The
    writer keeps the sha256, size, record count and per-class counts the
    manifest needs, and each record's length: when the shard is complete, its
    record index (:mod:`chute.format.index`) is written the same way into the
    ``index/`` folder beside it (a temporary name, renamed into place just before
    the shard). On an error inside the ``with`` block the partial file is
    deleted; on success its data reach the disk before the rename.

    The temporary file is ``tmp_dir/NAME.partial`` (beside the shard without
    ``tmp_dir``), or ``tmp_name`` there: a name of its own per attempt lets two
    writers of the same shard (a Beam bundle retried while the first attempt
    still runs) finish in either order, each renaming identical bytes into place.

    Example:
        >>> with ShardWriter("ram://out/train-00000-of-00001.tfrecord") as w:  # doctest: +SKIP
        ...     w.write(framed, labels=[0, 1])
        >>> w.info["num_records"]  # doctest: +SKIP
        2
    """

    def __init__(self, path: str, *, tmp_dir: str | None = None, tmp_name: str | None = None):
        self.path = path
        name = storage.basename(path)
        tmp_name = tmp_name or name + ".partial"
        self._tmp = storage.join(tmp_dir, tmp_name) if tmp_dir else path[: -len(name)] + tmp_name
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._class_counts: collections.Counter[int] = collections.Counter()
        self._records = 0
        self._lengths: list[int] = []  # of each record, for the index
        self._handle: Any = None
        self.info: dict[str, Any] = {}

    def __enter__(self) -> ShardWriter:
        self._handle = storage.open_file(self._tmp, "wb")
        self._handle.write(b"")  # GFile creates the file on the first write, even an empty one
        return self

    def write(
        self,
        framed: bytes,
        labels: list[int | records.Target],
        *,
        lengths: list[int] | None = None,
    ) -> None:
        """Appends framed records whose labels are ``labels`` (a class each, or a
        :class:`~chute.format.records.Target`: a multi-label image counts for each label);
        ``lengths``: each framed record's length, when the caller has them (else read
        from the frames)."""
        self._handle.write(framed)
        if lengths is None:
            self._lengths += record_index.frame_lengths(framed)
        else:
            self._lengths += [length - records.FRAME_OVERHEAD for length in lengths]
        self._hash.update(framed)
        self._bytes += len(framed)
        self._records += len(labels)
        if all(type(label) is int for label in labels):  # single-label: counted in one call
            self._class_counts.update(labels)
            return
        for label in labels:
            self._class_counts.update(records.classes_in(label))

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._handle.close()
            storage.remove_if_exists(self._tmp)
            return
        storage.sync(self._handle)
        self._handle.close()
        index = record_index.RecordIndex.from_lengths(self._lengths).to_bytes()
        index_tmp = self._tmp.removesuffix(".partial") + record_index.SUFFIX + ".partial"
        name = storage.basename(self.path)
        location = storage.dirname(self.path)
        index_path = record_index.index_path(location, record_index.index_name(name))
        try:
            with storage.open_file(index_tmp, "wb") as handle:
                handle.write(index)
                storage.sync(handle)
            storage.makedirs(record_index.folder(location))
            storage.rename(index_tmp, index_path)
        except BaseException:
            storage.remove_if_exists(index_tmp)
            storage.remove_if_exists(self._tmp)
            raise
        # The shard after its index: a shard in place always has its index beside it.
        storage.rename(self._tmp, self.path)
        self.info = {
            "file": name,
            "num_records": self._records,
            "bytes": self._bytes,
            "sha256": self._hash.hexdigest(),
            "class_counts": manifest.sparse_counts(self._class_counts),
            "index": IndexEntry(
                record_index.index_name(name), record_index.sha256(index)
            ).to_dict(),
        }
