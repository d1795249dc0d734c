"""Sources: turn a dataset as people have it into a list of labelled items.

Recognised sources (see :func:`scan`):

* a folder with one sub-folder per class (nested folders belong to their
  top-level class; hidden entries skipped; symlinks followed, loops cut);
* a pre-split folder: ``train/<class>/…``, ``val/<class>/…`` (or
  ``validation``), optional ``test/<class>/…``;
* a CSV or JSONL list of ``path,label`` (optional ``split`` column), paths
  relative to the list's folder; several labels per image in one cell
  (``cat|night``) or a JSON list, and a ``weight`` column (see :mod:`.lists`);
* a ``.npz`` file with ``x``/``y`` (or ``x_train``/``y_train`` and
  ``x_test``/``y_test``) uint8 arrays, optional ``class_names``;
* ``keras:cifar10``, ``keras:cifar100``, ``keras:mnist``,
  ``keras:fashion_mnist`` through ``keras.datasets``;
* a ``.zip`` or ``.tar`` (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``)
  archive of such a tree, read member by member (see :mod:`.archives`, :mod:`.tars`);
* WebDataset tar shards, ``{key}.jpg`` beside ``{key}.cls`` (or ``.txt``,
  ``.json``), one ``.tar`` or a pattern such as ``shard-{000000..000099}.tar``
  (see :mod:`.webdataset`); a ``.json`` list gives several labels per image;
* Hugging Face Parquet files (a folder in the Hub's layout, a dataset
  repository cloned, or one ``.parquet`` file), or ``hf:OWNER/NAME[:CONFIG]``
  downloaded from the Hub (see :mod:`.parquet`); a label column of lists
  (``Sequence(ClassLabel)``) gives several labels per image.

How labels are read (one or several per image, detected or asked) follows
:class:`~.base.LabelRules`; a class-per-folder tree, an ``.npz`` and ``keras:``
have one class per image and refuse ``label_mode="multi"``.

One module per kind; :mod:`.base` holds what they share (a leaf): the
:class:`Source` protocol and its three classes (image files, pixel arrays,
members of container files). One table (``_KINDS``) decides a source's kind,
both for :func:`scan` and for :func:`container_files`.
Whatever the kind, :func:`scan` makes keys, reject reasons and class names
text (:func:`chute.image.files.text_key`): a name that is not UTF-8 keeps its bytes as
``\\xNN`` in them, while its file is read through its real path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import IMAGE_EXTENSIONS, image_files, text_key
from chute.image.size import DEFAULT_MAX_PIXELS
from chute.ingest.sources import archives, arrays, lists, parquet, tars, webdataset
from chute.ingest.sources.base import (
    SPLITS,
    ArraySource,
    FileSource,
    Item,
    LabelRules,
    MemberSource,
    ProgressFn,
    Source,
)
from chute.ingest.sources.folder import scan_folder
from chute.ingest.sources.members import TAR, ZIP

__all__ = [
    "IMAGE_EXTENSIONS",
    "SPLITS",
    "ArraySource",
    "FileSource",
    "Item",
    "LabelRules",
    "MemberSource",
    "Source",
    "container_files",
    "image_files",
    "scan",
    "source_identity",
    "text_key",
]


class _Request(NamedTuple):
    """What the caller of :func:`scan` asked, passed to every kind's scanner."""

    allow_outside: bool
    max_pixels: int
    progress: ProgressFn | None
    columns: dict[str, str | None]
    labels: LabelRules = LabelRules()


def _single_label(kind: str, source: str, request: _Request) -> None:
    """Refuses ``label_mode="multi"`` for a source that has one class per image by its
    shape (a class-per-folder tree, arrays of integer labels)."""
    asked = "label_mode='multi'" if request.labels.mode == "multi" else request.labels.hinted
    if asked is None:
        return
    why = "one integer label per image" if kind in ("npz", "keras") else "one class per folder"
    raise ChuteError(
        f"`label_mode`: a {kind} source is single-label ({why}). Received: "
        f"{asked}, source={source!r}; list the images and their labels in a CSV "
        "(path,labels with 'cat|night'), a JSONL file (\"labels\": [...]) or a Parquet file "
        "with a list column"
    )


def _scan_archive(path: str, request: _Request) -> Source:
    """A zip or tar of class folders, or a tar of WebDataset samples."""
    # A zip is always a class tree; only a tar may hold WebDataset samples.
    if not archives.is_tar(path):
        _single_label("zip", path, request)
        return archives.tree_source(ZIP, path, archives.list_zip(path))
    listing = tars.list_tar(path, max_pixels=request.max_pixels, progress=request.progress)
    try:
        if webdataset.looks_like(listing.files):
            return webdataset.samples_source(
                path, [(storage.basename(path), listing)], labels=request.labels
            )
        _single_label("tar", path, request)
        return archives.tree_source(TAR, path, listing)
    # The listing unpacked a compressed tar to scratch: removed if the source is never made.
    except BaseException:
        archives.remove(listing.temp_dir)
        raise


def _scan_parquet(path: str, request: _Request) -> Source:
    return parquet.scan_parquet(
        path,
        max_pixels=request.max_pixels,
        progress=request.progress,
        labels=request.labels,
        **request.columns,
    )


def _escape_names(found: Source) -> None:
    """Keys, reject reasons and class names as text (:func:`chute.image.files.text_key`),
    whatever the kind: a name that is not UTF-8 is written escaped, never crashes a writer."""
    found.items = [
        item if (key := text_key(item.key)) == item.key else item._replace(key=key)
        for item in found.items
    ]
    found.rejects = [
        {field: text_key(v) if isinstance(v, str) else v for field, v in reject.items()}
        for reject in found.rejects
    ]
    found.class_names = [text_key(name) for name in found.class_names]


def _looked_for(kind: str) -> str:
    """What a source of ``kind`` holding no images was searched for, as a message says it."""
    if kind == "parquet":
        return "rows with image bytes and a label in its Parquet files"
    files = f"files ending in {', '.join(sorted(IMAGE_EXTENSIONS))}, in any letter case"
    if kind == "webdataset":
        return f"{files}, in WebDataset samples ({{key}}.<image> beside {{key}}.cls, .txt or .json)"
    return f"{files}, inside class folders"


def _is_pattern(source: str) -> bool:
    # A file that exists is itself, even with braces or [ in its name.
    return webdataset.is_pattern(source) and not storage.exists(source)


def _ends(*suffixes: str) -> Callable[[str], bool]:
    return lambda source: source.lower().endswith(suffixes)


def _itself(source: str) -> list[str]:
    return [source]


class _Kind(NamedTuple):
    """A row of the table of kinds."""

    recognises: Callable[[str], bool]
    must_exist: bool  # recognised by name: a missing file is "does not exist", not "unknown"
    scan: Callable[[str, _Request], Source]
    # the files it is read from, known without scanning (a re-run compares their size and
    # time before unpacking anything); None: its items must be listed, or downloaded
    files: Callable[[str], list[str]] | None = None


# Tried in order: the first row that recognises a source decides its kind. Order matters:
# hf:/keras: names and patterns are not paths; Parquet folders before class folders; a
# folder named like a file (data.npz/) is a folder.
_KINDS: list[_Kind] = [
    _Kind(lambda s: s.startswith("hf:"), False, lambda s, r: _scan_parquet(parquet.download(s), r)),
    # _single_label raises for label_mode="multi" (before anything is read), else is None.
    _Kind(
        lambda s: s.startswith("keras:"),
        False,
        lambda s, r: _single_label("keras", s, r) or arrays.scan_keras(s),
    ),
    _Kind(
        _is_pattern,
        False,
        lambda s, r: webdataset.scan_pattern(
            s, max_pixels=r.max_pixels, progress=r.progress, labels=r.labels
        ),
        webdataset.shard_paths,
    ),
    _Kind(
        lambda s: storage.exists(s) and parquet.is_parquet_source(s),
        True,
        _scan_parquet,
        parquet.files_of,
    ),
    _Kind(
        lambda s: storage.exists(s) and storage.isdir(s),
        True,
        lambda s, r: _single_label("folder", s, r) or scan_folder(s),
    ),
    _Kind(
        _ends(".csv", ".jsonl"),
        True,
        lambda s, r: lists.scan_list(s, allow_outside=r.allow_outside, labels=r.labels),
    ),
    _Kind(
        _ends(".npz"), True, lambda s, r: _single_label("npz", s, r) or arrays.scan_npz(s), _itself
    ),
    _Kind(archives.is_archive, True, _scan_archive, _itself),
]


def _kind_of(source: str) -> _Kind | None:
    return next((kind for kind in _KINDS if kind.recognises(source)), None)


def scan(
    source: str,
    *,
    allow_outside: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    progress: Callable[[str, int, int], None] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    labels: LabelRules = LabelRules(),  # noqa: B008 (frozen: one shared default is safe)
) -> Source:
    """Lists a source's items and class names, sorted and deterministic.

    Args:
        source: a folder, a ``.csv``/``.jsonl``/``.npz`` file, a ``.zip`` or
            ``.tar`` (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``) archive,
            a pattern of WebDataset ``.tar`` shards, Parquet files (a folder or a
            ``.parquet`` file), ``hf:OWNER/NAME[:CONFIG]``, or ``keras:NAME``.
        allow_outside: let a list name files outside its own folder.
        max_pixels: the conversion's pixel limit; a compressed tar's members too
            large for it are not unpacked (they are rejected).
        progress: called as ``progress("unpack", bytes_done, bytes_total)``
            while a compressed tar or Parquet files are unpacked.
        image_column: Parquet: the column of images (default: found from the schema).
        label_column: Parquet: the column of labels (default: found from the schema).
        labels: how labels and sample weights are read (single or several per image,
            the separator, empty and crowded label fields, the weight column); see
            :class:`~chute.ingest.sources.base.LabelRules`.

    Returns:
        The :class:`Source`; close it (or use it as a context manager) to delete
        what a compressed tar was unpacked to.

    Raises:
        ChuteError: the source is missing, of an unknown kind, malformed, or empty.

    Example:
        >>> scan("keras:mnist").class_names[:3]  # doctest: +SKIP
        ['0', '1', '2']
        >>> scan("data/shard-{000000..000003}.tar").kind  # doctest: +SKIP
        'webdataset'
    """
    if not isinstance(source, str | os.PathLike) or not str(source):
        raise ChuteError(f"`source` must be a path or 'keras:NAME'. Received: source={source!r}")
    source = os.fspath(source)
    columns = {"image_column": image_column, "label_column": label_column}
    request = _Request(allow_outside, max_pixels, progress, columns, labels)
    kind = _kind_of(source)
    if kind is None:
        if not storage.exists(source):
            raise ChuteError(f"`source` does not exist. Received: source={source!r}")
        raise ChuteError(
            "`source` must be a folder, a .csv, .jsonl, .npz or .parquet file, a "
            f"{', '.join(archives.SUFFIXES)} archive, a pattern of WebDataset .tar shards "
            f"or one of {sorted('keras:' + k for k in arrays.KERAS_CLASS_NAMES)}. "
            f"Received: source={source!r}"
        )
    if kind.must_exist and not storage.exists(source):
        raise ChuteError(f"`source` does not exist. Received: source={source!r}")
    found = kind.scan(source, request)
    # Once, here, for every kind: each scanner may keep the raw names it found.
    _escape_names(found)
    given = [f"{name}={value!r}" for name, value in columns.items() if value is not None]
    # Checked after the scan: a folder may turn out to hold Parquet files.
    if given and found.kind != "parquet":
        # Closed before raising: the caller never gets the source to close.
        found.close()
        raise ChuteError(
            f"`{given[0].split('=')[0]}` applies to Parquet sources; `source` is a "
            f"{found.kind} source. Received: {', '.join(given)}"
        )
    if labels.weight_column is not None and found.kind not in ("csv", "jsonl", "parquet"):
        found.close()
        raise ChuteError(
            "`weight_column` applies to CSV, JSONL and Parquet sources; `source` is a "
            f"{found.kind} source. Received: weight_column={labels.weight_column!r}"
        )
    if not found.items:
        found.close()
        refused = ""
        if found.rejects:
            first = found.rejects[0]
            refused = f"; {len(found.rejects)} refused, first {first['key']!r}: {first['reason']}"
        raise ChuteError(
            f"`source` holds no images. Received: source={source!r} "
            f"(looked for {_looked_for(found.kind)}{refused})"
        )
    return found


def container_files(source: str | os.PathLike) -> list[str] | None:
    """The files a source is read from when they are known without scanning it (what
    ``source-files.csv`` lists for it): an archive, Parquet files, an ``.npz``,
    WebDataset shards. None for sources whose items must be listed (folders, lists)
    or downloaded (``hf:``, ``keras:``), and for a source that is not there.

    Example:
        >>> container_files("keras:mnist") is None
        True
    """
    source = os.fspath(source)
    try:
        kind = _kind_of(source)
        if kind is None or kind.files is None or (kind.must_exist and not storage.exists(source)):
            return None
        return kind.files(source)
    except ChuteError:
        return None  # the scan reports it


def source_identity(source: str | os.PathLike) -> str:
    """A source as the user named it, normalised, so that a re-run or resume recognises
    it however it is spelled: a local path made absolute (``src``, ``src/``,
    ``./src`` and ``/abs/src`` are one), a remote one without a trailing ``/`` nor its
    credentials (:func:`~chute.format.storage.redact`);
    ``hf:`` and ``keras:`` names as they are (never the folder a download went to);
    a name that is not UTF-8 escaped as keys are (:func:`text_key`).

    Example:
        >>> source_identity("hf:AI-Lab-Makerere/beans"), source_identity("gs://b/imgs/")
        ('hf:AI-Lab-Makerere/beans', 'gs://b/imgs')
        >>> source_identity("data/../src/") == os.path.abspath("src")
        True
    """
    source = os.fspath(source).strip()
    if source.startswith(("hf:", "keras:")):
        return source
    if storage.is_local(source):
        return text_key(os.path.abspath(storage.local_path(source)))
    # Redacted: the identity is stored (plan, manifest); a re-run with the same place but
    # another password or signature is the same source.
    return text_key(storage.redact(source.rstrip("/") or source))
