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
rather than a traceback wherever that field is first used, and parses the splits once
into typed records (:class:`~chute.format.splits.Split`,
:class:`~chute.format.splits.Shard`) that readers use by attribute.
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
from chute.format.splits import MISSING, Shard, Split, bad, parse_split

MANIFEST_NAME = "manifest.json"
LABEL_MODES = ("single", "multi")
WORK_DIR = ".chute-work"  # a conversion in progress keeps its state here
FORMAT = "chute.manifest"
VERSION = 4  # 4: multi-label datasets (``label_mode``) and sample weights (``weighted``);
# a single-label dataset without weights is still written as 3, for older readers.
# 3: sparse per-shard class counts (2: a list of every class's count per shard);
# 2: the image spec holds resize, interpolation and quality (1: in options)
# What a list of integers stands in for while the manifest's JSON is written (json.dumps
# writes the NULs as \u0000, which no string of the manifest holds with these words).
_PLACEHOLDER = re.compile(r'"\\u0000chute-list-(\d+)\\u0000"')


def _placeholders(value: Any, lines: list[str]) -> Any:
    """``value`` with each non-empty list of integers replaced by a placeholder string
    naming its one-line JSON in ``lines`` (json.dumps's indent would give each number a
    line; a text substitution after it could also change a class name that looks alike)."""
    if isinstance(value, dict):
        return {key: _placeholders(item, lines) for key, item in value.items()}
    if isinstance(value, list | tuple):
        if value and all(type(item) is int for item in value):
            lines.append("[" + ", ".join(map(str, value)) + "]")
            return f"\0chute-list-{len(lines) - 1}\0"
        return [_placeholders(item, lines) for item in value]
    return value


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
    splits: dict[str, Split]  # stored objects given here are parsed (see chute.format.splits)
    options: dict[str, Any]
    source: dict[str, Any]  # location, kind, fingerprint, num_items
    rejects: list[dict[str, str]] = dataclasses.field(default_factory=list)
    duplicates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    created_by: str = ""
    # "single": one ``class`` per record; "multi": a ``labels`` list per record, and the
    # class counts count the images carrying each label (they add up to more than the images)
    label_mode: str = "single"
    weighted: bool = False  # each record has a ``weight`` feature
    # The dataset's history once something was appended (``chute convert --append``): an
    # entry a version, oldest first (see :meth:`version`); empty for a dataset converted once.
    versions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    location: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        where = storage.join(self.location, MANIFEST_NAME) if self.location else MANIFEST_NAME
        if self.label_mode not in LABEL_MODES:
            raise bad(where, "label_mode", self.label_mode, f"one of {LABEL_MODES}")
        if not isinstance(self.weighted, bool):
            raise bad(where, "weighted", self.weighted, "true or false")
        self.splits = {
            name: split
            # Parsed once, here: no reader looks a shard's fields up by string afterwards.
            if isinstance(split, Split)
            else parse_split(split, where, f"splits.{name}", self.class_names)
            for name, split in self.splits.items()
        }

    @property
    def multi_label(self) -> bool:
        """Whether each image carries a set of labels (``labels``) rather than one ``class``."""
        return self.label_mode == "multi"

    @property
    def num_classes(self) -> int:
        """How many classes there are."""
        return len(self.class_names)

    def num_examples(self, split: str) -> int:
        """Records in ``split`` (0 for a split that does not exist)."""
        found = self.splits.get(split)
        return found.examples if found is not None else 0

    @property
    def version(self) -> int:
        """The dataset's version: 1, plus one for each ``chute convert --append``."""
        return len(self.versions) or 1

    def at_version(self, version: int, name: str = "version") -> Manifest:
        """The dataset as it was at ``version``: the shards and classes it held then (its
        classes are a prefix of today's; an append never renumbers a class).

        Args:
            version: a version from 1 to :attr:`version`.
            name: what the caller calls it, for the error (``dataset_version``).

        Raises:
            ChuteError: ``version`` is not one of the dataset's versions.

        Example:
            >>> load("flowers").at_version(1).num_examples("train")  # doctest: +SKIP
            2936
        """
        checks.int_in(name, version, 1, self.version, f"a version from 1 to {self.version}")
        if version == self.version:
            return self
        entry = self.versions[version - 1]
        classes = self.class_names[: entry["num_classes"]]
        splits = {}
        for name, split in self.splits.items():
            shards = [shard for shard in split.shards if shard.version <= version]
            if shards:
                splits[name] = Split.of(shards, len(classes))
        return dataclasses.replace(
            self,
            class_names=classes,
            splits=splits,
            versions=self.versions[:version],
            rejects=[r for r in self.rejects if r.get("version", 1) <= version],
            duplicates=[d for d in self.duplicates if d.get("version", 1) <= version],
        )

    def with_classes(self, class_names: list[str]) -> Manifest:
        """The same dataset in a wider label space: ``class_names`` starts with this
        dataset's own, in order, and the classes after them have no examples here (what
        a mixture of datasets reads one of them as, :mod:`chute.read.mixture`).

        Raises:
            ChuteError: ``class_names`` does not start with this dataset's classes.

        Example:
            >>> load("pets").with_classes(["cat", "dog", "eel"]).num_classes  # doctest: +SKIP
            3
        """
        if list(class_names[: self.num_classes]) != list(self.class_names):
            raise ChuteError(
                f"A wider label space must start with {self.location or 'the dataset'}'s "
                f"classes in order. Received: class_names={list(class_names)[:5]!r}..."
            )
        if len(class_names) == self.num_classes:
            return self
        splits = {
            name: Split.of(split.shards, len(class_names)) for name, split in self.splits.items()
        }
        return dataclasses.replace(self, class_names=list(class_names), splits=splits)

    def check_split(self, split: str) -> str:
        """``split`` if this dataset has it, else a ChuteError naming the splits it has."""
        return checks.one_of("split", split, self.splits)

    def split(self, name: str) -> Split:
        """Split ``name``, or a ChuteError naming the splits this dataset has."""
        return self.splits[self.check_split(name)]

    def shard_paths(self, split: str) -> list[str]:
        """Full paths of ``split``'s shards, in order."""
        return [storage.join(self.location, s.name) for s in self.split(split).shards]

    def shard_counts(self, split: str) -> list[int]:
        """Records in each of ``split``'s shards, in order."""
        return [s.records for s in self.split(split).shards]

    def shard_class_counts(self, shard: Shard) -> list[int]:
        """Every class's count in one of this manifest's shards, in label order."""
        return shard.dense_counts(self.num_classes)

    def to_json(self) -> str:
        """The manifest as deterministic, human-readable JSON."""
        # What older readers can read stays version 3, without the new fields.
        plain = not self.multi_label and not self.weighted
        body: dict[str, Any] = {"format": FORMAT, "version": 3 if plain else VERSION}
        for field in dataclasses.fields(self):
            if field.name == "location":  # where it was read from, not what it says
                continue
            if plain and field.name in ("label_mode", "weighted"):
                continue
            if field.name == "versions" and not self.versions:  # as before versions
                continue
            body[field.name] = getattr(self, field.name)
        body["image"] = self.image.to_dict()
        body["splits"] = {name: split.to_dict() for name, split in self.splits.items()}
        # Lists of integers (per-class counts, sizes) stay on one line each: written here,
        # each in place of a placeholder that json.dumps writes as a string.
        lines: list[str] = []
        body = _placeholders(body, lines)
        # ensure_ascii=False: class names stay readable in any script, not \u escapes.
        text = json.dumps(body, indent=1, ensure_ascii=False)
        return _PLACEHOLDER.sub(lambda m: lines[int(m[1])], text) + "\n"

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
            raise bad(where, "version", version, "a version number")
        # A newer version may mean something else by the same fields: refused, not misread.
        if version > VERSION:
            raise ChuteError(
                f"{where} was written by a newer chute (manifest version "
                f"{version}, this chute reads up to {VERSION}); upgrade chute"
            )
        splits = check_structure(body, where)
        fields = {f.name for f in dataclasses.fields(cls)}
        # Fields this chute does not know (from a hand edit) are left out, not passed on.
        values = {k: v for k, v in body.items() if k in fields}
        values["splits"] = splits
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
        # Atomic: its presence says the conversion is complete, so it must never be half there.
        storage.write_atomic(path, self.to_json().encode("utf-8"))
        return path


def check_structure(body: dict[str, Any], where: str) -> dict[str, Split]:
    """Refuses a manifest whose fields are not what chute writes and readers rely on:
    class names, splits, their counts and shards (file names, record counts, sizes,
    sha256s, class counts, record index files), and the report fields (rejects,
    duplicates, warnings); returns the splits parsed (:mod:`chute.format.splits`). One
    error names the field (``splits.train.shards[2].sha256``), what it must be and what
    it holds, so a hand-edited manifest is no traceback in ``verify``, ``index`` or a
    reader. Labels are checked against the class names where the manifest holds them
    (per-class counts): a manifest with fewer class names than its records' labels is
    refused here. Fields a version of chute did not write are optional (``index``, and
    ``options``, ``source``, ``rejects``, ... of a hand-written manifest); whether counts
    agree with each other and with the shards is ``chute verify``'s to report.

    Example:
        >>> split = {"num_examples": 0, "class_counts": [0], "shards": None}
        >>> check_structure({"class_names": ["a"], "splits": {"train": split}}, "m")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: m is not a valid chute manifest: `splits.train.shards` must be a list of shard entries. Received: splits.train.shards=None. Correct it, or convert the dataset again
    """  # noqa: E501
    names = body.get("class_names", MISSING)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad(where, "class_names", names, "a list of class names")
    splits = body.get("splits", MISSING)
    if not isinstance(splits, dict) or not splits:
        raise bad(where, "splits", splits, "an object of splits")
    parsed = {
        split: parse_split(entry, where, f"splits.{split}", names)
        for split, entry in splits.items()
    }
    image = body.get("image", MISSING)
    if not isinstance(image, dict):
        raise bad(where, "image", image, "an image spec (an object)")
    # Optional: a hand-written manifest may leave them out, but not make them something else.
    for key in ("options", "source"):
        if not isinstance(body.get(key, {}), dict):
            raise bad(where, key, body[key], "an object")
    rejects = body.get("rejects", [])
    if not _objects(rejects, {"key": str, "reason": str}):
        raise bad(where, "rejects", rejects, "a list of {'key': ..., 'reason': ...} objects")
    duplicates = body.get("duplicates", [])
    if not _objects(duplicates, {"keys": list, "dropped": list}):
        allowed = "a list of {'keys': [...], 'dropped': [...]} objects"
        raise bad(where, "duplicates", duplicates, allowed)
    warnings = body.get("warnings", [])
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise bad(where, "warnings", warnings, "a list of texts")
    versions = body.get("versions", [])
    if not _objects(versions, {"version": int, "num_classes": int, "added": dict}) or [
        entry["version"] for entry in versions
    ] != list(range(1, len(versions) + 1)):
        allowed = "a list of {'version': 1, 2, ..., 'num_classes': ..., 'added': {...}} objects"
        raise bad(where, "versions", versions, allowed)
    if not isinstance(body.get("created_by", ""), str):
        raise bad(where, "created_by", body["created_by"], "a text")
    return parsed


def _objects(value: Any, fields: dict[str, type]) -> bool:
    """Whether ``value`` is a list of objects whose ``fields`` have these types."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and all(isinstance(item.get(k), t) for k, t in fields.items())
        for item in value
    )


def sparse_counts(counts: dict[int, int]) -> dict[str, list[int]]:
    """A shard's class counts as stored: the labels it holds (ascending) and their counts.

    At 10,000 classes a list of every class's count per shard would make the
    manifest shards × classes numbers, parsed on every load; this form grows
    with the records instead.

    Example:
        >>> sparse_counts({7: 2, 0: 5, 3: 0})
        {'classes': [0, 7], 'counts': [5, 2]}
    """
    # Ascending labels, empty classes left out: the same counts always give the same JSON.
    labels = sorted(label for label, count in counts.items() if count)
    return {"classes": labels, "counts": [int(counts[label]) for label in labels]}


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
    directory, file = manifest_path(storage.check_location(path, "path"))
    if not storage.exists(file):
        hint = ""
        # A work folder without a manifest is an interrupted conversion, not a wrong path.
        if storage.exists(storage.join(directory, WORK_DIR)):
            hint = " (a conversion started there but did not finish: run the same convert again)"
        raise ChuteError(f"No {MANIFEST_NAME} in {directory!r}: not a chute dataset{hint}")
    text = storage.read_bytes(file).decode("utf-8")
    return Manifest.from_json(text, location=directory, file=file)
