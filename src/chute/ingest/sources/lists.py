"""CSV and JSONL lists of ``path,label`` (optional ``split`` column) as a source.

Paths are relative to the list's folder and must stay inside it unless
``allow_outside``.

Several labels per image (multi-label, see :class:`~.base.LabelRules`): a CSV
cell holding them between separators (``cat|outdoor|night``; the header's
column ``labels``, ``label`` or ``class``), or a JSONL ``"labels"`` (or
``"label"``) holding a JSON list. In ``auto`` mode a JSON list, or a label
holding the separator anywhere in the file, makes the list multi-label (logged).
Class names are the distinct labels, sorted (numerically when all are
integers); a label given twice on one image counts once. An image with no
label is rejected (or a negative, with ``allow_empty``), so is one with more
than ``max_labels``; a separator that leaves an empty name (``cat||dog``) is an
error naming the line.

Sample weights: the column (CSV header) or key (JSONL) that ``weight_column`` names
(only then: a column that happens to be called ``weight`` weighs nothing by itself):
finite numbers >= 0, single- or multi-label.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import posixpath
from typing import Any, NamedTuple

from chute.errors import ChuteError
from chute.format import storage
from chute.format.records import MAX_WEIGHT
from chute.ingest.sources.base import (
    SPLIT_ALIASES,
    FileSource,
    Item,
    LabelRules,
    Source,
    class_names_of,
)

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials

_PATH_HEADERS = ("path", "file", "filename", "filepath", "image")
_LABEL_HEADERS = ("labels", "label", "class")


class _Row(NamedTuple):
    """A row of the list as read: the label is a cell's text, or a JSON list's names."""

    line: int
    path: str
    label: str | tuple[str, ...]
    split: str | None
    weight: float | None


def scan_list(
    path: str,
    *,
    allow_outside: bool,
    labels: LabelRules = LabelRules(),  # noqa: B008 (frozen: one shared default is safe)
) -> Source:
    """The items of a CSV or JSONL list, sorted by split and key; one or several labels
    per image as ``labels`` asks (see the module's docstring).

    Raises:
        ChuteError: the list is not UTF-8, a row is malformed, a label or path is empty
            (single-label), a separator leaves an empty name, a weight is not a finite
            number >= 0, a path leaves the list's folder.
    """
    try:
        # utf-8-sig: a list saved by a spreadsheet often starts with a byte-order mark.
        text = storage.read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ChuteError(
            f"`source` must be a UTF-8 text list. Received: {path!r}, which is not UTF-8 "
            f"({error.reason} at byte {error.start}); save it as UTF-8"
        ) from None
    jsonl = path.lower().endswith(".jsonl")
    rows = _read_jsonl(path, text, labels) if jsonl else _read_csv(path, text, labels)
    base = (
        posixpath.dirname(path)
        if not storage.is_local(path)
        else os.path.dirname(os.path.abspath(storage.local_path(path)))
    )
    multi = _is_multi(path, rows, labels)
    if not multi and any(not label for _, _, label, _, _ in rows):
        number = next(n for n, _, label, _, _ in rows if not label)
        raise ChuteError(f"{path}, line {number}: the label is empty")
    kept, rejects = _first_of_each_file(path, base, rows, allow_outside)
    if multi:
        kept, class_names, rejects = _multi_labels(path, kept, rejects, labels)
    else:
        for row, _ in kept:
            if isinstance(row.label, tuple):  # label_mode="single" asked of a JSON list
                raise ChuteError(
                    f"{path}, line {row.line}: the label is a list, and `label_mode` is "
                    f"'single'. Received: {list(row.label)!r}; pass label_mode='multi' "
                    "(--label-mode multi) or 'auto'"
                )
        class_names = class_names_of([row.label for row, _ in kept])
    label_of = {name: i for i, name in enumerate(class_names)}
    presplit = any(row.split for row, _ in kept)
    items = []
    for row, resolved in kept:
        split_name = None
        if presplit:
            split_name = SPLIT_ALIASES.get((row.split or "").lower())
            if split_name is None:
                raise ChuteError(
                    f"{path}, line {row.line}: `split` must be one of train, val, validation, "
                    f"test. Received: split={row.split!r}"
                )
        item = Item(row.path, -1, split_name, resolved, weight=row.weight)
        if multi:
            item = item._replace(labels=tuple(sorted({label_of[name] for name in row.label})))
        else:
            item = item._replace(label=label_of[row.label])
        items.append(item)
    # Sorted: the list's own order must not change the conversion.
    items.sort(key=lambda item: (item.split or "", item.key))
    kind = "jsonl" if jsonl else "csv"
    weighted = any(row.weight is not None for row in rows)
    return FileSource(
        kind, path, class_names, items, presplit=presplit, rejects=rejects,
        multi_label=multi, weighted=weighted,
    )  # fmt: skip


def _read_jsonl(path: str, text: str, rules: LabelRules) -> list[_Row]:
    """The rows of a JSONL list: ``{"path", "label" or "labels", "split"?, "weight"?}``."""
    rows: list[_Row] = []
    # Weights only when asked: a column that happens to be named "weight" must not start
    # weighing an existing dataset's loss when it is converted again.
    weight_key = rules.weight_column
    keys_seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            split = record.get("split")
            if split is not None and not isinstance(split, str):
                raise TypeError(f"'split' must be a string, got {split!r}")
            value = record["labels"] if "labels" in record else record["label"]
            label = _json_names(value) if isinstance(value, list) else str(value)
            keys_seen.update(record)
            weight = record.get(weight_key) if weight_key else None
            rows.append((number, str(record["path"]), label, split, weight))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ChuteError(
                f"{path}, line {number}: each line must be a JSON object with 'path' and "
                f"'label' (or 'labels'). Received: {line[:80]!r} ({error})"
            ) from None
    weighted = rules.weight_column is not None
    if rules.weight_column is not None and rows and weight_key not in keys_seen:
        raise ChuteError(
            f"`weight_column`: no line of {path} has the key {weight_key!r} (keys: "
            f"{sorted(keys_seen)}). Received: weight_column={weight_key!r}"
        )
    return [
        _Row(n, p, label, split, _weight(path, n, weight_key, w) if weighted else None)
        for n, p, label, split, w in rows
    ]


def _json_names(value: list) -> tuple[str, ...]:
    """A JSON list of labels as names: integers and strings (``[3, "cat"]``)."""
    for name in value:
        # bool is an int in Python: true is no label.
        if isinstance(name, bool) or not isinstance(name, int | str):
            raise TypeError(f"a label is an integer or a string, not {name!r}")
    return tuple(str(name).strip() for name in value)


def _read_csv(path: str, text: str, rules: LabelRules) -> list[_Row]:
    """The rows of a CSV list: ``path,label`` (``label`` holding one or several labels),
    with a header naming ``split`` and ``weight`` columns if any."""
    reader = list(csv.reader(io.StringIO(text)))
    columns: dict[str, int | None] = {"path": 0, "label": 1, "split": None, "weight": None}
    header: list[str] = []
    if reader and reader[0] and reader[0][0].strip().lower() in _PATH_HEADERS:
        header = [h.strip().lower() for h in reader[0]]
        wanted = (rules.weight_column or "").strip().lower()  # weights only when asked
        columns = {
            "path": 0,
            "label": next((i for i, h in enumerate(header) if h in _LABEL_HEADERS), 1),
            "split": header.index("split") if "split" in header else None,
            "weight": header.index(wanted) if wanted and wanted in header else None,
        }
        if rules.weight_column is not None and columns["weight"] is None:
            raise ChuteError(
                f"`weight_column`: {path} has columns {reader[0]}; {rules.weight_column!r} is "
                f"not one of them. Received: weight_column={rules.weight_column!r}"
            )
        # The header becomes an empty row, so line numbers in messages stay the file's own.
        reader = [[], *reader[1:]]
    elif rules.weight_column is not None:
        raise ChuteError(
            f"`weight_column`: {path} has no header row naming its columns (its first row is "
            f"{reader[0] if reader else []}). Received: weight_column={rules.weight_column!r}; "
            "add a header such as path,label,weight"
        )
    last = max(c for c in columns.values() if c is not None)
    rows = []
    for number, row in enumerate(reader, start=1):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) <= last:
            raise ChuteError(
                f"{path}, line {number}: each row must be 'path,label'. Received: {row!r}"
            )
        split_col, weight_col = columns["split"], columns["weight"]
        rows.append(
            _Row(
                number,
                row[columns["path"]].strip(),
                row[columns["label"]].strip(),
                row[split_col].strip() if split_col is not None else None,
                None
                if weight_col is None
                else _weight(path, number, header[weight_col], row[weight_col]),
            )
        )
    return rows


def _weight(path: str, line: int, column: str, value: Any) -> float:
    """A sample weight as a float: finite and >= 0."""
    try:
        # bool is an int in Python: true is no weight.
        weight = float(value.strip() if isinstance(value, str) else value)
        if isinstance(value, bool) or not math.isfinite(weight) or weight < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise ChuteError(
            f"{path}, line {line}: the sample weight ({column!r}) must be a finite number "
            f">= 0. Received: {value!r}"
        ) from None
    if weight > MAX_WEIGHT:
        raise ChuteError(
            f"{path}, line {line}: the sample weight ({column!r}) must be at most "
            f"{MAX_WEIGHT:.7g}, as records store weights in float32. Received: {value!r}"
        )
    return weight


def _is_multi(path: str, rows: list[_Row], rules: LabelRules) -> bool:
    """Whether the list is multi-label: as asked, or in ``auto`` mode when a label is a
    JSON list or holds the separator (the choice is logged)."""
    name = storage.basename(path)
    if rules.mode != "auto":
        if rules.mode == "multi":
            log.info("multi-label: label_mode='multi' (%s)", name)
        return rules.mode == "multi"
    lists = sum(isinstance(row.label, tuple) for row in rows)
    separated = sum(isinstance(row.label, str) and rules.separator in row.label for row in rows)
    if rules.hinted and not (lists or separated):
        log.info("multi-label: %s asks for it (%s)", rules.hinted, name)
        return True
    if lists:
        log.info("multi-label: %d lines of %s hold a JSON list of labels", lists, name)
    elif separated:
        log.info("multi-label: %d rows of %s hold %r", separated, name, rules.separator)
    else:
        log.info("single-label: no label of %s holds %r or a list", name, rules.separator)
    return bool(lists or separated)


def _names(path: str, row: _Row, separator: str) -> tuple[str, ...]:
    """A row's label names (a cell split at the separator; an empty cell: none)."""
    if isinstance(row.label, tuple):
        names = row.label
        if any(not name for name in names):
            raise ChuteError(
                f"{path}, line {row.line}: a label in the list is empty. Received: "
                f"{list(row.label)!r}"
            )
        return names
    if not row.label:
        return ()
    names = tuple(name.strip() for name in row.label.split(separator))
    if any(not name for name in names):
        raise ChuteError(
            f"{path}, line {row.line}: the labels {row.label!r} split at the separator "
            f"{separator!r} leave an empty name; remove the extra {separator!r}, or pass "
            "`label_separator` (--label-separator) if the labels are separated otherwise"
        )
    return names


def _multi_labels(
    path: str, kept: list[tuple[_Row, str]], rejects: list[dict], rules: LabelRules
) -> tuple[list[tuple[_Row, str]], list[str], list[dict]]:
    """The rows with their label names, the class names, and the rows refused (no label,
    too many)."""
    named, rejects = [], list(rejects)
    for row, resolved in kept:
        names = tuple(dict.fromkeys(_names(path, row, rules.separator)))  # once each, in order
        if not names and not rules.allow_empty:
            rejects.append(
                {"key": row.path,
                 "reason": f"no labels (line {row.line}); pass allow_empty_labels=True "
                           "(--allow-empty-labels) to keep it as a negative"}
            )  # fmt: skip
            continue
        if rules.max_labels is not None and len(names) > rules.max_labels:
            rejects.append(
                {"key": row.path,
                 "reason": f"{len(names)} labels (line {row.line}), more than "
                           f"max_labels={rules.max_labels}"}
            )  # fmt: skip
            continue
        named.append((row._replace(label=names), resolved))
    class_names = class_names_of([name for row, _ in named for name in row.label])
    if named and not class_names:  # negatives only: nothing to learn
        raise ChuteError(f"`source`: no image of {path} has a label. Received: source={path!r}")
    return named, class_names, rejects


def _first_of_each_file(
    path: str, base: str, rows: list[_Row], allow_outside: bool
) -> tuple[list[tuple[_Row, str]], list[dict]]:
    """The rows with their resolved paths, each file once (its first row), and a
    reject for every row that lists a file again."""
    kept, first_line, repeats = [], {}, []
    for row in rows:
        number, rel, label = row.line, row.path, row.label
        resolved = _resolve_listed(path, base, rel, number, allow_outside)
        # A file listed twice would be one image in two places, perhaps in two classes.
        if resolved in first_line:
            line, first_label = first_line[resolved]
            note = "" if label == first_label else f" with label {label!r}, not {first_label!r}"
            repeats.append(
                {"key": f"{rel} (line {number})",
                 "reason": f"listed again{note}: line {line} lists the same file"}
            )  # fmt: skip
            continue
        first_line[resolved] = (number, label)
        kept.append((row, resolved))
    return kept, repeats


def _resolve_listed(list_path: str, base: str, rel: str, line: int, allow_outside: bool) -> str:
    if not rel:
        raise ChuteError(f"{list_path}, line {line}: the path is empty")
    if storage.is_local(base):
        absolute = os.path.isabs(rel)
        resolved = os.path.normpath(os.path.join(base, rel))
        # symlinks resolved on both sides: a link inside the folder may lead out of it
        real, real_base = os.path.realpath(resolved), os.path.realpath(base)
        inside = real == real_base or real.startswith(real_base.rstrip(os.sep) + os.sep)
    else:
        absolute = rel.startswith("/") or "://" in rel
        if "://" in rel:
            resolved = rel
        else:  # normpath would fold the scheme's "//": keep it apart
            scheme, rest = base.split("://", 1)
            resolved = f"{scheme}://" + posixpath.normpath(posixpath.join(rest, rel))
        inside = resolved.startswith(base.rstrip("/") + "/")
    if (absolute or not inside) and not allow_outside:
        raise ChuteError(
            f"{list_path}, line {line}: paths must stay inside the list's folder {base!r}. "
            f"Received: {rel!r}. Pass allow_outside=True (--allow-outside) to accept it."
        )
    return resolved
