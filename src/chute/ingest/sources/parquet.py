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

``hf:OWNER/NAME[:CONFIG]`` downloads the files through ``huggingface_hub`` (what
the ``datasets`` library uses; ``pip install 'chute[hf]'``) into its cache.

Example:
    >>> found = scan_parquet("beans/data")  # doctest: +SKIP
    >>> found.kind, found.class_names  # doctest: +SKIP
    ('parquet', ['angular_leaf_spot', 'bean_rust', 'healthy'])
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import IMAGE_EXTENSIONS
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.base import (
    SPLIT_ALIASES,
    Item,
    MemberSource,
    Source,
    class_names_of,
    make_scratch_dir,
)
from chute.ingest.sources.members import TAR, Member

log = logging.getLogger(__name__)

EXTRA = "chute[hf]"
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
            "Reading Parquet needs pyarrow, which is not installed: pip install "
            f"'{EXTRA}' (or pip install pyarrow)"
        ) from None
    return pq


def _columns(schema: Any, image_column: str | None, label_column: str | None, path: str):
    """``(image column, label column, class names from the metadata or None)``."""
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
    label = label_column or typed("ClassLabel") or ("label" if "label" in names else None)
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
    feature = features.get(label) if isinstance(features.get(label), dict) else {}
    class_names = feature.get("names") if feature.get("_type") == "ClassLabel" else None
    return image, label, class_names


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
    """Whether a column of Arrow type ``kind`` can hold labels: not bytes, not nested."""
    import pyarrow as pa

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
        ("label_column", label, label_column, _holds_labels, "labels (integers or strings)"),
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
        return _read_all(pq, source, files, splits, temp_dir, image_column, label_column,
                         max_pixels, progress)  # fmt: skip
    # BaseException: an interrupt mid-copy must not leave gigabytes in the scratch folder.
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def _read_all(pq, source, files, splits, temp_dir, image_column, label_column, max_pixels,
              progress) -> Source:  # fmt: skip
    total = sum(storage.size(f) for f in files)
    limit = members_lib.max_member_bytes(max_pixels)
    data_path = os.path.join(temp_dir, "images.data")
    rows: list[tuple[str, Any, str | None, Member | None, str | None]] = []
    named: list[str] | None = None
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
            image, label, names = _columns(handle.schema_arrow, image_column, label_column, path)
            if names is not None:
                if named is not None and names != named:
                    raise ChuteError(
                        f"`source`: the class names of {path} differ from the other files'. "
                        f"Received: source={source!r}"
                    )
                named = names
            rel = os.path.relpath(path, source) if path != source else os.path.basename(path)
            row = 0
            for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=[image, label]):
                images = batch.column(0).to_pylist()
                labels = batch.column(1).to_pylist()
                for value, target in zip(images, labels, strict=True):
                    key = f"{rel}#{row:08d}"
                    row += 1
                    data = value.get("bytes") if isinstance(value, dict) else value
                    if not isinstance(data, bytes | bytearray) or not data:
                        rows.append((key, target, split, None, "no image bytes in the row"))
                        continue
                    if len(data) > limit:  # the worker rejects it from its size, unread
                        member = Member(data_path, TAR, key, -1, len(data))
                        rows.append((key, target, split, member, None))
                        continue
                    # Per image: a full disk would fail the write anyway, with a worse message.
                    if shutil.disk_usage(temp_dir).free < len(data) + DISK_RESERVE:
                        raise ChuteError(
                            f"Not enough free disk space in {temp_dir} to copy the images of "
                            f"`source`. Received: source={source!r}; set TMPDIR to a larger disk"
                        )
                    member = Member(data_path, TAR, key, out.tell(), len(data))
                    out.write(data)
                    rows.append((key, target, split, member, None))
                done += batch.nbytes
                if progress:
                    progress("unpack", min(done, total), total)
    return _source(source, files, rows, named, all(splits), temp_dir)


def _source(source, files, rows, named, presplit: bool, temp_dir: str) -> Source:
    """The Source of the rows read: labels resolved to class indices, bad rows rejected."""
    rejects = [{"key": key, "reason": reason} for key, _, _, _, reason in rows if reason]
    usable = [r for r in rows if r[4] is None]
    if named is not None:
        class_names = list(named)
    else:
        class_names = class_names_of([str(t) for _, t, _, _, _ in usable if t is not None])
    index = {name: i for i, name in enumerate(class_names)}
    items, found = [], []
    for key, target, split, member, _ in usable:
        if target is None:
            rejects.append({"key": key, "reason": "missing label"})
            continue
        if named is not None:  # a class index, or a name the metadata lists (string labels)
            # bool is an int in Python: True is no class index.
            valid = isinstance(target, int) and not isinstance(target, bool)
            if valid and 0 <= target < len(class_names):
                label = target
            elif isinstance(target, str) and target in index:
                label = index[target]
            else:
                reason = (
                    f"label {target!r} is not a class index from 0 to "
                    f"{len(class_names) - 1}, nor a class name of the file's metadata"
                )
                rejects.append({"key": key, "reason": reason})
                continue
        else:
            label = index[str(target)]
        items.append(Item(key, label, split, None, len(found)))
        found.append(member)
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
            f"installed: pip install '{EXTRA}'"
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
