"""CSV and JSONL lists of ``path,label`` (optional ``split`` column) as a source.

Paths are relative to the list's folder and must stay inside it unless
``allow_outside``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath

from chute.errors import ChuteError
from chute.format import storage
from chute.ingest.sources.base import (
    SPLIT_ALIASES,
    FileSource,
    Item,
    Source,
    class_names_of,
)


def scan_list(path: str, *, allow_outside: bool) -> Source:
    try:
        # utf-8-sig: a list saved by a spreadsheet often starts with a byte-order mark.
        text = storage.read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ChuteError(
            f"`source` must be a UTF-8 text list. Received: {path!r}, which is not UTF-8 "
            f"({error.reason} at byte {error.start}); save it as UTF-8"
        ) from None
    rows: list[tuple[int, str, str, str | None]] = []  # (line, path, label, split)
    if path.lower().endswith(".jsonl"):
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                split = record.get("split")
                if split is not None and not isinstance(split, str):
                    raise TypeError(f"'split' must be a string, got {split!r}")
                rows.append((number, str(record["path"]), str(record["label"]), split))
            except (ValueError, KeyError, TypeError) as error:
                raise ChuteError(
                    f"{path}, line {number}: each line must be a JSON object with 'path' and "
                    f"'label'. Received: {line[:80]!r} ({error})"
                ) from None
    else:
        reader = list(csv.reader(io.StringIO(text)))
        columns = {"path": 0, "label": 1, "split": None}
        if (
            reader
            and reader[0]
            and reader[0][0].strip().lower()
            in (
                "path",
                "file",
                "filename",
                "filepath",
                "image",
            )
        ):
            header = [h.strip().lower() for h in reader[0]]
            columns = {
                "path": 0,
                "label": next((i for i, h in enumerate(header) if h in ("label", "class")), 1),
                "split": header.index("split") if "split" in header else None,
            }
            # The header becomes an empty row, so line numbers in messages stay the file's own.
            reader = [[], *reader[1:]]
        for number, row in enumerate(reader, start=1):
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) <= max(c for c in columns.values() if c is not None):
                raise ChuteError(
                    f"{path}, line {number}: each row must be 'path,label'. Received: {row!r}"
                )
            split_col = columns["split"]
            rows.append(
                (
                    number,
                    row[columns["path"]].strip(),
                    row[columns["label"]].strip(),
                    row[split_col].strip() if split_col is not None else None,
                )
            )
    base = (
        posixpath.dirname(path)
        if not storage.is_local(path)
        else os.path.dirname(os.path.abspath(storage.local_path(path)))
    )
    if any(not label for _, _, label, _ in rows):
        number = next(n for n, _, label, _ in rows if not label)
        raise ChuteError(f"{path}, line {number}: the label is empty")
    rows, repeats = _first_of_each_file(path, base, rows, allow_outside)
    class_names = class_names_of([label for *_, label, _, _ in rows])
    label_of = {name: i for i, name in enumerate(class_names)}
    presplit = any(split for *_, split, _ in rows)
    items = []
    for number, rel, label, split, resolved in rows:
        split_name = None
        if presplit:
            split_name = SPLIT_ALIASES.get((split or "").lower())
            if split_name is None:
                raise ChuteError(
                    f"{path}, line {number}: `split` must be one of train, val, validation, "
                    f"test. Received: split={split!r}"
                )
        items.append(Item(rel, label_of[label], split_name, resolved))
    # Sorted: the list's own order must not change the conversion.
    items.sort(key=lambda item: (item.split or "", item.key))
    kind = "jsonl" if path.lower().endswith(".jsonl") else "csv"
    return FileSource(kind, path, class_names, items, presplit=presplit, rejects=repeats)


def _first_of_each_file(
    path: str, base: str, rows: list[tuple], allow_outside: bool
) -> tuple[list[tuple], list[dict]]:
    """The rows with their resolved paths, each file once (its first row), and a
    reject for every row that lists a file again."""
    kept, first_line, repeats = [], {}, []
    for number, rel, label, split in rows:
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
        kept.append((number, rel, label, split, resolved))
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
