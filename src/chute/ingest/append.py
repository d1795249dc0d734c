"""``chute convert SRC OUT --append``: new images into a converted dataset, as a new version.

An append never rewrites a shard: it writes new shards (named with their version,
``train-v0002-00000-of-00004.tfrecord``) with their record indexes, then replaces
the manifest, last and atomically, so a reader sees the old version or the new one.
What it must keep from the dataset, this module decides:

- the options: the dataset's own (image spec, split fractions, seed); an option
  given that differs is refused with what differs, except those that only say how
  to read the new source (:data:`MAY_DIFFER`);
- the label space: the dataset's classes keep their numbers; classes the new
  source adds come after them (:func:`relabel`);
- the images it holds: their content hashes (``hashes/``, see
  :mod:`chute.format.contents`) make every copy of one a skipped, counted image;
- the history: the manifest's ``versions`` gains an entry (what was added, per
  split, from which source, when), and :func:`merged` is the new manifest.

The conversion itself (workers, shard notes, resume after a kill, the lock) is
:func:`chute.ingest.convert.convert`'s, unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
from typing import Any

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.splits import Split
from chute.ingest.options import ConvertOptions
from chute.ingest.sources import Source
from chute.ingest.sources.base import SPLITS, ListingRow

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)

# Options that only say how to read the new source, or how big its shards are.
MAY_DIFFER = frozenset(
    {
        "image_column",
        "label_column",
        "label_separator",
        "allow_empty_labels",
        "max_labels",
        "max_pixels",
        "weight_column",
        "shard_size_mb",
        "min_shards",
    }
)


FRACTIONS = ("val_fraction", "test_fraction")


def base_of(output: str) -> manifest_lib.Manifest:
    """The manifest of the dataset an append adds to.

    Raises:
        ChuteError: ``output`` holds no finished conversion.
    """
    if storage.exists(storage.join(output, manifest_lib.MANIFEST_NAME)):
        return manifest_lib.load(output)
    if storage.exists(storage.join(output, manifest_lib.WORK_DIR)):
        raise ChuteError(
            f"`append` adds to a converted dataset, and {storage.redact(output)!r} holds a "
            "conversion that did not finish. Run the command that started it again to "
            "finish it, then append"
        )
    raise ChuteError(
        f"`append` adds to a converted dataset, and there is none in "
        f"{storage.redact(output)!r}. Received: output={storage.redact(output)!r}; convert "
        "without append first"
    )


def options_for(base: manifest_lib.Manifest, given: dict[str, Any]) -> ConvertOptions:
    """The dataset's options, with what ``given`` may change (:data:`MAY_DIFFER`).

    Raises:
        ChuteError: a given option differs from the dataset's (each one named, with
            both values), or is not an option.
    """
    stored = {**ConvertOptions().to_dict(), **base.options}
    wanted = ConvertOptions.from_dict({**stored, **given}).to_dict()
    decided = _decided(base)  # what "auto" became: the size, mode and encoding it stores
    # A dataset whose source came split carved no val or test: an append may carve them.
    free = MAY_DIFFER | {name for name in FRACTIONS if not stored.get(name)}
    differ = [
        f"{name}={wanted[name]!r} (the dataset's: {decided.get(name, stored.get(name))!r})"
        for name in sorted(given)
        if name not in free and wanted[name] not in (stored.get(name), decided.get(name))
    ]
    if differ:
        raise ChuteError(
            "`append` keeps the dataset's image spec, split and seed, so its new images "
            f"are stored and split as the others. Received: {', '.join(differ)}; leave "
            "them out, or convert into another folder"
        )
    # min_shards was the whole dataset's: an append makes as many shards as its size needs.
    return ConvertOptions.from_dict({**wanted, "min_shards": given.get("min_shards")})


def _decided(base: manifest_lib.Manifest) -> dict[str, Any]:
    """The options a conversion left to the images' headers, as it decided them."""
    spec = base.image
    decided: dict[str, Any] = {
        "color_mode": "grayscale" if spec.channels == 1 else "rgb",
        "encoding": spec.encoding,
    }
    if spec.fixed_size:
        decided["image_size"] = [spec.height, spec.width]
    return decided


def relabel(found: Source, base: manifest_lib.Manifest) -> list[str]:
    """Renumbers the new source's labels into the dataset's label space, in place: a
    class the dataset has keeps its number, a new one comes after the dataset's (in
    the source's order). Returns the classes added.

    Raises:
        ChuteError: the source's labels are of another kind (one class an image vs a
            set of labels, weights or none) than the dataset's.
    """
    if found.multi_label != base.multi_label or found.weighted != base.weighted:

        def kind(multi: bool, weighted: bool) -> str:
            return f"{'multi' if multi else 'single'}-label{', weighted' if weighted else ''}"

        raise ChuteError(
            f"`source` holds {kind(found.multi_label, found.weighted)} images and the "
            f"dataset {kind(base.multi_label, base.weighted)} ones. Received: "
            f"source={storage.redact(found.location)!r}; an append adds images of the "
            "dataset's kind"
        )
    known = {name: label for label, name in enumerate(base.class_names)}
    numbered = found.class_names == [str(i) for i in range(len(found.class_names))]
    # Numbers are no names: matched against named classes they would all be new ones.
    if (
        numbered
        and set(found.class_names) - set(known)
        and set(base.class_names) - set(numbers_of(base))
    ):
        raise ChuteError(
            "`source` numbers its classes (an array source without `class_names`) and "
            f"the dataset names them ({', '.join(base.class_names[:3])}, ...). Received: "
            f"source={storage.redact(found.location)!r}; save the class names with the "
            "arrays (np.savez(..., class_names=[...])) so that classes match by name"
        )
    added = [name for name in found.class_names if name not in known]
    numbers = {**known, **{name: len(known) + i for i, name in enumerate(added)}}
    mapped = [numbers[name] for name in found.class_names]
    items = []
    for item in found.items:
        if item.labels is not None:
            item = item._replace(labels=tuple(sorted(mapped[c] for c in item.labels)))
        elif item.label >= 0:
            item = item._replace(label=mapped[item.label])
        items.append(item)
    found.items = items
    found.class_names = list(base.class_names) + added
    if added:
        log.info("append: %d new class(es) after the dataset's %d", len(added), len(known))
    return added


def numbers_of(manifest: manifest_lib.Manifest) -> list[str]:
    """The names an array source without class names gives the dataset's classes."""
    return [str(i) for i in range(manifest.num_classes)]


def listing_digest(files: list[ListingRow]) -> str:
    """What identifies a source's files as listed (names, sizes, times): a sha256."""
    return hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()


def already(base: manifest_lib.Manifest, identity: str, files: list[ListingRow]) -> int | None:
    """The version that appended this very source (same name, same files), if any."""
    digest = listing_digest(files)
    shown = storage.redact(identity)  # as the manifest keeps it: without credentials
    for entry in base.versions[1:]:
        source = entry.get("source", {})
        if source.get("location") == shown and source.get("listing") == digest:
            return entry["version"]
    return None


def merged(
    base: manifest_lib.Manifest,
    added: manifest_lib.Manifest,
    *,
    copies: int,
    files: list[ListingRow],
) -> manifest_lib.Manifest:
    """The manifest after the append: the dataset's shards, then the new ones (marked
    with the new version), every split counted again, the history one entry longer."""
    from chute import __version__

    version = base.version + 1
    classes = added.class_names
    shards: dict[str, list] = {name: list(split.shards) for name, split in base.splits.items()}
    for name, split in added.splits.items():
        # A shard left empty (every image a copy, or refused) is not kept: see empty_shards.
        shards.setdefault(name, []).extend(
            dataclasses.replace(shard, version=version) for shard in split.shards if shard.records
        )
    splits = {
        name: Split.of(shards[name], len(classes))
        for name in SPLITS
        if shards.get(name)  # in the splits' order: train, val, test
    }
    entry = {
        "version": version,
        "num_classes": len(classes),
        "added": {name: split.examples for name, split in added.splits.items() if split.examples},
        "copies_skipped": copies,
        "rejected": len(added.rejects),
        "source": {**added.source, "listing": listing_digest(files)},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "created_by": f"chute {__version__}",
    }
    return dataclasses.replace(
        base,
        class_names=classes,
        splits=splits,
        versions=(base.versions or [first_version(base)]) + [entry],
        rejects=base.rejects + _new_rejects(base.rejects, added.rejects, version),
        duplicates=base.duplicates + [{**group, "version": version} for group in added.duplicates],
        warnings=base.warnings + added.warnings,
    )


def _new_rejects(held: list[dict], added: list[dict], version: int) -> list[dict]:
    """The append's rejects that the dataset does not list already (the same file
    refused for the same reason), marked with the version."""
    seen = {(reject["key"], reject["reason"]) for reject in held}
    return [
        {**reject, "version": version}
        for reject in added
        if (reject["key"], reject["reason"]) not in seen
    ]


def empty_shards(added: manifest_lib.Manifest) -> list[str]:
    """The shards an append wrote that hold no record (each of their images a copy of
    one the dataset holds, or refused): deleted, and left out of the manifest."""
    return [s.name for split in added.splits.values() for s in split.shards if not s.records]


def first_version(base: manifest_lib.Manifest) -> dict[str, Any]:
    """The history's first entry, for a dataset converted once: what that conversion wrote."""
    return {
        "version": 1,
        "num_classes": base.num_classes,
        "added": {name: split.examples for name, split in base.splits.items()},
        "rejected": len(base.rejects),
        "source": dict(base.source),
        "created_by": base.created_by,
    }


def describe(manifest: manifest_lib.Manifest) -> list[str]:
    """A line a version, oldest first (what ``chute inspect`` shows).

    Example:
        >>> describe(load("flowers"))  # doctest: +SKIP
        ['v1: train 2936, val 734 from flower_photos (folder)', 'v2: train +40 from new (folder)']
    """
    lines = []
    for entry in manifest.versions or [first_version(manifest)]:
        added = ", ".join(
            f"{name} {'+' if entry['version'] > 1 else ''}{count}"
            for name, count in entry["added"].items()
        )
        source = entry.get("source", {})
        # redacted: a manifest written by an older chute may hold a source URL's credentials
        shown = storage.redact(str(source.get("location")))
        where = f" from {shown} ({source.get('kind')})" if source else ""
        skipped = entry.get("copies_skipped")
        copies = f"; {skipped} cop(ies) of images it held skipped" if skipped else ""
        when = f", {entry['created']}" if entry.get("created") else ""
        lines.append(f"v{entry['version']}: {added or 'nothing'}{where}{copies}{when}")
    return lines
