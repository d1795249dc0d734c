"""The manifest: the one description of a converted dataset.

``manifest.json`` (versioned) holds the class names in label order, the
:class:`~chute.format.spec.ImageSpec`, every split's per-class counts and shards
(file, record count, bytes, sha256, the counts of just the classes the shard
holds and its record index's file and sha256, see :mod:`chute.format.index`),
the conversion options, the source's fingerprint, and the rejected inputs and
duplicates. Exact dataset sizes come from here, and ``verify`` checks the
shards against it. It is written last, so its presence means the conversion
finished.

A shard entry's ``index`` is optional: datasets converted before chute wrote
record indexes have none (``chute index`` adds them), and a chute that does not
know the field reads the manifest as before, so it needs no new version.

Reading a manifest checks every field readers use (:func:`check_structure`), so a
hand-edited one is a single error naming the field (``splits.train.shards[2].sha256``)
rather than a traceback wherever that field is first used.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format import storage
from chute.format.spec import ImageSpec

MANIFEST_NAME = "manifest.json"
WORK_DIR = ".chute-work"  # a conversion in progress keeps its state here
FORMAT = "chute.manifest"
VERSION = 3  # 3: sparse per-shard class counts (2: a list of every class's count per shard);
# 2: the image spec holds resize, interpolation and quality (1: in options)
_NUMBER_LIST = re.compile(r"\[\s*((?:-?\d+,\s*)*-?\d+)\s*\]")


@dataclasses.dataclass
class Manifest:
    """A converted dataset's manifest.

    Example:
        >>> m = load("ram://kn-shards")  # doctest: +SKIP
        >>> m.class_names[:2], m.num_examples("train")  # doctest: +SKIP
        (['a', 'b'], 25600)
    """

    class_names: list[str]
    image: ImageSpec
    # name -> num_examples, class_counts (every class's, in label order), shards
    splits: dict[str, dict[str, Any]]
    options: dict[str, Any]
    source: dict[str, Any]  # location, kind, fingerprint, num_items
    rejects: list[dict[str, str]] = dataclasses.field(default_factory=list)
    duplicates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    created_by: str = ""
    location: str = dataclasses.field(default="", compare=False)

    @property
    def num_classes(self) -> int:
        """How many classes there are."""
        return len(self.class_names)

    def num_examples(self, split: str) -> int:
        """Records in ``split`` (0 for a split that does not exist)."""
        return int(self.splits.get(split, {}).get("num_examples", 0))

    def check_split(self, split: str) -> str:
        """``split`` if this dataset has it, else a ChuteError naming the splits it has."""
        return checks.one_of("split", split, self.splits)

    def shard_paths(self, split: str) -> list[str]:
        """Full paths of ``split``'s shards, in order."""
        self.check_split(split)
        return [storage.join(self.location, s["file"]) for s in self.splits[split]["shards"]]

    def shard_counts(self, split: str) -> list[int]:
        """Records in each of ``split``'s shards, in order."""
        self.check_split(split)
        return [s["num_records"] for s in self.splits[split]["shards"]]

    def shard_class_counts(self, shard: dict[str, Any]) -> list[int]:
        """Every class's count in one of this manifest's shard entries, in label order."""
        return dense_counts(shard["class_counts"], self.num_classes)

    def to_json(self) -> str:
        """The manifest as deterministic, human-readable JSON."""
        body = {"format": FORMAT, "version": VERSION}
        body.update({k: v for k, v in dataclasses.asdict(self).items() if k != "location"})
        text = json.dumps(body, indent=1, ensure_ascii=False)
        # Keep lists of numbers (per-class counts, sizes) on one line each.
        return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\s+", ", ", m[1]) + "]", text) + "\n"

    @classmethod
    def from_json(cls, text: str, location: str = "", *, file: str = "") -> Manifest:
        """Parses :meth:`to_json` output; rejects other formats, newer versions and fields
        that are not what chute writes (one error naming the field: see
        :func:`check_structure`).

        Args:
            text: the manifest's JSON.
            location: the dataset folder it describes.
            file: the manifest's path, for messages (``location/manifest.json`` if not given).
        """
        where = file or (storage.join(location, MANIFEST_NAME) if location else MANIFEST_NAME)
        try:
            body = json.loads(text)
        except ValueError as error:
            raise ChuteError(f"{where} is not valid JSON: {error}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ChuteError(f"{where} is not a chute manifest")
        version = body.get("version", 0)
        if not checks.is_int(version) or version < 0:
            raise _bad(where, "version", version, "a version number")
        if version > VERSION:
            raise ChuteError(
                f"{where} was written by a newer chute (manifest version "
                f"{version}, this chute reads up to {VERSION}); upgrade chute"
            )
        check_structure(body, where)
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in body.items() if k in fields}
        image = dict(values.get("image") or {})
        if version < 2:  # resize, interpolation and quality were options
            options = values.get("options") or {}
            for key in ("resize", "interpolation", "quality"):
                if key in options:
                    image.setdefault(key, options[key])
        try:
            values["image"] = ImageSpec.from_dict(image)
        except ChuteError as error:
            message = f"{where} is not a valid chute manifest: in `image`, {error}"
            raise ChuteError(message) from None
        return cls(**values, location=location)

    def save(self, directory: str) -> str:
        """Writes ``manifest.json`` atomically into ``directory``; returns its path."""
        path = storage.join(directory, MANIFEST_NAME)
        storage.write_atomic(path, self.to_json().encode("utf-8"))
        return path


_MISSING = object()  # a field that is not there, as _bad shows it


def _bad(where: str, field: str, value: Any, allowed: str) -> ChuteError:
    received = f"{field} is missing" if value is _MISSING else f"{field}={value!r:.200}"
    return ChuteError(
        f"{where} is not a valid chute manifest: `{field}` must be {allowed}. "
        f"Received: {received}. Correct it, or convert the dataset again"
    )


def check_shard_file(name: Any, field: str = "file", where: str = MANIFEST_NAME) -> str:
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
        and not any(sep in name for sep in ("/", "\\", "\0"))
        and not re.match(r"^[A-Za-z]:", name)
    )
    if not plain:
        allowed = "a file name inside the dataset's folder (no '/', '\\', '..' or drive)"
        raise _bad(where, field, _MISSING if name is None else name, allowed)
    return name


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_structure(body: dict[str, Any], where: str) -> None:
    """Refuses a manifest whose fields are not what chute writes and readers rely on:
    class names, splits, their counts and shards (file names, record counts, sizes,
    sha256s, class counts, record index files), and the report fields (rejects,
    duplicates, warnings). One error names the field (``splits.train.shards[2].sha256``),
    what it must be and what it holds, so a hand-edited manifest is no traceback in
    ``verify``, ``index`` or a reader. Labels are checked against the class names where
    the manifest holds them (per-class counts): a manifest with fewer class names than
    its records' labels is refused here. Fields a version of chute did not write are
    optional (``index``, and ``options``, ``source``, ``rejects``, ... of a hand-written
    manifest); whether counts agree with each other and with the shards is
    ``chute verify``'s to report.

    Example:
        >>> split = {"num_examples": 0, "class_counts": [0], "shards": None}
        >>> check_structure({"class_names": ["a"], "splits": {"train": split}}, "m")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: m is not a valid chute manifest: `splits.train.shards` must be a list of shard entries. Received: splits.train.shards=None. Correct it, or convert the dataset again
    """  # noqa: E501
    names = body.get("class_names", _MISSING)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _bad(where, "class_names", names, "a list of class names")
    splits = body.get("splits", _MISSING)
    if not isinstance(splits, dict) or not splits:
        raise _bad(where, "splits", splits, "an object of splits")
    for split, entry in splits.items():
        field = f"splits.{split}"
        if not isinstance(entry, dict):
            raise _bad(where, field, entry, "an object")
        _count(where, f"{field}.num_examples", entry.get("num_examples", _MISSING))
        _dense_counts(where, f"{field}.class_counts", entry.get("class_counts", _MISSING), names)
        shards = entry.get("shards", _MISSING)
        if not isinstance(shards, list):
            raise _bad(where, f"{field}.shards", shards, "a list of shard entries")
        for number, shard in enumerate(shards):
            _check_shard(where, f"{field}.shards[{number}]", shard, names)
    image = body.get("image", _MISSING)
    if not isinstance(image, dict):
        raise _bad(where, "image", image, "an image spec (an object)")
    for key in ("options", "source"):
        if not isinstance(body.get(key, {}), dict):
            raise _bad(where, key, body[key], "an object")
    rejects = body.get("rejects", [])
    if not _objects(rejects, {"key": str, "reason": str}):
        raise _bad(where, "rejects", rejects, "a list of {'key': ..., 'reason': ...} objects")
    duplicates = body.get("duplicates", [])
    if not _objects(duplicates, {"keys": list, "dropped": list}):
        allowed = "a list of {'keys': [...], 'dropped': [...]} objects"
        raise _bad(where, "duplicates", duplicates, allowed)
    warnings = body.get("warnings", [])
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise _bad(where, "warnings", warnings, "a list of texts")
    if not isinstance(body.get("created_by", ""), str):
        raise _bad(where, "created_by", body["created_by"], "a text")


def _objects(value: Any, fields: dict[str, type]) -> bool:
    """Whether ``value`` is a list of objects whose ``fields`` have these types."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and all(isinstance(item.get(k), t) for k, t in fields.items())
        for item in value
    )


def _count(where: str, field: str, value: Any) -> None:
    if not checks.is_int(value) or value < 0:
        raise _bad(where, field, value, "a count (an integer >= 0)")


def _dense_counts(where: str, field: str, value: Any, names: list[str]) -> None:
    """A count per class, in label order: as many as there are class names."""
    if not isinstance(value, list) or not all(checks.is_int(c) and c >= 0 for c in value):
        raise _bad(where, field, value, f"a list of {len(names)} counts, one per class name")
    if len(value) != len(names):
        raise _bad(
            where,
            field,
            value,
            f"one count per class name: class_names has {len(names)} names, this "
            f"{len(value)} counts (the class names and the records' labels disagree)",
        )


def _check_shard(where: str, field: str, shard: Any, names: list[str]) -> None:
    """One shard entry (see :func:`check_structure`)."""
    if not isinstance(shard, dict):
        raise _bad(where, field, shard, "a shard entry (an object)")
    check_shard_file(shard.get("file"), f"{field}.file", where)
    for key in ("num_records", "bytes"):
        _count(where, f"{field}.{key}", shard.get(key, _MISSING))
    digest = shard.get("sha256", _MISSING)
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise _bad(where, f"{field}.sha256", digest, "the shard's sha256 (64 lowercase hex digits)")
    counts = shard.get("class_counts", _MISSING)
    if isinstance(counts, list):  # version 2: every class's count
        _dense_counts(where, f"{field}.class_counts", counts, names)
    else:
        _sparse_counts(where, f"{field}.class_counts", counts, names)
    index = shard.get("index")
    if index is not None:
        digest = index.get("sha256", _MISSING) if isinstance(index, dict) else None
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            allowed = "a record index entry ({'file': ..., 'sha256': 64 lowercase hex digits})"
            raise _bad(where, f"{field}.index", index, allowed)
        check_shard_file(index.get("file"), f"{field}.index.file", where)


def _sparse_counts(where: str, field: str, value: Any, names: list[str]) -> None:
    """A shard's stored class counts (see :func:`sparse_counts`), with labels that have a
    class name."""
    allowed = "{'classes': [labels], 'counts': [a count per label]}"
    if not isinstance(value, dict):
        raise _bad(where, field, value, allowed)
    labels, counts = value.get("classes", _MISSING), value.get("counts", _MISSING)
    if not isinstance(labels, list) or not all(checks.is_int(c) for c in labels):
        raise _bad(where, f"{field}.classes", labels, "a list of labels")
    if len(set(labels)) != len(labels):
        raise _bad(where, f"{field}.classes", labels, "a list of distinct labels")
    beyond = [label for label in labels if not 0 <= label < len(names)]
    if beyond:
        raise _bad(
            where,
            f"{field}.classes",
            labels,
            f"labels from 0 to {len(names) - 1}: class_names has {len(names)} names, so label "
            f"{beyond[0]} has none (the class names and the records' labels disagree)",
        )
    if (
        not isinstance(counts, list)
        or len(counts) != len(labels)
        or not all(checks.is_int(c) and c >= 0 for c in counts)
    ):
        raise _bad(where, f"{field}.counts", counts, f"{len(labels)} counts, one per label")


def sparse_counts(counts: dict[int, int]) -> dict[str, list[int]]:
    """A shard's class counts as stored: the labels it holds (ascending) and their counts.

    At 10,000 classes a list of every class's count per shard would make the
    manifest shards × classes numbers, parsed on every load; this form grows
    with the records instead.

    Example:
        >>> sparse_counts({7: 2, 0: 5, 3: 0})
        {'classes': [0, 7], 'counts': [5, 2]}
    """
    labels = sorted(label for label, count in counts.items() if count)
    return {"classes": labels, "counts": [int(counts[label]) for label in labels]}


def dense_counts(stored: Any, num_classes: int) -> list[int]:
    """Every class's count from a shard's stored counts (sparse, or a version-2 list).

    Example:
        >>> dense_counts({"classes": [0, 7], "counts": [5, 2]}, 8)
        [5, 0, 0, 0, 0, 0, 0, 2]
    """
    if isinstance(stored, list):
        return [int(count) for count in stored]
    dense = [0] * num_classes
    for label, count in zip(stored["classes"], stored["counts"], strict=True):
        dense[label] = int(count)
    return dense


def manifest_path(path: str | os.PathLike) -> tuple[str, str]:
    """``(directory, manifest file)`` for a converted directory or its manifest file."""
    path = os.fspath(path)
    if path.endswith(".json"):
        directory = path.replace("\\", "/").rsplit("/", 1)[0] if "/" in path else "."
        return directory, path
    return path, storage.join(path, MANIFEST_NAME)


def load(path: str | os.PathLike | Manifest) -> Manifest:
    """Reads the manifest of a converted directory (local, ``gs://``, ``ram://``).

    Args:
        path: the directory ``chute convert`` wrote, or its ``manifest.json``;
            a :class:`Manifest` already read is returned as it is.

    Raises:
        ChuteError: there is no manifest there, or it is not a chute manifest.
    """
    if isinstance(path, Manifest):
        return path
    directory, file = manifest_path(path)
    if not storage.exists(file):
        hint = ""
        if storage.exists(storage.join(directory, WORK_DIR)):
            hint = " (a conversion started there but did not finish: run the same convert again)"
        raise ChuteError(f"No {MANIFEST_NAME} in {directory!r}: not a chute dataset{hint}")
    text = storage.read_bytes(file).decode("utf-8")
    return Manifest.from_json(text, location=directory, file=file)
