"""A manifest's splits and their shards as typed records, parsed and checked once.

``manifest.json`` stores each split as ``{"num_examples", "class_counts", "shards"}``
and each shard as ``{"file", "num_records", "bytes", "sha256", "class_counts",
"index"}``. :func:`parse_split` checks such an object (one error naming the field,
``splits.train.shards[2].sha256``, what it must be and what it holds) and returns a
:class:`Split` of :class:`Shard` records; ``to_dict`` gives the same object back, key
for key, so a manifest read and written again is the same bytes. The records are also
read-only mappings over that object (``split["shards"]``, ``dict(shard)``) for code
written against manifest dicts; code outside ``chute.format`` reads the attributes.

Example:
    >>> shard = {"file": "train-00000-of-00001.tfrecord", "num_records": 3, "bytes": 60,
    ...          "sha256": "0" * 64, "class_counts": {"classes": [1], "counts": [3]}}
    >>> split = parse_split({"num_examples": 3, "class_counts": [0, 3], "shards": [shard]},
    ...                     "manifest.json", "splits.train", ["a", "b"])
    >>> split.shards[0].records, split.shards[0].dense_counts(2), split.to_dict()["shards"] == [shard]
    (3, [0, 3], True)
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chute import checks
from chute.errors import ChuteError

MISSING = object()  # a field that is not there, as bad() shows it
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Stored(Mapping):
    """A record that is also a read-only mapping over its stored (JSON) form, for code
    written against manifest dicts: ``manifest.splits["train"]["shards"][0]["file"]``,
    ``"index" in shard``, ``dict(split)`` keep working. chute itself reads the
    attributes (a test keeps key lookups out of the code outside ``chute.format``)."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    # Records compare by their fields (as dataclasses do), a record and a plain mapping by
    # the stored form (as mappings do): a manifest's split still equals its JSON object.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Stored):
            return type(self) is type(other) and _compared(self) == _compared(other)
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        # Hashed like it compares, so equal records are one key in a dict or set.
        return hash(_compared(self))


def _compared(record: Any) -> tuple:
    """A record's fields that equality compares (a dataclass's ``compare=True`` ones)."""
    return tuple(getattr(record, f.name) for f in dataclasses.fields(record) if f.compare)


@dataclasses.dataclass(frozen=True, eq=False)  # equality: see _Stored
class IndexEntry(_Stored):
    """A shard's record index (see :mod:`chute.format.index`): its file name in the
    dataset's ``index/`` folder and the sha256 of its bytes."""

    file: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """The stored form: ``{"file": ..., "sha256": ...}``."""
        return {"file": self.file, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True, eq=False)  # equality: see _Stored
class Shard(_Stored):
    """One shard of a split.

    Attributes:
        name: its file name, inside the dataset's folder.
        records: how many records it holds.
        bytes: its size.
        sha256: the hex sha256 of its bytes.
        class_counts: ``(label, count)`` of the classes it holds, ascending.
        index: its record index, or None for a dataset converted before chute wrote them
            (``chute index`` adds them).
        listed: stored as a list of every class's count (manifest version 2), written
            back the same way.
    """

    name: str
    records: int
    bytes: int
    sha256: str
    class_counts: tuple[tuple[int, int], ...]
    index: IndexEntry | None = None
    listed: bool = dataclasses.field(default=False, compare=False, repr=False)
    version: int = 1  # the dataset version that added it (``chute convert --append``)

    @classmethod
    def from_dict(cls, stored: Any, where: str = "the shard's entry") -> Shard:
        """A shard from its stored object (a manifest's, or the shard writer's ``info``),
        checked; its labels are checked against the class names by :func:`parse_split`."""
        return parse_shard(stored, where, "shard", None)

    def dense_counts(self, num_classes: int) -> list[int]:
        """Every class's count, in label order."""
        dense = [0] * num_classes
        for label, count in self.class_counts:
            dense[label] = count
        return dense

    def to_dict(self) -> dict[str, Any]:
        """The stored form, key for key as the shard writer writes it."""
        # Written back as it was read: the record still equals its stored object (see _Stored).
        if self.listed:
            counts: Any = [count for _, count in self.class_counts]
        else:
            counts = {
                "classes": [label for label, _ in self.class_counts],
                "counts": [count for _, count in self.class_counts],
            }
        out = {
            "file": self.name,
            "num_records": self.records,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "class_counts": counts,
        }
        if self.index is not None:
            out["index"] = self.index.to_dict()
        if self.version != 1:  # the first version's shards say nothing: as before versions
            out["version"] = self.version
        return out


@dataclasses.dataclass(frozen=True, eq=False)  # equality: see _Stored
class Split(_Stored):
    """One split: its record count, every class's count (label order) and its shards
    (read by key, ``split["shards"]`` is the list of :class:`Shard` records)."""

    examples: int
    class_counts: tuple[int, ...]
    shards: tuple[Shard, ...]

    @classmethod
    def of(cls, shards: Sequence[Shard], num_classes: int) -> Split:
        """The split of these shards: their records and class counts summed."""
        totals = [0] * num_classes
        for shard in shards:
            for label, n in shard.class_counts:
                totals[label] += n
        return cls(sum(shard.records for shard in shards), tuple(totals), tuple(shards))

    def fingerprint(self) -> str:
        """What identifies the split's data: a sha256 (hex, 16 digits) of its shards' names,
        record counts and sha256s, in order; any change of a record changes it.

        Example:
            >>> shard = Shard("train-00000-of-00001.tfrecord", 3, 60, "0" * 64, ((1, 3),))
            >>> Split.of([shard], 2).fingerprint()
            '98add0a014ec88c1'
        """
        digest = hashlib.sha256()
        for shard in self.shards:
            digest.update(f"{shard.name}\0{shard.records}\0{shard.sha256}\n".encode())
        return digest.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "num_examples": self.examples,
            "class_counts": list(self.class_counts),
            "shards": [shard.to_dict() for shard in self.shards],
        }

    def __getitem__(self, key: str) -> Any:  # see _Stored: the shards stay records
        if key == "shards":
            return list(self.shards)
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("num_examples", "class_counts", "shards"))

    def __len__(self) -> int:
        return 3


def bad(where: str, field: str, value: Any, allowed: str) -> ChuteError:
    """The error for a manifest field that is not what chute writes: it names the file,
    the field, what it must be and what it holds (or that it is missing)."""
    # At most 200 characters: a hand-edited list of thousands of counts would flood the message.
    received = f"{field} is missing" if value is MISSING else f"{field}={value!r:.200}"
    return ChuteError(
        f"{where} is not a valid chute manifest: `{field}` must be {allowed}. "
        f"Received: {received}. Correct it, or convert the dataset again"
    )


def check_shard_file(name: Any, field: str = "file", where: str = "manifest.json") -> str:
    """A shard's file name from a manifest, refused unless it is a plain name inside the
    dataset's folder: a downloaded manifest must not make chute open ``/etc/passwd`` or
    ``../other/...``.

    Example:
        >>> check_shard_file("train-00000-of-00004.tfrecord")
        'train-00000-of-00004.tfrecord'
        >>> check_shard_file("../other/train.tfrecord")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: manifest.json is not a valid chute manifest: `file` must be a file name inside the dataset's folder (no '/', '\\', '..' or drive). Received: file='../other/train.tfrecord'. Correct it, or convert the dataset again
    """  # noqa: E501
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        # "\0": a NUL would cut the path short in the C functions that open it.
        and not any(sep in name for sep in ("/", "\\", "\0"))
        # A drive letter would make an absolute Windows path out of a plain join.
        and not re.match(r"^[A-Za-z]:", name)
    )
    if not plain:
        allowed = "a file name inside the dataset's folder (no '/', '\\', '..' or drive)"
        raise bad(where, field, MISSING if name is None else name, allowed)
    return name


def parse_split(entry: Any, where: str, field: str, names: list[str]) -> Split:
    """A split's stored object as a :class:`Split`, or one error naming the field.

    Args:
        entry: the stored object.
        where: the manifest's file, for messages.
        field: the split's field (``splits.train``), for messages.
        names: the manifest's class names (labels are checked against them).
    """
    if not isinstance(entry, dict):
        raise bad(where, field, entry, "an object")
    examples = count(where, f"{field}.num_examples", entry.get("num_examples", MISSING))
    counts = listed_counts(
        where, f"{field}.class_counts", entry.get("class_counts", MISSING), names
    )
    shards = entry.get("shards", MISSING)
    if not isinstance(shards, list):
        raise bad(where, f"{field}.shards", shards, "a list of shard entries")
    parsed = tuple(
        parse_shard(shard, where, f"{field}.shards[{number}]", names)
        for number, shard in enumerate(shards)
    )
    return Split(examples, tuple(counts), parsed)


def parse_shard(shard: Any, where: str, field: str, names: list[str] | None) -> Shard:
    """A shard's stored object as a :class:`Shard` (see :func:`parse_split`; ``names``
    None: labels unchecked)."""
    if not isinstance(shard, dict):
        raise bad(where, field, shard, "a shard entry (an object)")
    name = check_shard_file(shard.get("file"), f"{field}.file", where)
    records, size = (
        count(where, f"{field}.{k}", shard.get(k, MISSING)) for k in ("num_records", "bytes")
    )
    digest = shard.get("sha256", MISSING)
    # Lowercase only: the sha256s are compared as strings, and chute writes them lowercase.
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise bad(where, f"{field}.sha256", digest, "the shard's sha256 (64 lowercase hex digits)")
    stored = shard.get("class_counts", MISSING)
    listed = isinstance(stored, list)  # version 2: every class's count
    if listed:
        dense = listed_counts(where, f"{field}.class_counts", stored, names)
        pairs = tuple(enumerate(dense))
    else:
        pairs = _sparse_counts(where, f"{field}.class_counts", stored, names)
    index = shard.get("index")
    if index is not None:
        index_digest = index.get("sha256", MISSING) if isinstance(index, dict) else None
        if not isinstance(index_digest, str) or not _SHA256.fullmatch(index_digest):
            allowed = "a record index entry ({'file': ..., 'sha256': 64 lowercase hex digits})"
            raise bad(where, f"{field}.index", index, allowed)
        index = IndexEntry(
            check_shard_file(index.get("file"), f"{field}.index.file", where), index_digest
        )
    version = shard.get("version", 1)
    if not checks.is_int(version) or version < 1:
        raise bad(where, f"{field}.version", version, "a dataset version (an integer >= 1)")
    return Shard(name, records, size, digest, pairs, index, listed, int(version))


def count(where: str, field: str, value: Any) -> int:
    """``value`` if it is a count (an integer >= 0), else the error naming ``field``."""
    if not checks.is_int(value) or value < 0:
        raise bad(where, field, value, "a count (an integer >= 0)")
    return int(value)


def listed_counts(where: str, field: str, value: Any, names: list[str] | None) -> list[int]:
    """A count per class, in label order: as many as there are class names."""
    if not isinstance(value, list) or not checks.all_ints(value, minimum=0):
        wanted = "" if names is None else f" {len(names)}"
        raise bad(where, field, value, f"a list of{wanted} counts, one per class name")
    if names is not None and len(value) != len(names):
        raise bad(
            where,
            field,
            value,
            f"one count per class name: class_names has {len(names)} names, this "
            f"{len(value)} counts (the class names and the records' labels disagree)",
        )
    return [int(c) for c in value]


def _sparse_counts(
    where: str, field: str, value: Any, names: list[str] | None
) -> tuple[tuple[int, int], ...]:
    """A shard's stored class counts (``{"classes": [...], "counts": [...]}``), with labels
    that have a class name, as ``(label, count)`` pairs."""
    allowed = "{'classes': [labels], 'counts': [a count per label]}"
    if not isinstance(value, dict):
        raise bad(where, field, value, allowed)
    labels, counts = value.get("classes", MISSING), value.get("counts", MISSING)
    if not isinstance(labels, list) or not checks.all_ints(labels):
        raise bad(where, f"{field}.classes", labels, "a list of labels")
    # A label twice would count its class twice in the split's totals.
    if len(set(labels)) != len(labels):
        raise bad(where, f"{field}.classes", labels, "a list of distinct labels")
    outside = names is not None and labels and not 0 <= min(labels) <= max(labels) < len(names)
    beyond = [label for label in labels if not 0 <= label < len(names)] if outside else []
    if beyond:
        raise bad(
            where,
            f"{field}.classes",
            labels,
            f"labels from 0 to {len(names) - 1}: class_names has {len(names)} names, so label "
            f"{beyond[0]} has none (the class names and the records' labels disagree)",
        )
    if (
        not isinstance(counts, list)
        or len(counts) != len(labels)
        or not checks.all_ints(counts, minimum=0)
    ):
        raise bad(where, f"{field}.counts", counts, f"{len(labels)} counts, one per label")
    return tuple(zip(map(int, labels), map(int, counts), strict=True))
