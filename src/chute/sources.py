"""Sources: turn a dataset as people have it into a list of labelled items.

Recognised sources (see :func:`scan`):

* a folder with one sub-folder per class (nested folders belong to their
  top-level class; hidden entries skipped; symlinks followed, loops cut);
* a pre-split folder: ``train/<class>/…``, ``val/<class>/…`` (or
  ``validation``), optional ``test/<class>/…``;
* a CSV or JSONL list of ``path,label`` (optional ``split`` column), paths
  relative to the list's folder;
* a ``.npz`` file with ``x``/``y`` (or ``x_train``/``y_train`` and
  ``x_test``/``y_test``) uint8 arrays, optional ``class_names``;
* ``keras:cifar10``, ``keras:cifar100``, ``keras:mnist``,
  ``keras:fashion_mnist`` through ``keras.datasets``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
import posixpath
import zipfile
from typing import NamedTuple

import numpy as np

from chute import storage
from chute.errors import ChuteError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
SPLITS = ("train", "val", "test")
_SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "test": "test"}

KERAS_CLASS_NAMES = {
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
    "cifar10": [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ],
    "cifar100": """
        apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy
        bridge bus butterfly camel can castle caterpillar cattle chair chimpanzee clock
        cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish
        forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion
        lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree
        orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
        porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk
        skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table
        tank telephone television tiger tractor train trout tulip turtle wardrobe whale
        willow_tree wolf woman worm
    """.split(),  # noqa: SIM905
}


class Item(NamedTuple):
    """One image to convert.

    ``path`` is set for file sources; ``index`` is the row of
    ``Source.arrays[split]`` for array sources (-1 for files).
    """

    key: str
    label: int
    split: str | None
    path: str | None
    index: int = -1


@dataclasses.dataclass
class Source:
    """A scanned source: class names in label order and the items."""

    kind: str
    location: str
    class_names: list[str]
    items: list[Item]
    presplit: bool = False
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def payload(self, item: Item) -> str | np.ndarray:
        """What a worker needs to read the item: a path, or its pixel array."""
        if item.path is not None:
            return item.path
        return self.arrays[item.split or "train"][item.index]


def scan(source: str, *, allow_outside: bool = False) -> Source:
    """Lists a source's items and class names, sorted and deterministic.

    Args:
        source: a folder, a ``.csv``/``.jsonl``/``.npz`` file, or ``keras:NAME``.
        allow_outside: let a list name files outside its own folder.

    Returns:
        The :class:`Source`.

    Raises:
        ChuteError: the source is missing, of an unknown kind, malformed, or empty.

    Example:
        >>> scan("keras:mnist").class_names[:3]  # doctest: +SKIP
        ['0', '1', '2']
    """
    if not isinstance(source, str | os.PathLike) or not str(source):
        raise ChuteError(f"`source` must be a path or 'keras:NAME'. Received: source={source!r}")
    source = os.fspath(source)
    if source.startswith("keras:"):
        found = _scan_keras(source)
    else:
        fs = storage.gfile() if not storage.is_local(source) else None
        local = storage.local_path(source)
        exists = os.path.exists(local) if fs is None else fs.exists(source)
        if not exists:
            raise ChuteError(f"`source` does not exist. Received: source={source!r}")
        is_dir = os.path.isdir(local) if fs is None else fs.isdir(source)
        lower = source.lower()
        if is_dir:
            found = _scan_folder(source)
        elif lower.endswith((".csv", ".jsonl")):
            found = _scan_list(source, allow_outside=allow_outside)
        elif lower.endswith(".npz"):
            found = _scan_npz(source)
        else:
            raise ChuteError(
                "`source` must be a folder, a .csv, .jsonl or .npz file, or one of "
                f"{sorted('keras:' + k for k in KERAS_CLASS_NAMES)}. Received: source={source!r}"
            )
    if not found.items:
        raise ChuteError(
            f"`source` holds no images. Received: source={source!r} (looked for files ending in "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}, in any letter case, inside class folders)"
        )
    return found


# -- folders ------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def image_files(top: str, outer: frozenset[str] = frozenset()) -> list[str]:
    """Image paths under ``top`` relative to it (``/``-separated), sorted.

    Hidden files and folders are skipped; symlinked folders are followed
    unless they lead back to a folder already on the current path, or to one of
    the ``outer`` folders (real paths of the dataset and split roots): a loop.
    """
    found: list[str] = []
    if not storage.is_local(top):
        fs = storage.gfile()
        for dirpath, dirnames, filenames in fs.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = posixpath.relpath(dirpath.rstrip("/"), top.rstrip("/"))
            for name in filenames:
                if not name.startswith(".") and _is_image(name):
                    found.append(name if rel == "." else posixpath.join(rel, name))
        return sorted(found)

    def visit(path: str, rel: str, ancestors: frozenset[str]) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as error:
            log.warning("cannot list %s: %s", path, error)
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue
            if is_dir:
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    log.warning("skipping symlink loop at %s", entry.path)
                    continue
                visit(entry.path, child_rel, ancestors | {real})
            elif _is_image(entry.name):
                found.append(child_rel)

    top = storage.local_path(top)
    visit(top, "", outer | {os.path.realpath(top)})
    return sorted(found)


def _subfolders(path: str) -> list[str]:
    if storage.is_local(path):
        path = storage.local_path(path)
        return sorted(e.name for e in os.scandir(path) if not e.name.startswith(".") and e.is_dir())
    fs = storage.gfile()
    return sorted(
        n.rstrip("/")
        for n in fs.listdir(path)
        if not n.startswith(".") and fs.isdir(posixpath.join(path, n.rstrip("/")))
    )


def _scan_folder(root: str) -> Source:
    top = _subfolders(root)
    split_dirs = {name: _SPLIT_ALIASES.get(name.lower()) for name in top}
    presplit = (
        len(top) >= 2
        and all(split_dirs.values())
        and "train" in split_dirs.values()
        and len(set(split_dirs.values())) == len(top)
    )
    if not presplit:
        classes = top
        paths = {"": (root, classes)}
    else:
        paths = {}
        for name, split in split_dirs.items():
            split_root = storage.join(root, name)
            paths[split] = (split_root, _subfolders(split_root))
        classes = sorted({c for _, names in paths.values() for c in names})
        if not classes:
            presplit = False
            classes, paths = top, {"": (root, top)}
    if not classes:
        raise ChuteError(
            f"`source` has no class sub-folders. Received: source={root!r} (expected "
            "SOURCE/<class>/<image> or SOURCE/train/<class>/<image>)"
        )
    label_of = {name: i for i, name in enumerate(classes)}
    items: list[Item] = []
    for split, (split_root, names) in sorted(paths.items()):
        split_name = next(k for k, v in split_dirs.items() if v == split) if split else ""
        outer = frozenset()
        if storage.is_local(root):
            outer = frozenset(os.path.realpath(storage.local_path(p)) for p in (root, split_root))
        for class_name in names:
            prefix = f"{split_name}/{class_name}" if split else class_name
            class_root = storage.join(split_root, class_name)
            for rel in image_files(class_root, outer):
                items.append(
                    Item(
                        key=f"{prefix}/{rel}",
                        label=label_of[class_name],
                        split=split or None,
                        path=storage.join(class_root, *rel.split("/")),
                    )
                )
    kind = "split-folder" if presplit else "folder"
    return Source(kind, root, list(classes), items, presplit=presplit)


# -- lists --------------------------------------------------------------------------------


def _class_names(labels: list[str]) -> list[str]:
    unique = set(labels)
    if all(label.lstrip("-").isdigit() for label in unique):
        return sorted(unique, key=lambda label: (int(label), label))  # "1" and "01" stay apart
    return sorted(unique)


def _scan_list(path: str, *, allow_outside: bool) -> Source:
    try:
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
    labels = [label for _, _, label, _ in rows]
    if any(not label for label in labels):
        number = next(n for n, _, label, _ in rows if not label)
        raise ChuteError(f"{path}, line {number}: the label is empty")
    class_names = _class_names(labels)
    label_of = {name: i for i, name in enumerate(class_names)}
    presplit = any(split for *_, split in rows)
    items = []
    for number, rel, label, split in rows:
        resolved = _resolve_listed(path, base, rel, number, allow_outside)
        split_name = None
        if presplit:
            split_name = _SPLIT_ALIASES.get((split or "").lower())
            if split_name is None:
                raise ChuteError(
                    f"{path}, line {number}: `split` must be one of train, val, validation, "
                    f"test. Received: split={split!r}"
                )
        items.append(Item(rel, label_of[label], split_name, resolved))
    items.sort(key=lambda item: (item.split or "", item.key))
    kind = "jsonl" if path.lower().endswith(".jsonl") else "csv"
    return Source(kind, path, class_names, items, presplit=presplit)


def _resolve_listed(list_path: str, base: str, rel: str, line: int, allow_outside: bool) -> str:
    if not rel:
        raise ChuteError(f"{list_path}, line {line}: the path is empty")
    if storage.is_local(base):
        absolute = os.path.isabs(rel)
        resolved = os.path.normpath(os.path.join(base, rel))
        inside = resolved == base or resolved.startswith(base.rstrip(os.sep) + os.sep)
    else:
        absolute = rel.startswith("/") or "://" in rel
        resolved = rel if "://" in rel else posixpath.normpath(posixpath.join(base, rel))
        inside = resolved.startswith(base.rstrip("/") + "/")
    if (absolute or not inside) and not allow_outside:
        raise ChuteError(
            f"{list_path}, line {line}: paths must stay inside the list's folder {base!r}. "
            f"Received: {rel!r}. Pass allow_outside=True (--allow-outside) to accept it."
        )
    return resolved


# -- arrays -------------------------------------------------------------------------------


def _array_source(
    kind: str,
    location: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    class_names: list[str] | None,
) -> Source:
    arrays: dict[str, np.ndarray] = {}
    items: list[Item] = []
    max_label = -1
    presplit = len(splits) > 1
    for split, (x, y) in splits.items():
        x = np.asarray(x)
        y = np.asarray(y)
        if x.dtype != np.uint8:
            raise ChuteError(
                f"`x` must hold uint8 pixels (0-255). Received: x.dtype={x.dtype} in {location} "
                f"({split}); convert with (x * 255).round().astype('uint8') if it is in [0, 1]"
            )
        if x.ndim == 4 and x.shape[-1] == 1:
            x = x[..., 0]
        if not (x.ndim == 3 or (x.ndim == 4 and x.shape[-1] in (3, 4))):
            raise ChuteError(
                "`x` must have shape (N, H, W) or (N, H, W, C) with C in {1, 3, 4}. "
                f"Received: x.shape={x.shape} in {location} ({split})"
            )
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise ChuteError(
                f"`y` must be {len(x)} integer labels, one per image. Received: "
                f"y.shape={y.shape}, y.dtype={y.dtype} in {location} ({split})"
            )
        if len(y) and y.min() < 0:
            raise ChuteError(f"`y` must be labels >= 0. Received: min(y)={y.min()} in {location}")
        max_label = max(max_label, int(y.max()) if len(y) else -1)
        arrays[split] = x
        width = max(5, len(str(len(x))))
        items.extend(
            Item(f"{split}/{i:0{width}d}", int(label), split if presplit else None, None, i)
            for i, label in enumerate(y)
        )
    if class_names is None:
        class_names = [str(i) for i in range(max_label + 1)]
    elif max_label >= len(class_names):
        raise ChuteError(
            f"`y` has label {max_label} but only {len(class_names)} class names were given "
            f"in {location}"
        )
    return Source(kind, location, list(class_names), items, presplit=presplit, arrays=arrays)


def _scan_npz(path: str) -> Source:
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        data = np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False)
        keys = set(data.files)
        if {"x", "y"} <= keys:
            splits["train"] = (data["x"], data["y"])
        for split in SPLITS:
            if {f"x_{split}", f"y_{split}"} <= keys:
                splits[split] = (data[f"x_{split}"], data[f"y_{split}"])
        names = [str(n) for n in data["class_names"].tolist()] if "class_names" in keys else None
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ChuteError(f"`source` is not a readable .npz file: {path!r} ({error})") from None
    if "train" not in splits:
        raise ChuteError(
            "A .npz source must hold arrays 'x' and 'y' (or 'x_train' and 'y_train', with "
            f"optional 'x_val'/'y_val', 'x_test'/'y_test'). Received: {path!r} holds "
            f"{sorted(keys)}"
        )
    return _array_source("npz", path, splits, names)


def _scan_keras(source: str) -> Source:
    name = source.split(":", 1)[1]
    if name not in KERAS_CLASS_NAMES:
        raise ChuteError(
            "`source` names an unknown keras dataset. Received: source="
            f"{source!r}; allowed: {', '.join('keras:' + k for k in sorted(KERAS_CLASS_NAMES))}"
        )
    import keras

    (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, name).load_data()
    return _array_source(
        "keras",
        source,
        {"train": (x_train, y_train), "test": (x_test, y_test)},
        KERAS_CLASS_NAMES[name],
    )
