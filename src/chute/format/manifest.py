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
    def from_json(cls, text: str, location: str = "") -> Manifest:
        """Parses :meth:`to_json` output; rejects other formats and newer versions."""
        try:
            body = json.loads(text)
        except ValueError as error:
            raise ChuteError(f"{location or 'manifest'} is not valid JSON: {error}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ChuteError(f"{location or 'manifest'} is not a chute manifest")
        if body.get("version", 0) > VERSION:
            raise ChuteError(
                f"{location} was written by a newer chute (manifest version "
                f"{body['version']}, this chute reads up to {VERSION}); upgrade chute"
            )
        check_structure(body, location or MANIFEST_NAME)
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in body.items() if k in fields}
        image = dict(values.get("image") or {})
        if body.get("version", 0) < 2:  # resize, interpolation and quality were options
            options = values.get("options") or {}
            for key in ("resize", "interpolation", "quality"):
                if key in options:
                    image.setdefault(key, options[key])
        values["image"] = ImageSpec.from_dict(image)
        return cls(**values, location=location)

    def save(self, directory: str) -> str:
        """Writes ``manifest.json`` atomically into ``directory``; returns its path."""
        path = storage.join(directory, MANIFEST_NAME)
        storage.write_atomic(path, self.to_json().encode("utf-8"))
        return path


def _bad(where: str, field: str, value: Any, allowed: str) -> ChuteError:
    return ChuteError(
        f"{where} is not a valid chute manifest: `{field}` must be {allowed}. "
        f"Received: {field}={value!r:.200}"
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
        chute.errors.ChuteError: manifest.json is not a valid chute manifest: `file` must be a file name inside the dataset's folder (no '/', '\\', '..' or drive). Received: file='../other/train.tfrecord'
    """  # noqa: E501
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(sep in name for sep in ("/", "\\", "\0"))
        and not re.match(r"^[A-Za-z]:", name)
    )
    if not plain:
        allowed = "a file name inside the dataset's folder (no '/', '\\', '..' or drive)"
        raise _bad(where, field, name, allowed)
    return name


def check_structure(body: dict[str, Any], where: str) -> None:
    """Refuses a manifest whose fields readers index into without checking: class names,
    splits and their shards (file names, record counts, record index files). One error
    names the field.

    Example:
        >>> split = {"num_examples": 0, "shards": None}
        >>> check_structure({"class_names": ["a"], "splits": {"train": split}}, "m")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: m is not a valid chute manifest: `splits.train.shards` must be a list of shard entries. Received: splits.train.shards=None
    """  # noqa: E501
    names = body.get("class_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _bad(where, "class_names", names, "a list of class names")
    splits = body.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise _bad(where, "splits", splits, "an object of splits")
    for split, entry in splits.items():
        if not isinstance(entry, dict):
            raise _bad(where, f"splits.{split}", entry, "an object")
        count = entry.get("num_examples")
        if not checks.is_int(count) or count < 0:
            raise _bad(where, f"splits.{split}.num_examples", count, "a count")
        shards = entry.get("shards")
        if not isinstance(shards, list):
            raise _bad(where, f"splits.{split}.shards", shards, "a list of shard entries")
        for number, shard in enumerate(shards):
            field = f"splits.{split}.shards[{number}]"
            if not isinstance(shard, dict):
                raise _bad(where, field, shard, "a shard entry (an object)")
            check_shard_file(shard.get("file"), f"{field}.file", where)
            records = shard.get("num_records")
            if not checks.is_int(records) or records < 0:
                raise _bad(where, f"{field}.num_records", records, "a count")
            index = shard.get("index")
            if index is not None:
                if not isinstance(index, dict) or not isinstance(index.get("sha256"), str):
                    allowed = "a record index entry ({'file': ..., 'sha256': ...})"
                    raise _bad(where, f"{field}.index", index, allowed)
                check_shard_file(index.get("file"), f"{field}.index.file", where)


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
    return Manifest.from_json(storage.read_bytes(file).decode("utf-8"), location=directory)
