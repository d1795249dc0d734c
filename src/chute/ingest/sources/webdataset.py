"""WebDataset tar shards as a source: ``{key}.jpg`` beside ``{key}.cls`` in ``.tar`` files.

A sample is the members sharing a key: the member's path up to the first dot
of its file name (``shard/00042.jpg`` and ``shard/00042.cls`` are sample
``shard/00042``), as WebDataset groups them. Each image member (``.jpg``,
``.jpeg``, ``.png``, ``.webp``, or any other image extension chute reads)
is an item, labelled by its sample's label member, the first of:

* ``{key}.cls``: a class index (``3``) or a class name;
* ``{key}.json``: an integer, a string, or an object with ``"label"`` (or
  ``"cls"``) holding one;
* ``{key}.txt``: a class index or a class name.

Integer labels become class names ``"0"``, ``"1"``, … sorted numerically (as a
CSV list's are); names are sorted. An image without a label member, or with a
label that does not parse, is rejected with the reason; so are truncated and
undecodable members. Hidden files and ``__MACOSX`` are skipped, as in folders.

Several labels per image (multi-label): a ``.json`` holding a list
(``["cat", "night"]``, ``[3, 7]``) or an object whose ``"labels"`` (or
``"label"``) holds one, or, with ``label_mode="multi"`` or when any ``.txt``
holds the separator, a ``.txt`` of labels between separators (``cat|night``).
``label_mode="auto"`` chooses multi when any sample has such a label (logged).
A sample with no label (``[]``, an empty ``.txt``) is rejected unless empty
labels are allowed (a negative); so is one with more than ``max_labels``.

The source is one ``.tar`` (compressed ones too: unpacked once, see
:mod:`.archives`), or a pattern naming shards: brace ranges and
lists (``shard-{000000..000099}.tar``, ``{train,extra}-0.tar``) and globs
(``shards/*.tar``). A single tar is read as WebDataset when at least half of
its images have a label member in their sample, otherwise as a class tree;
a pattern must name WebDataset shards. Shards form one pool, split by
``--val-fraction``; an item's key is ``{shard file}/{member}``.

Example:
    >>> import chute
    >>> chute.convert("data/shard-{000000..000003}.tar", "shards",
    ...               image_size=224)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import re

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import IMAGE_EXTENSIONS
from chute.ingest.sources import archives, tars
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.base import (
    LABEL_EXTENSIONS,
    LITTER,
    Item,
    LabelRules,
    MemberSource,
    ProgressFn,
    Source,
    class_names_of,
    make_scratch_dir,
)

IMAGE_EXTS = frozenset(ext[1:] for ext in IMAGE_EXTENSIONS)
# A cap on what a pattern expands to: a typo such as {0..99999999} must not fill memory.
MAX_SHARDS = 100_000
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
_INTEGER = re.compile(r"-?\d+")
_NO_RULES = LabelRules()

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source named by URL is logged without its credentials


def is_pattern(source: str) -> bool:
    """Whether ``source`` has braces or glob characters (names shards, not one file).

    Example:
        >>> is_pattern("shard-{000000..000003}.tar"), is_pattern("data.tar")
        (True, False)
    """
    return bool(_BRACES.search(source)) or any(c in source for c in "*?[")


def expand_braces(pattern: str) -> list[str]:
    """``pattern`` with its brace ranges and lists expanded, in order.

    Ranges keep the zero padding of their bounds, as WebDataset's ``braceexpand`` does.

    Raises:
        ChuteError: a pattern naming more than :data:`MAX_SHARDS` paths.

    Example:
        >>> expand_braces("s-{08..10}.tar")
        ['s-08.tar', 's-09.tar', 's-10.tar']
        >>> expand_braces("{a,b}-{0..1}")
        ['a-0', 'a-1', 'b-0', 'b-1']
    """
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[: match.start()], match[1], pattern[match.end() :]
    numbers = _RANGE.fullmatch(body)
    if numbers:
        first, last = int(numbers[1]), int(numbers[2])
        # A leading zero in either bound asks for zero padding, as braceexpand reads it.
        padded = any(len(n.lstrip("-")) > 1 and n.lstrip("-")[0] == "0" for n in numbers.groups())
        width = max(len(numbers[1]), len(numbers[2])) if padded else 0
        # Checked before the range is built: its size is known from the bounds.
        if abs(last - first) >= MAX_SHARDS:
            raise _too_many(pattern)
        step = 1 if last >= first else -1
        choices = [f"{n:0{width}d}" for n in range(first, last + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:  # "{x}": no expansion, kept as written
        return [head + match[0] + rest for rest in expand_braces(tail)]
    out = [path for choice in choices for path in expand_braces(head + choice + tail)]
    if len(out) > MAX_SHARDS:
        raise _too_many(pattern)
    return out


def _too_many(pattern: str) -> ChuteError:
    return ChuteError(f"`source` names more than {MAX_SHARDS} shards. Received: source={pattern!r}")


def shard_paths(pattern: str) -> list[str]:
    """The shard files a pattern names, sorted; every named file must exist.

    Raises:
        ChuteError: a named shard is missing, a glob matches nothing, or a
            file is not a tar archive.
    """
    paths, missing = [], []
    for candidate in expand_braces(pattern):
        if any(c in candidate for c in "*?["):
            matches = storage.glob(candidate)
            paths += matches
            if not matches:
                missing.append(candidate)
        elif storage.exists(candidate):
            paths.append(candidate)
        else:
            missing.append(candidate)
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise ChuteError(
            f"`source` names shards that do not exist ({shown}{', ...' if len(missing) > 5 else ''}"
            f"; {len(missing)} in all). Received: source={pattern!r}"
        )
    # A set: overlapping patterns ({a,b}* and a*) must not read a shard twice.
    paths = sorted(set(paths))
    others = [p for p in paths if not archives.is_tar(p)]
    if others:
        raise ChuteError(
            f"`source` must name WebDataset .tar shards ({', '.join(archives.TAR_SUFFIXES)}). "
            f"Received: source={pattern!r}, which names {others[0]!r}"
        )
    return paths


def scan_pattern(
    pattern: str,
    *,
    max_pixels: int,
    progress: ProgressFn | None = None,
    labels: LabelRules = _NO_RULES,
) -> Source:
    """The samples of every shard a pattern names, as one :class:`Source`.

    Raises:
        ChuteError: see :func:`shard_paths`; a shard is unreadable, or holds no
            WebDataset samples.
    """
    paths = shard_paths(pattern)
    names = [storage.basename(p) for p in paths]
    if len(set(names)) < len(names):  # same file names in different folders: keep folders
        names = paths
    sizes = [storage.size(path) for path in paths]
    total = sum(sizes)
    temp_dir = make_scratch_dir()
    try:
        shards = []
        for number, (name, path) in enumerate(zip(names, paths, strict=True)):
            shown = None
            if progress is not None:  # one bar over every shard unpacked
                before = sum(sizes[:number])

                def shown(phase: str, done: int, _: int, before: int = before) -> None:
                    progress(phase, before + done, total)

            listing = tars.list_tar(path, max_pixels=max_pixels, progress=shown, temp_dir=temp_dir)
            if not looks_like(listing.files):
                raise ChuteError(
                    f"`source` must name WebDataset shards ({{key}}.jpg beside {{key}}.cls, "
                    f".txt or .json). Received: source={pattern!r}, whose {path!r} holds no "
                    "such samples"
                )
            shards.append((name, listing))
        return samples_source(pattern, shards, temp_dir, containers=paths, labels=labels)
    # BaseException: Ctrl-C mid-unpack must not leave the scratch folder behind.
    except BaseException:
        archives.remove(temp_dir)
        raise


def _samples(files: dict[str, archives.Entry]) -> dict[str, dict[str, archives.Entry]]:
    """Sample key -> {extension (lower case) -> entry}; hidden files and litter skipped."""
    samples: dict[str, dict[str, archives.Entry]] = {}
    for name, entry in files.items():
        parts = name.split("/")
        if any(part.startswith(".") or part in LITTER for part in parts):
            continue
        folder, _, base = name.rpartition("/")
        # Up to the first dot, as WebDataset groups: "x.seg.png" belongs to sample "x".
        stem, dot, extension = base.partition(".")
        if dot and stem:
            key = f"{folder}/{stem}" if folder else stem
            samples.setdefault(key, {})[extension.lower()] = entry
    return samples


def looks_like(files: dict[str, archives.Entry]) -> bool:
    """Whether a tar holds WebDataset samples: at least half of its images have a label
    member (``.cls``, ``.json``, ``.txt``) with the same key."""
    images = labelled = 0
    for extensions in _samples(files).values():
        count = sum(extension in IMAGE_EXTS for extension in extensions)
        images += count
        if any(extension in extensions for extension in LABEL_EXTENSIONS):
            labelled += count
    # At least half: a class tree with a few stray .txt notes is no WebDataset.
    return labelled > 0 and 2 * labelled >= images


def samples_source(
    location: str,
    shards: list[tuple[str, archives.Listing]],
    temp_dir: str | None = None,
    *,
    containers: list[str] | None = None,
    labels: LabelRules = _NO_RULES,
) -> Source:
    """The items of WebDataset shards (``(shard name, listing)``, in order), sorted by key."""
    # Every sample's label first: whether the source is multi-label depends on them all.
    read = []
    for _, listing in shards:
        samples = sorted(_samples(listing.files).items())
        read.append([(key, extensions, _label(key, extensions)) for key, extensions in samples
                     if any(extension in IMAGE_EXTS for extension in extensions)])  # fmt: skip
    multi = _is_multi(location, [found for sample in read for *_, found in sample], labels)
    pending: list[tuple[str, str | tuple[str, ...], members_lib.Member]] = []
    rejects: list[dict] = []
    for (shard, listing), samples in zip(shards, read, strict=True):
        temp_dir = temp_dir or listing.temp_dir
        rejects += [{"key": f"{shard}/{r['key']}", "reason": r["reason"]} for r in listing.rejects]
        for key, extensions, (value, label_extension, problem) in samples:
            images = sorted(extension for extension in extensions if extension in IMAGE_EXTS)
            label = value
            if problem is None:
                member = f"{key}.{label_extension}"
                label, problem = _labels_as(shard, member, value, multi, labels)
            for extension in images:
                entry = extensions[extension]
                # The member's own reject (truncated, too large) comes before the label's.
                reason = entry.reject if entry.member is None else problem
                if reason is not None:
                    rejects.append({"key": f"{shard}/{entry.name}", "reason": reason})
                else:
                    pending.append((f"{shard}/{entry.name}", label, entry.member))
    # Sorted by key: the order never depends on how the shards were listed.
    pending.sort(key=lambda sample: sample[0])
    if multi:
        class_names = class_names_of([name for _, names, _ in pending for name in names])
    else:
        class_names = class_names_of([label for _, label, _ in pending])
    label_of = {name: i for i, name in enumerate(class_names)}
    items = [
        Item(key, -1, None, None, i, labels=tuple(sorted(label_of[n] for n in label)))
        if multi
        else Item(key, label_of[label], None, None, i)
        for i, (key, label, _) in enumerate(pending)
    ]
    return MemberSource(
        "webdataset",
        location,
        class_names,
        items,
        rejects=rejects,
        multi_label=multi,
        members=[member for *_, member in pending],
        containers=containers or [location],
        temp_dir=temp_dir,
    )


def _is_multi(location: str, found: list[tuple], rules: LabelRules) -> bool:
    """Whether the samples are multi-label: as asked, or in ``auto`` mode when a label is
    a JSON list or a ``.txt`` holds the separator (logged)."""
    if rules.mode != "auto":
        return rules.mode == "multi"
    lists = sum(isinstance(value, tuple) for value, _, problem in found if problem is None)
    separated = sum(
        extension == "txt" and isinstance(value, str) and rules.separator in value
        for value, extension, problem in found
        if problem is None
    )
    if rules.hinted and not (lists or separated):
        log.info("multi-label: %s asks for it (%s)", rules.hinted, location)
        return True
    if lists:
        log.info("multi-label: %d samples of %s hold a JSON list of labels", lists, location)
    elif separated:
        log.info("multi-label: %d .txt labels of %s hold %r", separated, location, rules.separator)
    return bool(lists or separated)


def _labels_as(
    shard: str, name: str, value: str | tuple[str, ...], multi: bool, rules: LabelRules
) -> tuple[str | tuple[str, ...], str | None]:
    """A sample's label as the source reads it: a class name (single-label) or a tuple of
    names (multi-label), or why the sample is rejected.

    Raises:
        ChuteError: a ``.txt`` whose separator leaves an empty name.
    """
    if not multi:
        if isinstance(value, tuple):
            return "", f"label member {name} holds a list of labels; label_mode='multi' reads it"
        return value, None if value else f"label member {name} is empty"
    if isinstance(value, tuple):
        names = value
    elif name.endswith(".txt") and value:
        names = tuple(_canonical(part) for part in value.split(rules.separator))
        if not all(names):
            raise ChuteError(
                f"{shard}/{name}: the labels {value!r} split at the separator "
                f"{rules.separator!r} leave an empty name; remove the extra "
                f"{rules.separator!r}, or pass `label_separator` (--label-separator) if the "
                "labels are separated otherwise"
            )
    else:
        names = (value,) if value else ()
    names = tuple(dict.fromkeys(names))  # a label twice on one image counts once
    if not names and not rules.allow_empty:
        return (), (
            f"no labels in label member {name}; pass allow_empty_labels=True "
            "(--allow-empty-labels) to keep it as a negative"
        )
    if rules.max_labels is not None and len(names) > rules.max_labels:
        return (), f"{len(names)} labels in {name}, more than max_labels={rules.max_labels}"
    return names, None


def _canonical(name: str) -> str:
    """A label name as a class name: stripped, an integer without leading zeros."""
    name = name.strip()
    return str(int(name)) if _INTEGER.fullmatch(name) else name


def _label(
    key: str, extensions: dict[str, archives.Entry]
) -> tuple[str | tuple[str, ...], str, str | None]:
    """A sample's label (a class name, empty for an empty member, or a JSON list's names),
    the extension of the member it came from, or why there is none."""
    extension = next((e for e in LABEL_EXTENSIONS if e in extensions), None)
    if extension is None:
        return "", "", f"no label: the sample has no {key}.cls, .json or .txt member"
    name, entry = f"{key}.{extension}", extensions[extension]
    try:
        data = _small(entry)
        # utf-8-sig: a label file saved with a byte-order mark still reads as its text.
        text = data.decode("utf-8-sig").strip()
    except members_lib.MemberError as error:
        return "", extension, f"label member {name}: {error}"
    except UnicodeDecodeError:
        return "", extension, f"label member {name}: not UTF-8 text"
    if extension == "json":
        try:
            value = json.loads(text)
        except ValueError as error:
            return "", extension, f"label member {name}: not JSON ({error})"
        if isinstance(value, dict):
            field = next((f for f in ("labels", "label", "cls") if f in value), None)
            if field is None:
                return (
                    "",
                    extension,
                    (f"label member {name}: a JSON object without 'label' or 'cls'"),
                )
            value = value[field]
        values = value if isinstance(value, list) else [value]
        # bool is an int in Python: true is no label.
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int | str)]
        if bad:
            return (
                "",
                extension,
                (f"label member {name}: a label is an integer or a string, not {bad[0]!r}"),
            )
        if isinstance(value, list):
            names = tuple(_canonical(str(v)) for v in value)
            if not all(names):
                return "", extension, f"label member {name}: an empty label in {value!r}"
            return names, extension, None
        text = str(value).strip()
    return _canonical(text), extension, None


def _small(entry: archives.Entry) -> bytes:
    """The bytes of a label member (kept while unpacking, or read from the tar)."""
    if entry.data is not None:
        return entry.data
    if entry.member is None:
        raise members_lib.MemberError(entry.reject or "not a file")
    if entry.member.size > archives.SMALL_MEMBER:
        raise members_lib.MemberError(f"too large for a label ({entry.member.size} bytes)")
    return members_lib.read_member(entry.member, 0)  # 0 pixels: at most the 1 MiB slack
