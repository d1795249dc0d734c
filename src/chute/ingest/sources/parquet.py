"""Hugging Face image datasets: Parquet files with an image and a label column.

Image-classification datasets on the Hugging Face Hub are Parquet files
(``data/train-00000-of-00003.parquet``, or ``CONFIG/train/0000.parquet`` in the
Hub's converted branch) with an ``image`` column (a ``{bytes, path}`` struct)
and a ``label`` column; the class names are in the schema's ``huggingface``
metadata (a ``ClassLabel`` feature; string labels are looked up in its names).
The split of a file comes from its name, else from the folder it is in
(``train``, ``validation``/``val``/``valid``, ``test``). A dataset repository
cloned from the Hub (``README.md``, ``assets/preview.png``, ``data/*.parquet``)
is read from its ``data/`` folder (or its configuration folders), not taken for
a tree of class folders because of its card's pictures.

Parquet has no random access to one row, so the files are read once, batch by
batch with pyarrow (memory stays flat): every image's bytes go into one
temporary file, as a compressed tar's do (:mod:`.tars`), and the
workers read them by offset (:class:`~chute.ingest.members.Member`). The
temporary file is deleted when the conversion ends.

Multi-label: a label column of lists (``Sequence(ClassLabel)`` in the metadata,
written ``{"feature": {"_type": "ClassLabel", ...}, "_type": "Sequence"}`` or,
by newer ``datasets``, ``{"_type": "List", "feature": ...}``; or a plain list of
strings or integers) gives each image several labels: class names from the
metadata when it has them, else the distinct values sorted. With
``label_mode="multi"`` a column of single values is read as one label each.
Sample weights: the column ``weight_column`` names (only then), numbers.

``hf:OWNER/NAME[:CONFIG]`` downloads the files through ``huggingface_hub`` (what
the ``datasets`` library uses; chute's ``hf`` extra) into its cache.

Example:
    >>> found = scan_parquet("beans/data")  # doctest: +SKIP
    >>> found.kind, found.class_names  # doctest: +SKIP
    ('parquet', ['angular_leaf_spot', 'bean_rust', 'healthy'])
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from chute.errors import ChuteError
from chute.format import storage
from chute.format.records import MAX_WEIGHT
from chute.image.files import IMAGE_EXTENSIONS
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.base import (
    SPLIT_ALIASES,
    Item,
    LabelRules,
    MemberSource,
    Source,
    class_names_of,
    make_scratch_dir,
)
from chute.ingest.sources.members import TAR, Member
from chute.lazy import extra

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials

BATCH_ROWS = 256  # rows read at a time: a few MB of images in memory, whatever the file
DISK_RESERVE = 256 << 20  # free space left on the temporary folder's disk
_SPLIT_WORDS = {**SPLIT_ALIASES, "valid": "val", "dev": "val"}
_TOKEN = re.compile(r"[A-Za-z]+")
HUB_DATA = "data"  # where a dataset repository on the Hub keeps its data files
CARD_BYTES = 64 << 10  # read of a README.md for its YAML header


def is_parquet_source(path: str) -> bool:
    """A ``.parquet`` file, a folder holding Parquet files and no image files, or a Hugging
    Face dataset repository cloned (see :func:`files_of`)."""
    if path.lower().endswith(".parquet"):
        return True
    return storage.isdir(path) and bool(files_of(path))


def _parquet_files(folder: str) -> list[str]:
    """The Parquet files under ``folder``, sorted; none when it holds an image file (a
    class-per-folder tree, found at its first image)."""
    found = []
    local = storage.is_local(folder)
    walk = os.walk(storage.local_path(folder)) if local else storage.walk(folder)
    for dirpath, dirnames, filenames in walk:
        # In place, so the walk skips hidden folders and goes in a fixed order.
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            # An image file makes it a tree of class folders, whatever Parquet it holds.
            if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                return []
            if name.lower().endswith(".parquet"):
                found.append(storage.join(dirpath, name))
    return sorted(found)


def files_of(source: str) -> list[str]:
    """The Parquet files a source is read from: the file, or those under the folder; in a
    Hugging Face dataset repository cloned, whose card's pictures (``assets/*.png``) would
    otherwise make it a tree of class folders, those of its data folders (see
    :func:`_hub_files`)."""
    if not storage.isdir(source):
        return [source]
    return _parquet_files(source) or _hub_files(source)


def _hub_files(folder: str) -> list[str]:
    """The Parquet files of a folder in the Hub's repository layout: its ``data/`` folder
    of Parquet files, else, when its ``README.md`` is a dataset card (``configs:`` or
    ``dataset_info:`` in its YAML header), its configuration folders (top-level folders of
    Parquet files and no image). None otherwise: a tree of class folders."""
    data = storage.join(folder, HUB_DATA)
    if storage.isdir(data) and (found := _parquet_files(data)):
        log.info("%s: a Hugging Face dataset repository: reading %s/", folder, HUB_DATA)
        return found
    if not _is_dataset_card(storage.join(folder, "README.md")):
        return []  # a tree of class folders: not one folder listed more
    tops = [storage.join(folder, name) for name in storage.listdir(folder)]
    found = [
        path
        for top in tops
        if not storage.basename(top).startswith(".") and storage.isdir(top)
        for path in _parquet_files(top)
    ]
    if found:
        log.info("%s: a Hugging Face dataset repository: reading its Parquet folders", folder)
    return sorted(found)


def _is_dataset_card(path: str) -> bool:
    """Whether ``path`` is a Hub dataset card: a README.md whose YAML header declares the
    dataset's configurations or features."""
    if not storage.exists(path):
        return False
    with storage.open_file(path) as handle:
        head = handle.read(CARD_BYTES).decode("utf-8", "replace")
    header = re.match(r"---\s*\n(.*?)\n---", head, re.DOTALL)
    return bool(header and re.search(r"^(configs|dataset_info):", header.group(1), re.M))


def split_of(path: str) -> str | None:
    """The split a Parquet file holds, from its name, else its folders' names.

    Example:
        >>> split_of("data/train-00000-of-00003.parquet"), split_of("cfg/validation/0.parquet")
        ('train', 'val')
    """
    parts = path.replace("\\", "/").split("/")
    # The file's own name first, then its folders from the nearest up.
    for part in reversed(parts):
        words = _TOKEN.findall(part.lower())
        # Only the first word: "train-00000-of-00003" is train, a "trainer" folder is not.
        if words and words[0] in _SPLIT_WORDS:
            return _SPLIT_WORDS[words[0]]
    return None


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ChuteError(
            "Reading Parquet needs pyarrow, which is not installed: "
            f"{extra('hf', instead='pyarrow')}"
        ) from None
    return pq


def _class_feature(feature: Any) -> tuple[list | None, bool] | None:
    """``(class names, several per image)`` of a Hugging Face feature that is a
    ``ClassLabel`` or a list of them (``Sequence``, ``List``, or ``[ClassLabel]`` as old
    ``datasets`` wrote it); None for any other feature."""
    if isinstance(feature, list) and len(feature) == 1:  # [ClassLabel(...)]: a list of them
        inner = _class_feature(feature[0])
        return None if inner is None or inner[1] else (inner[0], True)
    if not isinstance(feature, dict):
        return None
    if feature.get("_type") == "ClassLabel":
        return feature.get("names"), False
    if feature.get("_type") in ("Sequence", "List"):
        inner = _class_feature(feature.get("feature"))
        return None if inner is None or inner[1] else (inner[0], True)
    return None


def _columns(
    schema: Any,
    image_column: str | None,
    label_column: str | None,
    path: str,
    weight_column: str | None = None,
):
    """``(image column, label column, class names from the metadata or None, weight
    column or None)``."""
    features: dict = {}
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw:
        try:
            info = json.loads(raw)
            features = info.get("info", {}).get("features", {}) or {}
        except (ValueError, AttributeError):
            log.warning("%s: its huggingface metadata is not JSON; columns by name", path)
    names = schema.names

    def typed(kind: str) -> str | None:
        of_kind = (n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == kind)
        return next(of_kind, None)

    # The option, then the metadata's declared type, then the Hub's usual name.
    image = image_column or typed("Image") or ("image" if "image" in names else None)
    # A ClassLabel first (as before lists of them counted), then a Sequence(ClassLabel).
    lists = (n for n, f in features.items() if (_class_feature(f) or (None, False))[1])
    usual = next((n for n in ("label", "labels") if n in names), None)
    label = label_column or typed("ClassLabel") or next(lists, None) or usual
    for argument, column, given in (
        ("image_column", image, image_column),
        ("label_column", label, label_column),
    ):
        if column is None or column not in names:
            what = f"column {given!r} is not in it" if given else "no such column was found"
            raise ChuteError(
                f"`{argument}`: {path} has columns {names}; {what}. Received: "
                f"{argument}={given!r} (pass --{argument.replace('_', '-')} NAME)"
            )
    _check_kinds(schema, image, label, image_column, label_column, path)
    class_names = (_class_feature(features.get(label)) or (None, False))[0]
    # weights only when asked: a column named "weight" alone does not weigh a dataset
    weight = _weight_column(schema, weight_column, path) if weight_column else None
    return image, label, class_names, weight


def _weight_column(schema: Any, given: str | None, path: str) -> str | None:
    """The column of sample weights: the one given (which must be there, and numbers), else
    None when none is given."""
    import pyarrow as pa

    column = given or "weight"
    if column not in schema.names:
        if given is None:
            return None
        raise ChuteError(
            f"`weight_column`: {path} has columns {schema.names}; {given!r} is not one of "
            f"them. Received: weight_column={given!r}"
        )
    kind = schema.field(column).type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        if given is None:
            log.info("%s: column 'weight' holds %s, not numbers: not read as weights", path, kind)
            return None
        raise ChuteError(
            f"`weight_column`: column {given!r} of {path} holds {kind}, not numbers. "
            f"Received: weight_column={given!r} (columns: {schema.names})"
        )
    log.info("%s: sample weights from column %r", path, column)
    return column


def _is_list(kind: Any) -> bool:
    """Whether a column of Arrow type ``kind`` holds lists (several labels per row)."""
    import pyarrow as pa

    return (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _holds_images(kind: Any) -> bool:
    """Whether a column of Arrow type ``kind`` can hold encoded images: bytes, or the
    Hub's ``{bytes, path}`` struct (null: every row is rejected, with its reason)."""
    import pyarrow as pa

    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
    if pa.types.is_null(kind) or any(test(kind) for test in binary):
        return True
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        inner = kind.field("bytes").type
        return pa.types.is_null(inner) or any(test(inner) for test in binary)
    return False


def _holds_labels(kind: Any) -> bool:
    """Whether a column of Arrow type ``kind`` can hold labels: not bytes, not nested; or
    a list of such (several labels per row)."""
    import pyarrow as pa

    if _is_list(kind):
        inner = kind.value_type
        return (
            pa.types.is_integer(inner)
            or pa.types.is_string(inner)
            or pa.types.is_large_string(inner)
        )
    return not (
        pa.types.is_nested(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def _check_kinds(schema: Any, image: str, label: str, image_column, label_column, path):
    """Refuses columns that cannot be what they are asked to be, before any row is read.

    Raises:
        ChuteError: one column for both, images in a column of numbers, labels in a
            column of images.
    """
    if image == label:
        argument = "label_column" if label_column else "image_column"
        raise ChuteError(
            f"`{argument}`: the image and the label must be two columns; both are {image!r}. "
            f"Received: image_column={image_column!r}, label_column={label_column!r} "
            f"({path} has columns {schema.names}; pass --image-column NAME and "
            "--label-column NAME)"
        )
    for argument, column, given, fits, what in (
        ("image_column", image, image_column, _holds_images, "images (bytes or {bytes, path})"),
        (
            "label_column",
            label,
            label_column,
            _holds_labels,
            "labels (integers or strings, or lists of them)",
        ),
    ):
        kind = schema.field(column).type
        if not fits(kind):
            found = "" if given else f" (found by its name or metadata: {column!r})"
            raise ChuteError(
                f"`{argument}`: column {column!r} of {path} holds {kind}, not {what}. "
                f"Received: {argument}={given!r}{found}; pass "
                f"--{argument.replace('_', '-')} NAME (columns: {schema.names})"
            )


def scan_parquet(
    source: str,
    *,
    image_column: str | None = None,
    label_column: str | None = None,
    max_pixels: int,
    progress: Callable[[str, int, int], None] | None = None,
    labels: LabelRules = LabelRules(),  # noqa: B008 (frozen: one shared default is safe)
) -> Source:
    """Lists the images of Parquet files (a file, or a folder of them), copying their bytes
    into one temporary file that the workers read.

    Raises:
        ChuteError: pyarrow missing, no image or label column, files naming and not
            naming splits mixed, class names that differ between files, or a file
            that is not Parquet.
    """
    pq = _pyarrow()
    files = files_of(source)
    # a split named inside the source: by the file, or its folders below the source
    splits = [
        split_of(os.path.relpath(f, source) if f != source else storage.basename(f)) for f in files
    ]
    # Half named would leave the unnamed files' split unclear.
    if any(splits) and not all(splits):
        unnamed = files[splits.index(None)]
        raise ChuteError(
            f"`source` mixes Parquet files that name their split and files that do not "
            f"({unnamed}). Received: source={source!r}; name every file train-*, "
            "validation-* or test-*, or none"
        )
    temp_dir = make_scratch_dir()
    try:
        return _read_all(pq, source, files, splits, temp_dir, (image_column, label_column),
                         labels, max_pixels, progress)  # fmt: skip
    # BaseException: an interrupt mid-copy must not leave gigabytes in the scratch folder.
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def _read_all(pq, source, files, splits, temp_dir, columns, rules: LabelRules, max_pixels,
              progress) -> Source:  # fmt: skip
    total = sum(storage.size(f) for f in files)
    limit = members_lib.max_member_bytes(max_pixels)
    data_path = os.path.join(temp_dir, "images.data")
    rows: list[tuple[str, Any, str | None, Member | None, str | None, float | None]] = []
    named: list[str] | None = None
    multi: bool | None = None  # whether the label column holds lists, from the first file
    done = 0
    with open(data_path, "wb") as out:
        for path, split in zip(files, splits, strict=True):
            try:
                handle = pq.ParquetFile(storage.local_path(path) if storage.is_local(path) else
                                        storage.open_file(path))  # fmt: skip
            except Exception as error:  # pyarrow's errors: not Parquet, truncated, ...
                raise ChuteError(
                    f"`source` file {path} is not a readable Parquet file ({error}). "
                    f"Received: source={source!r}"
                ) from None
            schema = handle.schema_arrow
            image, label, names, weight = _columns(schema, *columns, path, rules.weight_column)
            multi = _check_multi(multi, _is_list(schema.field(label).type), label, path, rules)
            if names is not None:
                if named is not None and names != named:
                    raise ChuteError(
                        f"`source`: the class names of {path} differ from the other files'. "
                        f"Received: source={source!r}"
                    )
                named = names
            rel = os.path.relpath(path, source) if path != source else os.path.basename(path)
            row = 0
            wanted = [image, label] + ([weight] if weight else [])
            for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=wanted):
                images = batch.column(0).to_pylist()
                labels = batch.column(1).to_pylist()
                weights = batch.column(2).to_pylist() if weight else [None] * len(labels)
                for value, target, sample_weight in zip(images, labels, weights, strict=True):
                    key = f"{rel}#{row:08d}"
                    if weight:
                        sample_weight = _weight(path, row, weight, sample_weight)
                    row += 1
                    data = value.get("bytes") if isinstance(value, dict) else value
                    if not isinstance(data, bytes | bytearray) or not data:
                        rows.append(
                            (key, target, split, None, "no image bytes in the row", sample_weight)
                        )
                        continue
                    if len(data) > limit:  # the worker rejects it from its size, unread
                        member = Member(data_path, TAR, key, -1, len(data))
                        rows.append((key, target, split, member, None, sample_weight))
                        continue
                    # Per image: a full disk would fail the write anyway, with a worse message.
                    if shutil.disk_usage(temp_dir).free < len(data) + DISK_RESERVE:
                        raise ChuteError(
                            f"Not enough free disk space in {temp_dir} to copy the images of "
                            f"`source`. Received: source={source!r}; set TMPDIR to a larger disk"
                        )
                    member = Member(data_path, TAR, key, out.tell(), len(data))
                    out.write(data)
                    rows.append((key, target, split, member, None, sample_weight))
                done += batch.nbytes
                if progress:
                    progress("unpack", min(done, total), total)
    if multi:
        return _multi_source(source, files, rows, named, all(splits), temp_dir, rules)
    return _source(source, files, rows, named, all(splits), temp_dir)


def _check_multi(before: bool | None, lists: bool, label: str, path: str, rules) -> bool:
    """Whether the label column is read as several labels per row: lists are (unless
    ``label_mode="single"``, refused), single values only with ``label_mode="multi"``."""
    if lists and rules.mode == "single":
        raise ChuteError(
            f"`label_mode`: column {label!r} of {path} holds lists (several labels per image). "
            "Received: label_mode='single'; pass label_mode='multi' (--label-mode multi) or "
            "'auto'"
        )
    multi = lists or rules.mode == "multi" or rules.hinted is not None
    if before is not None and before != multi:
        raise ChuteError(
            f"`source`: column {label!r} of {path} holds {'lists' if lists else 'single values'}"
            f", unlike the other files'. Received: label_mode={rules.mode!r}"
        )
    if before is None and rules.mode == "auto":
        what = "lists: multi-label" if multi else "single values: single-label"
        log.info("%s: column %r holds %s", path, label, what)
    return multi


def _weight(path: str, row: int, column: str, value: Any) -> float:
    """A row's sample weight, finite and >= 0."""
    if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
        if value > MAX_WEIGHT:
            raise ChuteError(
                f"{path}, row {row}: the sample weight (column {column!r}) must be at most "
                f"{MAX_WEIGHT:.7g}, as records store weights in float32. Received: {value!r}"
            )
        return float(value)
    raise ChuteError(
        f"{path}, row {row}: the sample weight (column {column!r}) must be a finite number "
        f">= 0. Received: {value!r}"
    )


def _source(source, files, rows, named, presplit: bool, temp_dir: str) -> Source:
    """The Source of the rows read: labels resolved to class indices, bad rows rejected."""
    rejects = [{"key": row[0], "reason": row[4]} for row in rows if row[4]]
    usable = [r for r in rows if r[4] is None]
    if named is not None:
        class_names = list(named)
    else:
        class_names = class_names_of([str(row[1]) for row in usable if row[1] is not None])
    index = {name: i for i, name in enumerate(class_names)}
    items, found = [], []
    for key, target, split, member, _, weight in usable:
        if target is None:
            rejects.append({"key": key, "reason": "missing label"})
            continue
        if named is not None:  # a class index, or a name the metadata lists (string labels)
            label = _class_index(target, class_names, index)
            if label is None:
                rejects.append({"key": key, "reason": _not_a_class(target, class_names)})
                continue
        else:
            label = index[str(target)]
        items.append(Item(key, label, split, None, len(found), weight=weight))
        found.append(member)
    return _made(source, files, items, class_names, presplit, rejects, found, temp_dir, False)


def _not_a_class(value: Any, class_names: list[str]) -> str:
    return (
        f"label {value!r} is not a class index from 0 to {len(class_names) - 1}, nor a class "
        "name of the file's metadata"
    )


def _multi_source(source, files, rows, named, presplit: bool, temp_dir: str, rules) -> Source:
    """The Source of rows with several labels each (a list, or one value with
    ``label_mode="multi"``): class indices from the metadata's names, else the distinct
    values sorted; rows with no label, too many, or one the metadata does not name rejected."""
    rejects = [{"key": row[0], "reason": row[4]} for row in rows if row[4]]
    index = {name: i for i, name in enumerate(named or [])}
    accepted = []  # (row, its labels: class indices when named, else names)
    for row in (r for r in rows if r[4] is None):
        key, target = row[0], row[1]
        if target is None:
            rejects.append({"key": key, "reason": "missing label"})
            continue
        # label_mode="multi" over a column of single values: one label each
        values = target if isinstance(target, list) else [target]
        if named is not None:
            labels = [_class_index(value, named, index) for value in values]
            if None in labels:
                bad = values[labels.index(None)]
                rejects.append({"key": key, "reason": _not_a_class(bad, named)})
                continue
        elif None in values:
            rejects.append({"key": key, "reason": f"a null label in {values!r}"})
            continue
        else:
            labels = [str(value) for value in values]
        labels = list(dict.fromkeys(labels))  # a label twice on one image counts once
        if not labels and not rules.allow_empty:
            reason = (
                "no labels (an empty list); pass allow_empty_labels=True to keep it as a negative"
            )
            rejects.append({"key": key, "reason": reason})
            continue
        if rules.max_labels is not None and len(labels) > rules.max_labels:
            reason = f"{len(labels)} labels, more than max_labels={rules.max_labels}"
            rejects.append({"key": key, "reason": reason})
            continue
        accepted.append((row, labels))
    if named is not None:
        class_names = list(named)
    else:
        class_names = class_names_of([name for _, labels in accepted for name in labels])
        index = {name: i for i, name in enumerate(class_names)}
        accepted = [(row, [index[name] for name in labels]) for row, labels in accepted]
    items, found = [], []
    for (key, _, split, member, _, weight), labels in accepted:
        indices = tuple(sorted(labels))
        items.append(Item(key, -1, split, None, len(found), labels=indices, weight=weight))
        found.append(member)
    return _made(source, files, items, class_names, presplit, rejects, found, temp_dir, True)


def _class_index(value: Any, named: list[str], index: dict[str, int]) -> int | None:
    """A label's class index under the metadata's names (an index, or a name); None if
    it is neither."""
    # bool is an int in Python: True is no class index.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(named):
        return value
    if isinstance(value, str) and value in index:
        return index[value]
    return None


def _made(source, files, items, class_names, presplit, rejects, found, temp_dir, multi) -> Source:
    """The :class:`MemberSource` of the items kept (logged)."""
    log.info(
        "%s: %d images in %d classes from %d Parquet file(s)%s",
        source,
        len(items),
        len(class_names),
        len(files),
        ", split by file name" if presplit else "",
    )
    return MemberSource(
        kind="parquet",
        location=source,
        class_names=class_names,
        items=items,
        presplit=presplit,
        rejects=rejects,
        multi_label=multi,
        weighted=any(item.weight is not None for item in items),
        members=found,
        containers=list(files),
        temp_dir=temp_dir,
    )


def download(name: str) -> str:
    """``hf:OWNER/NAME[:CONFIG]``: the dataset's Parquet files, downloaded by
    ``huggingface_hub`` into its cache (the Hub's Parquet conversion for datasets
    stored otherwise); returns the folder holding them."""
    spec = name[len("hf:") :]
    repo, _, config = spec.partition(":")
    if not re.fullmatch(r"[\w.\-]+(/[\w.\-]+)?", repo or ""):
        raise ChuteError(f"`source` must be hf:OWNER/NAME[:CONFIG]. Received: source={name!r}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ChuteError(
            f"`source` {name!r} is downloaded through Hugging Face's libraries, which are not "
            f"installed: {extra('hf', instead='huggingface_hub')}"
        ) from None
    patterns = [f"{config}/**/*.parquet", f"{config}/*.parquet"] if config else ["**/*.parquet"]
    try:
        folder = snapshot_download(repo, repo_type="dataset", allow_patterns=patterns)
        if not _parquet_files(folder):  # stored otherwise: the Hub's converted copy
            folder = snapshot_download(
                repo, repo_type="dataset", revision="refs/convert/parquet", allow_patterns=patterns
            )
    except Exception as error:  # network, authentication, a name that is not there
        raise ChuteError(f"`source` {name!r} could not be downloaded: {error}") from None
    inside = os.path.join(folder, config) if config else folder
    return inside if os.path.isdir(inside) else folder
