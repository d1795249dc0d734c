"""The manifest: the one description of a converted dataset.

``manifest.json`` (versioned) holds the class names in label order, the
:class:`~chute.format.spec.ImageSpec`, every split's shards (file, record count, bytes, sha256,
per-class counts), the conversion options, the source's fingerprint, and the
rejected inputs and duplicates. Exact dataset sizes come from here, and
``verify`` checks the shards against it. It is written last, so its presence
means the conversion finished.
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
VERSION = 2  # 2: the image spec holds resize, interpolation and quality (1: in options)
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
    splits: dict[str, dict[str, Any]]  # name -> num_examples, class_counts, shards
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
